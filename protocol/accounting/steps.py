"""Poisson-subsampled *multi-round* steps: one cohort answers several shuffled rounds.

:class:`~shuffledp.protocol.accounting.session.SessionAccountant` subsamples every round
on its own (``add_round(..., sampling_rate=q)``): each round's batch is a fresh Poisson
sample. In a learning step (ULDP-SGD, Girgis, Data & Diggavi, Algorithm 6) the *same*
cohort answers both rounds of the vector mean protocol (range round, then mean round),
so the two rounds are subsampled **jointly**. Composing two independently subsampled
rounds would under-report the loss: a user in the cohort is in both rounds at once, and
subsampling amplifies ``log(1 + q (e^(e1 + e2) - 1))``, which exceeds
``log(1 + q (e^e1 - 1)) + log(1 + q (e^e2 - 1))``. This module accounts the step as one
subsampled mechanism:

1. **Inner step** (a fixed batch of ``k`` reports per round): the rounds are composed
   by :class:`SessionAccountant` itself (its PLD and RDP routes, unsubsampled). The
   later rounds' parameters may depend on the earlier rounds' output (the mean round's
   ranges come from the range round); every dominating pair used holds for *any*
   parameters of the round, so adaptive composition of the PLDs / RDP curves is valid.
2. **Poisson subsampling** of the step, exactly as the session accountant does it for
   one round (``session.py`` module docstring): the population is ``N = round(k / q)``,
   the batch size ``S ~ Bin(N, q)`` has the same law under both neighbouring datasets,
   given ``S = s`` the cohort is a uniform ``s``-subset, and all ``s`` in the binomial
   window ``[k_lo, k_hi]`` (tail mass ``<= 1e-14`` outside, added to delta) are bounded
   by the worst corner: the inner step at ``k_lo`` reports per round and inclusion
   probability ``gamma = k_hi / N``. PLD route: the inner step's ``delta(eps)`` curve
   (from its composed PLD) is mapped by the advanced joint convexity of Balle, Barthe &
   Gaboardi (NeurIPS 2018, Thm. 2), ``eps' = log(1 + gamma (e^eps - 1))``,
   ``delta' = gamma delta(eps) + tail``, and turned back into a dominating PLD with the
   session's pessimistic connect-the-dots construction (``session._pld_from_curve``).
   RDP route: Wang, Balle & Kasiviswanathan (AISTATS 2019, Thm. 9) on the inner step's
   composed RDP with ``eps_inf`` the step's total pure ``eps0``, mixed with the pure-DP
   bound on the tail, as in ``SessionAccountant._group_rdp``.
3. **T steps**: the step PLD is self-composed ``T`` times (dp-accounting), the RDP curve
   multiplied by ``T``; the reported epsilon is the smaller of the two upper bounds.

With ``sampling_rate=None`` (everyone answers every step) there is no subsampling and the
session is exactly :class:`SessionAccountant` with every round added ``T`` times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shuffledp.protocol.accounting.guarantees import LocalGuarantee
from shuffledp.protocol.accounting.rdp import rdp_epsilon
from shuffledp.protocol.accounting.session import (
    SessionAccountant,
    _pld_from_curve,
    _poisson_window,
    subsampled_curve,
    subsampled_rdp,
)
from shuffledp.protocol.errors import InvalidParameter

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: Points of the inner step's delta(eps) curve sampled before subsampling.
STEP_CURVE_POINTS = 200
#: Reference delta for the automatic PLD discretization (as ``SessionAccountant``'s default).
REFERENCE_DELTA = 1e-6


@dataclass
class SubsampledStepAccountant:
    """``steps`` identical steps; each Poisson-samples a cohort that answers every round of ``guarantees``.

    ``cohort`` is the expected cohort size ``k = q N`` (the batch size of each round),
    ``sampling_rate`` is ``q`` (``None`` or 1: no subsampling). Every epsilon reported is
    an upper bound (see the module docstring for the theorems used).
    """

    guarantees: Sequence[LocalGuarantee]
    cohort: int
    sampling_rate: float | None
    steps: int
    value_discretization_interval: float | None = None
    #: PLD grid of the inner (unsubsampled) step: rounding is pessimistic, so a coarser grid only
    #: adds to epsilon (about +0.001 at T = 1000 steps for 5e-4 against 1e-4) and is 4x faster.
    inner_discretization: float = 5e-4
    _pld: "PrivacyLossDistribution | None" = field(default=None, init=False, repr=False)
    _rdp: tuple | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.guarantees:
            raise InvalidParameter("guarantees", "a step needs at least one round")
        if any(not isinstance(g, LocalGuarantee) for g in self.guarantees):
            raise InvalidParameter("guarantees", "must be LocalGuarantee objects")
        if isinstance(self.cohort, bool) or not isinstance(self.cohort, (int, np.integer)) or self.cohort < 2:
            raise InvalidParameter("cohort", f"must be an integer >= 2, got {self.cohort!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, (int, np.integer)) or self.steps < 1:
            raise InvalidParameter("steps", f"must be an integer >= 1, got {self.steps!r}")
        q = self.sampling_rate
        if q is not None:
            if isinstance(q, bool) or not isinstance(q, (int, float, np.floating)) or not 0 < q <= 1:
                raise InvalidParameter("sampling_rate", f"must be in (0, 1], got {q!r}")
            if q == 1:
                self.sampling_rate = None
        d = self.value_discretization_interval
        if d is not None and not 0 < d <= 0.1:
            raise InvalidParameter("value_discretization_interval", "must be in (0, 0.1]")
        if not 0 < self.inner_discretization <= 0.1:
            raise InvalidParameter("inner_discretization", "must be in (0, 0.1]")
        self.cohort, self.steps = int(self.cohort), int(self.steps)

    # ------------------------------------------------------------------ pieces
    @property
    def step_epsilon0(self) -> float:
        """Local (pure) epsilon of one user's whole step (basic composition of its rounds)."""
        return float(sum(g.epsilon0 for g in self.guarantees))

    def window(self) -> tuple[int, int, int, float]:
        """``(N, k_lo, k_hi, tail)`` of the Poisson batch-size window (``session._poisson_window``)."""
        if self.sampling_rate is None:
            return self.cohort, self.cohort, self.cohort, 0.0
        return _poisson_window(self.cohort, self.sampling_rate)

    def _session(self, n: int, count: int, d: float | None = None) -> SessionAccountant:
        acc = SessionAccountant(value_discretization_interval=d)
        for g in self.guarantees:
            acc.add_round(g, n, count=count)
        return acc

    def subsampled_step_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """``(eps', delta')`` of one subsampled step (upper bound), before re-discretization."""
        N, k_lo, k_hi, tail = self.window()
        gamma = k_hi / N
        inner = self._session(k_lo, 1, self.inner_discretization).pld()
        e_total = self.step_epsilon0
        e_hi = min(e_total, float(inner.get_epsilon_for_delta(1e-15)))
        grid = np.unique(np.concatenate([np.linspace(0.0, e_hi, STEP_CURVE_POINTS), np.geomspace(1e-4, max(e_hi, 2e-4), 40)]))
        deltas = np.asarray(inner.get_delta_for_epsilon(grid), dtype=np.float64)
        grid = np.append(grid, e_total)
        deltas = np.append(deltas, 0.0)  # the step is pure e_total-DP
        return subsampled_curve(grid, deltas, gamma, tail)

    def _discretization(self, eps_p: np.ndarray, del_p: np.ndarray) -> float:
        if self.value_discretization_interval is not None:
            return float(self.value_discretization_interval)
        below = eps_p[del_p <= REFERENCE_DELTA]
        smallest = float(below.min()) if below.size else float(eps_p.max())
        return float(min(1e-4, max(1e-5, smallest / 100.0)))

    # ------------------------------------------------------------------ routes
    def pld(self) -> "PrivacyLossDistribution":
        """The session's privacy loss distribution (all ``steps``)."""
        if self._pld is None:
            if self.sampling_rate is None:
                self._pld = self._session(self.cohort, self.steps).pld()
            else:
                eps_p, del_p = self.subsampled_step_curve()
                step = _pld_from_curve(eps_p, del_p, self._discretization(eps_p, del_p))
                self._pld = step.self_compose(self.steps) if self.steps > 1 else step
        return self._pld

    def rdp(self) -> tuple[tuple[int, ...], np.ndarray]:
        """``(orders, RDP)`` of the whole session."""
        if self._rdp is None:
            if self.sampling_rate is None:
                self._rdp = self._session(self.cohort, self.steps).rdp()
            else:
                N, k_lo, k_hi, tail = self.window()
                orders, inner = self._session(k_lo, 1).rdp()
                self._rdp = (tuple(orders), self.steps * subsampled_rdp(inner, orders, k_hi / N, tail, self.step_epsilon0))
        return self._rdp

    def epsilon_breakdown(self, delta: float) -> dict[str, float]:
        """Session epsilon at ``delta`` by each route (both upper bounds)."""
        if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
            raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
        eps_pld = float(self.pld().get_epsilon_for_delta(float(delta)))
        orders, rdp = self.rdp()
        return {"pld": eps_pld, "rdp": rdp_epsilon(orders, rdp, float(delta))}

    def epsilon(self, delta: float) -> float:
        """Central (session) epsilon at ``delta``: the smaller of the two routes."""
        b = self.epsilon_breakdown(delta)
        return min(b["pld"], b["rdp"])
