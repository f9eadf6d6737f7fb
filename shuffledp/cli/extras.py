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

from shuffledp.install import install_command

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
