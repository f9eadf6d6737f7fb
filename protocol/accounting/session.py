"""Composition of shuffled rounds into a session ledger.

Every round group is turned into two objects that dp-accounting composes:

1. A **privacy loss distribution** built from the round's ``delta(eps)`` curve with
   dp-accounting's pessimistic connect-the-dots discretisation
   (``pld_pmf.create_pmf_pessimistic_connect_dots``; Doroshenko, Ghazi, Kamath, Kumar
   & Manurangsi 2022). The curve is the pointwise minimum of the round's valid
   numerical curves (each an upper bound), evaluated on an epsilon grid, extended to
   negative epsilons by ``delta(-e) = 1 - e^-e + e^-e delta(e)`` (our curves bound
   both directions), rounded *up* to the PLD's discretisation (``delta`` is
   non-increasing, so the old value remains an upper bound at the larger epsilon),
   and replaced by its lower convex hull in ``(e^eps, delta)``: the true curve is
   convex there and below every point, hence below the hull. Connect-the-dots then
   yields a PLD whose hockey-stick curve interpolates these points linearly in
   ``e^eps``, i.e. dominates the round. Rounds are composed with
   ``PrivacyLossDistribution.compose`` / ``self_compose``.
2. An **RDP curve** at integer orders (minimum of Girgis et al.'s bound and the
   numerical RDP of the valid clone pairs), composed by addition and converted with
   dp-accounting's ``compute_epsilon``.

The session's epsilon is the smaller of the two, both being upper bounds.

Subsampled rounds (``sampling_rate``; ``n`` is the batch size the shuffler delivers,
in expectation for Poisson sampling):

* ``uniform``: a fixed batch of ``n`` reports drawn from ``N = n / rate`` users.
  Conditionally on being absent, user 1's round is a mixture of rounds in which
  user 1's slot holds another user's data, so the round with and without user 1 is
  ``(eps, delta_round(eps))``-indistinguishable and the advanced joint convexity of
  Balle, Barthe & Gaboardi (NeurIPS 2018, Theorem 2) gives
  ``eps' = log(1 + rate (e^eps - 1))`` at ``delta' = rate * delta_round(eps)``. On the
  RDP side, Wang, Balle & Kasiviswanathan's Theorem 9 (see :mod:`.rdp`).
* ``poisson``: each of ``N = round(n / rate)`` users joins independently. The batch
  size ``S ~ Bin(N, rate)`` has the same law under both neighbouring datasets and,
  given ``S = k``, the batch is a uniform ``k``-subset, i.e. the uniform case with
  ``gamma = k / N``. We bound all ``k`` in ``[k_lo, k_hi]`` (binomial tails of 1e-14
  outside, added to delta) by the worst corner: the round at ``k_lo`` reports and
  ``gamma = k_hi / N``. Outside the window the round is still ``eps0``-DP (RDP side).

Approximate-DP randomizers are refused (:class:`AmplificationNotClaimed`).

Sizes (all answered in bounded time; refusals are :class:`InvalidParameter`, before any work):

* ``n`` in ``[1, 10^18]`` and ``count`` in ``[1, 10^18]``. A round's batch (``n``, or the
  Poisson window's ``k_lo``) above ``shuffle_round.EVALUATION_MAX_N`` is accounted at that size
  (a larger batch is a post-processing of a smaller one: ``shuffle_round`` module doc).
* Any ``sampling_rate`` in ``(0, 1]``. Where the population ``n / rate`` is beyond ``2^53``
  the batch-size window comes from the Chernoff bounds of a sum of independent Bernoulli
  variables with mean ``n +- 1`` (valid whatever ``N``) instead of exact binomial tails.
* The PLD route self-composes a group's ``count`` rounds only where dp-accounting's own
  truncation bound puts the result under :data:`PLD_MAX_POINTS` points; beyond it (e.g.
  ``10^9`` rounds) the session is accounted by the RDP route alone:
  :meth:`SessionAccountant.epsilon_breakdown` reports ``pld = inf``, :meth:`~SessionAccountant.pld`
  raises :class:`PLDRouteUnavailable` and :meth:`~SessionAccountant.delta` converts the RDP curve.
* ``epsilon0`` below ``shuffle_round.NUMERICAL_MIN_EPSILON0``: a round's curve is the local one
  (binary RR's at ``eps0``, which bounds every ``eps0``-LDP randomizer; shuffling is a
  post-processing) and its RDP Girgis et al.'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from shuffledp.protocol.accounting._numerics import binom_cdf_le
from shuffledp.protocol.accounting.cache import cached
from shuffledp.protocol.accounting.clones import ClonePair
from shuffledp.protocol.accounting.guarantees import LocalGuarantee
from shuffledp.protocol.accounting.rdp import (
    EXTENDED_ORDERS,
    binary_rr_rdp_floor,
    clone_pair_rdp,
    girgis_rdp,
    pure_dp_rdp,
    rdp_epsilon,
    wor_subsampled_rdp,
)
from shuffledp.protocol.accounting.shuffle_round import (
    EVALUATION_MAX_N,
    NUMERICAL_MIN_EPSILON0,
    _check_round,
    clone_pairs_apply,
    local_delta_curve,
    round_curve_support,
    round_pairs,
    round_reference_epsilon,
    round_delta_curve,
    shuffled_round,
)
from shuffledp.protocol.errors import InvalidParameter

if TYPE_CHECKING:  # dp-accounting is imported lazily (about 1 s)
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

SAMPLING_SCHEMES = ("poisson", "uniform")
#: Binomial tail mass left outside the batch-size window of a Poisson-sampled round.
POISSON_TAIL = 1e-14
#: Number of points on the positive side of each round's epsilon grid.
CURVE_POINTS = 80
#: Numerical resolution of a session's PLD epsilon, relative. The value is an upper bound for the
#: round curve it was computed from, but it is not a smooth function of that curve: the
#: pessimistic discretisation rounds every privacy loss up to the PLD's grid and composition moves
#: mass across grid cells, so a change of the curve at its own round-off level (1e-15 to 1e-12
#: relative, which another BLAS kernel or summation order produces) moves the composed epsilon by
#: up to ~1e-7 relative (measured on the fixtures' 100-round Laplace session at delta = 1e-8; the
#: test ``test_session_epsilon_resolution_covers_round_off`` re-measures it). Two session epsilons
#: closer than this are the same number.
SESSION_PLD_RTOL = 1e-6
#: Largest self-composed PLD (points) the PLD route builds for one group of rounds (an FFT of this
#: length: about a second); above it the RDP route alone accounts the session (module doc).
PLD_MAX_POINTS = 1 << 22
#: Largest ``count`` (rounds in one group) accepted.
MAX_COUNT = 10**18
#: Populations ``n / rate`` above this use the Chernoff batch-size window (module doc).
EXACT_POPULATION_MAX = 2**53


class PLDRouteUnavailable(InvalidParameter):
    """The session's PLD would exceed :data:`PLD_MAX_POINTS` points: only the RDP route accounts it."""

    def __init__(self, count: int, points: int) -> None:
        super().__init__("count", f"{count} composed rounds need a PLD of about {points} points, more than "
                                  f"the {PLD_MAX_POINTS} the PLD route builds; the RDP route accounts this session")


