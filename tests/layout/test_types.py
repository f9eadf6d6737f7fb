"""The package type-checks: ``mypy -p shuffledp`` reports no error, with pyproject.toml's ``[tool.mypy]``.

mypy cannot follow setuptools' ``package-dir`` mapping (``shuffledp.protocol`` is ``protocol/``,
and so on) nor an editable install's import hook, so the package is laid out as it is installed,
a tree of links to the sources in a temporary folder, and mypy runs there. An error is reported
at its path in this repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_dirs() -> dict[str, Path]:
    """Each package of pyproject.toml and the source folder it is installed from."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        setuptools = tomllib.load(fh)["tool"]["setuptools"]
    mapped = setuptools["package-dir"]
    return {name: ROOT / mapped.get(name, name.replace(".", "/")) for name in setuptools["packages"]}


def _link_tree(out: Path) -> dict[Path, Path]:
    """Lay the package out under ``out`` as installed (links to each source file); the map back."""
    back = {}
    for name, source in _package_dirs().items():
        target = out / name.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for path in source.glob("*.py"):
            (target / path.name).symlink_to(path)
            back[(target / path.name).relative_to(out)] = path.relative_to(ROOT)
        if (source / "py.typed").exists():
            (target / "py.typed").symlink_to(source / "py.typed")
    return back


def test_mypy_reports_no_error(tmp_path):
    tree = tmp_path / "tree"
    back = _link_tree(tree)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", "--hide-error-context", "-p", "shuffledp"],
        cwd=tree, capture_output=True, text=True, timeout=240, env={**os.environ, "MYPY_FORCE_COLOR": "0"})

    def in_repo(line: str) -> str:
        path, sep, rest = line.partition(":")
        return f"{back.get(Path(path), path)}{sep}{rest}"

    errors = [in_repo(line) for line in done.stdout.splitlines() if re.search(r": error: ", line)]
    assert done.returncode == 0 and not errors, "\n".join(errors or [done.stdout[-3000:], done.stderr[-3000:]])
