"""User-level private SGD in the shuffle model (Girgis, Data & Diggavi, Algorithm 6 / Theorem 5).

Mechanism (one step ``t`` of ``T``; logistic regression, model dimension ``p``):

1. **Cohort.** Every one of the ``N`` users joins independently with probability
   ``q = k / N`` (Poisson sampling; the paper samples a fixed-size set, the accountant
   handles both, we use Poisson).
2. **User gradient.** A sampled user computes the average gradient of its ``m`` samples'
   logistic losses at the current model and clips it to l2 norm ``C`` (user-level
   clipping of the average: the bound is per user; Algorithm 6 line 7 clips each sample's
   gradient, which also bounds the average by ``C``). Every contribution has norm ``<= C``.
3. **Vector mean protocol.** The cohort's clipped gradients go through Algorithm 5
   (:class:`~shuffledp.analyzer.vector_mean.VectorMeanProtocol`) on the fast engine
   (:func:`shuffledp.simulation.engine.run_fast`), with a fresh public rotation and engine seed per
   step: a range round at ``eps0/2`` and a mean round (projected discrete Laplace, pure,
   as Appendix D-A requires for amplification) at ``eps0/2``, each report shuffled.
   Data bound: every rotated coordinate satisfies ``|(U g)_l| <= ||g||_2 <= C`` (``U`` is
   orthonormal), so ``rotated_bound = C``. Concentration radius: the per-coordinate radius
   that holds for *any* vectors of norm ``<= C`` around the centre 0 is
   ``tau' = min(C, C sqrt(2 log(2 k D / gamma) / D))`` (the rotation lemma: a rotated
   coordinate of a fixed vector is ``||g||^2/D``-sub-Gaussian over the random signs; union
   bound over the ``k D`` coordinates; the rotation is drawn after the model, so it is
   independent of the gradients). For ``D <= 32`` and realistic ``k`` this is ``C``
   itself, and the range round would have one bin, announcing ``[-3C, 3C]`` whatever the
   data: it is then skipped (``VectorMeanConfig.range_round``) and the mean round gets the
   whole ``eps0`` over ``[-C, C]`` (a sixth of the interval at twice the budget: a twelfth
   of the Laplace scale); the accountant is told (``step_has_range_round``). Algorithm 6 line 10's
   ``tau = C sqrt(log(2n/gamma)) / m`` needs i.i.d. samples across users and is not used:
   for bounded per-sample gradients the valid l2 radius of a mean of ``m`` is
   ``C (1 + sqrt(2 log(k/gamma))) / sqrt(m)`` (McDiarmid), which is above ``C`` until
   ``m`` is in the hundreds. ``rotated_tau`` can be overridden: tau affects only the
   accuracy (clipping bias), never the privacy, since reports are projected onto the
   announced range whatever the data.
4. **Update.** ``theta <- theta - lr (momentum buffer)``, the buffer being the analyzer's
   mean estimate (plus ``l2 theta``); optionally projected onto a ball (Algorithm 6 line
   12); the model released is the average of the last ``tail_average`` fraction of
   iterates. All of this is post-processing of the shuffled reports.

Guarantees:

* **Local** (against the analyzer without the shuffler): each participation is pure
  user-level ``eps0``-LDP (Theorem 5's "``(eps0, 0)``-LDP per iteration"); over the run a
  user who participates ``s`` times is ``s eps0``-LDP (basic composition; ``s <= T``,
  ``E s = q T``).
* **Central** (shuffle model): each round's local guarantee is the one
  :func:`shuffledp.audit.claim.round_guarantee` gives vector rounds (generic pure
  ``eps0/2``-LDP: Feldman-McMillan-Talwar 2021 and the variation-ratio / Girgis et al.
  RDP bounds of the session accountant); the two rounds of a step share the cohort, so
  the step is subsampled *jointly* (:class:`~shuffledp.protocol.accounting.steps.SubsampledStepAccountant`:
  PLD of the composed shuffled rounds, Balle-Barthe-Gaboardi amplification by Poisson
  subsampling, ``T``-fold PLD composition; RDP route with Wang-Balle-Kasiviswanathan).
  Theorem 5's closed form ``eps = O(eps0 sqrt(q T log(2qT/delta) log(2/delta) / n))`` has
  unspecified constants and is not evaluated; the numerical accountant replaces it.

Baselines on the same data and optimizer: **non-private** (the cohort's unclipped mean
gradient) and **central user-level DP-SGD** (clipped user gradients summed, Gaussian noise
``N(0, sigma^2 C^2 I)``, divided by the expected cohort ``k``; Poisson-subsampled Gaussian
accounted with dp-accounting's PLD accountant, ``sigma``
calibrated to the same ``(eps, delta)``). Both are accounted for the same neighbouring relation:
one user's whole data replaced in a fixed population of ``N`` users (the relation the session
accountant's shuffle and subsampling bounds are for; under add/remove-one the central
baseline would need about half the noise).

Hyper-parameters (lr, C, T, k) are chosen by the caller; their tuning is not accounted.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.vector_mean import VectorMeanAccumulator, VectorMeanConfig, VectorMeanProtocol
from shuffledp.simulation.engine import EngineRun, run_fast
from shuffledp.learning.data import UserDataset
from shuffledp.protocol.accounting.guarantees import LocalGuarantee, generic_guarantee, laplace_mean_guarantee
from shuffledp.protocol.accounting.steps import SubsampledStepAccountant
from shuffledp.protocol.errors import InvalidParameter

Progress = Callable[[str, int], None]
METHODS = ("uldp-shuffle", "central", "nonprivate")
#: Failure probability of the rotation-lemma radius (per step).
DEFAULT_GAMMA = 1e-6
#: Grid size of each step's Laplace mean reports (the accountant's blanket bound depends on it).
STEP_GRID_LEVELS = 4096
#: dp-accounting PLD grid for the central baseline (pessimistic rounding: an upper bound;
#: 1e-3 instead of the default 1e-4 makes calibration ~10x faster for +0.02 in epsilon at T = 1000).
CENTRAL_PLD_INTERVAL = 1e-3


# ----------------------------------------------------------------- the model
def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def user_gradients(theta: np.ndarray, features: np.ndarray, labels: np.ndarray, l2: float = 0.0) -> np.ndarray:
    """Each user's average logistic-loss gradient over its samples: ``(k, m, p), (k, m) -> (k, p)``."""
    residual = sigmoid(features @ theta) - labels
    grads = np.einsum("km,kmp->kp", residual, features) / features.shape[1]
    return grads + l2 * theta if l2 else grads