@dataclass
class RoundGroup:
    """``count`` identical rounds."""

    local: LocalGuarantee
    n: int
    sampling_rate: float | None
    sampling: str
    count: int
    _pld: "PrivacyLossDistribution | None" = field(default=None, repr=False)
    _rdp: np.ndarray | None = field(default=None, repr=False)
    _reference: dict = field(default_factory=dict, repr=False)


def _poisson_window(n: int, rate: float) -> tuple[int, int, int, float]:
    """Population ``N``, batch window ``[k_lo, k_hi]`` and its outside mass."""
    N = max(n, int(round(n / rate)))
    mu = N * rate
    sd = math.sqrt(N * rate * (1 - rate))
    z = 8.0
    while True:
        k_lo = max(1, int(math.floor(mu - z * sd)))
        k_hi = min(N, int(math.ceil(mu + z * sd)))
        tail = float(binom_cdf_le(k_lo - 1.0, N, rate) + (1.0 - binom_cdf_le(k_hi, N, rate)))
        if tail <= POISSON_TAIL or z > 40:
            return N, k_lo, k_hi, tail
        z += 1.0


def _log_poisson_chernoff(mu: float, a: float) -> float:
    """``log`` of the Chernoff bound ``e^-mu (e mu / a)^a`` on ``Pr[S >= a]`` (``a > mu``) or ``Pr[S <= a]``
    (``a < mu``) for a sum ``S`` of independent Bernoulli variables with mean ``mu`` (any number of them)."""
    if a <= 0:
        return -mu
    return -mu + a + a * math.log(mu / a)


