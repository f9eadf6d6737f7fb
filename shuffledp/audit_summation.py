"""Empirical lower bound on the central epsilon of scalar multi-message summation.

Mechanism audited (Balle, Bell, Gascón & Nissim, "Private Summation in the
Multi-Message Shuffle Model", CCS 2020, arXiv:2002.00817, Sec. 4): every user clips
its value to ``[lower, upper]``, encodes it in ``{0, ..., p}`` by randomized rounding,
adds a Pólya noise share (the ``n`` shares sum to ``DLap(alpha)``,
``alpha = exp(-eps / p)``) and sends ``M`` additive shares mod ``q``
(:func:`shuffledp.client.summation.randomize_modular_sum`). The analyzer sums all
``n M`` shares mod ``q``, centres the result in ``(-q/2, q/2]`` and reads it as the sum
of the encodings plus the noise (:func:`shuffledp.analyzer.summation.decode_scalar_sum`).

Claim audited: the round's central ``(eps, delta)`` as the project states it
(:func:`shuffledp.protocol.summation_params.choose_scalar_sum`, checked by
:func:`~shuffledp.protocol.summation_params.check_scalar_sum`, which a client runs
before it answers): the noise is pure ``eps``-DP on the sum and all of ``delta``
pays for the split and mix.

The test
--------
* Neighbouring datasets: ``D0``, ``n`` users all at ``lower``; ``D1``, the same but one
  user at ``upper`` (one user's whole contribution changes). At the endpoints the
  randomized rounding is exact (``encode(lower) = 0``, ``encode(upper) = p``), so the
  encoded sums are ``0`` and ``p``.
* Statistic: the decoded total ``T`` (integer, encoded units) of one round, computed
  the analyzer's way from the shares the real client code produced. ``T`` is a
  function of the analyzer's view (the shuffled multiset of shares), so it is
  post-processing: if the view is ``(eps, delta)``-DP, then every event ``E`` on ``T``
  has ``P0[E] <= e^eps P1[E] + delta`` and ``P1[E] <= e^eps P0[E] + delta``. A tail test
  on ``T`` therefore lower-bounds the central epsilon of the whole shuffled view, and
  the bound stays valid whatever the code does wrong (wrap-around, a broken sampler).
* Events: tails ``{T >= k}`` (favour ``D1``) and ``{T <= k}`` (favour ``D0``), one chosen
  on a selection sample (:func:`shuffledp.audit_shuffled.best_event`) and evaluated on a
  fresh one (:func:`~shuffledp.audit_shuffled.evaluate_event`) with Clopper-Pearson
  bounds (:func:`shuffledp.audit_local.epsilon_lower_bound`): ``eps >= ln((p_lo - delta)
  / q_hi)`` with the stated confidence. The event is fixed before the evaluation
  sample exists, so any rule of choice keeps the bound valid.
* The selection ranks events by their bound at :data:`SELECTION_CONFIDENCE`
  (``1 - 1e-6``), not at the evaluation's 95 %. Every tail beyond ``p`` has the same
  ratio ``e^eps`` (below), with less and less mass; ranked at 95 % the maximum over
  hundreds of thresholds is won by a far tail whose few counts were lucky (a winner's
  curse), and that event then evaluates poorly on the fresh sample. Measured with
  exact DLap draws at ``eps = 1, p = 36``, ``10^4`` rounds, 1000 repetitions: ranked at
  95 % the bound has mean 0.87, standard deviation 0.18 and is 0 in over 1 % of runs;
  ranked at ``1 - 1e-6`` it has mean 0.94 (the expected bound at the best event is
  0.94), standard deviation 0.022, minimum 0.85. Stricter ranking changes nothing more.

What a correct round gives (the figure the audit can reach)
------------------------------------------------------------
Absent wrap-around (probability below ``1e-9`` with the chooser's ``q``),
``T = N`` under ``D0`` and ``T = p + N`` under ``D1`` with ``N ~ DLap(alpha)``,
``P(N = j) = (1 - alpha)/(1 + alpha) alpha^|j|``. Summing the geometric series, for
``m >= 0``

    ``P(N >= m) = alpha^m / (1 + alpha)``.

Hence for every threshold ``k >= p``

    ``P1(T >= k) / P0(T >= k) = P(N >= k - p) / P(N >= k) = alpha^-p = e^eps_noise``,

``eps_noise = -p ln(alpha)`` (``= eps``), exactly, and by symmetry the same for
``P0(T <= k) / P1(T <= k)`` at every ``k <= 0``. The privacy loss ``ln P0(t)/P1(t)`` of
``T`` is ``eps_noise`` for ``t <= 0``, ``-eps_noise`` for ``t >= p`` and linear between, so
the tails are the optimal events and ``T`` is ``(eps_noise + ln(1 - delta (1 + alpha)),
delta)``-DP and no better: about ``eps - 2 delta``. The claim is ``eps`` itself (the
noise is pure), so a correct round's true epsilon and its claim coincide up to
``O(delta)``; ``lower / claim`` measures only the audit's statistical power. The
event ``{T >= p}`` has mass ``1/(1 + alpha) ~ 1/2`` under ``D1`` and
``e^-eps / (1 + alpha)`` under ``D0``, so ``R`` rounds resolve the ratio to about
``sqrt(2 e^eps / R)`` in the log; the expected bound at the best event is ``0.94 eps`` at
``R = 10^4`` and ``0.96 eps`` at ``2 10^4`` (``eps = 1`` or ``4``, 95 %, ``delta = 1e-6``;
:func:`shuffledp.audit_local.expected_epsilon_lower_bound`).

Because the claim is tight, a correct round can exceed it whenever a Clopper-Pearson
end fails: with probability at most ``1 - confidence`` per row (measured with exact DLap
draws at 95 %: 0.3 % at ``eps = 1``, 0.3-1 % at ``eps = 4``, a few hundred runs each). So
:func:`summation_rows` uses a family-wise confidence over its rows (Bonferroni, as
:func:`shuffledp.audit_local.audit_local` does).

Paths: the real client code runs on :class:`~shuffledp.protocol.randomness.SeededSource`
(numpy's negative binomial), vectorized over users and rounds in chunks. The device
path (:class:`~shuffledp.protocol.randomness.SystemSource`) draws every NB in Python
and is far too slow for ``10^4`` rounds of ``10^3`` users; its NB law is checked in
``tests/test_distributed_noise.py``. Functions are looked up at call time through
their modules, so a planted fault (:mod:`shuffledp.audit_faults`, ``nbinom-reversed``)
is audited as it runs.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from shuffledp.audit_shuffled import ShuffledAudit, best_event, evaluate_event
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.messages import MAX_EPSILON, MIN_EPSILON, ModularSumParams
from shuffledp.protocol.modular_sum import centered, modular_sum
from shuffledp.protocol.randomness import SeededSource
from shuffledp.protocol.summation_params import SummationChoice

__all__ = [
    "CHUNK_SHARES",
    "SELECTION_CONFIDENCE",
    "SUMMATION_ROUNDS",
    "SUMMATION_SETTINGS",
    "audit_summation",
    "decoded_totals",
    "noise_epsilon",
    "round_shares",
    "sample_totals",
    "summation_claim",
    "summation_rounds",
    "summation_rows",
]

Progress = Callable[[str, int], None]
#: Confidence at which the selection sample ranks events (module docstring); evaluation uses the caller's.
SELECTION_CONFIDENCE = 1.0 - 1e-6
#: Shares per chunk when simulating rounds (bounds memory: ~16 MB per int64 array).
CHUNK_SHARES = 2**21
#: ``(n, epsilon)`` of the rows :func:`summation_rows` audits.
SUMMATION_SETTINGS: tuple[tuple[int, float], ...] = ((100, 1.0), (100, 4.0), (1000, 1.0), (1000, 4.0))
#: ``(cap, user_rounds)`` of :func:`summation_rounds`, default and ``quick``: measured on 2 cores, the four
#: default rows take about 45 s and the quick ones about 6 s (a round of ``n = 1000`` users costs ~0.4 ms).
SUMMATION_ROUNDS: dict[bool, tuple[int, int]] = {False: (40_000, 8_000_000), True: (2_500, 500_000)}
_INT64_MAX = 2**63 - 1


def _check_args(n: object, epsilon: object, delta: object, rounds: object, confidence: object,
                lower: object, upper: object, seed: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise InvalidParameter("n", f"must be an integer >= 3 (split and mix needs 3 users), got {n!r}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not MIN_EPSILON <= epsilon <= MAX_EPSILON:
        raise InvalidParameter("epsilon", f"must be in [{MIN_EPSILON}, {MAX_EPSILON}], got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1) (summation is approximate DP), got {delta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 100:
        raise InvalidParameter("rounds", f"must be an integer >= 100, got {rounds!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 < confidence < 1.0:
        raise InvalidParameter("confidence", f"must be in (0.5, 1), got {confidence!r}")
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidParameter(name, f"must be a finite number, got {value!r}")
    if not lower < upper:
        raise InvalidParameter("upper", f"must exceed lower = {lower!r}, got {upper!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameter("seed", f"must be an integer >= 0, got {seed!r}")


def _dataset(params: ModularSumParams, dataset: int) -> np.ndarray:
    """The users' values: ``D0`` all at ``lower``; ``D1`` the same with user 0 at ``upper``."""
    if dataset not in (0, 1):
        raise InvalidParameter("dataset", f"must be 0 (D0) or 1 (D1), got {dataset!r}")
    values = np.full(params.users, float(params.lower))
    if dataset == 1:
        values[0] = float(params.upper)
    return values


