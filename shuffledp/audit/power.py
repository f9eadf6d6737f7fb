"""When a lower bound of 0 means "no power": how many runs the event test needs.

Every lower bound of the audit (:func:`shuffledp.audit.local.epsilon_lower_bound`, used
by the local, shuffled and summation parts) comes from one event ``E`` counted in ``N``
runs of each of two neighbouring inputs: ``k1`` hits where ``E`` is favoured (rate ``p``)
and ``k2`` where it is not (rate ``q``). With ``alpha = 1 - confidence`` the bound is

    ``eps_lb = ln((p_lo - delta) / q_hi)``, or 0 when that is not positive,

``p_lo`` the one-sided Clopper–Pearson lower bound of ``k1 / N`` and ``q_hi`` the
one-sided upper bound of ``k2 / N``, each at ``1 - alpha / 2``. It is positive exactly
when ``p_lo - delta > q_hi``: when the lower confidence bound of the event's probability
ratio, ``(p_lo - delta) / q_hi``, exceeds 1. A row whose bound is 0 has **no power**: it
neither confirms nor refutes its claim.

Runs needed (:func:`runs_needed`)
---------------------------------
With the normal approximation of both Clopper–Pearson ends, ``p_lo ~ p_hat - z_a s_p /
sqrt N`` and ``q_hi ~ q_hat + z_a s_q / sqrt N`` (``s_p = sqrt(p (1 - p))``,
``s_q = sqrt(q (1 - q))``, ``z_a`` the standard normal quantile at ``1 - alpha / 2``), and
``p_hat - q_hat ~ Normal(p - q, (s_p^2 + s_q^2) / N)``. The bound is positive with
probability at least ``power`` when

    ``N >= N0 = ((z_a (s_p + s_q) + z_b sqrt(s_p^2 + s_q^2)) / (p - q - delta))^2``,

``z_b`` the normal quantile at ``power``; none suffices when ``p <= q + delta``. Clopper–Pearson
is more conservative than the normal approximation (most for rare events), so
:func:`runs_needed` starts at ``ceil(N0)`` and steps up by 2 % until the *exact* power
(:func:`detection_power`) reaches ``power``.

:func:`detection_power` is exact: ``K1 ~ Bin(N, p)`` and ``K2 ~ Bin(N, q)`` are independent,
and ``p_lo(k1) > t`` holds iff ``P(Bin(N, t) >= k1) < alpha / 2`` (the Beta–binomial
identity behind Clopper–Pearson), so for each ``k2`` the bound is positive iff ``K1`` is at
least ``binom.isf(alpha / 2, N, q_hi(k2) + delta) + 1``; the power is the sum of these tail
probabilities over the law of ``K2`` (in cells of ``K2``, each at its least favourable
value, when the law spans more than 20,000 counts: a lower bound on the power).

Which rates (:func:`rates_at_claim`, :func:`power_fields`)
----------------------------------------------------------
A row reports two figures, both in runs per input (the row's ``trials`` or ``rounds``):

* ``runs_needed``: at the rates of code that leaks *exactly its claim* on the row's event,
  ``q = k2 / N`` (the rate the claim constrains) and ``p = min(1, e^eps q + delta)``
  (``q = (k1 / N - delta) e^-eps`` when ``k2 = 0``; none when the event was never seen).
  Fewer runs cannot show even a leak at the claim: the row had no power to say anything.
  At least that many, and the bound is still 0, means the code leaks less than its
  claim on this event (a loose claim or a weak event).
* ``runs_needed_observed``: at the observed rates ``k1 / N``, ``k2 / N`` (None when
  ``k1 / N <= k2 / N + delta``: no leak seen on this event, at any size).

Both are at :data:`POWER`: the bound is positive with that probability.
``tests/audit/test_audit_power.py`` checks ``runs_needed`` by simulation at the claimed
epsilon.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

__all__ = ["MAX_RUNS", "POWER", "detection_power", "power_fields", "power_note", "rates_at_claim", "runs_needed"]

#: The probability of a positive lower bound that ``runs_needed`` is for.
POWER = 0.9
#: Above this many runs per input, :func:`runs_needed` returns the normal approximation unrefined.
MAX_RUNS = 10**13
# Cells of K2's law evaluated by detection_power (beyond: coarser cells, conservatively).
_CELLS = 20_000


def _check(p: float, q: float, delta: float, confidence: float, power: float | None = None) -> None:
    for name, value in (("p", p), ("q", q), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 <= float(value) <= 1.0:
            raise InvalidParameter(name, f"must be a probability, got {value!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) or not 0.0 < confidence < 1.0:
        raise InvalidParameter("confidence", f"must be in (0, 1), got {confidence!r}")
    if power is not None and (isinstance(power, bool) or not isinstance(power, (int, float)) or not 0.0 < power < 1.0):
        raise InvalidParameter("power", f"must be in (0, 1), got {power!r}")


def detection_power(p: float, q: float, runs: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The exact probability that the event bound is positive with ``runs`` runs per input (module docstring).

    ``p``, ``q``: the event's rates under the favoured and the other input; ``delta`` and
    ``confidence`` as in :func:`shuffledp.audit.local.epsilon_lower_bound`."""
    from scipy.stats import binom

    _check(p, q, delta, confidence)
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 1:
        raise InvalidParameter("runs", f"must be a positive integer, got {runs!r}")
    n = int(runs)
    half = (1.0 - confidence) / 2.0
    lo = int(binom.ppf(1e-13, n, q)) if q > 0 else 0
    hi = int(binom.isf(1e-13, n, q)) if q > 0 else 0
    hi = max(lo, min(hi, n))
    step = max(1, math.ceil((hi - lo + 1) / _CELLS))
    right = np.minimum(np.arange(lo + step - 1, hi + step, step), hi)  # each cell's largest k2 (the worst)
    left = np.concatenate(([lo], right[:-1] + 1))
    mass = binom.cdf(right, n, q) - binom.cdf(left - 1, n, q)
    # q_hi(k2): Beta^-1(1 - alpha/2; k2 + 1, n - k2), 1 at k2 = n
    from scipy.stats import beta

    q_hi = np.where(right < n, beta.ppf(1.0 - half, right + 1.0, np.maximum(n - right, 1.0)), 1.0)
    t = q_hi + delta
    ok = t < 1.0
    k_star = np.where(ok, binom.isf(half, n, np.where(ok, t, 0.5)) + 1.0, np.inf)
    tail = np.where(np.isfinite(k_star), binom.sf(np.where(np.isfinite(k_star), k_star, 0.0) - 1.0, n, p), 0.0)
    return float(min(1.0, max(0.0, np.sum(mass * tail))))


