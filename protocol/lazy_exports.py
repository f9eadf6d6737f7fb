"""A package's public names, each loaded from its module on first use (PEP 562).

A package whose ``__init__`` imports every submodule makes anyone who needs one of them pay for
all (the accountant's scipy and dp-accounting, the simulation's parties). With
``__getattr__, __dir__ = lazy_exports(__name__, globals(), {name: submodule, ...})`` the package
imports nothing until a name is asked for, then that one submodule; the name is then kept in
the package's namespace, so later lookups are ordinary attribute reads.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's module-level ``__getattr__`` and ``__dir__`` for ``exports`` (public name ->
    submodule of ``package`` defining it); ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # later lookups find it directly
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