def _poisson_batch(n: int, rate: float) -> tuple[int, float, float]:
    """``(k_lo, gamma, tail)`` of a Poisson-sampled round: the batch window's lower end, the worst
    inclusion probability ``k_hi / N`` and the batch-size mass outside the window (module doc).

    Populations up to :data:`EXACT_POPULATION_MAX` use :func:`_poisson_window` (binomial tails).
    Beyond it ``N = round(n / rate)`` is never formed: the mean ``N rate`` is within ``rate / 2`` of
    ``n``, the Chernoff bounds (decreasing in the mean below it, increasing above) are taken at
    ``n -+ 1``, and ``gamma = k_hi / N <= k_hi rate / (n - 1/2)``, padded for rounding."""
    if n / rate <= EXACT_POPULATION_MAX:
        N, k_lo, k_hi, tail = _poisson_window(n, rate)
        return k_lo, k_hi / N, tail
    mu_lo, mu_hi = max(n * (1.0 - 1e-12) - 0.5, 1e-300), n * (1.0 + 1e-12) + 0.5
    sd = math.sqrt(n + 1.0)
    z = 8.0
    while True:
        k_lo = max(1, int(math.floor(n - z * sd)))
        k_hi = int(math.ceil(n + z * sd)) + 1
        low = math.exp(_log_poisson_chernoff(mu_lo, k_lo - 1.0)) if k_lo - 1 < mu_lo else 1.0
        high = math.exp(_log_poisson_chernoff(mu_hi, k_hi + 1.0)) if k_hi + 1 > mu_hi else 1.0
        tail = min(1.0, (low + high) * (1.0 + 1e-9))
        if tail <= POISSON_TAIL or z > 40:
            break
        z += 1.0
    gamma = min(1.0, k_hi * rate / max(n - 0.5, 0.5) * (1.0 + 1e-12))
    return k_lo, gamma, tail


