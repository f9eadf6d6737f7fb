"""Vector mean's central guarantee after shuffling (``simulation/vector.py::central_guarantee_at``).

Each round is accounted for the reports it sends: one generic pure-LDP report per user (sampled
range round), D Hadamard-response reports per user (paper mode: D composed rounds), one projected
Laplace report per user on G levels (mean round: its blanket covers the coordinate mixture);
Gaussian mean reports get no shuffled bound. The numbers are recomputed here from the accountant,
and every round's rule is the audit's (``audit/claim.py::plan_guarantee``).
"""

from __future__ import annotations

import pytest

from shuffledp.analyzer.vector_mean import VectorMeanConfig
from shuffledp.cli.vector import format_central
from shuffledp.protocol.accounting import (
    SessionAccountant,
    hadamard_response_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)
from shuffledp.audit.claim import plan_guarantee
from shuffledp.simulation.engine import run_fast
from shuffledp.analyzer.vector_mean import VectorMeanProtocol
from shuffledp.simulation.vector import VectorSimulationConfig, central_guarantee_at, run_vector_simulation
from shuffledp.simulation.vector_population import VectorPopulation

N, DELTA = 2000, 1e-6


def _config(**kw) -> VectorMeanConfig:
    return VectorMeanConfig(**{"dim": 4, "rotated_bound": 2.0, "rotated_tau": 0.4, "epsilon0": 4.0, "rotation_seed": 3, **kw})


def test_paper_mode_composes_one_hadamard_round_per_coordinate():
    config = _config(mode="paper")
    D, K = config.padded_dim, config.range_params().padded_bins
    got = central_guarantee_at(config, N, DELTA)
    assert [(r["accounted_as"], r["reports_per_user"], r["composed"], r["report_epsilon0"]) for r in got["rounds"]] == [
        ("hadamard-response", D, D, 4.0 / (2 * D)), ("laplace-mean", 1, 1, 2.0)]
    hr, mean = hadamard_response_guarantee(4.0 / (2 * D), K), laplace_mean_guarantee(2.0, config.grid_levels)
    session = SessionAccountant()
    session.add_round(hr, N, count=D)
    session.add_round(mean, N)
    share = DELTA / (D + 1)
    basic = D * shuffled_round(hr, N, share).epsilon + shuffled_round(mean, N, share).epsilon
    assert got["session_composition_epsilon"] == pytest.approx(session.epsilon(DELTA), rel=1e-12)
    assert got["basic_composition_epsilon"] == pytest.approx(basic, rel=1e-12)
    assert got["epsilon"] == min(got["session_composition_epsilon"], basic) and got["delta"] == DELTA
    lines = format_central(got)
    assert lines[0].startswith(f"central privacy after shuffling  eps = {got['epsilon']:.4g}, delta = 1e-06")
    assert f"round 0 (vector-range): {D} reports per user, each {4.0 / (2 * D):.4g}-LDP (one per coordinate: {D} composed rounds" in lines[1]
    assert f"accounted as a hadamard-response over {K} rows" in lines[1]


def test_skipped_range_round_leaves_one_round_at_the_whole_budget():
    config = _config(rotated_tau=5.0)  # one bin: no range round
    got = central_guarantee_at(config, N, DELTA)
    assert [(r["round"], r["mechanism"], r["report_epsilon0"]) for r in got["rounds"]] == [(0, "vector-mean", 4.0)]
    g = laplace_mean_guarantee(4.0, config.grid_levels)
    session = SessionAccountant()
    session.add_round(g, N)
    assert got["epsilon"] == pytest.approx(min(session.epsilon(DELTA), shuffled_round(g, N, DELTA).epsilon), rel=1e-12)


def test_gaussian_reports_get_the_local_guarantee_only():
    got = central_guarantee_at(_config(noise="gaussian", delta0=1e-6), N, DELTA)
    assert got["epsilon"] is None and got["delta"] is None
    assert got["method"].startswith("no shuffled bound for gaussian-mean; local guarantee only")
    assert format_central(got) == [f"central privacy after shuffling  central: {got['method']}"]


def test_the_simulation_reports_local_and_central_at_the_default_delta_unless_given():
    from shuffledp.protocol.accounting.composition import default_central_delta

    population = VectorPopulation("gaussian", 3, 5)
    plain = run_vector_simulation(VectorSimulationConfig(population, 300, 4.0, seed=1))
    assert plain.local == {"epsilon0": 4.0, "delta0": 0.0}
    # no delta given: the rule every command uses, min(1e-6, n^-1.1), not "not accounted"
    default = central_guarantee_at(VectorSimulationConfig(population, 300, 4.0, seed=1).protocol_config(), 300,
                                   default_central_delta(300))
    assert plain.central == default and plain.central["delta"] == 1e-6
    for path in ("fast", "messages"):
        accounted = run_vector_simulation(VectorSimulationConfig(population, 300, 4.0, seed=1, path=path, central_delta=DELTA))
        protocol = VectorSimulationConfig(population, 300, 4.0, seed=1).protocol_config()
        assert accounted.central == central_guarantee_at(protocol, 300, DELTA)
        assert accounted.as_dict()["central"]["epsilon"] < 4.0


@pytest.mark.parametrize("kw", [{}, {"rotated_tau": 5.0}])
def test_every_sampled_round_is_accounted_by_the_audits_rule(kw):
    # One rule for one report: the simulation's central figure and `shuffledp audit` amplify the
    # same local guarantee for every round the protocol really runs (sampled mode; a skipped range round).
    import numpy as np

    config = _config(**kw)
    rounds = central_guarantee_at(config, N, DELTA)["rounds"]
    run = run_fast(VectorMeanProtocol(config), np.random.default_rng(0).normal(0.5, 0.1, (200, 4)), seed=1)
    assert len(run.rounds) == len(rounds)
    for accounted, executed in zip(rounds, run.rounds):
        from shuffledp.protocol.accounting.composition import round_guarantee

        size = accounted.get("num_bins", accounted.get("grid_levels"))
        assert accounted["report_epsilon0"] == executed.plan.epsilon0
        assert round_guarantee(accounted["accounted_as"], accounted["report_epsilon0"], size) == plan_guarantee(
            executed.plan.params, executed.plan.epsilon0)
