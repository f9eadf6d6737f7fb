"""How often the range round fails, and how often the analyzer's own check says so, over many seeds.

A simulation knows what the analyzer cannot: whether the announced range holds the
true mean. Over ``seeds`` runs of the scalar range -> mean protocol on the vectorized
engine (the engines see the same reports, ``tests/simulation/test_engine.py``), each run is
classified by the truth (*failed*: the announced range misses the true mean) and by
the analyzer's two-round verdict (:mod:`shuffledp.analyzer.range_check`: reported
*untrusted* or not; counted as ``warned``):

* ``missed``: failed and reported trusted. For a range holding no user the verdict bounds
  the joint probability, P(the range holds no user AND it is reported trusted), by its
  ``alpha`` (0.001) plus ``gamma`` (the frequency test and the mean round's sign test
  combined: the module's docstring); a range that misses the mean but holds users is not covered;
* ``silent_misses``: the range held no user and was reported trusted, the very event whose
  probability the verdict bounds by ``alpha + gamma``;
* ``false warnings``: reported untrusted though the range held the mean: the price of a
  verdict that only trusts a range shown to hold users. How few any valid verdict can give is
  :mod:`shuffledp.studies.range_limit`'s Neyman–Pearson limit.

Rates carry Clopper–Pearson 95 % intervals. ``shuffledp simulate --seeds K`` prints
one study; ``benchmarks/bench_range_check.py`` sweeps n and plots them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class RangeStudy:
    """Counts over ``runs`` seeds, and the errors of the estimates in standard errors."""

    runs: int
    failed: int
    held_none: int
    warned: int
    missed: int
    false_warnings: int
    #: Largest |error| / reported standard error among runs not warned, and among warned ones.
    worst_unwarned_z: float
    worst_warned_z: float
    config: dict[str, Any]
    #: The same counts for the range round's frequency test alone (alpha = 0.01), for comparison.
    frequency_only_missed: int = 0
    frequency_only_false_warnings: int = 0
    #: Runs whose range held no user and that were reported trusted: the event the verdict's level bounds.
    silent_misses: int = 0
    #: The Neyman–Pearson limit on false warnings (:mod:`shuffledp.studies.range_limit`), if asked for.
    limit: dict[str, Any] | None = None

    def rate(self, count: int) -> tuple[float, float, float]:
        """``(rate, low, high)``: the fraction of runs and its Clopper–Pearson 95 % interval."""
        from shuffledp.audit.local import clopper_pearson

        low, high = clopper_pearson(count, self.runs, 0.95)
        return count / self.runs, low, high

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("failed", "held_none", "warned", "missed", "false_warnings", "frequency_only_missed",
                     "frequency_only_false_warnings", "silent_misses"):
            rate, low, high = self.rate(getattr(self, name))
            out[f"{name}_rate"] = {"rate": rate, "ci95": [low, high]}
        return out


def range_study(config, seeds: int, first_seed: int = 0, progress: Progress | None = None,
                with_limit: bool = False) -> RangeStudy:
    """Run ``config`` (a :class:`~shuffledp.simulation.SimulationConfig`, fast path) with ``seeds``
    seeds and classify every run (module docstring). No accounting is run: only the estimates.
    ``with_limit``: also the Neyman–Pearson limit over as many Monte Carlo runs for each of its two
    nulls (users at one point, spread over three bins; the larger is kept), ``2 seeds`` more progress steps."""
    from shuffledp.analyzer.scalar_mean import ScalarMeanProtocol
    from shuffledp.simulation.engine import run_fast
    from shuffledp.simulation.scalar import _local_means

    if not (isinstance(seeds, int) and seeds >= 1):
        raise InvalidParameter("seeds", f"must be an integer >= 1, got {seeds!r}")
    protocol = ScalarMeanProtocol(config.protocol_config())
    failed = held_none = warned = missed = false_warnings = frequency_missed = frequency_false = silent = 0
    worst = {True: 0.0, False: 0.0}
    for seed in range(first_seed, first_seed + seeds):
        run_config = dataclasses.replace(config, seed=seed, path="fast", broker=None)
        means, true_mean = _local_means(run_config, None)
        outcome = run_fast(protocol, means, seed).result
        found = outcome.found_range
        is_failed = not (found.lower <= true_mean <= found.upper)
        is_warned = not outcome.range_check.ok
        failed += is_failed
        holds_none = not np.any((means >= found.lower) & (means <= found.upper))
        held_none += holds_none
        silent += holds_none and not is_warned
        warned += is_warned
        missed += is_failed and not is_warned
        false_warnings += is_warned and not is_failed
        check = outcome.range_check  # its round-1 figures are the frequency test's own
        frequency_ok = check.range_p_value <= check.alpha
        frequency_missed += is_failed and frequency_ok
        frequency_false += not frequency_ok and not is_failed
        z = abs(outcome.mean.estimate - true_mean) / outcome.mean.standard_error
        worst[is_warned] = max(worst[is_warned], z if math.isfinite(z) else math.inf)
        if progress:
            progress("seeds", 1)
    summary = {"n": config.n, "epsilon0": config.epsilon0, "bound": config.population.bound,
               "tau": config.radius, "m": config.population.m, "first_seed": first_seed, "noise": config.noise,
               "delta0": config.delta0}
    limit = None
    if with_limit:
        from shuffledp.studies.range_limit import neyman_pearson_limit

        limits = [neyman_pearson_limit(config, seeds, first_seed + 10**6, progress=progress, spread=spread) for spread in (1, 3)]
        limit = max(limits, key=lambda one: one.must_warn).as_dict()
    return RangeStudy(seeds, failed, held_none, warned, missed, false_warnings, worst[False], worst[True], summary,
                      frequency_missed, frequency_false, silent, limit)


def format_study(study: RangeStudy) -> str:
    c = study.config
    lines = [f"range round over {study.runs} seeds (n = {c['n']:,}, eps0 = {c['epsilon0']:g}, B = {c['bound']:g}, "
             f"tau = {c['tau']:.4g}, m = {c['m']}, {c.get('noise', 'laplace')} noise; fast engine)"]
    for label, name in (("range missed the true mean", "failed"), ("range held no user", "held_none"),
                        ("reported untrusted", "warned"), ("missed (failed, reported trusted)", "missed"),
                        ("silent (held no user, trusted)", "silent_misses"),
                        ("false warnings (held, untrusted)", "false_warnings"),
                        ("range round's test alone: missed", "frequency_only_missed"),
                        ("range round's test alone: false", "frequency_only_false_warnings")):
        count = getattr(study, name)
        rate, low, high = study.rate(count)
        lines.append(f"  {label:<32} {count:>6} / {study.runs}  ({100 * rate:5.1f} %, 95 % CI {100 * low:.1f}-{100 * high:.1f} %)")
    if study.limit is not None:
        low, high = study.limit["must_warn_rate"]["ci95"]
        lines.append(f"  {'fewest any valid check can give':<32} {study.limit['must_warn']:>6} / {study.limit['runs']}  "
                     f"({100 * study.limit['must_warn_rate']['rate']:5.1f} %, 95 % CI {100 * low:.1f}-{100 * high:.1f} %; "
                     f"false warnings at level {study.limit['alpha']:g}, Neyman-Pearson, null users over "
                     f"{study.limit['spread']} bin(s))")
    lines.append(f"  worst |error| / standard error: {study.worst_unwarned_z:.1f} where trusted, "
                 f"{study.worst_warned_z:.1f} where untrusted")
    return "\n".join(lines)


__all__ = ["RangeStudy", "format_study", "range_study"]
