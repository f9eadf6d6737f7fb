"""Protocols as data: a protocol is described once, and any engine runs it.

A :class:`Protocol` is a generator of rounds. It yields a :class:`RoundPlan` (the
mechanism's public parameters and the round's guarantee), receives the round's
opened reports (an ``(N, width)`` int64 array, in the shuffler's order, which says
nothing), computes the next round's parameters from them, and finally returns its
result. The client randomizer of every round is the one
:func:`shuffledp.client.mechanisms.randomize_round` names for the plan's
parameters; the decoder is the protocol's own code between yields.

Two engines run any protocol (``shuffledp/simulation/engine.py``): the vectorized engine calls
the randomizer on arrays and permutes the rows; the message engine announces each
plan as a signed round spec through the real coordinator, clients, sealing,
shuffler and analyzer (:meth:`shuffledp.analyzer.coordinator.Coordinator.run_protocol`).
Because both draw every report from the same function, and a shuffled batch is a
uniformly permuted multiset either way, the two give the same output distribution
(``tests/simulation/test_engine.py`` checks identical multisets under one seed).

Sufficient statistics. A plan may name a *collector* (``RoundPlan.collect``): a factory of
an object whose ``add_rows(rows)`` folds any block of the round's reports, in any order,
into the statistics the decoder needs (a histogram, per-coordinate sums). A protocol that
names one reads its round through :func:`collected`, so an engine may send it either the
opened rows (the message engine, and the fast engine when it holds a round's reports) or
a collector it already fed block by block (the fast engine streaming millions of users
in bounded memory). Collectors keep exact sums (integers: counts, signed bits, grid
values), so the decoder's result is the same to the last bit either way, whatever the
blocks and their order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generator

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import MechanismParams, messages_per_user


@dataclass(frozen=True)
class RoundPlan:
    """One round as a protocol asks for it: parameters and the guarantee clients are charged."""

    params: MechanismParams
    epsilon0: float
    delta0: float = 0.0
    #: Factory of the round's collector (see the module docstring), or ``None``: the protocol reads the rows.
    collect: Callable[[], "Collector"] | None = field(default=None, compare=False, repr=False)

    @property
    def messages_per_user(self) -> int:
        return messages_per_user(self.params)


class Collector(ABC):
    """The sufficient statistics of one round's reports, folded block by block (exactly, in any order)."""

    #: The attributes that hold the statistics (exact sums): what the default :meth:`merge` adds.
    statistics: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in a block of reports: int64 ``(N, width)`` rows."""

    def merge(self, other: "Collector") -> "Collector":
        """Fold in ``other``, a collector of the same round filled with other reports; return ``self``.

        Afterwards ``self`` holds the statistics of both sets of reports, exactly as if one
        collector had been fed them all: the statistics are exact sums, so merging is
        associative and commutative to the last bit, and an engine may fill collectors on
        separate machines and merge them in any order and grouping. The default adds the
        attributes :attr:`statistics` names; a collector whose statistics are not plain sums
        overrides it."""
        if type(other) is not type(self):
            raise InvalidParameter("other", f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        if not self.statistics:
            raise NotImplementedError(f"{type(self).__name__} names no statistics to merge")
        for name in self.statistics:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def collected(plan: RoundPlan, reports: "np.ndarray | Collector") -> Any:
    """The round's collector filled with its reports, from what an engine sent: the opened rows
    (folded into a fresh ``plan.collect()`` here) or a collector the engine already fed."""
    if plan.collect is None:
        raise ValueError("this round's plan names no collector")
    if isinstance(reports, np.ndarray):
        collector = plan.collect()
        collector.add_rows(reports.reshape(-1, reports.shape[-1]) if reports.ndim != 2 else reports)
        return collector
    return reports


#: What a protocol's ``rounds`` generator is: yields plans, is sent each round's reports, returns a result.
Rounds = Generator[RoundPlan, np.ndarray, Any]


class Protocol(ABC):
    """A multi-round protocol described once (see the module docstring)."""

    #: Name on the command line (``shuffledp simulate --protocol NAME``); a protocol whose name
    #: depends on its parameters sets it per instance.
    name: str
    #: ``1``: each user holds one number (its local mean); ``2``: a vector (per instance, likewise).
    data_rank: int = 1

    @abstractmethod
    def rounds(self) -> Rounds:
        """Yield each round's plan, receive its opened reports (or, for a plan with a collector, that
        collector filled: read it through :func:`collected`), return the protocol's result."""

    @property
    @abstractmethod
    def budget(self) -> tuple[float, float]:
        """``(epsilon, delta)`` a client's ledger is charged over all rounds (basic composition)."""


def drive(protocol: Protocol, execute: Callable[[RoundPlan], np.ndarray]) -> Any:
    """Run ``protocol`` with ``execute`` answering each plan with that round's reports."""
    rounds = protocol.rounds()
    plan = next(rounds)
    while True:
        try:
            plan = rounds.send(execute(plan))
        except StopIteration as done:
            return done.value
