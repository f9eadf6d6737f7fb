"""Optional dependencies: which extra brings which module, and which command needs which.

The core install (``pip install shuffledp``) is the device install: numpy, cbor2 and
cryptography, enough for :mod:`shuffledp.client` and the protocol core. The commands
need more, grouped as extras in ``pyproject.toml``:

* ``analysis``: scipy, dp-accounting, tqdm, matplotlib (simulation, accounting, audit, plots);
* ``mqtt``: aiomqtt (the broker transport: ``up``, the services, ``--broker``);
* ``all``: both; ``learning``: scikit-learn; ``bench``: pure-ldp; ``docs``: pdoc;
* ``dask``: dask.distributed (``--dask-scheduler`` / ``--dask-workers``: the fast engine on a cluster).

A command whose extra is missing stops before doing any work with one line that names
the extra to install (:class:`MissingExtraError`), never a traceback.
"""

from __future__ import annotations

import importlib.util

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


class MissingExtraError(ImportError):
    """A command needs an optional dependency that is not installed."""

    def __init__(self, command: str, extra: str, module: str) -> None:
        self.command, self.extra, self.module = command, extra, module
        super().__init__(
            f"shuffledp {command}: needs the '{extra}' extra (module '{module}' is not installed); "
            f"install it with: pip install 'shuffledp[{extra}]'"
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


def require_extras(command: str, extras: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``command``'s extras is importable."""
    for extra in COMMAND_EXTRAS.get(command, ()) if extras is None else extras:
        for module in EXTRA_MODULES[extra]:
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError(command, extra, module)


def as_missing_extra(command: str, exc: ModuleNotFoundError) -> MissingExtraError | None:
    """The :class:`MissingExtraError` behind ``exc`` if an extra provides the missing module."""
    extra = extra_for_module(exc.name)
    return None if extra is None else MissingExtraError(command, extra, exc.name or "?")
