"""Shuffled rounds and session plans as objects Google's ``dp_accounting`` composes.

A shuffled round (a :class:`~shuffledp.protocol.accounting.guarantees.LocalGuarantee`, the batch
size ``n`` and the sampling of users, as ``shuffledp account`` takes them) or a session plan
(:func:`~shuffledp.protocol.accounting.composition.session_plan`, ``docs/accounting.md``) becomes

* a ``dp_accounting`` :class:`~dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution`
  (:func:`round_pld`, :func:`plan_pld`), to ``compose`` with any other PLD on the same grid; or
* a ``DpEvent`` (:class:`ShuffledRoundDpEvent`, :func:`plan_dp_event`) that
  :class:`ShuffledPLDAccountant`, a ``dp_accounting`` ``PLDAccountant``, composes next to
  dp-accounting's own events (Gaussian, Laplace, Poisson-sampled Gaussian, ...).

Guarantee: each PLD is the one :class:`~shuffledp.protocol.accounting.session.SessionAccountant`
builds for the round (its PLD route, the same code): a pessimistic connect-the-dots PLD
(Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022) of the lower convex hull of the round's
``delta(eps)`` upper bounds, so its hockey-stick curve dominates the round's true one and every
epsilon dp-accounting reads from it, composed or not, is an upper bound (module doc of
:mod:`.session`). It is the PLD route only: ``shuffledp account`` and
:func:`~shuffledp.protocol.accounting.composition.account_plan` report the smallest of several
upper bounds (also the RDP route and the basic composition of per-round bounds), so the epsilon
read from this PLD is never below theirs beyond the PLD's numerical resolution
(:data:`~shuffledp.protocol.accounting.session.SESSION_PLD_RTOL`) and equals theirs where the PLD
route is the one they use.

Neighbouring relation: replace-one (one user's input changes; the batch size is public), the
relation every shuffledp bound is proved for. :class:`ShuffledPLDAccountant` therefore works
under ``NeighborRel.REPLACE_ONE`` and refuses a shuffled round under any other relation (a PLD of
one relation composed with events accounted under another bounds neither).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import attr
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from shuffledp.protocol.accounting.composition import _plan_groups, round_guarantee
from shuffledp.protocol.accounting.guarantees import AmplificationNotClaimed, LocalGuarantee
from shuffledp.protocol.accounting.session import SessionAccountant

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution


def _session_pld(rounds: list[tuple[LocalGuarantee, int, float | None, str, int]],
                 value_discretization_interval: float | None, reference_delta: float) -> "PrivacyLossDistribution":
    """The session accountant's PLD of ``rounds``: ``(local, n, sampling_rate, sampling, count)`` each."""
    session = SessionAccountant(value_discretization_interval=value_discretization_interval,
                                reference_delta=reference_delta)
    for local, n, rate, scheme, count in rounds:
        session.add_round(local, n, sampling_rate=rate, sampling=scheme, count=count)
    return session.pld()


def round_pld(local: LocalGuarantee, n: int, *, sampling_rate: float | None = None, sampling: str = "poisson",
              count: int = 1, value_discretization_interval: float | None = None,
              reference_delta: float = 1e-6) -> "PrivacyLossDistribution":
    """PLD of ``count`` shuffled rounds of ``n`` reports of ``local`` (``sampling_rate``/``sampling``:
    :meth:`SessionAccountant.add_round`), an upper bound under replace-one neighbours (module doc).

    ``value_discretization_interval`` is the PLD's grid (pass the grid of the PLDs it is to be
    composed with); None picks the session accountant's (``reference_delta`` steers that choice:
    ``shuffledp account`` passes its ``--delta``). Raises :class:`~.session.PLDRouteUnavailable`
    where the PLD would exceed :data:`~.session.PLD_MAX_POINTS` points."""
    return _session_pld([(local, n, sampling_rate, sampling, count)], value_discretization_interval, reference_delta)