def runs_needed(p: float, q: float, delta: float = 0.0, confidence: float = 0.95, power: float = POWER) -> int | None:
    """Runs per input with which the event bound is positive with probability ``power``; None if no number does.

    ``N0 = ((z_a (s_p + s_q) + z_b sqrt(s_p^2 + s_q^2)) / (p - q - delta))^2`` with
    ``s = sqrt(r (1 - r))``, ``z_a = Phi^-1(1 - (1 - confidence) / 2)``, ``z_b = Phi^-1(power)``
    (module docstring), then raised in steps of 2 % until :func:`detection_power` reaches
    ``power`` (above :data:`MAX_RUNS`: ``ceil(N0)`` as is). None when ``p <= q + delta``.
    """
    from scipy.stats import norm

    _check(p, q, delta, confidence, power)
    gap = float(p) - float(q) - float(delta)
    if gap <= 0.0:
        return None
    s_p, s_q = math.sqrt(p * (1.0 - p)), math.sqrt(q * (1.0 - q))
    z_a, z_b = float(norm.ppf(1.0 - (1.0 - confidence) / 2.0)), float(norm.ppf(power))
    n = max(1, math.ceil(((z_a * (s_p + s_q) + z_b * math.hypot(s_p, s_q)) / gap) ** 2))
    for _ in range(400):
        if n > MAX_RUNS or detection_power(p, q, n, delta, confidence) >= power:
            return n
        n = math.ceil(n * 1.02) + 1
    return n