class SessionAccountant:
    """Composes shuffled rounds into a session; every epsilon it reports is an upper bound.

    ``value_discretization_interval`` is the PLD grid. Rounding is pessimistic, so
    composing ``T`` rounds can cost up to ``T`` times it in epsilon (on the safe side).
    By default (``None``) it is chosen per session: 1/100 of the smallest per-round
    epsilon (after subsampling) at ``reference_delta``, clipped to ``[1e-5, 1e-4]``.
    """

    def __init__(
        self,
        *,
        value_discretization_interval: float | None = None,
        orders=None,
        reference_delta: float = 1e-6,
    ):
        if value_discretization_interval is not None and not 0 < value_discretization_interval <= 0.1:
            raise InvalidParameter("value_discretization_interval", "must be in (0, 0.1]")
        if not 0 < reference_delta < 1:
            raise InvalidParameter("reference_delta", "must be in (0, 1)")
        self._fixed_d = None if value_discretization_interval is None else float(value_discretization_interval)
        self._d: float | None = self._fixed_d
        self._orders = tuple(EXTENDED_ORDERS if orders is None else orders)
        if any(int(o) != o or o < 2 for o in self._orders) or 2 not in self._orders:
            raise InvalidParameter("orders", "must be integers >= 2, including 2")
        self._reference_delta = reference_delta
        self._groups: list[RoundGroup] = []

    # ---------------------------------------------------------------- ledger
    def add_round(
        self,
        local: LocalGuarantee,
        n: int,
        *,
        sampling_rate: float | None = None,
        sampling: str = "poisson",
        count: int = 1,
    ) -> None:
        """Record ``count`` rounds, each shuffling ``n`` reports of ``local``.

        With ``sampling_rate``, each round's batch is drawn from a population of
        ``n / sampling_rate`` users (``sampling``: ``"poisson"`` or ``"uniform"``) and
        ``n`` is the (expected) batch size.
        """
        n = _check_round(local, n)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 1 <= count <= MAX_COUNT:
            raise InvalidParameter("count", f"must be an integer in [1, 10^18], got {count!r}")
        if sampling not in SAMPLING_SCHEMES:
            raise InvalidParameter("sampling", f"must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
        if sampling_rate is not None:
            if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, (int, float, np.floating)):
                raise InvalidParameter("sampling_rate", f"must be a number in (0, 1], got {sampling_rate!r}")
            if not 0 < sampling_rate <= 1:
                raise InvalidParameter("sampling_rate", f"must be in (0, 1], got {sampling_rate}")
            if sampling_rate == 1:
                sampling_rate = None
        self._groups.append(RoundGroup(local, n, None if sampling_rate is None else float(sampling_rate), sampling, int(count)))
        if self._fixed_d is None:  # the automatic grid may change: rebuild PLDs lazily
            self._d = None
            for g in self._groups:
                g._pld = None

    def __len__(self) -> int:
        return sum(g.count for g in self._groups)

    # ------------------------------------------------------------- per group
    def _inner_n(self, g: RoundGroup) -> tuple[int, float, float]:
        """(reports in the worst batch, worst inclusion probability, extra delta)."""
        if g.sampling_rate is None:
            return min(g.n, EVALUATION_MAX_N), 1.0, 0.0
        if g.sampling == "uniform":
            return min(g.n, EVALUATION_MAX_N), g.sampling_rate, 0.0
        k_lo, gamma, tail = _poisson_batch(g.n, g.sampling_rate)
        return min(k_lo, EVALUATION_MAX_N), gamma, tail

    def _discretization(self) -> float:
        if self._d is None:
            smallest = math.inf
            for g in self._groups:
                n_in, gamma, _ = self._inner_n(g)
                e_in = round_reference_epsilon(g.local, n_in, self._reference_delta)
                smallest = min(smallest, math.log1p(gamma * math.expm1(e_in)))
            self._d = float(min(1e-4, max(1e-5, smallest / 100.0)))
        return self._d

    @property
    def value_discretization_interval(self) -> float:
        self._check_ready()
        return self._discretization()

    def _group_pld(self, g: RoundGroup) -> "PrivacyLossDistribution":
        if g._pld is None:
            n_in, gamma, tail = self._inner_n(g)
            g._pld = _group_pld(g.local, n_in, gamma, tail, self._discretization(), g.count)
        return g._pld

    def _group_rdp(self, g: RoundGroup) -> np.ndarray:
        if g._rdp is None:
            n_in, gamma, tail = self._inner_n(g)
            g._rdp = _group_rdp(g.local, n_in, gamma, tail, self._orders, g.count).copy()
        return g._rdp

    # ------------------------------------------------------------- answers
    def _check_ready(self) -> None:
        if not self._groups:
            raise InvalidParameter("session", "no rounds added")

    def pld(self) -> "PrivacyLossDistribution":
        """The composed privacy loss distribution of the whole session (:class:`PLDRouteUnavailable`
        where a group's would exceed :data:`PLD_MAX_POINTS` points)."""
        self._check_ready()
        total = self._group_pld(self._groups[0])
        for g in self._groups[1:]:
            total = total.compose(self._group_pld(g))
        return total

    def rdp(self) -> tuple[tuple[int, ...], np.ndarray]:
        """(orders, composed RDP) of the whole session."""
        self._check_ready()
        total = 0 + self._group_rdp(self._groups[0])  # a new array: the groups' stay as cached
        for g in self._groups[1:]:
            total = total + self._group_rdp(g)
        return self._orders, total

    def _pld_epsilon(self, delta: float) -> float:
        """The PLD route's epsilon, ``inf`` where the route is not built (module doc)."""
        try:
            return _pld_epsilon_for_delta(self.pld(), delta)
        except PLDRouteUnavailable:
            return math.inf

    def epsilon_breakdown(self, delta: float) -> dict[str, float]:
        """Session epsilon by each composition route (both are upper bounds; ``pld`` is ``inf`` where
        the PLD route is not built: module doc)."""
        return cached("session_epsilon", self._question(delta), lambda: self._epsilon_breakdown(float(delta)))

    def _question(self, delta: float) -> dict:
        """The session's parameters, as the on-disk cache keys them (``delta`` checked)."""
        if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
            raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
        self._check_ready()
        return {
            "groups": [
                {"local": dataclasses.asdict(g.local), "n": g.n, "sampling_rate": g.sampling_rate, "sampling": g.sampling,
                 "count": g.count}
                for g in self._groups
            ],
            "discretization": self._fixed_d,
            "orders": list(self._orders),
            "reference_delta": self._reference_delta,
            "delta": float(delta),
        }

    def _epsilon_breakdown(self, delta: float) -> dict[str, float]:
        eps_pld = self._pld_epsilon(delta)
        orders, rdp = self.rdp()
        eps_rdp = rdp_epsilon(orders, rdp, delta)
        return {"pld": eps_pld, "rdp": float(eps_rdp)}

    def epsilon(self, delta: float) -> float:
        """Central epsilon of the whole session at ``delta`` (an upper bound): the smaller of the two
        routes of :meth:`epsilon_breakdown`, without computing the RDP route where
        :meth:`rdp_floor_epsilon` shows it cannot be the smaller one."""
        return cached("session_epsilon_best", self._question(delta), lambda: self._best_epsilon(float(delta)))

    def _best_epsilon(self, delta: float) -> float:
        eps_pld = self._pld_epsilon(delta)
        if math.isfinite(eps_pld) and self.rdp_floor_epsilon(delta) >= eps_pld * (1.0 + 1e-6):
            return eps_pld
        orders, rdp = self.rdp()
        return min(eps_pld, float(rdp_epsilon(orders, rdp, delta)))

    def rdp_floor_epsilon(self, delta: float) -> float:
        """A lower bound on the RDP route's epsilon (:meth:`epsilon_breakdown`'s ``"rdp"``), cheap to get.

        Each group's RDP curve is the minimum of curves that all bound shuffled binary RR at the same
        ``eps0`` from above, so it is at least :func:`.rdp.binary_rr_rdp_floor` (one dataset's exact
        divergence) at every order; subsampling (Wang et al., Thm 9, and the Poisson-tail mixture),
        the count and dp-accounting's conversion are all non-decreasing in the RDP values, so the
        same steps applied to the floors give an epsilon at most the route's. Where it is already
        above the PLD route's, :meth:`epsilon` skips the clone-pair moments (the costly part of the
        RDP route): the session's epsilon is the PLD route's either way.
        """
        self._question(delta)  # checks
        total = np.zeros(len(self._orders))
        for g in self._groups:
            n_in, gamma, tail = self._inner_n(g)
            if not clone_pairs_apply(g.local.epsilon0):
                return 0.0  # no floor computed there (a trivial lower bound)
            inner = binary_rr_rdp_floor(g.local.epsilon0, n_in, self._orders)
            if gamma < 1.0:
                inner = subsampled_rdp(inner, self._orders, gamma, tail, g.local.epsilon0)
            total = total + g.count * inner
        return float(rdp_epsilon(self._orders, total, delta))

    def delta(self, epsilon: float) -> float:
        """Central delta of the whole session at ``epsilon`` (an upper bound, PLD route; the RDP route's
        conversion where the PLD route is not built)."""
        if not (isinstance(epsilon, (int, float, np.floating)) and epsilon >= 0 and math.isfinite(epsilon)):
            raise InvalidParameter("epsilon", f"must be finite and >= 0, got {epsilon!r}")
        self._check_ready()
        try:
            return float(self.pld().get_delta_for_epsilon(float(epsilon)))
        except PLDRouteUnavailable:
            from dp_accounting.rdp import rdp_privacy_accountant

            orders, rdp = self.rdp()
            return float(min(1.0, rdp_privacy_accountant.compute_delta(list(orders), list(rdp), float(epsilon))[0]))

    def describe(self) -> list[dict]:
        """One row per added round group, with the single-round bound at ``reference_delta``."""
        rows = []
        for g in self._groups:
            if not g._reference:
                rb = shuffled_round(g.local, g.n, self._reference_delta)
                g._reference = {"round_epsilon": rb.epsilon, "round_method": rb.method}
            rows.append(
                {
                    "mechanism": g.local.mechanism,
                    "epsilon0": g.local.epsilon0,
                    "delta0": g.local.delta0,
                    "num_bins": g.local.num_bins,
                    "k": g.local.k,
                    "num_blocks": g.local.num_blocks,
                    "n": g.n,
                    "count": g.count,
                    "sampling_rate": g.sampling_rate,
                    "sampling": g.sampling if g.sampling_rate is not None else None,
                    "reference_delta": self._reference_delta,
                    **g._reference,
                }
            )
        return rows