def round_shares(params: ModularSumParams, epsilon: float, dataset: int, rounds: int, source: SeededSource) -> np.ndarray:
    """All shares of ``rounds`` independent rounds of dataset ``D0``/``D1``: int64 ``(rounds, n M)``.

    One call of the shipped :func:`shuffledp.client.summation.randomize_modular_sum`
    (looked up at call time) on the ``n`` users of every round stacked: users are
    independent, each draws its own rounding, Pólya share (shape ``1 / params.users``)
    and split, so row ``r`` is exactly one round's shares (in user order: the order
    does not change their sum).
    """
    from shuffledp.client import summation as client_summation

    values = np.tile(_dataset(params, dataset), rounds)
    shares = client_summation.randomize_modular_sum(values, params, epsilon, source)
    return shares.reshape(rounds, params.users * params.messages)


def decoded_totals(shares: np.ndarray, params: ModularSumParams) -> np.ndarray:
    """Each round's decoded total, int64 ``(rounds,)``: the analyzer's ``encoded_total``.

    As :func:`shuffledp.analyzer.summation.decode_scalar_sum` computes it: the sum of
    the round's shares mod ``q`` (exact), mapped to ``(-q/2, q/2]`` by
    :func:`~shuffledp.protocol.modular_sum.centered`. Vectorized over rounds when a
    row's sum fits in int64, else round by round with
    :func:`~shuffledp.protocol.modular_sum.modular_sum`.
    """
    rows = np.asarray(shares, dtype=np.int64)
    q = params.modulus
    if rows.shape[1] * (q - 1) <= _INT64_MAX:
        sums = np.mod(rows.sum(axis=1), q)
    else:
        sums = np.array([modular_sum(row, q) for row in rows], dtype=np.int64)
    return np.asarray(centered(sums, q), dtype=np.int64)


