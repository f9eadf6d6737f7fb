"""The API reference builds without a pdoc warning, and its guides' examples run.

``scripts/api_docs.sh`` builds the HTML reference with pdoc: one page per public module
of the packages pyproject.toml lists, and the guide pages of ``docs/api/``. Each guide's
python code blocks are run as one script, in a fresh process, as a reader would paste them.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "api_docs.sh"
GUIDES = ROOT / "docs" / "api"
GUIDE_NAMES = ("simulate", "embed", "audit", "account")
PUBLIC_PACKAGES = ("shuffledp", "shuffledp.central", "shuffledp.protocol", "shuffledp.protocol.accounting",
                   "shuffledp.client", "shuffledp.shuffler", "shuffledp.analyzer")
# A dotted name in backquotes in a guide: pdoc turns it into a link when it resolves.
REFERENCE = re.compile(r"`((?:shuffledp|guides)(?:\.\w+)+)`")


def packages() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]["packages"]


def public_modules() -> list[str]:
    names = []
    for package in packages():
        names.append(package)
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__, package + "."):
            if not info.ispkg and not info.name.rpartition(".")[2].startswith("_"):
                names.append(info.name)
    return names


def page(out: Path, module: str) -> Path:
    return out / (module.replace(".", "/") + ".html")


def python_blocks(guide: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", (GUIDES / f"{guide}.md").read_text(encoding="utf-8"), re.S | re.M)


def test_the_reference_builds_with_a_page_per_module_and_guide(tmp_path):
    out = tmp_path / "api-docs"
    # --no-source: the same pages without pdoc's highlighted source listings, which are pdoc's own
    # rendering of files it reads as they are and took half the build's time.
    done = subprocess.run(
        ["bash", str(SCRIPT), "--no-source", str(out)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]  # pdoc warnings and import errors are fatal, and printed here

    missing = [m for m in (*PUBLIC_PACKAGES, *public_modules()) if not page(out, m).is_file()]
    assert not missing, f"no page for {missing}"
    assert (out / "index.html").is_file() and (out / "search.js").is_file()
    assert page(out, "guides").is_file()

    for guide in GUIDE_NAMES:
        html = page(out, f"guides.{guide}").read_text(encoding="utf-8")
        first_heading = (GUIDES / f"{guide}.md").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        assert first_heading in html  # the markdown was included, not just the stub
        references = set(REFERENCE.findall((GUIDES / f"{guide}.md").read_text(encoding="utf-8")))
        assert references
        unresolved = sorted(name for name in references if f">{name}</a>" not in html)
        assert not unresolved, f"guides.{guide} names what the reference does not document: {unresolved}"


def test_the_build_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "keep.txt").write_text("not a build")
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2 and (tmp_path / "keep.txt").exists()


@pytest.mark.parametrize("guide", GUIDE_NAMES)
def test_the_guide_examples_run(guide, tmp_path):
    blocks = python_blocks(guide)
    assert blocks, f"docs/api/{guide}.md has no python example"
    script = tmp_path / f"{guide}_example.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    env = {**os.environ, "SHUFFLEDP_ACCOUNTING_CACHE": "off", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()