def _plan_rounds(plan: Mapping[str, Any]) -> list[tuple[LocalGuarantee, int, float | None, str, int]]:
    """The plan's rounds as session-accountant rounds, by the plan's one rule table
    (:func:`~.composition.mechanism_rule`); :class:`AmplificationNotClaimed` for a plan with a round
    no amplification is claimed for (``account_plan`` prints no epsilon for it either)."""
    groups, reasons, _ = _plan_groups(plan)
    if reasons:
        raise AmplificationNotClaimed("; ".join(reasons))
    rounds = []
    for kind, epsilon0, size, count, batch, blocks, sampling in groups:
        rate, scheme = (None, "poisson") if sampling is None else sampling
        rounds.append((round_guarantee(kind, epsilon0, size, blocks), batch, rate, scheme, count))
    return rounds


def plan_pld(plan: Mapping[str, Any], *, value_discretization_interval: float | None = None,
             reference_delta: float = 1e-6) -> "PrivacyLossDistribution":
    """PLD of a whole session plan (the plan's ``delta`` is not used: a PLD answers every delta).

    With the default grid it is the PLD :func:`~.composition.account_plan` composes (its session
    accountant's), so ``plan_pld(plan).get_epsilon_for_delta(plan["delta"])`` is the plan's
    ``session_composition_epsilon`` where the PLD route gives it, and never below the plan's
    ``epsilon`` (module doc). Refuses a malformed plan with :class:`~shuffledp.protocol.errors.InvalidParameter`."""
    return _session_pld(_plan_rounds(plan), value_discretization_interval, reference_delta)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ShuffledRoundDpEvent(dp_event.DpEvent):
    """One shuffled round of ``n`` reports of ``local`` (``sampling_rate``: the users' sampling
    probability, ``n`` then the expected batch; ``sampling``: ``"poisson"`` or ``"uniform"``), for
    :class:`ShuffledPLDAccountant`. ``dp_event.SelfComposedDpEvent(event, T)`` is ``T`` such rounds,
    composed by the session accountant's self-composition."""

    local: LocalGuarantee
    n: int
    sampling_rate: float | None = None
    sampling: str = "poisson"


def plan_dp_event(plan: Mapping[str, Any]) -> dp_event.DpEvent:
    """A session plan as a ``dp_accounting`` event: the composition of its rounds, each a
    :class:`ShuffledRoundDpEvent` self-composed ``count`` times (:func:`plan_pld` for the refusals)."""
    events: list[dp_event.DpEvent] = []
    for local, n, rate, scheme, count in _plan_rounds(plan):
        event = ShuffledRoundDpEvent(local, n, rate, scheme)
        events.append(event if count == 1 else dp_event.SelfComposedDpEvent(event, count))
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


class ShuffledPLDAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant that also composes :class:`ShuffledRoundDpEvent` (module doc).

    Every other event is dp-accounting's to account, on the same grid
    (``value_discretization_interval``) and under the same relation, which defaults to replace-one
    here, the relation of shuffledp's bounds; a shuffled round under another relation is refused
    (``dp_accounting.privacy_accountant.UnsupportedEventError`` from ``compose``)."""

    _pld: PrivacyLossDistribution  # the composition so far (dp-accounting's PLDAccountant keeps it)

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.REPLACE_ONE,
                 value_discretization_interval: float = 1e-4) -> None:
        super().__init__(neighboring_relation, value_discretization_interval)

    def _maybe_compose(self, event: dp_event.DpEvent, count: int,
                       do_compose: bool) -> pld_privacy_accountant.CompositionErrorDetails | None:
        if not isinstance(event, ShuffledRoundDpEvent):
            return super()._maybe_compose(event, count, do_compose)
        if self.neighboring_relation is not NeighboringRelation.REPLACE_ONE:
            return pld_privacy_accountant.CompositionErrorDetails(
                invalid_event=event,
                error_message=f"a shuffled round is bounded under REPLACE_ONE neighbours, not {self.neighboring_relation}")
        if do_compose:
            self._pld = self._pld.compose(round_pld(
                event.local, event.n, sampling_rate=event.sampling_rate, sampling=event.sampling, count=count,
                value_discretization_interval=self._value_discretization_interval))
        return None