def clip_rows(vectors: np.ndarray, clip: float) -> np.ndarray:
    """Scale every row to l2 norm at most ``clip`` (rows already inside are unchanged)."""
    if not (math.isfinite(clip) and clip > 0):
        raise InvalidParameter("clip", f"must be finite and > 0, got {clip}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(1.0, norms / clip)


def accuracy(theta: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean((features @ theta > 0) == (labels > 0.5)))


def logistic_loss(theta: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float:
    z = features @ theta
    return float(np.mean(np.logaddexp(0.0, z) - labels * z))


# ----------------------------------------------------------- the protocol step
def rotated_radius(clip: float, padded_dim: int, cohort: int, gamma: float = DEFAULT_GAMMA) -> float:
    """Per-coordinate radius around 0 of the rotated coordinates of ``cohort`` vectors of norm ``<= clip``
    (w.p. ``>= 1 - gamma`` over the rotation; never above ``clip``, which holds surely)."""
    if not 0 < gamma < 1:
        raise InvalidParameter("gamma", f"must be in (0, 1), got {gamma}")
    return min(clip, clip * math.sqrt(2.0 * math.log(2.0 * cohort * padded_dim / gamma) / padded_dim))


def step_vector_config(
    dim: int,
    clip: float,
    epsilon0: float,
    cohort: int,
    rotation_seed: int,
    *,
    gamma: float = DEFAULT_GAMMA,
    rotated_tau: float | None = None,
    mode: str = "sampled",
) -> VectorMeanConfig:
    """Algorithm 5's public parameters for one step (see the module docstring for bound and tau)."""
    if not (math.isfinite(clip) and clip > 0):
        raise InvalidParameter("clip", f"must be finite and > 0, got {clip}")
    padded = VectorMeanConfig(dim, 1.0, 1.0, epsilon0, mode=mode, rotation_seed=rotation_seed).padded_dim
    tau = rotated_radius(clip, padded, max(2, cohort), gamma) if rotated_tau is None else float(rotated_tau)
    return VectorMeanConfig(dim, clip, tau, epsilon0, noise="laplace", mode=mode, rotation_seed=rotation_seed,
                            grid_levels=STEP_GRID_LEVELS)


def privatize_mean(clipped: np.ndarray, config: VectorMeanConfig, seed: int) -> tuple[np.ndarray, EngineRun]:
    """The cohort's mean through Algorithm 5 on the fast engine: ``(estimate, run)``."""
    run = run_fast(VectorMeanProtocol(config), clipped, seed)
    return run.result.estimate, run


def exact_error_model(clipped: np.ndarray, config: VectorMeanConfig, ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean the estimate is unbiased for, per-coordinate variance)`` given the announced ranges
    (``VectorMeanAccumulator``'s exact error model; the first equals the true mean when no
    rotated coordinate is outside its range)."""
    acc = VectorMeanAccumulator(config, np.asarray(ranges, dtype=np.float64))
    acc.add_truth(config.rotation.apply(clipped))
    acc.n = len(clipped)
    return acc.projected_mean(), acc.variance()


def step_guarantees(epsilon0: float, range_round: bool = True) -> list[LocalGuarantee]:
    """Local guarantees of a step's rounds, as :func:`shuffledp.audit.claim.round_guarantee` rules:
    the ``vector-range`` round (generic) and the ``vector-mean`` Laplace round on
    :data:`STEP_GRID_LEVELS` levels (its privacy-blanket bound applies) at ``eps0/2`` each; with
    no range round (one bin, :attr:`VectorMeanConfig.range_round`) the mean round alone at ``eps0``."""
    if not range_round:
        return [laplace_mean_guarantee(epsilon0, STEP_GRID_LEVELS)]
    return [generic_guarantee(epsilon0 / 2.0), laplace_mean_guarantee(epsilon0 / 2.0, STEP_GRID_LEVELS)]


def step_has_range_round(dim: int, clip: float, cohort: int, *, gamma: float = DEFAULT_GAMMA, rotated_tau: float | None = None) -> bool:
    """Whether a step's vector protocol runs its range round (more than one bin over ``[-C, C]``):
    public, fixed for a run, and what the accountant must be told."""
    return step_vector_config(dim, clip, 1.0, cohort, 0, gamma=gamma, rotated_tau=rotated_tau).range_round


def executed_guarantees(run: EngineRun) -> list[LocalGuarantee | None]:
    """:func:`~shuffledp.audit.claim.plan_guarantee` of each round a run actually executed."""
    from shuffledp.audit.claim import plan_guarantee

    return [plan_guarantee(r.plan.params, r.plan.epsilon0) for r in run.rounds]


# ------------------------------------------------------------------ accounting
def _check_schedule(users: int, cohort: int, steps: int) -> None:
    for name, value, low in (("users", users, 2), ("cohort", cohort, 2), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InvalidParameter(name, f"must be an integer >= {low}, got {value!r}")
    if cohort > users:
        raise InvalidParameter("cohort", f"must be <= users ({users}), got {cohort}")


def uldp_accountant(epsilon0: float, users: int, cohort: int, steps: int, *, range_round: bool = True) -> SubsampledStepAccountant:
    """The shuffle-model accountant of ``steps`` ULDP-SGD steps (cohorts Poisson-sampled at ``q = cohort/users``)."""
    _check_schedule(users, cohort, steps)
    rate = cohort / users
    return SubsampledStepAccountant(step_guarantees(epsilon0, range_round), cohort, None if cohort == users else rate, steps)


def uldp_privacy(epsilon0: float, users: int, cohort: int, steps: int, delta: float = 1e-5, *, range_round: bool = True) -> dict[str, Any]:
    """Session ``(eps, delta)`` in the shuffle model, and the local budgets, of a ULDP-SGD run."""
    acc = uldp_accountant(epsilon0, users, cohort, steps, range_round=range_round)
    b = acc.epsilon_breakdown(delta)
    q = cohort / users
    return {
        "model": "shuffle",
        "epsilon": min(b["pld"], b["rdp"]),
        "delta": delta,
        "epsilon_pld": b["pld"],
        "epsilon_rdp": b["rdp"],
        "epsilon0_per_step": epsilon0,
        "rounds_per_step": 2 if range_round else 1,
        "round_epsilon0": epsilon0 / 2.0 if range_round else epsilon0,
        "sampling_rate": q,
        "expected_participations": q * steps,
        "local_epsilon_expected_participations": q * steps * epsilon0,
        "local_epsilon_worst_case": steps * epsilon0,
        "method": "joint Poisson subsampling of the shuffled rounds of a step, PLD (min with RDP), T-fold composition",
    }


def calibrate_epsilon0(
    target_epsilon: float,
    users: int,
    cohort: int,
    steps: int,
    delta: float = 1e-5,
    *,
    low: float = 0.05,
    high: float = 30.0,
    rtol: float = 0.01,
    start: float = 2.0,
    range_round: bool = True,
) -> float:
    """Largest per-step ``eps0`` in ``[low, high]`` (within a factor ``1 + rtol``) whose session epsilon is
    ``<= target_epsilon``: a bracket grown geometrically from ``start``, then bisection in ``log eps0``
    (the session epsilon is non-decreasing in ``eps0``). Raises if even ``low`` exceeds the target."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise InvalidParameter("target_epsilon", f"must be finite and > 0, got {target_epsilon}")
    if not (0 < low <= start <= high <= 50):
        raise InvalidParameter("low", f"need 0 < low <= start <= high <= 50, got {low}, {start}, {high}")
    if not 0 < rtol < 1:
        raise InvalidParameter("rtol", f"must be in (0, 1), got {rtol}")

    def ok(e0: float) -> bool:
        return uldp_accountant(e0, users, cohort, steps, range_round=range_round).epsilon(delta) <= target_epsilon

    if ok(start):
        lo, hi = start, None
        while hi is None:
            if lo >= high:
                return high
            nxt = min(high, 2.0 * lo)
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = None, start
        while lo is None:
            if hi <= low:
                raise InvalidParameter("target_epsilon", f"{target_epsilon} is below the session epsilon at eps0 = {low}")
            nxt = max(low, hi / 2.0)
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
    assert lo is not None and hi is not None  # the bracket's two ends, found above
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _central_accountant():
    """dp-accounting's PLD accountant for the central baseline, with the *replace-one-user* relation:
    the shuffle accountant's relation (a fixed population of N users, one user's data replaced)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=CENTRAL_PLD_INTERVAL
    )


def central_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float = 1e-5) -> float:
    """Central user-level DP-SGD: ``T`` Poisson-subsampled Gaussian steps (dp-accounting PLD, replace one user)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps
    )
    acc = _central_accountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(target_epsilon: float, sampling_rate: float, steps: int, delta: float = 1e-5) -> float:
    """Smallest Gaussian noise multiplier with central session epsilon ``<= target_epsilon`` (dp-accounting)."""
    import dp_accounting

    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise InvalidParameter("target_epsilon", f"must be finite and > 0, got {target_epsilon}")
    if not 0 < sampling_rate <= 1:
        raise InvalidParameter("sampling_rate", f"must be in (0, 1], got {sampling_rate}")

    def event(sigma: float):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(sigma)), steps
        )

    return float(
        dp_accounting.calibrate_dp_mechanism(
            _central_accountant, event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(0.3, 50.0), tol=1e-3,
        )
    )


