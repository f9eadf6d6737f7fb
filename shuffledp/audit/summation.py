"""Empirical lower bound on the central epsilon of multi-message summation, scalar and vector.

Scalar summation
================

Mechanism audited (Balle, Bell, Gascón & Nissim, "Private Summation in the
Multi-Message Shuffle Model", CCS 2020, arXiv:2002.00817, Sec. 4): every user clips
its value to ``[lower, upper]``, encodes it in ``{0, ..., p}`` by randomized rounding,
adds a Pólya noise share (the ``n`` shares sum to ``DLap(alpha)``,
``alpha = exp(-eps / p)``) and sends ``M`` additive shares mod ``q``
(:func:`shuffledp.client.summation.randomize_modular_sum`). The analyzer sums all
``n M`` shares mod ``q``, centres the result in ``(-q/2, q/2]`` and reads it as the sum
of the encodings plus the noise (:func:`shuffledp.analyzer.summation.decode_scalar_sum`).

Claim audited: the round's central ``(eps, delta)`` as the project states it
(:func:`shuffledp.protocol.mechanisms.summation_params.choose_scalar_sum`, checked by
:func:`~shuffledp.protocol.mechanisms.summation_params.check_scalar_sum`, which a client runs
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
  on a selection sample (:func:`shuffledp.audit.shuffled.best_event`) and evaluated on a
  fresh one (:func:`~shuffledp.audit.shuffled.evaluate_event`) with Clopper-Pearson
  bounds (:func:`shuffledp.audit.local.epsilon_lower_bound`): ``eps >= ln((p_lo - delta)
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
:func:`shuffledp.audit.local.expected_epsilon_lower_bound`).

Because the claim is tight, a correct round can exceed it whenever a Clopper-Pearson
end fails: with probability at most ``1 - confidence`` per row (measured with exact DLap
draws at 95 %: 0.3 % at ``eps = 1``, 0.3-1 % at ``eps = 4``, a few hundred runs each). So
:func:`summation_rows` uses a family-wise confidence over its rows (Bonferroni, as
:func:`shuffledp.audit.local.audit_local` does).

Paths: the real client code runs on :class:`~shuffledp.protocol.mechanisms.randomness.SeededSource`
(numpy's negative binomial), vectorized over users and rounds in chunks. The device
path (:class:`~shuffledp.protocol.mechanisms.randomness.SystemSource`) draws every NB in Python
and is far too slow for ``10^4`` rounds of ``10^3`` users; its NB law is checked in
``tests/protocol/test_distributed_noise.py``. Functions are looked up at call time through
their modules, so a planted fault (:mod:`shuffledp.audit.faults`, ``nbinom-reversed``)
is audited as it runs.

Vector summation
================

Mechanism audited (Huang, Liang & Yi, NeurIPS 2021, Sec. 5, with Skellam noise after
Agarwal, Kairouz & Liu, NeurIPS 2021):
:func:`shuffledp.client.summation.randomize_vector_sum` clips each user's vector to the
l2 ball of ``radius`` ``r``, rotates it (``U = H diag(s) / sqrt(D)``, public seed, ``D``
the padded dimension), scales by ``L / r`` (``L = levels``), rounds every coordinate at
random, adds per-coordinate Skellam shares (the ``n`` shares of a coordinate sum to
``Skellam(mu)``) and sends ``M`` additive shares mod ``q`` of every coordinate, tagged
with it. The analyzer (:func:`shuffledp.analyzer.summation.decode_vector_sum`) sums each
coordinate's shares mod ``q``, centres the sums (``encoded_total``, the integer vector
``S``), scales by ``r / L`` and rotates back.

Claim audited: the round's central ``(eps, delta)`` as
:func:`shuffledp.protocol.mechanisms.summation_params.choose_vector_sum` picks and
:func:`~shuffledp.protocol.mechanisms.summation_params.check_vector_sum` checks it: ``mu`` is the
smallest for which the Skellam RDP bound (Agarwal, Kairouz & Liu) at the l2 and l1
sensitivities of a *replaced* user's encoding (``D2 = 2 (L + sqrt D)``), converted by
Canonne, Kamath & Steinke (Prop. 12), gives ``eps`` at ``delta / 2``; the split and mix
costs the rest of ``delta`` at most.

The test
--------
* Neighbouring datasets: users ``1 .. n-1`` at the zero vector in both; user 0 at
  ``-r e_0`` (``D0``) or at ``+r e_0`` (``D1``). That is a replacement, the neighbouring
  relation the claim is calibrated for, and the largest one (the two points are a
  diameter of the ball apart), as the scalar rows move one user from ``lower`` to
  ``upper``. (Zero against ``r e_0`` is a neighbouring pair too, but moves the sum half
  as far: the best a test on it can reach is 1.7 instead of 3.59 at ``eps = 4``.) A
  zero vector encodes exactly (its scaled rotation is 0, ``floor`` 0, and a Bernoulli(0)
  never fires), so the other users add their noise shares and nothing else.
* Rotation and rounding: ``U e_0 = s_0 H[:, 0] / sqrt(D)`` has every entry ``+-1/sqrt(D)``,
  so user 0's scaled coordinates are ``x_j = +-(L / sqrt D) w_j`` with
  ``w = sign(U e_0)`` (:func:`projection`): the contribution is spread evenly over all
  ``D`` coordinates. Randomized rounding encodes ``x_j`` as ``floor(x_j) +
  Bernoulli(frac(x_j))``; this is exact only when ``L / sqrt D`` is an integer. The
  chooser's ``L = ceil(100 sqrt D)`` gives ``x_j = +-100`` exactly at ``D = 4`` and ``16``
  (the rows here), but ``+-100.05`` at ``D = 8``. Nothing in the argument below depends on
  it: the samples are the real code's outputs on real inputs, so the bound is valid
  whatever the rounding does; only the *theoretical* law of the statistic (for
  ``exact_epsilon`` and the tests) has to include it, and it does.
* Statistic: ``T = <w, S>`` (integer), the decoded coordinate totals projected on the
  direction of user 0's contribution. Equivalently ``T = (L sqrt(D) / r) est_0`` with
  ``est = U^T S r / L`` the analyzer's de-rotated estimate: ``est_0 = <U e_0, S> r / L``
  and ``U e_0 = w / sqrt D``. It is a function of the analyzer's view
  (the shuffled multiset of tagged shares), so it is post-processing, and every event on
  it lower-bounds the central epsilon of the whole view, as in the scalar rows. Why this
  projection: for Gaussian noise ``N(0, sigma^2 I)`` the log-likelihood ratio between
  means ``-v`` and ``+v`` is ``2 <v, S> / sigma^2``, so ``<v, S>`` is sufficient and its
  tails are the Neyman-Pearson tests; ``Skellam(mu)`` with ``mu`` of ``10^5 .. 10^6`` is
  normal up to its excess kurtosis ``1 / (2 mu)``, and ``v`` is proportional to ``w``.
* The law of ``T`` (:func:`statistic_law`): coordinate ``j``'s noise is ``N_j ~
  Skellam(mu)``, independent over ``j``; ``Skellam`` is symmetric and additive, so
  ``sum_j w_j N_j ~ Skellam(D mu)``. User 0 adds ``w_j enc_j = a_j + Bernoulli(g_j)``
  (``g_j = frac(x_j)`` for ``w_j = 1``, ``1 - frac(x_j)`` otherwise). So ``T = sum_j a_j +
  PoissonBinomial(g) + Skellam(D mu)``, and ``T`` under ``D0`` has the law of ``-T`` under
  ``D1``. At the rows' parameters ``T = -+ L sqrt(D) + Skellam(D mu)``: the means are
  ``2 L sqrt D`` apart (3200 at ``D = 16``, 800 at ``D = 4``) against a standard
  deviation ``sqrt(2 D mu)`` (4210 and 3774), a shift of 0.76 sd at ``eps = 4`` and 0.21
  sd at ``eps = 1`` (``sqrt(2) L / sqrt(mu)``: set by ``(eps, delta)``, not by ``D``).
  Wrap-around (probability at most ``1e-9`` a round) is ignored by the theory only.
* Events: ``T`` is cut into bins of ``max(1, floor(sd / 64))`` (a function of the
  parameters only, so binning is post-processing too), and the tail is chosen and
  evaluated exactly as in the scalar rows (selection sample ranked at
  :data:`SELECTION_CONFIDENCE`, fresh evaluation sample, Clopper-Pearson).

What a correct round gives
--------------------------
``exact_epsilon`` (:func:`statistic_epsilon`) is the exact epsilon of ``T`` at ``delta``:
the smallest ``eps`` with ``sum_t max(0, P1(t) - e^eps P0(t)) <= delta`` both ways,
computed from the law above with ``P(Skellam(m) = k) = e^(-2m) I_k(2m)``
(``scipy.special.ive``). No event ``E`` on ``T`` can give more: a bound
``ln((P1(E) - delta) / P0(E)) > eps`` would make the sum above exceed ``delta`` at that
``eps``. The event ``{P1 / P0 > e^eps}`` attains it, and because the Skellam law is
log-concave the shift family has monotone likelihood ratios and that event is a tail
(when rounding is exact; otherwise the two laws are not exact shifts, and the figure
still bounds every event on ``T``). So ``exact_epsilon`` is what this test reaches with unlimited rounds: 3.586 at ``eps = 4``
(``n = 100``, ``D = 16``, ``L = 400``, ``mu = 553,837``), 0.888 at ``eps = 1`` (``D = 4``,
``L = 200``, ``mu = 1,780,279``), 0.90 and 0.89 of the claims; the test file checks it
against the Gaussian mechanism's exact formula. The rest of the claim is the RDP
conversion's slack (the route's own epsilon is in ``claimed_method``: 3.905 and 0.991),
the rounding term ``sqrt D`` in the sensitivity, and the part of ``delta`` given to the
split. Under Gaussian-like noise, however, the likelihood ratio is large only deep in
the tails, which a few thousand rounds cannot see: at the rows' rounds the bound is
about 0.93 (``eps = 4``, 2,757 rounds) and 0.19 (``eps = 1``, 13,392 rounds), 0.23 and 0.19
of the claims. These rows therefore prove no tightness; they catch noise that is well
below the claim: with ``skellam-mu-too-small`` (``mu / 100``: shifts of 7.6 and 2.1 sd) the
bound is 5.2 and 3.4 with 1,000 rounds (``quick``: 100 rounds cap the ``eps = 4`` row near
2.9, but the ``eps = 1`` row's 214 still fail, at 1.6 to 2.3 over six seeds). Since the bound of a correct round stays far
below its claim, the vector rows add no false alarms beyond the family-wise share of
Clopper-Pearson failures.

Cost: ``n D M`` shares a round (27,200 at ``n = 100``, ``D = 16``, ``M = 17``), about 40 ns a
share on 2 cores (the client's split and the stacking of ``(coordinate, share)`` rows
dominate), so a default row takes about 11 s (:data:`VECTOR_ROUNDS`). The decoding is
vectorized when the tags have the client's layout and falls back to the analyzer's own
decoder otherwise (:func:`vector_coordinate_totals`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from shuffledp.audit.shuffled import ShuffledAudit, best_event, evaluate_event, event_counts
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import MAX_EPSILON, MAX_VECTOR_DIM, MIN_EPSILON, ModularSumParams, VectorSumParams
from shuffledp.protocol.mechanisms.modular_sum import centered, modular_sum
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.mechanisms.rotation import RandomRotation
from shuffledp.protocol.mechanisms.summation_params import SummationChoice

__all__ = [
    "CHUNK_SHARES",
    "SELECTION_CONFIDENCE",
    "SUMMATION_ROUNDS",
    "SUMMATION_SETTINGS",
    "VECTOR_RADIUS",
    "VECTOR_ROUNDS",
    "audit_summation",
    "audit_vector_summation",
    "bin_width",
    "decoded_totals",
    "noise_epsilon",
    "projection",
    "round_shares",
    "sample_totals",
    "sample_vector_statistics",
    "statistic_epsilon",
    "statistic_law",
    "statistic_sd",
    "summation_claim",
    "summation_rounds",
    "summation_rows",
    "vector_coordinate_totals",
    "vector_dataset",
    "vector_round_reports",
    "vector_summation_claim",
    "vector_summation_rounds",
]

Progress = Callable[[str, int], None]
#: Confidence at which the selection sample ranks events (module docstring); evaluation uses the caller's.
SELECTION_CONFIDENCE = 1.0 - 1e-6
#: Shares per chunk when simulating rounds (bounds memory: ~16 MB per int64 array).
CHUNK_SHARES = 2**21
#: The rows :func:`summation_rows` audits: ``(n, epsilon)`` scalar, ``(n, epsilon, dim)`` vector. The vector rows
#: are the ones the chooser accepts at ``n = 100`` (``dim = 16`` at ``eps = 1`` is refused: a device would draw
#: Poisson means of ``1.1e6`` in all, over its limit ``2^18``), so ``eps = 1`` runs at ``dim = 4``.
SUMMATION_SETTINGS: tuple[tuple[int, float] | tuple[int, float, int], ...] = (
    (100, 1.0), (100, 4.0), (1000, 1.0), (1000, 4.0), (100, 4.0, 16), (100, 1.0, 4),
)
#: ``(cap, user_rounds)`` of :func:`summation_rounds`, default and ``quick``: measured on 2 cores, the four
#: default rows take about 45 s and the quick ones about 6 s (a round of ``n = 1000`` users costs ~0.4 ms).
SUMMATION_ROUNDS: dict[bool, tuple[int, int]] = {False: (40_000, 8_000_000), True: (2_500, 500_000)}
#: Radius of the vector rows' l2 ball (the audit is scale-free: the encoding works in ``levels / radius`` units).
VECTOR_RADIUS = 1.0
#: ``(cap, shares)`` of :func:`vector_summation_rounds`, default and ``quick``: rounds per sample are
#: ``min(cap, shares // (n D M))``, at least 100. The client costs about 40 ns per share on 2 cores, so a default
#: vector row (four samples) takes about 11 s and a quick one under 1 s.
VECTOR_ROUNDS: dict[bool, tuple[int, int]] = {False: (20_000, 75_000_000), True: (1_000, 1_200_000)}
_INT64_MAX = 2**63 - 1


def _check_common(n: object, epsilon: object, delta: object, rounds: object, confidence: object, seed: object) -> None:
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
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameter("seed", f"must be an integer >= 0, got {seed!r}")


def _check_args(n: object, epsilon: object, delta: object, rounds: object, confidence: object,
                lower: object, upper: object, seed: object) -> None:
    _check_common(n, epsilon, delta, rounds, confidence, seed)
    bounds = []
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidParameter(name, f"must be a finite number, got {value!r}")
        bounds.append(float(value))
    if not bounds[0] < bounds[1]:
        raise InvalidParameter("upper", f"must exceed lower = {lower!r}, got {upper!r}")


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
    :func:`~shuffledp.protocol.mechanisms.modular_sum.centered`. Vectorized over rounds when a
    row's sum fits in int64, else round by round with
    :func:`~shuffledp.protocol.mechanisms.modular_sum.modular_sum`.
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
) -> tuple[SummationChoice[ModularSumParams], float, str]:
    """The parameters the project picks for a round at central ``(epsilon, delta)`` and what it claims.

    Returns ``(choice, claimed_epsilon, method)``: the chooser's
    :class:`~shuffledp.protocol.mechanisms.summation_params.SummationChoice`, with the budget
    check a client runs (``params.check_budget``, as
    :class:`~shuffledp.analyzer.summation.SummationProtocol` does).
    """
    from shuffledp.protocol.mechanisms import summation_params

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
    with the real client code. Returns a :class:`~shuffledp.audit.shuffled.ShuffledAudit`
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

    kind, threshold, bound, (hits, other) = select_and_evaluate(sample, rounds, delta, confidence)
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
        count_hit=hits,
        count_other=other,
    )


def select_and_evaluate(sample, rounds: int, delta: float, confidence: float) -> tuple[str, int, float, tuple[int, int]]:
    """``(kind, threshold, bound, (hits, other))``: the tail event chosen on samples from streams 0 (D0) and 1 (D1)
    at :data:`SELECTION_CONFIDENCE`, evaluated on fresh samples from streams 2 and 3 at ``confidence``
    (``hits``, ``other``: the evaluation rounds in the event under the dataset it favours and the other).
    ``sample(side, stream)`` returns one sample of integer statistics of ``rounds`` rounds."""
    h0, h1, lo = _histograms(sample(0, 0), sample(1, 1))
    kind, index, _ = best_event(h0, h1, rounds, delta, max(confidence, SELECTION_CONFIDENCE))
    threshold = lo + index
    f0, f1, flo = _histograms(sample(0, 2), sample(1, 3), include=threshold)
    counts = event_counts(f0, f1, kind, threshold - flo)
    return kind, threshold, evaluate_event(f0, f1, rounds, kind, threshold - flo, delta, confidence), counts


# --------------------------------------------------------------------------
# Vector summation (Skellam)
# --------------------------------------------------------------------------


def _check_vector_args(dim: object, radius: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_VECTOR_DIM:
        raise InvalidParameter("dim", f"must be an integer in [1, {MAX_VECTOR_DIM}], got {dim!r}")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not math.isfinite(radius) or not radius > 0:
        raise InvalidParameter("radius", f"must be a finite number > 0, got {radius!r}")


def vector_summation_claim(
    n: int, epsilon: float, delta: float, dim: int, radius: float = VECTOR_RADIUS, rotation_seed: int = 0
) -> tuple[SummationChoice[VectorSumParams], float, str]:
    """The parameters the project picks for a vector round at central ``(epsilon, delta)`` and what it claims.

    Returns ``(choice, claimed_epsilon, method)`` from
    :func:`shuffledp.protocol.mechanisms.summation_params.choose_vector_sum`, with the budget check a
    client runs (``params.check_budget``). The claim is the round's target ``epsilon``;
    ``method`` also names the Skellam RDP route's own epsilon at the noise's share of delta.
    """
    from shuffledp.protocol.mechanisms import summation_params

    choice = summation_params.choose_vector_sum(n, epsilon, delta, dim, radius, rotation_seed)
    params = choice.params
    params.check_budget(epsilon, delta)
    l1, l2 = summation_params.vector_sensitivities(params.levels, params.padded_dim)
    route = summation_params.skellam_epsilon(params.mu, params.levels, params.padded_dim, delta - choice.split_delta)
    method = (
        f"summation_params: Skellam(mu = {params.mu:.6g}) per coordinate, RDP (Agarwal, Kairouz & Liu 2021) at "
        f"l2 sensitivity 2 (L + sqrt D) = {l2:.6g} (L = {params.levels}, D = {params.padded_dim}), converted "
        f"(Canonne, Kamath & Steinke 2020, Prop. 12): eps {route:.4g} at noise delta {delta - choice.split_delta:.2g}; "
        f"split and mix delta {choice.split_delta:.2g}"
    )
    return choice, float(choice.epsilon), method


def vector_dataset(params: VectorSumParams, dataset: int) -> np.ndarray:
    """The users' vectors, float ``(n, dim)``: all at zero except user 0, at ``-radius e_0`` (``D0``) or ``+radius e_0`` (``D1``)."""
    if dataset not in (0, 1):
        raise InvalidParameter("dataset", f"must be 0 (D0) or 1 (D1), got {dataset!r}")
    vectors = np.zeros((params.users, params.dim))
    vectors[0, 0] = (1.0 if dataset == 1 else -1.0) * float(params.radius)
    return vectors