def rates_at_claim(hits: int, other: int, runs: int, epsilon: float, delta: float) -> tuple[float, float] | None:
    """``(p, q)``: the event's rates if the code leaked exactly ``(epsilon, delta)`` on it (module docstring).

    ``q = other / runs`` and ``p = min(1, e^epsilon q + delta)``; when ``other = 0``,
    ``q = (hits / runs - delta) e^-epsilon``. None when that leaves ``q = 0`` (the event
    was not seen: there is nothing to scale)."""
    q = other / runs if other > 0 else max(0.0, hits / runs - delta) * math.exp(-epsilon)
    if q <= 0.0:
        return None
    return min(1.0, math.exp(epsilon) * q + delta), q


def power_fields(lower_bound: float, hits: int | None, other: int | None, runs: int, epsilon: float, delta: float,
                 confidence: float, power: float = POWER) -> dict[str, Any]:
    """The power fields of one audit row: ``no_power``, ``runs_needed``, ``runs_needed_observed``, ``power``,
    ``power_detail`` (why ``runs_needed`` is None for a no-power row, else "").

    ``no_power``: the row's lower bound is 0. The two run counts (per input, the row's own
    unit) are computed for no-power rows only (None otherwise, and when not computable):
    ``runs_needed`` at :func:`rates_at_claim`, ``runs_needed_observed`` at the observed
    rates; ``power`` is the probability of a positive bound they are for."""
    out: dict[str, Any] = {"no_power": not lower_bound > 0.0, "runs_needed": None, "runs_needed_observed": None,
                           "power": power, "power_detail": ""}
    if not out["no_power"]:
        return out
    if hits is None or other is None or runs < 1:
        out["power_detail"] = "the event's counts were not recorded: no estimate of the runs needed"
        return out
    claim = rates_at_claim(hits, other, runs, epsilon, delta)
    if claim is not None:
        out["runs_needed"] = runs_needed(claim[0], claim[1], delta, confidence, power)
    out["runs_needed_observed"] = runs_needed(hits / runs, other / runs, delta, confidence, power)
    if claim is None:
        out["power_detail"] = "the event never occurred in the evaluation runs: no estimate of the runs needed"
    elif out["runs_needed"] is None:
        out["power_detail"] = (f"no event separated the inputs on the selection sample (the chosen one holds in "
                               f"{other / runs:.0%} of the runs): more runs for the selection, no estimate of how many")
    return out


def _runs(value: int | None) -> str:
    return "-" if value is None else (f"{value:,}" if value < 10**7 else f"{value:.2g}")


def power_note(row: dict[str, Any], unit: str, claimed: float) -> str | None:
    """What a row with no power says (None for a row with power): the runs it used, and the runs with
    which a leak at the claim, and one at the observed rates, would give a positive bound."""
    if not row.get("no_power"):
        return None
    power = f"{row.get('power', POWER) * 100:.0f} %"
    used = row.get("trials", row.get("rounds"))
    if row.get("runs_needed") is None:
        return f"no power at {_runs(used)} {unit}: {row.get('power_detail', '')}"
    at_claim = f"a leak at the claim (eps {claimed:.4g}) would show ({power}) from {_runs(row['runs_needed'])} {unit}"
    observed = (f"at the observed rates from {_runs(row['runs_needed_observed'])}"
                if row.get("runs_needed_observed") is not None else "the observed rates show no leak on this event")
    return f"no power at {_runs(used)} {unit}: {at_claim}; {observed}"