# -------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainingConfig:
    """Optimizer and sampling schedule shared by every method (``cohort``: expected cohort size k)."""

    steps: int
    cohort: int
    learning_rate: float
    clip: float = 1.0
    momentum: float = 0.0
    l2: float = 0.0
    radius: float | None = None
    tail_average: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, (int, np.integer)) or self.steps < 1:
            raise InvalidParameter("steps", f"must be an integer >= 1, got {self.steps!r}")
        if isinstance(self.cohort, bool) or not isinstance(self.cohort, (int, np.integer)) or self.cohort < 2:
            raise InvalidParameter("cohort", f"must be an integer >= 2, got {self.cohort!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise InvalidParameter("learning_rate", f"must be finite and > 0, got {self.learning_rate}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise InvalidParameter("clip", f"must be finite and > 0, got {self.clip}")
        if not 0 <= self.momentum < 1:
            raise InvalidParameter("momentum", f"must be in [0, 1), got {self.momentum}")
        if not (math.isfinite(self.l2) and self.l2 >= 0):
            raise InvalidParameter("l2", f"must be finite and >= 0, got {self.l2}")
        if self.radius is not None and not (math.isfinite(self.radius) and self.radius > 0):
            raise InvalidParameter("radius", f"must be finite and > 0, got {self.radius}")
        if not 0 < self.tail_average <= 1:
            raise InvalidParameter("tail_average", f"must be in (0, 1], got {self.tail_average}")


@dataclass
class TrainingResult:
    method: str
    accuracy: float
    last_iterate_accuracy: float
    test_loss: float
    seconds: float
    privacy: dict[str, Any]
    config: dict[str, Any]
    theta: np.ndarray = field(repr=False)
    #: Steps with fewer than two sampled users (nothing released).
    skipped_steps: int = 0
    #: ULDP steps whose range round left a coordinate without reports (the analyzer released nothing).
    failed_protocol_steps: int = 0
    mean_cohort: float = 0.0
    accuracy_trace: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["theta"] = self.theta.tolist()
        return out


def _step_seed(seed: int, step: int, purpose: int) -> int:
    return int(np.random.SeedSequence([seed, 0x56D, purpose, step]).generate_state(1, np.uint64)[0] >> 1)


def train(
    data: UserDataset,
    config: TrainingConfig,
    method: str,
    *,
    epsilon0: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    gamma: float = DEFAULT_GAMMA,
    rotated_tau: float | None = None,
    account: bool = True,
    trace_every: int = 0,
    progress: Progress | None = None,
) -> TrainingResult:
    """Train logistic regression with ``method`` in :data:`METHODS` (see the module docstring).

    ``uldp-shuffle`` needs ``epsilon0`` (local budget per step), ``central`` needs
    ``noise_multiplier``. With ``account`` the run's session ``(eps, delta)`` is computed.
    """
    if method not in METHODS:
        raise InvalidParameter("method", f"must be one of {METHODS}, got {method!r}")
    users = data.users
    if config.cohort > users:
        raise InvalidParameter("cohort", f"must be <= users ({users}), got {config.cohort}")
    if method == "uldp-shuffle":
        if epsilon0 is None:
            raise InvalidParameter("epsilon0", "uldp-shuffle needs the local budget per step")
        step_guarantees(epsilon0)  # validates eps0
    if method == "central" and not (noise_multiplier is not None and math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise InvalidParameter("noise_multiplier", f"central DP-SGD needs a finite noise multiplier >= 0, got {noise_multiplier}")
    started = time.perf_counter()
    q = config.cohort / users
    sampler = np.random.default_rng(np.random.SeedSequence([config.seed, 0xC0, 0x407]))
    noise_rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0x6A55]))
    p = data.dim
    theta = np.zeros(p)
    buffer = np.zeros(p)
    average = np.zeros(p)
    averaged = 0
    start_average = int(math.floor((1.0 - config.tail_average) * config.steps))
    skipped, cohort_total = 0, 0
    checked = False
    failed = 0
    estimate: np.ndarray | None = None
    trace: list[tuple[int, float]] = []
    for t in range(config.steps):
        members = np.flatnonzero(sampler.random(users) < q)
        cohort_total += len(members)
        if len(members) < 2:  # run_fast needs two users; the step releases nothing
            skipped += 1
        else:
            grads = user_gradients(theta, data.features[members], data.labels[members])
            if method == "nonprivate":
                estimate = grads.mean(axis=0)
            elif method == "central":
                assert noise_multiplier is not None  # checked above for central
                clipped = clip_rows(grads, config.clip)
                noise = noise_rng.normal(0.0, noise_multiplier * config.clip, size=p)
                estimate = (clipped.sum(axis=0) + noise) / config.cohort
            else:
                assert epsilon0 is not None  # checked above for uldp-shuffle
                clipped = clip_rows(grads, config.clip)
                vcfg = step_vector_config(p, config.clip, epsilon0, config.cohort, _step_seed(config.seed, t, 1),
                                          gamma=gamma, rotated_tau=rotated_tau)
                try:
                    estimate, run = privatize_mean(clipped, vcfg, _step_seed(config.seed, t, 2))
                except InvalidParameter as exc:
                    # Some rotated coordinate drew no range report (small cohorts): the analyzer
                    # cannot announce that range. Which coordinates users draw does not depend on
                    # their data, so skipping the step is post-processing; it is still accounted.
                    if exc.parameter != "reports":
                        raise
                    failed += 1
                    estimate = None
                if estimate is not None and not checked:  # the accountant's rounds are the ones executed
                    if executed_guarantees(run) != step_guarantees(epsilon0, vcfg.range_round):
                        raise AssertionError("executed rounds' guarantees differ from the accounted ones")
                    checked = True
            if estimate is not None:
                buffer = config.momentum * buffer + estimate + config.l2 * theta
                theta = theta - config.learning_rate * buffer
                if config.radius is not None:
                    norm = float(np.linalg.norm(theta))
                    if norm > config.radius:
                        theta *= config.radius / norm
        if t >= start_average:
            averaged += 1
            average += (theta - average) / averaged
        if trace_every and (t + 1) % trace_every == 0:
            trace.append((t + 1, accuracy(average if averaged else theta, data.test_features, data.test_labels)))
        if progress:
            progress(f"{method} training", 1)
    seconds = time.perf_counter() - started
    privacy: dict[str, Any] = {"model": "none"}
    if account and method == "uldp-shuffle":
        assert epsilon0 is not None  # checked above for uldp-shuffle
        range_round = step_has_range_round(data.dim, config.clip, config.cohort, gamma=gamma, rotated_tau=rotated_tau)
        privacy = uldp_privacy(epsilon0, users, config.cohort, config.steps, delta, range_round=range_round)
    elif account and method == "central":
        assert noise_multiplier is not None  # checked above for central
        privacy = {
            "model": "central", "delta": delta, "noise_multiplier": noise_multiplier, "sampling_rate": q,
            "epsilon": central_epsilon(noise_multiplier, q, config.steps, delta) if noise_multiplier > 0 else math.inf,
            "method": "dp-accounting PLD, Poisson-subsampled Gaussian, replace one user",
        }
    return TrainingResult(
        method=method,
        accuracy=accuracy(average, data.test_features, data.test_labels),
        last_iterate_accuracy=accuracy(theta, data.test_features, data.test_labels),
        test_loss=logistic_loss(average, data.test_features, data.test_labels),
        seconds=seconds,
        privacy=privacy,
        config={**asdict(config), "dataset": data.describe(), "epsilon0": epsilon0, "gamma": gamma, "rotated_tau": rotated_tau},
        theta=average,
        skipped_steps=skipped,
        failed_protocol_steps=failed,
        mean_cohort=cohort_total / config.steps,
        accuracy_trace=trace,
    )
