"""Simulation: the two engines (vectorized and message-passing), populations, and the runners of each protocol.

The scalar-mean simulation (:mod:`shuffledp.simulation.scalar`) is the package's public
entry point, re-exported here: ``from shuffledp.simulation import SimulationConfig,
run_simulation``.
"""

from shuffledp.simulation.scalar import (
    SimulationConfig,
    SimulationResult,
    broker_connection,
    central_guarantee,
    central_guarantee_at,
    parse_broker,
    party_channels,
    run_simulation,
)

__all__ = [
    "SimulationConfig",
    "SimulationResult",
    "broker_connection",
    "central_guarantee",
    "central_guarantee_at",
    "parse_broker",
    "party_channels",
    "run_simulation",
]