def projection(params: VectorSumParams) -> np.ndarray:
    """``w = sign(U e_0)``, int64 ``(D,)``: the statistic is ``T = <w, S>`` (module docstring).

    Every entry of ``U e_0 = H diag(s) e_0 / sqrt(D)`` is ``s_0 H_j0 / sqrt(D) = +-1/sqrt(D)``."""
    column = RandomRotation(params.dim, params.rotation_seed).apply(np.eye(1, params.dim))[0]
    return np.where(column > 0, 1, -1).astype(np.int64)


def vector_round_reports(params: VectorSumParams, dataset: int, rounds: int, source: SeededSource) -> np.ndarray:
    """All reports of ``rounds`` independent rounds of ``D0``/``D1``: int64 ``(rounds, n D M, 2)``.

    One call of the shipped :func:`shuffledp.client.summation.randomize_vector_sum` (looked
    up at call time) on the users of every round stacked (users are independent: each draws
    its own rounding, Skellam shares and split), rows ``(coordinate, share)`` in user order.
    """
    from shuffledp.client import summation as client_summation

    vectors = np.tile(vector_dataset(params, dataset), (rounds, 1))
    reports = client_summation.randomize_vector_sum(vectors, params, source)
    return reports.reshape(rounds, params.users * params.messages_per_user, 2)


