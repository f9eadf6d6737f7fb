"""The central ``(epsilon, delta)`` of a protocol's shuffled rounds, composed: one rule for every protocol.

A session is given as a **plan** (:func:`session_plan`, :func:`account_plan`; the schema is in
``docs/accounting.md``): a JSON object listing each round's mechanism, the local ``epsilon0`` and
``delta0`` of one report, the mechanism's parameters, the reports each user sends, the batch of
users it is shuffled among, and how users are sampled. One table, :func:`mechanism_rule`, says how
every mechanism's round is accounted (``shuffledp audit``'s :func:`shuffledp.audit.claim.plan_guarantee`
reads the same table); ``simulate``, ``vector`` and ``distribution`` print the plan they accounted
(``--json``), and ``shuffledp account --plan FILE`` re-derives their session epsilon from it.

Internally a protocol's rounds are groups ``(accounted_as, epsilon0, size, count[, n[, blocks, sampling]])``:
``count`` identical shuffled rounds, each amplified from the local guarantee :func:`round_guarantee`
names (``hadamard-response`` with ``size`` Hadamard rows, ``laplace-mean`` with ``size`` grid
levels, ``block-hadamard-response`` over ``size`` symbols in ``blocks`` blocks, or ``generic``
pure ``epsilon0``-LDP), each batch holding ``n`` reports. The session is composed two ways, both
upper bounds, and the smaller is reported:

* the session accountant (:class:`~shuffledp.protocol.accounting.session.SessionAccountant`:
  PLD composition of the rounds' ``delta(eps)`` curves, Doroshenko et al. 2022, and RDP
  composition, the smaller) at ``delta``;
* basic composition of the per-round bounds (:func:`~shuffledp.protocol.accounting.shuffle_round.shuffled_round`),
  each round at an equal share of ``delta`` (not offered when a round samples its users).

Should both exceed the local total ``sum(count * epsilon0)`` (a tiny ``n``), the local guarantee
is reported instead: the shuffled output is a post-processing of the users' ``epsilon0``-LDP
reports, so it is never worse.

The default central delta of every command and of the Python API is :func:`default_central_delta`.

The whole answer is kept in the accountant's on-disk cache (:mod:`.cache`, keyed on this
package's sources and the libraries' versions), and the accountant's modules are imported only
to compute a missing answer: a repeated simulation is accounted without loading scipy's
optimizers or dp-accounting.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from shuffledp.protocol.accounting.cache import cached
from shuffledp.protocol.errors import InvalidParameter

#: The local guarantees a round can be accounted as (:func:`round_guarantee`).
ACCOUNTED_AS = ("hadamard-response", "laplace-mean", "block-hadamard-response", "generic")

#: The default central delta is never larger than this ...
DELTA_CAP = 1e-6
#: ... and always below 1/n: n^-DELTA_EXPONENT.
DELTA_EXPONENT = 1.1
#: The rule, as ``--help`` and the docs state it.
DEFAULT_DELTA_RULE = "min(1e-6, n^-1.1), n the number of users"

#: What a session plan's ``format`` and ``version`` say (``docs/accounting.md``, "Session plans").
PLAN_FORMAT = "shuffledp-session-plan"
PLAN_VERSION = 1
#: Most rounds (and most composed reports per round) a plan may hold.
MAX_PLAN_ROUNDS = 1000
MAX_REPORTS_PER_USER = 1 << 20


def default_central_delta(n: int) -> float:
    """The default central delta for ``n`` users: ``min(1e-6, n^-1.1)``, for every command and the Python API.

    Below 1/n always (a mechanism that publishes one user's data at random is (0, 1/n)-DP, so a
    delta of 1/n or more promises nothing), and never more than 1e-6 (for small n, n^-1.1 alone
    would be as large as 1e-2: at n = 100 it is 6.3e-3, a 0.6 % chance of an unbounded loss)."""
    return min(DELTA_CAP, 1.0 / max(1, int(n)) ** DELTA_EXPONENT)


def check_central_delta(delta: Any, name: str = "delta") -> float:
    """``delta`` as a float if it is a number in (0, 1); else :class:`InvalidParameter` (before any work)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (0.0 < float(delta) < 1.0):
        raise InvalidParameter(name, f"must be a number in (0, 1), got {delta!r}")
    return float(delta)


