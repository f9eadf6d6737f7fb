"""Empirical lower bounds on the central epsilon of a shuffled round.

The auditor's question: does the shuffled pipeline leak more than the accountant
claims? A lower bound comes from a distinguishing test between two neighbouring
datasets (one user's whole contribution changed), run many times:

* ``D0``: ``n`` users all hold input ``x``; ``D1``: the same, but one user holds ``x'``.
* The analyzer's view of a shuffled round is the multiset of reports; any function of
  it is post-processing, so a test on the *count* ``C`` of reports in a set ``A``
  gives a valid lower bound. Under ``D0``, ``C ~ Bin(n, a)``; under ``D1``,
  ``C ~ Bin(n - 1, a) + Bern(b)``, where ``a`` and ``b`` are the probabilities that the
  randomizer puts a report of ``x`` (resp. ``x'``) in ``A``. For binary randomized
  response ``C`` is the sufficient statistic of the shuffled output.
* The histogram of ``C`` over ``R`` rounds is sampled directly from its law,
  ``Multinomial(R, law of C)`` (:func:`count_histograms`: ``O(n)`` binomial draws whatever
  ``R``), with ``a`` and ``b`` taken from the shipped randomizer's own parameter
  (:func:`shuffledp.client.range_randomizer.keep_probability`), so a randomizer that
  keeps too often is audited as it runs. ``tests/audit/test_audit_shuffled.py`` checks the
  real randomizer's report frequencies against ``a`` and ``b``, and the engines are
  shown equal in distribution by ``tests/simulation/test_engine.py``.
* The event is a tail ``{C >= k}`` (favours ``D1``) or ``{C <= k}`` (favours ``D0``),
  chosen on one sample of rounds and evaluated on a fresh one, so the choice costs
  no confidence. With ``p`` and ``q`` the event's probabilities under the two datasets,
  ``(eps, delta)``-DP requires ``p <= e^eps q + delta``, so ``eps >= ln((p_low - delta) /
  q_high)`` with Clopper-Pearson bounds (:func:`shuffledp.audit.local.epsilon_lower_bound`,
  one estimator for both audits).

The bound is compared with the accountant's claim (an upper bound) and, for binary
randomized response at ``n <= RR_EXACT_MAX_N``, with the exact shuffled epsilon.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.audit.local import _check_confidence, _check_count, _check_delta, _lower_bound, epsilon_lower_bound
from shuffledp.protocol.errors import InvalidParameter

Progress = Callable[[str, int], None]
AUDITED_MECHANISMS = ("binary-rr", "hadamard-range")


def event_probabilities(mechanism: str, epsilon0: float, num_bins: int = 2) -> tuple[float, float, str]:
    """``(a, b, A)``: the probabilities that a report of ``x`` and of ``x'`` land in the event set ``A``.

    * ``binary-rr``: k-RR with ``k = 2`` (:func:`shuffledp.client.krr.randomize_krr`),
      ``A = {report = 1}``, ``x = 0``, ``x' = 1``: ``a = 1 - p``, ``b = p`` with ``p`` its keep
      probability (:func:`~shuffledp.client.krr.krr_keep_probability`).
    * ``hadamard-range`` (Algorithm 4 with ``K`` bins): ``x`` in bin 0, ``x'`` in bin 1,
      ``A`` = rows where the two bins' Hadamard signs differ, with bit = bin 1's sign:
      half the rows, so ``a = (1 - p) / 2``, ``b = p / 2`` with ``p`` the range
      randomizer's keep probability (:func:`~shuffledp.client.range_randomizer.keep_probability`).

    Both are looked up in the shipped modules at call time, so a planted fault there is audited.
    """
    from shuffledp.client import krr, range_randomizer

    if mechanism == "binary-rr":
        p = krr.krr_keep_probability(2, epsilon0)
        return 1.0 - p, p, "report = 1 (x = 0, x' = 1)"
    p = range_randomizer.keep_probability(epsilon0)
    if mechanism == "hadamard-range":
        if num_bins < 2 or num_bins & (num_bins - 1):
            raise InvalidParameter("num_bins", f"must be a power of two >= 2, got {num_bins}")
        return (1.0 - p) / 2.0, p / 2.0, "row where H[row,0] != H[row,1] and bit = H[row,1] (x in bin 0, x' in bin 1)"
    raise InvalidParameter("mechanism", f"must be one of {AUDITED_MECHANISMS}, got {mechanism!r}")


def multinomial_histogram(pmf: np.ndarray, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """The histogram of ``rounds`` i.i.d. draws from the law ``pmf`` on ``0..len(pmf)-1``.

    The histogram is ``Multinomial(rounds, pmf)``; it is drawn by binary splitting: the
    values are paired up level by level into a tree, and each node's count is split
    between its two halves by one binomial draw with probability (mass of the left half) /
    (mass of the node). The draws are exact given the masses, and every mass is a sum of
    non-negative terms (no cancellation), so a far tail keeps its full relative precision.
    ``O(len(pmf))`` binomial draws in ``O(log len(pmf))`` vectorized calls, whatever ``rounds``.
    """
    pmf = np.asarray(pmf, dtype=np.float64)
    leaves = 1 << max(0, int(pmf.size - 1).bit_length())
    levels = [np.concatenate([pmf, np.zeros(leaves - pmf.size)])]
    while levels[-1].size > 1:
        levels.append(levels[-1].reshape(-1, 2).sum(axis=1))
    counts = np.array([rounds], dtype=np.int64)
    for masses in reversed(levels[:-1]):
        pairs = masses.reshape(-1, 2)
        node = pairs.sum(axis=1)
        left_share = np.divide(pairs[:, 0], node, out=np.zeros_like(node), where=node > 0)
        left = rng.binomial(counts, np.minimum(left_share, 1.0))
        counts = np.stack([left, counts - left], axis=1).ravel()
    return counts[: pmf.size]


def count_laws(n: int, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """The laws on ``0..n`` of the count ``C`` under ``D0`` (``Bin(n, a)``) and ``D1`` (``Bin(n - 1, a) + Bern(b)``)."""
    from scipy.stats import binom

    law0 = binom.pmf(np.arange(n + 1), n, a)
    rest = binom.pmf(np.arange(n), n - 1, a)
    law1 = np.concatenate([(1.0 - b) * rest, [0.0]]) + np.concatenate([[0.0], b * rest])
    return law0, law1


def count_histograms(n: int, a: float, b: float, rounds: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Histograms (over ``0..n``) of the count ``C`` in ``rounds`` shuffled rounds of ``D0`` and of ``D1``:
    each the multinomial histogram of its law (:func:`count_laws`, :func:`multinomial_histogram`)."""
    law0, law1 = count_laws(n, a, b)
    return multinomial_histogram(law0, rounds, rng), multinomial_histogram(law1, rounds, rng)


