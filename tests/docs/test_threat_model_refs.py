"""Every function and test `docs/threat-model.md` names exists.

The threat model says, for each attack, which function stops it and which test tries it.
A name that no longer exists (a renamed test, a moved function) would leave a claim with
nothing behind it, so each ``path.py::Name`` or ``path.py::Class.member`` reference on the
page is resolved here in the source it names.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "threat-model.md"
REFERENCE = re.compile(r"`([A-Za-z0-9_/]+\.py)::([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`")


def references() -> list[tuple[str, str]]:
    return sorted(set(REFERENCE.findall(PAGE.read_text())))


@cache
def _module(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text())


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines or imports, with their nodes."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = node
    return names


def test_the_page_names_functions_and_tests():
    refs = references()
    assert len(refs) >= 60  # the attack table alone names more than this
    assert any(path.startswith("tests/") for path, _ in refs)


@pytest.mark.parametrize("path,name", references(), ids=lambda v: v)
def test_each_named_function_and_test_exists(path, name):
    assert (ROOT / path).is_file(), f"{path} does not exist"
    names = _defined(_module(path).body)
    head, _, member = name.partition(".")
    assert head in names, f"{path} defines no {head}"
    if member:
        owner = names[head]
        assert isinstance(owner, ast.ClassDef), f"{path}::{head} is not a class"
        assert member in _defined(owner.body), f"{path}::{head} has no member {member}"
    if path.startswith("tests/"):
        assert head.startswith("test_") and isinstance(names[head], (ast.FunctionDef, ast.AsyncFunctionDef))


#: ``js/src/...ts::Name`` or ``Name.member`` (the JavaScript device client's sources) and
#: ``js/test/...test.mjs::title`` (a Node test by its title).
JS_REFERENCE = re.compile(r"`(js/(?:src|test)/[A-Za-z0-9_/.-]+\.(?:ts|mjs))::([^`]+)`")


def js_references() -> list[tuple[str, str]]:
    return sorted(set(JS_REFERENCE.findall(PAGE.read_text())))


def test_the_page_names_the_javascript_client_s_functions_and_tests():
    refs = js_references()
    assert any(path.startswith("js/src/") for path, _ in refs) and any(path.startswith("js/test/") for path, _ in refs)


@pytest.mark.parametrize("path,name", js_references(), ids=lambda v: v[:80])
def test_each_named_javascript_function_and_test_exists(path, name):
    source = (ROOT / path).read_text()
    if path.startswith("js/test/"):
        assert re.search(r'\btest\(\s*"' + re.escape(name) + '"', source), f"{path} has no test titled {name!r}"
        return
    head, _, member = name.partition(".")
    declared = re.search(rf"^export (?:abstract )?(?:class|(?:async )?function|const|interface|type) {re.escape(head)}\b", source, re.M)
    assert declared, f"{path} exports no {head}"
    if member:
        body = source[declared.start():]
        assert re.search(rf"^\s+(?:static )?(?:async )?{re.escape(member)}\(", body, re.M), f"{path}::{head} has no member {member}"
