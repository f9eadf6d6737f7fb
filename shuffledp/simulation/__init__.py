"""Simulation: the two engines (vectorized and message-passing), populations, and the runners of each protocol.

The scalar-mean simulation (:mod:`shuffledp.simulation.scalar`) is the package's public
entry point, re-exported here: ``from shuffledp.simulation import SimulationConfig,
run_simulation``. The names load their module on first use (PEP 562), so a process that
needs one submodule (a message-engine worker needs :mod:`.client_pool`) imports only it.
"""

from __future__ import annotations

from shuffledp.protocol.lazy_exports import lazy_exports

#: Each public name and the module of this package that defines it.
_EXPORTS = {
    name: "scalar"
    for name in (
        "SimulationConfig",
        "SimulationResult",
        "broker_connection",
        "central_guarantee",
        "central_guarantee_at",
        "parse_broker",
        "party_channels",
        "run_simulation",
        "session_plan_of",
    )
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