def round_guarantee(accounted_as: str, epsilon0: float, size: int | None = None, blocks: int | None = None):
    """The local guarantee a shuffled round is amplified from: ``hadamard-response`` (``size`` Hadamard
    rows), ``laplace-mean`` (``size`` grid levels, or the mechanism's default for None),
    ``block-hadamard-response`` (``size`` symbols, ``blocks`` blocks), else ``generic`` pure
    ``epsilon0``-LDP (valid for every pure ``epsilon0``-LDP randomizer)."""
    from shuffledp.protocol.accounting.guarantees import (
        block_hadamard_response_guarantee,
        generic_guarantee,
        hadamard_response_guarantee,
        laplace_mean_guarantee,
    )

    if accounted_as in ("hadamard-response", "block-hadamard-response"):
        if size is None:
            raise InvalidParameter("size", f"{accounted_as} needs its size (Hadamard rows, or symbols)")
        if accounted_as == "hadamard-response":
            return hadamard_response_guarantee(epsilon0, size)
        return block_hadamard_response_guarantee(epsilon0, size, blocks)
    if accounted_as == "laplace-mean":
        return laplace_mean_guarantee(epsilon0, size)
    return generic_guarantee(epsilon0)


# --------------------------------------------------------------------------- the one rule table


def _int_param(params: Mapping[str, Any], name: str, mechanism: str, low: int = 1) -> int:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParameter(f"{mechanism} params.{name}", f"must be an integer >= {low}, got {value!r}")
    return value


def _noise(params: Mapping[str, Any], mechanism: str) -> str:
    noise = params.get("noise", "laplace")
    if noise not in ("laplace", "gaussian"):
        raise InvalidParameter(f"{mechanism} params.noise", f"must be 'laplace' or 'gaussian', got {noise!r}")
    return noise


#: Mechanisms whose rounds give no local guarantee to amplify: their (eps0, delta0) is already central
#: (summations: one user's shares reveal its value) or only approximate LDP (local Skellam noise).
UNAMPLIFIED = {
    "modular-sum": "a summation round: its (eps0, delta0) is central already (split-and-mix and the noise)",
    "vector-sum": "a summation round: its (eps0, delta0) is central already (split-and-mix and the noise)",
    "shifted-vector-sum": "a summation round: its (eps0, delta0) is central already (split-and-mix and the noise)",
    "local-vector": "local Skellam noise is (eps0, delta0)-LDP only: no amplification is claimed",
}