def sample_totals(params: ModularSumParams, epsilon: float, dataset: int, rounds: int, source: SeededSource) -> np.ndarray:
    """Decoded totals of ``rounds`` rounds of ``D0`` or ``D1``, simulated in chunks of about :data:`CHUNK_SHARES` shares."""
    per_chunk = max(1, CHUNK_SHARES // (params.users * params.messages))
    out = np.empty(rounds, dtype=np.int64)
    done = 0
    while done < rounds:
        m = min(per_chunk, rounds - done)
        out[done : done + m] = decoded_totals(round_shares(params, epsilon, dataset, m, source), params)
        done += m
    return out


def _histograms(t0: np.ndarray, t1: np.ndarray, include: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Histograms of both samples over one common support ``lo .. hi`` (containing ``include``), and ``lo``."""
    lo = int(min(t0.min(), t1.min()))
    hi = int(max(t0.max(), t1.max()))
    if include is not None:
        lo, hi = min(lo, include), max(hi, include)
    size = hi - lo + 1
    return np.bincount(t0 - lo, minlength=size), np.bincount(t1 - lo, minlength=size), lo


def summation_claim(
    n: int, epsilon: float, delta: float, lower: float = 0.0, upper: float = 1.0
) -> tuple[SummationChoice, float, str]:
    """The parameters the project picks for a round at central ``(epsilon, delta)`` and what it claims.

    Returns ``(choice, claimed_epsilon, method)``: the chooser's
    :class:`~shuffledp.protocol.summation_params.SummationChoice`, with the budget
    check a client runs (``params.check_budget``, as
    :class:`~shuffledp.analyzer.summation.SummationProtocol` does).
    """
    from shuffledp.protocol import summation_params

    choice = summation_params.choose_scalar_sum(n, epsilon, delta, lower, upper)
    choice.params.check_budget(epsilon, delta)
    method = (
        f"summation_params: DLap(exp(-eps/p)) noise, pure eps on the sum; "
        f"split and mix delta {choice.split_delta:.2g} <= {delta:.2g}"
    )
    return choice, float(choice.epsilon), method


def noise_epsilon(params: ModularSumParams, epsilon: float) -> float:
    """``-p ln(alpha)`` of the shipped noise parameter (``alpha = sum_alpha(eps, p)``): the noise's own epsilon."""
    from shuffledp.client import summation as client_summation

    return -params.precision * math.log(client_summation.sum_alpha(epsilon, params.precision))


def audit_summation(
    n: int,
    epsilon: float,
    delta: float = 1e-6,
    *,
    rounds: int = 10_000,
    confidence: float = 0.95,
    lower: float = 0.0,
    upper: float = 1.0,
    seed: int = 0,
) -> ShuffledAudit:
    """Lower-bound the central epsilon of one scalar summation round of ``n`` users (module docstring).

    Parameters come from the project's chooser at ``(epsilon, delta)``; ``rounds``
    rounds of each dataset are simulated twice (selection sample, evaluation sample)
    with the real client code. Returns a :class:`~shuffledp.audit_shuffled.ShuffledAudit`
    with ``mechanism = "modular-sum"``, ``epsilon0`` the round's central target,
    ``exact_epsilon`` the noise's own epsilon ``-p ln(alpha)`` and ``lower_bound`` valid
    with probability ``confidence``. ``passed``: lower bound <= claim.
    """
    _check_args(n, epsilon, delta, rounds, confidence, lower, upper, seed)
    started = time.perf_counter()
    choice, claimed, method = summation_claim(n, float(epsilon), float(delta), float(lower), float(upper))
    params = choice.params
    streams = [SeededSource(s) for s in np.random.SeedSequence([seed, 0x5A3D, n, round(epsilon * 1e6)]).spawn(4)]

    def sample(side: int, stream: int) -> np.ndarray:
        return sample_totals(params, float(epsilon), side, rounds, streams[stream])

    h0, h1, lo = _histograms(sample(0, 0), sample(1, 1))
    kind, index, _ = best_event(h0, h1, rounds, delta, max(confidence, SELECTION_CONFIDENCE))
    threshold = lo + index
    f0, f1, flo = _histograms(sample(0, 2), sample(1, 3), include=threshold)
    bound = evaluate_event(f0, f1, rounds, kind, threshold - flo, delta, confidence)
    return ShuffledAudit(
        mechanism="modular-sum",
        n=n,
        epsilon0=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        claimed_epsilon=claimed,
        claimed_method=method,
        exact_epsilon=noise_epsilon(params, float(epsilon)),
        lower_bound=bound,
        event=f"decoded total {kind} {threshold} (encoded units; D0 sum 0, D1 sum p = {params.precision})",
        confidence=confidence,
        seconds=time.perf_counter() - started,
    )


def summation_rounds(n: int, quick: bool) -> int:
    """Rounds per sample for ``n`` users: ``min(cap, user_rounds // n)`` (:data:`SUMMATION_ROUNDS`), at least 300.

    Default: 40,000 at ``n = 100``, 8,000 at ``n = 1000``; quick: 2,500 and 500."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidParameter("n", f"must be a positive integer, got {n!r}")
    cap, user_rounds = SUMMATION_ROUNDS[bool(quick)]
    return max(300, min(cap, user_rounds // n))


def summation_rows(
    quick: bool,
    seed: int,
    progress: Progress | None = None,
    *,
    delta: float = 1e-6,
    settings: tuple[tuple[int, float], ...] = SUMMATION_SETTINGS,
    rounds: int | None = None,
    familywise: bool = True,
) -> list[dict[str, Any]]:
    """The summation audit's rows for ``shuffledp audit``: one :func:`audit_summation` per ``(n, epsilon)``.

    Rounds per sample: :func:`summation_rounds` (``quick``: about a tenth), or ``rounds``.
    With ``familywise`` each row runs at confidence ``1 - 0.05 / rows``, so a correct
    implementation fails the whole table with probability at most 5 % (the claim is
    tight: module docstring); otherwise 95 % per row. Each row is
    :meth:`~shuffledp.audit_shuffled.ShuffledAudit.as_dict` (``epsilon0`` is the
    round's central target, ``exact_epsilon`` the noise's own epsilon) plus the
    round's ``precision``, ``modulus`` and ``messages``; ``progress(label, 1)`` is
    called after each row.
    """
    if not settings:
        raise InvalidParameter("settings", "must list at least one (n, epsilon)")
    confidence = 1.0 - 0.05 / len(settings) if familywise else 0.95
    out: list[dict[str, Any]] = []
    for n, epsilon in settings:
        r = rounds if rounds is not None else summation_rounds(n, quick)
        result = audit_summation(n, epsilon, delta, rounds=r, confidence=confidence, seed=seed)
        params = summation_claim(n, float(epsilon), delta)[0].params
        row = result.as_dict()
        row.update(precision=params.precision, modulus=params.modulus, messages=params.messages)
        out.append(row)
        if progress:
            progress(f"summation n={n} eps={epsilon:g}", 1)
    return out