def _tail_counts(h0: np.ndarray, h1: np.ndarray):
    """For each k: (D1 count of C >= k, D0 count of C >= k), and (D0 count of C <= k, D1 count of C <= k)."""
    upper = (np.cumsum(h1[::-1])[::-1], np.cumsum(h0[::-1])[::-1])
    lower = (np.cumsum(h0), np.cumsum(h1))
    return upper, lower


def _bound(hit: int, other: int, rounds: int, delta: float, confidence: float) -> float:
    return epsilon_lower_bound(int(hit), rounds, int(other), rounds, delta, confidence)


def best_event(h0: np.ndarray, h1: np.ndarray, rounds: int, delta: float, confidence: float) -> tuple[str, int, float]:
    """The tail event with the largest bound on these histograms: ``(">=" or "<=", k, bound)``."""
    (up_hit, up_other), (low_hit, low_other) = _tail_counts(h0, h1)
    # Every tail event's bound in one vectorized call: the same numbers as one ``_bound`` per
    # event (``_lower_bound`` is elementwise), in the scan order k = 0, 1, ... with ">=" before
    # "<=" at each k; the first strict maximum wins, and no positive bound leaves (">=", 0, 0.0).
    rounds = _check_count("n1", rounds, 1)
    delta, confidence = _check_delta(delta), _check_confidence(confidence)
    hits = np.stack([up_hit, low_hit], axis=1).ravel()
    others = np.stack([up_other, low_other], axis=1).ravel()
    for name, counts in (("k1", hits), ("k2", others)):
        if counts.size and (counts.min() < 0 or counts.max() > rounds):
            raise InvalidParameter(name, f"must be in [0, {rounds}], got {int(counts.min())}..{int(counts.max())}")
    values = np.where(hits > 0, _lower_bound(hits, rounds, others, rounds, delta, confidence), 0.0)
    if not values.size:
        return (">=", 0, 0.0)
    i = int(np.argmax(values))
    if not values[i] > 0.0:
        return (">=", 0, 0.0)
    return ((">=", "<=")[i % 2], i // 2, float(values[i]))


def event_counts(h0: np.ndarray, h1: np.ndarray, kind: str, k: int) -> tuple[int, int]:
    """``(hits, other)``: the rounds in the event under the dataset it favours and under the other one."""
    if kind == ">=":
        return int(h1[k:].sum()), int(h0[k:].sum())
    return int(h0[: k + 1].sum()), int(h1[: k + 1].sum())


def evaluate_event(h0: np.ndarray, h1: np.ndarray, rounds: int, kind: str, k: int, delta: float, confidence: float) -> float:
    """The bound of one fixed event on fresh histograms."""
    return _bound(*event_counts(h0, h1, kind, k), rounds, delta, confidence)


@dataclass
class ShuffledAudit:
    """One shuffled audit: the claim, the empirical lower bound, and how they compare."""

    mechanism: str
    n: int
    epsilon0: float
    delta: float
    rounds: int
    claimed_epsilon: float
    claimed_method: str
    exact_epsilon: float | None
    lower_bound: float
    event: str
    confidence: float
    seconds: float
    #: Evaluation rounds in the event under the dataset it favours, and under the other (None: not recorded).
    count_hit: int | None = None
    count_other: int | None = None

    @property
    def passed(self) -> bool:
        """No violation: the empirical lower bound does not exceed the claimed upper bound."""
        return self.lower_bound <= self.claimed_epsilon

    def as_dict(self) -> dict[str, Any]:
        """Every field, ``passed``, the ratios, and the power fields of
        :func:`shuffledp.audit.power.power_fields` (``no_power``: the lower bound is 0;
        ``runs_needed``, ``runs_needed_observed``: rounds per sample for a positive bound)."""
        from shuffledp.audit.power import power_fields

        out = asdict(self)
        out["passed"] = self.passed
        out.update(power_fields(self.lower_bound, self.count_hit, self.count_other, self.rounds, self.claimed_epsilon,
                                self.delta, self.confidence))
        out["lower_over_claim"] = self.lower_bound / self.claimed_epsilon if self.claimed_epsilon > 0 else None
        out["exact_over_lower"] = (
            self.exact_epsilon / self.lower_bound if self.exact_epsilon is not None and self.lower_bound > 0 else None
        )
        return out


def claimed_central(mechanism: str, epsilon0: float, n: int, delta: float, num_bins: int = 2) -> tuple[float, str, float | None]:
    """The accountant's claim for one shuffled round, and the exact value where one is computed."""
    from shuffledp.protocol.accounting import (
        RR_EXACT_MAX_N,
        binary_rr_guarantee,
        hadamard_response_guarantee,
        rr_exact_epsilon,
        shuffled_round,
    )

    local = binary_rr_guarantee(epsilon0) if mechanism == "binary-rr" else hadamard_response_guarantee(epsilon0, num_bins)
    bound = shuffled_round(local, n, delta)
    exact = rr_exact_epsilon(delta, n, epsilon0) if mechanism == "binary-rr" and n <= RR_EXACT_MAX_N else None
    return bound.epsilon, bound.method, exact


def audit_shuffled(
    mechanism: str,
    n: int,
    epsilon0: float,
    delta: float = 1e-6,
    *,
    rounds: int = 10**7,
    confidence: float = 0.95,
    num_bins: int = 2,
    seed: int = 0,
    claim: tuple[float, str, float | None] | None = None,
) -> ShuffledAudit:
    """Lower-bound the central epsilon of one shuffled round of ``mechanism`` (module docstring).

    ``rounds`` shuffled rounds of each dataset are sampled twice (selection, then
    evaluation). ``claim`` overrides the accountant (tests plant a wrong claim).
    """
    if not (isinstance(n, int) and n >= 2):
        raise InvalidParameter("n", f"must be an integer >= 2, got {n!r}")
    if not (isinstance(rounds, int) and rounds >= 100):
        raise InvalidParameter("rounds", f"must be an integer >= 100, got {rounds!r}")
    if not 0.5 < confidence < 1.0:
        raise InvalidParameter("confidence", f"must be in (0.5, 1), got {confidence!r}")
    if not 0.0 <= delta < 1.0:
        raise InvalidParameter("delta", f"must be in [0, 1), got {delta!r}")
    started = time.perf_counter()
    a, b, what = event_probabilities(mechanism, epsilon0, num_bins)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA0D1, n]))
    kind, k, _ = best_event(*count_histograms(n, a, b, rounds, rng), rounds, delta, confidence)
    hits, other = event_counts(*count_histograms(n, a, b, rounds, rng), kind, k)
    bound = _bound(hits, other, rounds, delta, confidence)
    claimed, method, exact = claim if claim is not None else claimed_central(mechanism, epsilon0, n, delta, num_bins)
    return ShuffledAudit(
        mechanism=mechanism,
        n=n,
        epsilon0=epsilon0,
        delta=delta,
        rounds=rounds,
        claimed_epsilon=claimed,
        claimed_method=method,
        exact_epsilon=exact,
        lower_bound=bound,
        event=f"count of [{what}] {kind} {k}",
        confidence=confidence,
        seconds=time.perf_counter() - started,
        count_hit=hits,
        count_other=other,
    )
