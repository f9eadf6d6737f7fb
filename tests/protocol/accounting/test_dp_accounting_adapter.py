"""The dp_accounting adapter: shuffled rounds and session plans composed by dp_accounting itself.

What ``shuffledp account`` prints is the smallest of several upper bounds (the session's PLD and RDP
routes, basic composition, the local total); the adapter hands over the PLD route's distribution.
So dp_accounting's epsilon from it must be the printed ``epsilon_pld`` / ``session_composition_epsilon``
(the same PLD; their epsilon readers agree within ``SESSION_PLD_RTOL``, the PLD epsilon's stated
resolution) and never below the printed ``epsilon`` beyond that resolution.
"""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation, UnsupportedEventError

from shuffledp.cli import main
from shuffledp.protocol.accounting import SessionAccountant, generic_guarantee, hadamard_response_guarantee
from shuffledp.protocol.accounting.composition import account_plan, plan_round, session_plan
from shuffledp.protocol.accounting.dp_accounting_adapter import (
    ShuffledPLDAccountant,
    ShuffledRoundDpEvent,
    plan_dp_event,
    plan_pld,
    round_pld,
)
from shuffledp.protocol.accounting.guarantees import AmplificationNotClaimed
from shuffledp.protocol.accounting.session import SESSION_PLD_RTOL

DELTA = 1e-6
#: The session accountant's automatic PLD grid is at most this (``SessionAccountant`` doc).
AUTO_GRID_MAX = 1e-4

MIXED_PLAN = session_plan([
    plan_round("hadamard-range", 1.0, {"padded_bins": 32}, 20_000),
    plan_round("projected-mean", 1.0, {"grid_levels": 1024, "noise": "laplace"}, 20_000,
               sampling={"rate": 0.1, "scheme": "poisson"}),
    plan_round("vector-range", 0.8, {"mode": "paper", "padded_bins": 8}, 20_000, reports_per_user=3),
], DELTA)


def _account(capsys, *argv: str) -> dict:
    assert main(["account", *argv, "--delta", str(DELTA), "--no-lower-bound", "-q", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["session"]


def _automatic_grid(local, n: int, count: int, sampling: dict) -> float:
    """The PLD grid the session accountant picks for these rounds (its public property)."""
    session = SessionAccountant(reference_delta=DELTA)
    session.add_round(local, n, count=count, **sampling)
    return session.value_discretization_interval


@pytest.mark.parametrize("argv, local, n, rounds, sampling", [
    (("-e", "4", "-n", "100000", "--rounds", "3"), generic_guarantee(4.0), 100_000, 3, {}),
    (("-e", "2", "-n", "5000", "--mechanism", "hadamard-response", "-K", "64", "--rounds", "5"),
     hadamard_response_guarantee(2.0, 64), 5_000, 5, {}),
    (("-e", "3", "-n", "2000", "--sampling-rate", "0.05", "--sampling", "uniform", "--rounds", "4"),
     generic_guarantee(3.0), 2_000, 4, {"sampling_rate": 0.05, "sampling": "uniform"}),
])
def test_round_pld_is_the_pld_route_shuffledp_account_prints(capsys, argv, local, n, rounds, sampling):
    printed = _account(capsys, *argv)
    # shuffledp account builds its session accountant with reference_delta = --delta: the same grid.
    pld = round_pld(local, n, count=rounds, reference_delta=DELTA, **sampling)
    eps = pld.get_epsilon_for_delta(DELTA)
    assert eps == pytest.approx(printed["epsilon_pld"], rel=SESSION_PLD_RTOL)
    assert eps >= printed["epsilon"] * (1 - SESSION_PLD_RTOL)
    # The same rounds as a DpEvent in the accountant, on the same grid, compose to the same PLD.
    grid = _automatic_grid(local, n, rounds, sampling)
    accountant = ShuffledPLDAccountant(value_discretization_interval=grid)
    accountant.compose(dp_event.SelfComposedDpEvent(ShuffledRoundDpEvent(local, n, **sampling), rounds))
    assert accountant.get_epsilon(DELTA) == pytest.approx(eps, rel=SESSION_PLD_RTOL)


def test_plan_pld_of_a_mixed_session_is_what_shuffledp_account_plan_composes(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(MIXED_PLAN))
    assert main(["account", "--plan", str(path), "-q", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["session"]
    eps = plan_pld(MIXED_PLAN).get_epsilon_for_delta(DELTA)
    assert eps == pytest.approx(answer["session_composition_epsilon"], rel=SESSION_PLD_RTOL)
    assert eps >= answer["epsilon"] * (1 - SESSION_PLD_RTOL)


def test_plan_event_in_dp_accountings_accountant_bounds_the_plan():
    # Composed on dp_accounting's default grid (1e-4) rather than the plan's automatic one. Both PLDs
    # dominate the composed hull curves, and the automatic one exceeds them by at most one grid step per
    # composed round (SessionAccountant doc), so the accountant's epsilon is at least the plan's minus
    # rounds * AUTO_GRID_MAX (5 composed rounds: 1 + 1 + 3).
    accountant = ShuffledPLDAccountant()
    accountant.compose(plan_dp_event(MIXED_PLAN))
    eps = accountant.get_epsilon(DELTA)
    plan_eps = account_plan(MIXED_PLAN)["epsilon"]
    assert eps >= plan_eps - 5 * AUTO_GRID_MAX
    # And it is the plan's own PLD on that grid.
    on_grid = plan_pld(MIXED_PLAN, value_discretization_interval=1e-4).get_epsilon_for_delta(DELTA)
    assert eps == pytest.approx(on_grid, rel=SESSION_PLD_RTOL)


def test_a_shuffled_session_composes_with_a_gaussian_event():
    sigma, grid = 8.0, 1e-4
    accountant = ShuffledPLDAccountant(value_discretization_interval=grid)
    accountant.compose(plan_dp_event(MIXED_PLAN))
    shuffled_only = accountant.get_epsilon(DELTA)
    accountant.compose(dp_event.GaussianDpEvent(sigma))
    both = accountant.get_epsilon(DELTA)
    gaussian = pld_lib.from_gaussian_mechanism(sigma, value_discretization_interval=grid,
                                               neighboring_relation=NeighboringRelation.REPLACE_ONE)
    expected = plan_pld(MIXED_PLAN, value_discretization_interval=grid).compose(gaussian)
    assert both == pytest.approx(expected.get_epsilon_for_delta(DELTA), rel=SESSION_PLD_RTOL)
    assert both > max(shuffled_only, gaussian.get_epsilon_for_delta(DELTA))


def test_refusals():
    with pytest.raises(UnsupportedEventError):
        ShuffledPLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE).compose(
            ShuffledRoundDpEvent(generic_guarantee(1.0), 1000))
    gaussian_round = session_plan([plan_round("projected-mean", 1.0, {"noise": "gaussian"}, 1000, delta0=1e-9)], DELTA)
    assert account_plan(gaussian_round)["epsilon"] is None
    with pytest.raises(AmplificationNotClaimed, match="no amplification"):
        plan_pld(gaussian_round)
    with pytest.raises(AmplificationNotClaimed):
        plan_dp_event(gaussian_round)