def vector_coordinate_totals(reports: np.ndarray, params: VectorSumParams) -> np.ndarray:
    """Each round's centered per-coordinate totals, int64 ``(rounds, D)``: the analyzer's ``encoded_total``.

    As :func:`shuffledp.analyzer.summation.decode_vector_sum` computes it: for every
    coordinate tag, the sum of its shares mod ``q``, centered to ``(-q/2, q/2]``. Fast path
    when every user's rows carry the client's tag layout (``M`` rows per coordinate, in
    order) and a round's coordinate sum fits in int64; otherwise the analyzer's decoder
    itself, round by round (it refuses a batch with missing shares).
    """
    rows = np.asarray(reports, dtype=np.int64)
    if rows.ndim != 3 or rows.shape[2] != 2:
        raise InvalidParameter("reports", f"must have shape (rounds, reports, 2), got {rows.shape}")
    rounds, dim, m, q = rows.shape[0], params.padded_dim, params.messages, params.modulus
    per_user = params.messages_per_user
    layout = np.repeat(np.arange(dim, dtype=np.int64), m)
    fast = (
        rows.shape[1] == params.users * per_user
        and params.users * m * (q - 1) <= _INT64_MAX
        and np.array_equal(rows[:, :, 0].reshape(rounds, params.users, per_user), np.broadcast_to(layout, (rounds, params.users, per_user)))
    )
    if fast:
        sums = np.mod(rows[:, :, 1].reshape(rounds, params.users, dim, m).sum(axis=(1, 3)), q)
        return np.asarray(centered(sums, q), dtype=np.int64).reshape(rounds, dim)
    from shuffledp.analyzer import summation as analyzer_summation

    return np.array([analyzer_summation.decode_vector_sum(r, params).encoded_total for r in rows], dtype=np.int64).reshape(rounds, dim)


