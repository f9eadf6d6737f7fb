"""The central ``(epsilon, delta)`` of a protocol's shuffled rounds, composed: one rule for every protocol.

A protocol's rounds are given as groups ``(accounted_as, epsilon0, size, count)``: ``count``
identical shuffled rounds, each amplified from the local guarantee :func:`round_guarantee`
names (``hadamard-response`` with ``size`` Hadamard rows, ``laplace-mean`` with ``size`` grid
levels, or ``generic`` pure ``epsilon0``-LDP), each batch holding ``n`` reports. The session is
composed two ways, both upper bounds, and the smaller is reported:

* the session accountant (:class:`~shuffledp.protocol.accounting.session.SessionAccountant`:
  PLD composition of the rounds' ``delta(eps)`` curves, Doroshenko et al. 2022, and RDP
  composition, the smaller) at ``delta``;
* basic composition of the per-round bounds (:func:`~shuffledp.protocol.accounting.shuffle_round.shuffled_round`),
  each round at an equal share of ``delta``.

Should both exceed the local total ``sum(count * epsilon0)`` (a tiny ``n``), the local guarantee
is reported instead: the shuffled output is a post-processing of the users' ``epsilon0``-LDP
reports, so it is never worse.

The whole answer is kept in the accountant's on-disk cache (:mod:`.cache`, keyed on this
package's sources and the libraries' versions), and the accountant's modules are imported only
to compute a missing answer: a repeated simulation is accounted without loading scipy's
optimizers or dp-accounting.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from shuffledp.protocol.accounting.cache import cached

#: The local guarantees a round can be accounted as (:func:`round_guarantee`).
ACCOUNTED_AS = ("hadamard-response", "laplace-mean", "generic")


def round_guarantee(accounted_as: str, epsilon0: float, size: int | None = None):
    """The local guarantee a shuffled round is amplified from: ``hadamard-response`` (``size`` Hadamard
    rows), ``laplace-mean`` (``size`` grid levels, or the mechanism's default for None), else ``generic``
    pure ``epsilon0``-LDP (valid for every pure ``epsilon0``-LDP randomizer)."""
    from shuffledp.protocol.accounting.guarantees import generic_guarantee, hadamard_response_guarantee, laplace_mean_guarantee

    if accounted_as == "hadamard-response":
        return hadamard_response_guarantee(epsilon0, size)
    if accounted_as == "laplace-mean":
        return laplace_mean_guarantee(epsilon0, size)
    return generic_guarantee(epsilon0)


def shuffled_session(rounds: Sequence[tuple[str, float, int | None, int]], n: int, delta: float) -> dict[str, Any]:
    """The session's central guarantee (module docstring): ``epsilon`` (None with the reason in ``method``
    where no bound applies), ``delta``, ``method``, both compositions and the ``per_round`` bounds."""
    groups = [(str(kind), float(epsilon0), None if size is None else int(size), int(count))
              for kind, epsilon0, size, count in rounds]
    question = {"rounds": [list(group) for group in groups], "n": int(n), "delta": float(delta)}
    return cached("shuffled_session", question, lambda: _compose(groups, int(n), float(delta)))


def _compose(groups: list[tuple[str, float, int | None, int]], n: int, delta: float) -> dict[str, Any]:
    from shuffledp.protocol.accounting.session import SessionAccountant
    from shuffledp.protocol.accounting.shuffle_round import shuffled_round
    from shuffledp.protocol.errors import ShuffleDPError

    shares = sum(count for *_, count in groups)
    try:
        session = SessionAccountant()
        per_round = []
        for kind, epsilon0, size, count in groups:
            guarantee = round_guarantee(kind, epsilon0, size)
            session.add_round(guarantee, n, count=count)
            bound = shuffled_round(guarantee, n, delta / shares)
            per_round.append({"epsilon": bound.epsilon, "delta": bound.delta, "method": bound.method, "count": count})
        session_eps = session.epsilon(delta)
    except ShuffleDPError as exc:
        return {"epsilon": None, "delta": delta, "method": f"none: {exc}"}
    basic = math.fsum(r["epsilon"] * r["count"] for r in per_round)
    local_total = math.fsum(epsilon0 * count for _, epsilon0, _, count in groups)
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
        "basic_composition_epsilon": basic,
        "per_round": per_round,
    }
