"""Optional dependencies: which extra brings which module, and which command needs which.

The core install is the device install: numpy, cbor2 and cryptography, enough for
:mod:`shuffledp.client` and the protocol core. The commands need more, grouped as extras
in ``pyproject.toml``:

* ``analysis``: scipy, dp-accounting, tqdm, matplotlib (simulation, accounting, audit, plots);
* ``mqtt``: aiomqtt (the broker transport: ``up``, the services, ``--broker``);
* ``all``: both; ``learning``: scikit-learn; ``bench``: pure-ldp; ``docs``: pdoc;
* ``dask``: dask.distributed (``--dask-scheduler`` / ``--dask-workers``: the fast engine on a cluster).

A command whose extras are missing stops before doing any work with one line that names
every extra it needs, the modules that are missing, and a pip command that installs them
here (:class:`MissingExtraError`), never a traceback. shuffledp is on no package index, so
that command is never ``pip install shuffledp[...]``: from a clone it is the editable
install of the clone with the extras (:func:`install_command`); from an installed wheel
or sdist, the extras' own requirements, read from the installed metadata.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

#: The importable top-level modules each extra provides.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "analysis": ("scipy", "dp_accounting", "matplotlib", "tqdm"),
    "mqtt": ("aiomqtt", "paho"),
    "learning": ("sklearn",),
    "bench": ("pure_ldp",),
    "docs": ("pdoc",),
    "dask": ("dask", "distributed"),
}

#: The extras each top-level command needs before it starts.
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "simulate": ("analysis",),
    "vector": ("analysis",),
    "distribution": ("analysis",),
    "account": ("analysis",),
    "audit": ("analysis",),
    "up": ("analysis", "mqtt"),
    "analyzer": ("analysis", "mqtt"),
    "shuffler": ("mqtt",),
    "clients": ("mqtt",),
    "client": ("mqtt",),
    "keys": (),
}


#: The repository root of a clone (where ``pyproject.toml`` is) when shuffledp runs from one.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


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


def _named(extras: tuple[str, ...]) -> str:
    quoted = [f"'{e}'" for e in extras]
    if len(quoted) == 1:
        return f"the {quoted[0]} extra"
    return f"the {', '.join(quoted[:-1])} and {quoted[-1]} extras"


class MissingExtraError(ImportError):
    """A command needs optional dependencies that are not installed.

    ``extras`` are every extra the command needs (installed or not), ``modules`` the ones
    found missing; the message names both and the pip command that installs them all."""

    def __init__(self, command: str, extras: tuple[str, ...], modules: tuple[str, ...]) -> None:
        self.command, self.extras, self.modules = command, extras, modules
        super().__init__(
            f"shuffledp {command}: needs {_named(extras)} (not installed: {', '.join(modules)}); "
            f"install with: {install_command(extras)}"
        )


def extra_for_module(module: str | None) -> str | None:
    """The extra that provides ``module`` (a dotted name is judged by its top level), or None."""
    if not module:
        return None
    top = module.split(".", 1)[0]
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return extra
    return None


def missing_modules(extras: tuple[str, ...]) -> tuple[str, ...]:
    """The modules of ``extras`` that cannot be imported here."""
    return tuple(m for extra in extras for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None)


def needed_extras(command: str, more: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every extra ``command`` needs, then ``more`` (each once, in that order)."""
    return tuple(dict.fromkeys(COMMAND_EXTRAS.get(command, ()) + more))


def require_extras(command: str, extras: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``command``'s extras (and of
    ``extras``, an option's own) is importable; the error names all of them."""
    wanted = needed_extras(command, extras or ())
    missing = missing_modules(wanted)
    if missing:
        raise MissingExtraError(command, wanted, missing)


def as_missing_extra(command: str, exc: ModuleNotFoundError) -> MissingExtraError | None:
    """The :class:`MissingExtraError` behind ``exc`` if an extra provides the missing module."""
    extra = extra_for_module(exc.name)
    if extra is None:
        return None
    return MissingExtraError(command, needed_extras(command, (extra,)), (exc.name or "?",))