def sample_vector_statistics(params: VectorSumParams, dataset: int, rounds: int, source: SeededSource) -> np.ndarray:
    """``T = <w, S>`` of ``rounds`` rounds of ``D0`` or ``D1``, int64, simulated in chunks of about :data:`CHUNK_SHARES` shares."""
    w = projection(params)
    per_chunk = max(1, CHUNK_SHARES // (params.users * params.messages_per_user))
    out = np.empty(rounds, dtype=np.int64)
    done = 0
    while done < rounds:
        m = min(per_chunk, rounds - done)
        out[done : done + m] = vector_coordinate_totals(vector_round_reports(params, dataset, m, source), params) @ w
        done += m
    return out


def statistic_sd(params: VectorSumParams) -> float:
    """``sqrt(2 D mu)``: the standard deviation of ``T``'s noise, ``Skellam(D mu)``."""
    return math.sqrt(2.0 * params.padded_dim * params.mu)


def bin_width(params: VectorSumParams) -> int:
    """Width of the bins ``T`` is histogrammed in: ``max(1, floor(sd / 64))`` (a function of the parameters only)."""
    return max(1, int(statistic_sd(params) // 64))


def _scaled_user(params: VectorSumParams, dataset: int) -> np.ndarray:
    """User 0's clipped, rotated, scaled vector (float ``(D,)``), as the shipped encoder computes it before rounding."""
    from shuffledp.client import summation as client_summation

    return client_summation.scaled_rotation(vector_dataset(params, dataset)[:1], params)[0]


def statistic_law(params: VectorSumParams, dataset: int, reach: float = 14.0) -> tuple[int, np.ndarray]:
    """The law of ``T`` under ``D0``/``D1`` for the shipped encoding and exact noise: ``(lo, pmf)``, ``P(T = lo + i) = pmf[i]``.

    ``T = sum_j w_j enc_j + Skellam(D mu)`` (module docstring): user 0's coordinate ``j``
    encodes to ``floor(x_j) + Bernoulli(frac(x_j))`` (``x`` its scaled rotation as
    :func:`shuffledp.client.summation.scaled_rotation` computes it), so ``w_j enc_j`` is
    ``a_j + Bernoulli(g_j)``; the sum over ``j`` is ``sum a_j`` plus a Poisson-binomial,
    convolved with ``Skellam(D mu)``, ``P(k) = e^(-2 D mu) I_k(2 D mu)`` (:func:`scipy.special.ive`).
    The support is cut ``reach`` standard deviations out (mass beyond: below 1e-40).
    """
    from scipy import special

    w = projection(params)
    x = _scaled_user(params, dataset)
    floor = np.floor(x)
    frac = x - floor
    a = np.where(w > 0, floor, -floor - 1.0).astype(np.int64)
    g = np.where(w > 0, frac, 1.0 - frac)
    rounding = np.ones(1)
    for gj in g:
        rounding = np.convolve(rounding, [1.0 - gj, gj])
    half = int(math.ceil(reach * statistic_sd(params)))
    k = np.arange(-half, half + 1)
    noise = special.ive(np.abs(k), 2.0 * params.padded_dim * params.mu)
    return int(a.sum()) - half, np.convolve(rounding, noise)


def _hockey_stick(p: np.ndarray, q: np.ndarray) -> Callable[[float], float]:
    """``eps -> sum_t max(0, p(t) - e^eps q(t))``, evaluated in ``O(log size)`` after one sort by the loss ``ln p/q``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.where(p > 0, np.log(p) - np.log(q), -np.inf)
    order = np.argsort(-loss, kind="stable")
    descending = loss[order]
    cp, cq = np.cumsum(p[order]), np.cumsum(q[order])

    def excess(epsilon: float) -> float:
        k = int(np.searchsorted(-descending, -epsilon, side="left"))  # entries with loss > epsilon
        return 0.0 if k == 0 else max(0.0, float(cp[k - 1] - math.exp(epsilon) * cq[k - 1]))

    return excess


def statistic_epsilon(params: VectorSumParams, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``T`` for the pair ``D0``, ``D1`` (both directions), from :func:`statistic_law`.

    The smallest ``eps`` with ``sum_t max(0, P1(t) - e^eps P0(t)) <= delta`` and the same
    with ``P0``, ``P1`` swapped (bisection to 1e-9): no event on ``T`` (binned or not) can
    give an audit more, and with exact rounding a tail reaches it (module docstring)."""
    lo0, p0 = statistic_law(params, 0)
    lo1, p1 = statistic_law(params, 1)
    lo = min(lo0, lo1)
    size = max(lo0 + p0.size, lo1 + p1.size) - lo
    f0 = np.zeros(size)
    f1 = np.zeros(size)
    f0[lo0 - lo : lo0 - lo + p0.size] = p0
    f1[lo1 - lo : lo1 - lo + p1.size] = p1
    up, down = _hockey_stick(f1, f0), _hockey_stick(f0, f1)

    def excess(epsilon: float) -> float:
        return max(up(epsilon), down(epsilon))

    low, high = 0.0, 1.0
    if excess(low) <= delta:
        return 0.0
    while excess(high) > delta:
        low, high = high, 2.0 * high
    while high - low > 1e-9:
        mid = 0.5 * (low + high)
        low, high = (mid, high) if excess(mid) > delta else (low, mid)
    return high


def audit_vector_summation(
    n: int,
    epsilon: float,
    delta: float = 1e-6,
    *,
    dim: int = 16,
    rounds: int = 2_000,
    confidence: float = 0.95,
    radius: float = VECTOR_RADIUS,
    seed: int = 0,
) -> ShuffledAudit:
    """Lower-bound the central epsilon of one vector summation round of ``n`` users (module docstring).

    Parameters come from the project's chooser at ``(epsilon, delta)`` (rotation seed:
    ``seed``); ``rounds`` rounds of each dataset are simulated twice (selection sample,
    evaluation sample) with the real client code. Returns a
    :class:`~shuffledp.audit.shuffled.ShuffledAudit` with ``mechanism = "vector-sum"``,
    ``epsilon0`` the round's central target, ``exact_epsilon`` the exact epsilon of the
    statistic ``T`` at ``delta`` (:func:`statistic_epsilon`: what the test can reach with
    unlimited rounds) and ``lower_bound`` valid with probability ``confidence``.
    ``passed``: lower bound <= claim.
    """
    _check_common(n, epsilon, delta, rounds, confidence, seed)
    _check_vector_args(dim, radius)
    if seed >= 2**64:
        raise InvalidParameter("seed", f"is the rotation's public seed: must be below 2^64, got {seed!r}")
    started = time.perf_counter()
    choice, claimed, method = vector_summation_claim(n, float(epsilon), float(delta), dim, float(radius), seed)
    params = choice.params
    width = bin_width(params)
    streams = [SeededSource(s) for s in np.random.SeedSequence([seed, 0x7EC5, n, dim, round(epsilon * 1e6)]).spawn(4)]

    def sample(side: int, stream: int) -> np.ndarray:
        return np.floor_divide(sample_vector_statistics(params, side, rounds, streams[stream]), width)

    kind, threshold, bound, (hits, other) = select_and_evaluate(sample, rounds, delta, confidence)
    cut = f"T >= {threshold * width}" if kind == ">=" else f"T <= {threshold * width + width - 1}"
    shift = float(projection(params) @ _scaled_user(params, 1))
    return ShuffledAudit(
        mechanism="vector-sum",
        n=n,
        epsilon0=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        claimed_epsilon=claimed,
        claimed_method=method,
        exact_epsilon=statistic_epsilon(params, float(delta)),
        lower_bound=bound,
        event=(
            f"{cut} (T = <sign(U e_0), decoded coordinate totals>, encoded units, bins of {width}; "
            f"E[T] {-shift:+.6g} (D0), {shift:+.6g} (D1), sd {statistic_sd(params):.0f})"
        ),
        confidence=confidence,
        seconds=time.perf_counter() - started,
        count_hit=hits,
        count_other=other,
    )


def vector_summation_rounds(params: VectorSumParams, quick: bool) -> int:
    """Rounds per sample of a vector row: ``min(cap, shares // (n D M))`` (:data:`VECTOR_ROUNDS`), at least 100.

    Default: 2,757 rounds at ``n = 100``, ``dim = 16``, ``eps = 4`` (``M = 17``) and 13,392 at
    ``dim = 4``, ``eps = 1`` (``M = 14``); quick: 100 and 214."""
    if not isinstance(params, VectorSumParams):
        raise InvalidParameter("params", f"must be VectorSumParams, got {type(params).__name__}")
    cap, shares = VECTOR_ROUNDS[bool(quick)]
    return max(100, min(cap, shares // (params.users * params.messages_per_user)))



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
    settings: tuple[tuple[int, float] | tuple[int, float, int], ...] = SUMMATION_SETTINGS,
    rounds: int | None = None,
    familywise: bool = True,
    family_alpha: float = 0.05,
) -> list[dict[str, Any]]:
    """The summation audit's rows for ``shuffledp audit``: one :func:`audit_summation` per ``(n, epsilon)``
    and one :func:`audit_vector_summation` per ``(n, epsilon, dim)``.

    Rounds per sample: :func:`summation_rounds` / :func:`vector_summation_rounds`
    (``quick``: about a tenth), or ``rounds``. With ``familywise`` each row runs at
    confidence ``1 - family_alpha / rows``, so a correct implementation fails the whole table
    with probability at most ``family_alpha`` (the scalar claim is tight: module docstring;
    ``shuffledp audit`` passes its share of the audit's budget); otherwise 95 % per row. Each row is :meth:`~shuffledp.audit.shuffled.ShuffledAudit.as_dict`
    (``epsilon0`` is the round's central target, ``exact_epsilon`` the scalar noise's own
    epsilon or the vector statistic's exact epsilon) plus the round's ``precision`` (vector:
    ``levels``, grid units per radius), ``modulus`` and ``messages`` (vector: per
    coordinate), and for vector rows ``dim``; ``progress(label, 1)`` is called after each row.
    """
    if not settings:
        raise InvalidParameter("settings", "must list at least one (n, epsilon) or (n, epsilon, dim)")
    for setting in settings:
        if not isinstance(setting, tuple) or len(setting) not in (2, 3):
            raise InvalidParameter("settings", f"each must be (n, epsilon) or (n, epsilon, dim), got {setting!r}")
    if not 0.0 < family_alpha < 0.5:
        raise InvalidParameter("family_alpha", f"must be in (0, 0.5), got {family_alpha!r}")
    confidence = 1.0 - family_alpha / len(settings) if familywise else 0.95
    out: list[dict[str, Any]] = []
    for setting in settings:
        if len(setting) == 2:
            n, epsilon = setting
            r = rounds if rounds is not None else summation_rounds(n, quick)
            result = audit_summation(n, epsilon, delta, rounds=r, confidence=confidence, seed=seed)
            params = summation_claim(n, float(epsilon), delta)[0].params
            row = result.as_dict()
            row.update(precision=params.precision, modulus=params.modulus, messages=params.messages)
            label = f"summation n={n} eps={epsilon:g}"
        else:
            n, epsilon, dim = setting
            _check_common(n, epsilon, delta, 100 if rounds is None else rounds, confidence, seed)
            _check_vector_args(dim, VECTOR_RADIUS)
            vector = vector_summation_claim(n, float(epsilon), delta, dim, VECTOR_RADIUS, seed)[0].params
            r = rounds if rounds is not None else vector_summation_rounds(vector, quick)
            result = audit_vector_summation(n, epsilon, delta, dim=dim, rounds=r, confidence=confidence, seed=seed)
            row = result.as_dict()
            row.update(precision=vector.levels, modulus=vector.modulus, messages=vector.messages, dim=dim)
            label = f"vector summation n={n} dim={dim} eps={epsilon:g}"
        out.append(row)
        if progress:
            progress(label, 1)
    return out