def mechanism_rule(mechanism: str, epsilon0: float, params: Mapping[str, Any] | None = None,
                   reports_per_user: int = 1) -> tuple[str, float, int | None, int, int | None] | str:
    """How a shuffled round of ``mechanism`` is accounted: ``(accounted_as, report_epsilon0, size, count, blocks)``,
    or, for a round no amplification is claimed for, the reason (a string). The one table: the
    simulations, ``shuffledp account --plan`` and the audit (:func:`shuffledp.audit.claim.plan_guarantee`) read it.

    ``epsilon0`` is the local epsilon of one report, ``reports_per_user`` the reports a user sends in
    the round (``count``: that many composed rounds of one report each, the reports being tagged
    by public coordinates).

    * ``hadamard-range``, ``shifted-norm`` (``padded_bins``): one-bit Hadamard response over
      ``max(2, padded_bins)`` rows (with one bin the report does not depend on the input, and the
      K = 2 guarantee, any valid bound, is used).
    * ``projected-mean``, ``vector-mean`` (``grid_levels``, ``noise``): Laplace noise, the projected
      discrete-Laplace report on ``grid_levels`` levels (``laplace-mean``: the generic bounds and the
      report's blanket; a uniformly drawn coordinate keeps the scalar report's blanket law); Gaussian
      noise is ``(eps0, delta0)``-LDP only: no amplification is claimed.
    * ``vector-range`` (``mode``): ``sampled``, one report about a coordinate drawn independently of
      the data, a ``generic`` pure eps0-LDP randomizer; ``paper``, ``reports_per_user`` reports, one per
      coordinate, each Hadamard response over ``max(2, padded_bins)`` rows: that many composed rounds.
    * ``coordinate-tree``: a coordinate and a level drawn independently of the data: ``generic``.
    * ``block-hadamard-response`` (``k``, ``blocks``): block Hadamard response over ``k`` symbols.
    * ``generic``: any pure eps0-LDP randomizer.
    * summations and ``local-vector``: no amplification (:data:`UNAMPLIFIED`).
    """
    params = dict(params or {})
    if isinstance(reports_per_user, bool) or not isinstance(reports_per_user, int) or not 1 <= reports_per_user <= MAX_REPORTS_PER_USER:
        raise InvalidParameter("reports_per_user", f"must be an integer in [1, {MAX_REPORTS_PER_USER}], got {reports_per_user!r}")
    if mechanism in UNAMPLIFIED:
        return UNAMPLIFIED[mechanism]
    if mechanism == "vector-range" and params.get("mode", "sampled") == "paper":
        bins = _int_param(params, "padded_bins", mechanism)
        return ("hadamard-response", epsilon0, max(2, bins), reports_per_user, None)
    if reports_per_user != 1:
        raise InvalidParameter("reports_per_user", f"{mechanism} sends one report per user, got {reports_per_user}")
    if mechanism in ("hadamard-range", "shifted-norm"):
        return ("hadamard-response", epsilon0, max(2, _int_param(params, "padded_bins", mechanism)), 1, None)
    if mechanism in ("projected-mean", "vector-mean"):
        if _noise(params, mechanism) != "laplace":
            return "Gaussian reports are (eps0, delta0)-LDP: no amplification is claimed"
        levels = params.get("grid_levels")
        return ("laplace-mean", epsilon0, None if levels is None else _int_param(params, "grid_levels", mechanism), 1, None)
    if mechanism == "vector-range":
        if params.get("mode", "sampled") != "sampled":
            raise InvalidParameter("vector-range params.mode", f"must be 'sampled' or 'paper', got {params.get('mode')!r}")
        return ("generic", epsilon0, None, 1, None)
    if mechanism in ("coordinate-tree", "generic"):
        return ("generic", epsilon0, None, 1, None)
    if mechanism == "block-hadamard-response":
        blocks = params.get("blocks")
        return ("block-hadamard-response", epsilon0, _int_param(params, "k", mechanism, 2), 1,
                None if blocks is None else _int_param(params, "blocks", mechanism))
    raise InvalidParameter("mechanism", f"no accounting rule for {mechanism!r}")


# --------------------------------------------------------------------------- plans