@functools.lru_cache(maxsize=32)
def _round_curve(local: LocalGuarantee, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """One round's ``delta(eps)`` points (grid to where the best curve drops below 1e-15, plus the
    point where it is 0), once per process: sessions sharing a round reuse it."""
    if local.epsilon0 < NUMERICAL_MIN_EPSILON0:  # the local curve: binary RR's at eps0 (module doc)
        e0 = float(local.epsilon0)
        grid = np.linspace(0.0, e0, CURVE_POINTS)
        deltas = local_delta_curve(grid, e0)
        grid.setflags(write=False)
        deltas.setflags(write=False)
        return grid, deltas
    e_top = round_curve_support(local, n_in)
    e_max = float(max((p.epsilon_max for p in round_pairs(local, n_in).values()), default=local.epsilon0))
    grid = np.unique(np.concatenate([np.linspace(0.0, e_top, CURVE_POINTS), [e_max]]))
    deltas = round_delta_curve(local, n_in, grid)
    deltas[grid >= e_max] = 0.0
    grid.setflags(write=False)
    deltas.setflags(write=False)
    return grid, deltas


@functools.lru_cache(maxsize=8)
def _group_pld(local: LocalGuarantee, n_in: int, gamma: float, tail: float, d: float,
               count: int) -> "PrivacyLossDistribution":
    """PLD of ``count`` identical rounds (one round's PLD composed ``count`` times, as dp-accounting's
    ``self_compose`` does it), once per process for the exact parameters and discretisation."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    grid, deltas = _round_curve(local, n_in)
    eps_p, del_p = subsampled_curve(grid, deltas, gamma, tail)
    pld = _pld_from_curve(eps_p, del_p, d)
    if count == 1:
        return pld
    pmf = pld._pmf_remove
    sparse = not isinstance(pmf, pld_pmf.DensePLDPmf)
    dense = _dense_pmf(pmf) if sparse else pmf
    lower, upper = _self_convolve_bounds(dense, count)  # the length of the composed pmf, before it is built
    if upper - lower + 1 > PLD_MAX_POINTS:
        raise PLDRouteUnavailable(count, upper - lower + 1)
    if sparse and count <= 64 and pmf.size**count <= pld_pmf._MAX_PMF_SPARSE_SIZE:
        # dp-accounting composes such a pmf one round at a time (it stays small): its own path
        return pld.self_compose(count)
    # Otherwise dp-accounting composes the dense pmf by one FFT power. A sparse pmf is made dense here
    # from 64 rounds on as well: dp-accounting would compose a one-point pmf (a round whose losses all
    # round to one grid cell) one round at a time, a loop of ``count`` compositions.
    return PrivacyLossDistribution(_dense_self_compose(dense, count, lower, upper))


#: Tail mass dp-accounting's ``self_compose`` truncates by default (and :func:`_self_convolve_bounds` uses).
SELF_COMPOSE_TAIL = 1e-15


def _dense_pmf(pmf) -> "pld_pmf.DensePLDPmf":
    """``pmf.to_dense_pmf()`` of a sparse dp-accounting pmf: the same array (zeros between its losses),
    built by one scatter instead of a Python loop over every loss of the range."""
    from dp_accounting.pld import pld_pmf

    losses = np.fromiter(pmf._loss_probs.keys(), dtype=np.int64, count=len(pmf._loss_probs))
    values = np.fromiter(pmf._loss_probs.values(), dtype=np.float64, count=len(pmf._loss_probs))
    lower = int(losses.min())
    probs = np.zeros(int(losses.max()) - lower + 1)
    probs[losses - lower] = values
    return pld_pmf.DensePLDPmf(pmf._discretization, lower, probs, pmf._infinity_mass, pmf._pessimistic_estimate)


def _self_convolve_bounds(dense, count: int) -> tuple[int, int]:
    """The truncation window (offsets into the ``count``-fold self-convolution) of dp-accounting's
    ``self_compose`` at its default tail mass: ``common.compute_self_convolve_bounds``, the same
    numbers, computed once (``self_compose`` would compute them again) and over the pmf's support.

    Its Chernoff bounds take ``log E[e^(order X)]`` by ``scipy.special.logsumexp`` over the whole
    dense pmf (a million entries for a round at ``eps0 = 50``), 40 orders. Zero entries add exact
    zeros there (``logsumexp`` sets their exponent to ``-inf``), so :func:`_logsumexp_of_support`
    evaluates the exponentials at the nonzero entries only and sums them in a zero array of the
    pmf's length: the same operations on the same values, in the same order."""
    probs = np.asarray(dense._probs)
    length = len(probs)
    upper_bound, lower_bound = (length - 1) * int(count), 0
    support = np.flatnonzero(probs)
    weights = probs[support]
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / length
    log_two_over_tail = math.log(2 / SELF_COMPOSE_TAIL)
    for order in orders:
        log_mgf = _logsumexp_of_support(support * order, weights, support, length)
        bound = (int(count) * log_mgf + log_two_over_tail) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper_bound = min(upper_bound, math.ceil(bound))
        if order < 0:
            lower_bound = max(lower_bound, math.floor(bound))
    return int(lower_bound), int(upper_bound)


def _logsumexp_of_support(a: np.ndarray, b: np.ndarray, support: np.ndarray, length: int) -> np.float64:
    """``scipy.special.logsumexp(a_full, b=b_full)`` (scipy 1.17, real non-negative weights) for the
    length-``length`` arrays that hold ``a``, ``b`` at ``support`` and zero weights elsewhere: its
    steps (the largest term taken out of the sum and added back as ``log(m)``), with each full-length
    array it sums rebuilt as zeros plus the support's entries."""
    def full(values: np.ndarray) -> np.ndarray:
        out = np.zeros(length)
        out[support] = values
        return out

    a_max = np.max(a, keepdims=True)
    is_max = a == a_max
    m = np.sum(full(b * is_max.astype(np.float64)), keepdims=True, dtype=np.float64)
    shifted = np.where(is_max, -np.inf, a)
    s = np.sum(full(b * np.exp(shifted - a_max)), keepdims=True, dtype=np.float64)
    s = np.where(s == 0, s, s / m)
    sgn = np.sign(s + 1) * np.sign(m)
    s = np.where(s < -1, -s - 2, s)
    out = np.log1p(s) + np.log(np.abs(m)) + a_max
    out[sgn < 0] = np.nan
    return out[0]


def _dense_self_compose(dense, count: int, lower: int, upper: int) -> "pld_pmf.DensePLDPmf":
    """``dense.self_compose(count)`` (dp-accounting's ``DensePLDPmf.self_compose`` and
    ``common.self_convolve``, step for step) on the truncation window ``[lower, upper]`` of
    :func:`_self_convolve_bounds`: the same pmf, without computing the window twice."""
    from dp_accounting.pld import pld_pmf
    from scipy import fft

    probs = dense._probs
    output_len = upper - lower + 1
    fast_len = fft.next_fast_len(max(output_len, len(probs)))
    powered = np.real(fft.ifft(fft.fft(probs, fast_len) ** count))
    out = np.array(np.roll(powered, -lower)[:output_len])
    inf_prob = SELF_COMPOSE_TAIL - math.expm1(count * math.log1p(-dense._infinity_mass))
    return pld_pmf.DensePLDPmf(dense._discretization, dense._lower_loss * count + lower, out, inf_prob,
                               dense._pessimistic_estimate)


@functools.lru_cache(maxsize=32)
def _group_rdp(local: LocalGuarantee, n_in: int, gamma: float, tail: float, orders: tuple,
               count: int) -> np.ndarray:
    """RDP of ``count`` identical rounds (minimum of Girgis et al. and the clone pairs' RDP, then
    subsampling), once per process."""
    e0 = local.epsilon0
    inner = girgis_rdp(e0, n_in, orders)
    for name, pair in round_pairs(local, n_in).items():
        if isinstance(pair, ClonePair) and pair.a2 == 0.0 and pair.scale == 1.0:
            inner = np.minimum(inner, clone_pair_rdp(pair, orders))
    if gamma < 1.0:
        inner = subsampled_rdp(inner, orders, gamma, tail, e0)
    out = count * inner
    out.setflags(write=False)
    return out


def subsampled_curve(grid: np.ndarray, deltas: np.ndarray, gamma: float, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """``(eps', delta')`` of a mechanism with curve ``delta(eps)`` on ``grid`` run on a subsample that
    holds a given user with probability at most ``gamma``: advanced joint convexity (Balle, Barthe &
    Gaboardi, NeurIPS 2018, Thm. 2), ``eps' = log(1 + gamma (e^eps - 1))``, ``delta' = gamma delta``,
    plus ``tail``, the Poisson batch-size mass outside the window (``_poisson_window``)."""
    eps_p = np.log1p(gamma * np.expm1(grid))
    del_p = np.minimum(1.0, gamma * np.asarray(deltas) + tail)
    return eps_p, del_p


def subsampled_rdp(inner: np.ndarray, orders, gamma: float, tail: float, eps_inf: float) -> np.ndarray:
    """RDP of a pure ``eps_inf``-DP mechanism with RDP ``inner`` on a subsample that holds a user with
    probability at most ``gamma`` (Wang, Balle & Kasiviswanathan, AISTATS 2019, Thm. 9), mixed with the
    pure-DP bound on the Poisson ``tail`` outside the batch window (where it is still ``eps_inf``-DP),
    and never above the pure-DP bound itself."""
    worst = pure_dp_rdp(eps_inf, orders)
    sub = wor_subsampled_rdp(inner, orders, gamma, eps_inf=eps_inf)
    if tail > 0:
        o = np.asarray(orders, dtype=np.float64)
        sub = np.logaddexp(math.log1p(-tail) + (o - 1) * sub, math.log(tail) + (o - 1) * worst) / (o - 1)
    return np.minimum(sub, worst)


def _pld_epsilon_for_delta(pld: "PrivacyLossDistribution", delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)``, the same number: for a symmetric dense pmf (a composed
    session's) by :func:`_dense_epsilon_for_delta`, otherwise by dp-accounting itself."""
    from dp_accounting.pld import pld_pmf

    pmf = pld._pmf_remove
    if pld._symmetric and isinstance(pmf, pld_pmf.DensePLDPmf) and len(pmf._probs) > 0:
        return float(_dense_epsilon_for_delta(pmf, float(delta)))
    return float(pld.get_epsilon_for_delta(delta))


#: Losses :func:`_dense_epsilon_for_delta` handles per step (from the largest down).
_EPSILON_CHUNK = 1 << 16


def _dense_epsilon_for_delta(pmf, delta: float) -> float:
    """dp-accounting's ``DensePLDPmf.get_epsilon_for_delta`` (``pld_pmf._get_epsilon_for_delta``,
    dp-accounting 0.6) with its loop over losses, from the largest down, done a chunk at a time.

    The loop keeps two running sums, the mass at losses ``>= l`` and the same mass weighted by
    ``e^-l``, and stops at the first loss ``l`` where ``log((mass - delta) / weighted) >= l``. The
    same floating-point operations in the same order: the losses by repeated subtraction of the
    discretisation (``itertools.count``) and both sums by sequential addition (``np.cumsum``), the
    weights by ``math.exp``; the stopping test is located with ``np.log`` and decided with
    ``math.log`` (the two may differ in the last bit)."""
    if pmf._infinity_mass > delta:
        return math.inf
    d = pmf._discretization
    probs = np.flip(np.asarray(pmf._probs, dtype=np.float64))
    mass_upper, mass_lower = pmf._infinity_mass, 0.0  # the running sums before each loss
    loss = (pmf._lower_loss + len(probs) - 1) * d  # the largest loss, then one step below the last
    for first in range(0, len(probs), _EPSILON_CHUNK):
        chunk = probs[first:first + _EPSILON_CHUNK]
        steps = np.full(len(chunk), -d)  # the first loss is the largest, each next one a step below
        losses = np.cumsum(np.concatenate([[loss], steps[1:]])) if first == 0 else \
            np.cumsum(np.concatenate([[loss], steps]))[1:]
        overflow = np.flatnonzero(losses < -700.0)  # math.exp(-loss) would overflow (dp-accounting raises there)
        if len(overflow):
            chunk, losses = chunk[:overflow[0]], losses[:overflow[0]]
        weights = np.fromiter(map(math.exp, (-losses).tolist()), dtype=np.float64, count=len(chunk)) * chunk
        uppers = np.cumsum(np.concatenate([[mass_upper], chunk]))  # uppers[i]: before loss i
        lowers = np.cumsum(np.concatenate([[mass_lower], weights]))
        stop = _first_stop(uppers[:-1], lowers[:-1], losses, delta)
        ret = _first_return(uppers[1:], lowers[1:], delta)
        if ret is not None and (stop is None or ret < stop):
            return max(0, float(losses[ret]))
        if stop is not None:
            mass_upper, mass_lower = uppers[stop], lowers[stop]
            break
        if len(overflow):
            return float(pmf.get_epsilon_for_delta(delta))  # dp-accounting's own loop, as it goes there
        mass_upper, mass_lower, loss = uppers[-1], lowers[-1], float(losses[-1])
    if mass_upper <= mass_lower + delta:
        return 0.0
    return math.log((mass_upper - delta) / mass_lower)


def _first_stop(uppers: np.ndarray, lowers: np.ndarray, losses: np.ndarray, delta: float) -> int | None:
    """First ``i`` with ``uppers[i] > delta``, ``lowers[i] > 0`` and ``math.log((uppers[i] - delta) /
    lowers[i]) >= losses[i]`` (dp-accounting's stopping test), or None."""
    ok = (uppers > delta) & (lowers > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        logs = np.log(np.where(ok, (uppers - delta) / np.where(ok, lowers, 1.0), 1.0))
    # np.log is within a few ulps of math.log: candidates with a margin, each decided by math.log
    margin = 8.0 * np.spacing(np.maximum(np.abs(logs), np.abs(losses))) + 1e-300
    for i in np.flatnonzero(ok & (logs + margin >= losses)).tolist():
        if math.log((uppers[i] - delta) / lowers[i]) >= losses[i]:
            return i
    return None


def _first_return(uppers: np.ndarray, lowers: np.ndarray, delta: float) -> int | None:
    """First ``i`` with ``uppers[i] >= delta`` and ``lowers[i] == 0`` (dp-accounting returns that loss:
    its ``e^-loss`` underflowed), or None."""
    hits = np.flatnonzero((uppers >= delta) & (lowers == 0))
    return int(hits[0]) if len(hits) else None


def _pld_from_curve(eps: np.ndarray, deltas: np.ndarray, d: float) -> "PrivacyLossDistribution":
    """Pessimistic symmetric PLD dominating a curve given at ``eps >= 0`` (see module doc)."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    eps = np.asarray(eps, dtype=np.float64)
    deltas = np.clip(np.asarray(deltas, dtype=np.float64), 0.0, 1.0)
    pos = eps > 0
    neg_eps = -eps[pos]
    neg_del = 1.0 - np.exp(-eps[pos]) + np.exp(-eps[pos]) * deltas[pos]
    all_eps = np.concatenate([neg_eps, eps])
    all_del = np.concatenate([neg_del, deltas])
    # round epsilons up to the grid (delta is non-increasing, so this stays an upper bound)
    k = np.ceil(all_eps / d - 1e-9).astype(np.int64)
    order = np.argsort(k, kind="stable")
    k, all_del = k[order], all_del[order]
    uniq, start = np.unique(k, return_index=True)
    mins = np.minimum.reduceat(all_del, start)
    # an upper bound at e is one at every e' > e (delta is non-increasing): running minimum
    mins = np.minimum.accumulate(mins)
    hull_k, hull_d = _lower_convex_hull(uniq, mins, d)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(d, hull_k, hull_d)
    return PrivacyLossDistribution(pmf)


def _lower_convex_hull(k: np.ndarray, deltas: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of the points ``(e^{k d}, delta)`` (monotone chain)."""
    x = np.exp(k * d)
    hk: list[int] = []
    hx: list[float] = []
    hd: list[float] = []
    for ki, xi, di in zip(k.tolist(), x.tolist(), deltas.tolist()):
        while len(hx) >= 2:
            x1, d1, x2, d2 = hx[-2], hd[-2], hx[-1], hd[-1]
            # drop the middle point if it lies on or above the segment (x1,d1)-(xi,di)
            if (d2 - d1) * (xi - x1) >= (di - d1) * (x2 - x1):
                hk.pop()
                hx.pop()
                hd.pop()
            else:
                break
        hk.append(ki)
        hx.append(xi)
        hd.append(di)
    return np.array(hk, dtype=np.int64), np.array(hd)
