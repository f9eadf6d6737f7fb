"""How to install an extra for the copy of shuffledp that runs: one pip line that works as printed.

shuffledp is on no package index, so the line is never ``pip install shuffledp[...]``. From a
clone (an editable install or ``PYTHONPATH``) it is the clone's editable install with the
extras; from an installed wheel or sdist it is the extras' own requirements, read from the
installed metadata. The commands' missing-extra messages (:mod:`shuffledp.cli.extras`) and the
library's own (the Dask engine, the ULDP-SGD data set) all print :func:`install_command`.
This module sits at the package's root layer, so any module may import it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

#: The repository root of a clone (where ``pyproject.toml`` is) when shuffledp runs from one.
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def source_tree() -> Path | None:
    """The clone this copy of shuffledp runs from (editable install or ``PYTHONPATH``), or None
    when it runs from an installed wheel or sdist."""
    pyproject = SOURCE_ROOT / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return SOURCE_ROOT if re.search(r'^name\s*=\s*"shuffledp"\s*$', text, re.MULTILINE) else None


def extras_requirements(extras: tuple[str, ...]) -> list[str]:
    """The requirements ``extras`` add to the installed distribution, as its metadata states them
    (``Requires-Dist: X; extra == "e"``; an extra naming other extras, as ``all`` does, expanded)."""
    from importlib import metadata

    try:
        declared = metadata.requires("shuffledp") or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
    by_extra: dict[str, list[str]] = {}
    for line in declared:
        requirement, _, condition = line.partition(";")
        for extra in marker.findall(condition):
            by_extra.setdefault(extra, []).append(requirement.strip())
    wanted: list[str] = []
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in by_extra.get(extra, []):
            self_reference = re.fullmatch(r"shuffledp\s*\[([^\]]*)\]\s*", requirement)
            if self_reference:
                todo += [e.strip() for e in self_reference.group(1).split(",") if e.strip()]
            elif requirement not in wanted:
                wanted.append(requirement)
    return wanted


def install_command(extras: tuple[str, ...]) -> str:
    """A pip command that installs ``extras`` for this copy of shuffledp, as one shell line.

    From a clone: ``pip install -e '<clone>[e1,e2]'`` (the clone's editable install with the
    extras). From an installed wheel or sdist: ``pip install`` of the extras' requirements from
    the installed metadata (shuffledp itself is on no index, so ``shuffledp[e1]`` could not be
    found). Either way the command works as printed, from any directory."""
    names = ",".join(extras)
    root = source_tree()
    if root is not None:
        return f"pip install -e {shlex.quote(f'{root}[{names}]')}"
    requirements = extras_requirements(extras)
    if requirements:
        return "pip install " + " ".join(shlex.quote(r.replace(" ", "")) for r in requirements)
    return f"pip install the requirements of [{names}] in shuffledp's pyproject.toml"