def plan_round(mechanism: str, epsilon0: float, params: Mapping[str, Any], batch: int, *, delta0: float = 0.0,
               reports_per_user: int = 1, sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One round of a session plan (``docs/accounting.md``): ``epsilon0``/``delta0`` of one report, the
    mechanism's ``params``, the ``reports_per_user``, the ``batch`` (users shuffled together) and the
    ``sampling`` of users (None: every user of the batch reports)."""
    return {"mechanism": str(mechanism), "epsilon0": float(epsilon0), "delta0": float(delta0), "params": dict(params),
            "reports_per_user": int(reports_per_user), "batch": int(batch),
            "sampling": None if sampling is None else dict(sampling)}


def session_plan(rounds: Sequence[Mapping[str, Any]], delta: float) -> dict[str, Any]:
    """A session plan: its rounds (:func:`plan_round`) and the central ``delta`` it is accounted at."""
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "delta": float(delta), "rounds": [dict(r) for r in rounds]}


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameter(name, f"must be a finite number, got {value!r}")
    return float(value)


def _plan_groups(plan: Mapping[str, Any]) -> tuple[list[tuple], list[str], float]:
    """``(groups, reasons, delta)``: the plan's amplified rounds as groups, and why any other round is not amplified."""
    if not isinstance(plan, Mapping):
        raise InvalidParameter("plan", "must be a JSON object")
    if plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
        raise InvalidParameter("plan", f"format/version must be {PLAN_FORMAT!r}/{PLAN_VERSION}, got "
                                       f"{plan.get('format')!r}/{plan.get('version')!r}")
    delta = check_central_delta(plan.get("delta"), "plan delta")
    rounds = plan.get("rounds")
    if not isinstance(rounds, list) or not rounds or len(rounds) > MAX_PLAN_ROUNDS:
        raise InvalidParameter("plan rounds", f"must be a list of 1 to {MAX_PLAN_ROUNDS} rounds")
    groups, reasons = [], []
    for i, r in enumerate(rounds):
        where = f"plan round {i}"
        if not isinstance(r, Mapping):
            raise InvalidParameter(where, "must be a JSON object")
        unknown = set(r) - {"mechanism", "epsilon0", "delta0", "params", "reports_per_user", "batch", "sampling", "round"}
        if unknown:
            raise InvalidParameter(where, f"unknown field(s) {sorted(unknown)}")
        mechanism = r.get("mechanism")
        if not isinstance(mechanism, str):
            raise InvalidParameter(f"{where} mechanism", f"must be a string, got {mechanism!r}")
        epsilon0 = _number(r.get("epsilon0"), f"{where} epsilon0")
        delta0 = _number(r.get("delta0", 0.0), f"{where} delta0")
        if epsilon0 <= 0 or not 0 <= delta0 < 1:
            raise InvalidParameter(where, f"needs epsilon0 > 0 and 0 <= delta0 < 1, got {epsilon0!r}, {delta0!r}")
        params = r.get("params", {})
        if not isinstance(params, Mapping):
            raise InvalidParameter(f"{where} params", "must be a JSON object")
        batch = r.get("batch")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidParameter(f"{where} batch", f"must be an integer >= 1 (the users shuffled together), got {batch!r}")
        sampling = r.get("sampling")
        if sampling is not None:
            if not isinstance(sampling, Mapping) or set(sampling) - {"rate", "scheme"}:
                raise InvalidParameter(f"{where} sampling", "must be null or {\"rate\": q, \"scheme\": \"poisson\"|\"uniform\"}")
            rate = _number(sampling.get("rate"), f"{where} sampling rate")
            scheme = sampling.get("scheme", "poisson")
            if not 0 < rate <= 1 or scheme not in ("poisson", "uniform"):
                raise InvalidParameter(f"{where} sampling", f"needs 0 < rate <= 1 and scheme poisson or uniform, got {rate!r}, {scheme!r}")
            sampling = (rate, scheme) if rate < 1 else None
        rule = mechanism_rule(mechanism, epsilon0, params, r.get("reports_per_user", 1))
        if isinstance(rule, str):
            reasons.append(f"round {i} ({mechanism}): {rule}")
            continue
        if delta0 != 0:
            reasons.append(f"round {i} ({mechanism}): delta0 = {delta0!r}: the amplification bounds need pure LDP")
            continue
        kind, eps, size, count, blocks = rule
        groups.append((kind, eps, size, count, batch, blocks, sampling))
    return groups, reasons, delta


def account_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The central guarantee of a session plan (module docstring): what ``shuffledp account --plan`` prints
    and what ``simulate``, ``vector`` and ``distribution`` print for the plan in their ``--json``.
    ``epsilon`` is None, with the reason in ``method``, when a round has no amplification claim.
    Refuses a malformed plan (:class:`InvalidParameter`) before any accounting."""
    groups, reasons, delta = _plan_groups(plan)
    if reasons:
        return {"epsilon": None, "delta": None, "method": "none: " + "; ".join(reasons)}
    batches = {g[4] for g in groups}
    if len(batches) == 1 and all(g[5] is None and g[6] is None for g in groups):
        return shuffled_session([g[:4] for g in groups], batches.pop(), delta)
    return shuffled_session(groups, 0, delta)


def shuffled_session(rounds: Sequence[tuple], n: int, delta: float) -> dict[str, Any]:
    """The session's central guarantee (module docstring): ``epsilon`` (None with the reason in ``method``
    where no bound applies), ``delta``, ``method``, both compositions and the ``per_round`` bounds.

    ``rounds``: groups ``(accounted_as, epsilon0, size, count)``, each batch of ``n`` reports, or
    ``(accounted_as, epsilon0, size, count, batch, blocks, sampling)`` with their own batch."""
    if any(len(group) != 4 for group in rounds):
        groups = [(str(g[0]), float(g[1]), None if g[2] is None else int(g[2]), int(g[3]), int(g[4]),
                   None if g[5] is None else int(g[5]), None if g[6] is None else (float(g[6][0]), str(g[6][1])))
                  for g in rounds]
        question = {"groups": [list(g) for g in groups], "delta": float(delta)}
        return cached("shuffled_session_plan", question, lambda: _compose(groups, float(delta)))
    groups4 = [(str(kind), float(epsilon0), None if size is None else int(size), int(count))
               for kind, epsilon0, size, count in rounds]
    question = {"rounds": [list(group) for group in groups4], "n": int(n), "delta": float(delta)}
    return cached("shuffled_session", question,
                  lambda: _compose([(*g, int(n), None, None) for g in groups4], float(delta)))


def _compose(groups: list[tuple], delta: float) -> dict[str, Any]:
    from shuffledp.protocol.accounting.session import SessionAccountant
    from shuffledp.protocol.accounting.shuffle_round import shuffled_round
    from shuffledp.protocol.errors import ShuffleDPError

    shares = sum(g[3] for g in groups)
    sampled = any(g[6] is not None for g in groups)
    try:
        session = SessionAccountant()
        per_round = []
        for kind, epsilon0, size, count, n, blocks, sampling in groups:
            guarantee = round_guarantee(kind, epsilon0, size, blocks)
            if sampling is None:
                session.add_round(guarantee, n, count=count)
                bound = shuffled_round(guarantee, n, delta / shares)
                per_round.append({"epsilon": bound.epsilon, "delta": bound.delta, "method": bound.method, "count": count})
            else:
                session.add_round(guarantee, n, sampling_rate=sampling[0], sampling=sampling[1], count=count)
                per_round.append({"epsilon": None, "delta": None, "method": "sampled: composed by the session accountant only",
                                  "count": count})
        session_eps = session.epsilon(delta)
    except ShuffleDPError as exc:
        return {"epsilon": None, "delta": delta, "method": f"none: {exc}"}
    basic = math.inf if sampled else math.fsum(r["epsilon"] * r["count"] for r in per_round)
    local_total = math.fsum(g[1] * g[3] for g in groups)
    if local_total < min(session_eps, basic):
        best, method = local_total, "the local guarantee (no amplification at this n: shuffling is post-processing)"
    else:
        best = min(session_eps, basic)
        method = "min(session composition, basic composition of per-round bounds at an equal share of delta)"
    return {
        "epsilon": best,
        "delta": delta,
        "method": method,
        "session_composition_epsilon": session_eps,
        "basic_composition_epsilon": None if sampled else basic,
        "per_round": per_round,
    }
