"""What ``shuffledp simulate`` and ``shuffledp vector`` print: every number says what it is.

* summations print the delta target and the delta spent, by the split-and-mix analysis and the noise;
* the fast engine's progress bar names the round being drawn (numbered from 0) and its mechanism;
* the instance-optimal header names its engine in words, on both engines;
* ``simulate --protocol distribution|vector-mean`` print their own header;
* vector mean prints its local and its central guarantee, on both engines, in text and JSON.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from shuffledp.cli import main
from shuffledp.cli.common import default_delta


def _run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


# ------------------------------------------------------------------------- 1. summation delta
@pytest.mark.parametrize("protocol,extra", [("sum", []), ("vector-sum", ["-d", "3"])])
def test_summation_prints_the_delta_target_and_the_delta_spent(protocol, extra, capsys):
    argv = ["simulate", "--protocol", protocol, "--fast", "-n", "400", "-m", "5", "-q", *extra]
    doc = json.loads(_run(capsys, *argv, "--json"))
    central = doc["central"]
    target, split, noise = central["delta_target"], central["split_delta"], central["noise_delta"]
    assert target == default_delta(400) == 1e-6
    assert central["delta_spent"] == central["delta"] == split + noise <= target
    assert central["epsilon"] == central["epsilon_target"] == 1.0
    text = _run(capsys, *argv)
    assert f"  central privacy  eps = 1, delta = {split + noise:.2g}   (eps: the target, the noise is calibrated to it)" in text
    assert (f"  delta            target 1e-06; spent {split + noise:.2g} = {split:.2g} by the split-and-mix analysis "
            f"(BBGN 2020 bound) + {noise:.2g} by the noise (") in text
    assert "(split " not in text  # the old unlabelled "(split x + noise y; ...)"
    if protocol == "sum":
        assert noise == 0 and "+ 0 by the noise (discrete Laplace from Pólya shares: pure)" in text
    else:
        assert noise == target / 2 and "by the noise (Skellam, RDP" in text


# ------------------------------------------------------------------------- 2. progress labels
def _stages(protocol, data):
    from shuffledp.simulation.engine import run_fast

    calls: list[tuple[str, int]] = []
    run = run_fast(protocol, data, seed=1, progress=lambda stage, count: calls.append((stage, count)))
    return calls, run


def _check_labels(calls, run) -> list[str]:
    """Each round's label is announced (count 0) before any of its users count, and every count
    after it carries it until the next round's: the label names the round being drawn."""
    labels = [f"round {i} ({r.plan.params.MECHANISM})" for i, r in enumerate(run.rounds)]
    announced = [stage for stage, count in calls if count == 0]
    assert announced == labels
    current = None
    for stage, count in calls:
        if count == 0:
            current = stage
        else:
            assert stage == current
    assert sum(count for _, count in calls) == 300 * len(labels)  # every user of every round counted once
    return labels


def test_progress_names_the_round_being_drawn():
    from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
    from shuffledp.analyzer.vector_mean import VectorMeanConfig, VectorMeanProtocol

    rng = np.random.default_rng(0)
    scalar = ScalarMeanProtocol(ScalarMeanConfig(bound=8.0, tau=2.0, epsilon0=2.0, grid_levels=256))
    assert _check_labels(*_stages(scalar, rng.normal(1.0, 1.0, 300))) == ["round 0 (hadamard-range)", "round 1 (projected-mean)"]
    vectors = rng.normal(0.1, 0.3, (300, 3))
    two = VectorMeanProtocol(VectorMeanConfig(3, rotated_bound=2.0, rotated_tau=0.4, epsilon0=4.0, rotation_seed=2))
    assert _check_labels(*_stages(two, vectors)) == ["round 0 (vector-range)", "round 1 (vector-mean)"]
    # One range bin: the range round is skipped, and round 0 is the mean round.
    one = VectorMeanProtocol(VectorMeanConfig(3, rotated_bound=2.0, rotated_tau=5.0, epsilon0=4.0, rotation_seed=4))
    assert _check_labels(*_stages(one, vectors)) == ["round 0 (vector-mean)"]


def test_the_progress_bar_shows_each_round_with_its_mechanism(capsys):
    assert main(["simulate", "--fast", "-n", "3000", "-m", "5"]) == 0
    err = capsys.readouterr().err
    assert "round 0 (hadamard-range)" in err and "round 1 (projected-mean)" in err
    assert err.index("round 0 (hadamard-range)") < err.index("round 1 (projected-mean)")
    assert "round 0 (projected-mean)" not in err and "round 1 (hadamard-range)" not in err


# ------------------------------------------------------------------------- 3. engine wording
def test_the_engine_is_named_in_words():
    from shuffledp.simulation.engine import describe_engine

    assert describe_engine("fast", "none (vectorized)") == "fast engine (vectorized, no messages)"
    assert describe_engine("messages", "in-process") == "messages engine (in-process)"
    assert describe_engine("messages", "mqtt 127.0.0.1:1883") == "messages engine (mqtt 127.0.0.1:1883)"


def test_instance_optimal_header_names_the_engine(capsys):
    out = _run(capsys, "simulate", "--protocol", "instance-optimal", "--fast", "-n", "1000", "-d", "3", "-q")
    header = out.splitlines()[0]
    assert header.endswith(", fast engine (vectorized, no messages)")
    assert "none" not in header and "engine fast" not in header


# ------------------------------------------------------------------------- 4. headers
@pytest.mark.parametrize("protocol,title", [
    ("distribution", "shuffledp simulate --protocol distribution: distribution estimation as the mean of one-hot vectors (Algorithm 5), "),
    ("vector-mean", "shuffledp simulate --protocol vector-mean: vector mean (Girgis et al. 2022, Algorithm 5), "),
])
def test_simulate_vector_protocols_print_their_own_header(protocol, title, capsys):
    out = _run(capsys, "simulate", "--protocol", protocol, "--fast", "-n", "300", "-m", "5", "-d", "4", "-e", "4", "-q")
    assert out.startswith(title)
    assert "shuffledp vector" not in out
    if protocol == "distribution":
        assert "categorical data (Zipf(1.1) over d = 4 symbols)" in out.splitlines()[0]


def test_vector_prints_its_own_header(capsys):
    out = _run(capsys, "vector", "-n", "300", "-d", "4", "-m", "5", "-q")
    assert out.startswith("shuffledp vector: vector mean (Girgis et al. 2022, Algorithm 5), sampled mode, d = 4, m = 5, gaussian data, fast path")


# ------------------------------------------------------------------------- 5. vector mean's guarantee
def _expected_central(eps0: float, n: int, delta: float, rounds: int = 2) -> float:
    """Sampled mode, recomputed here from the accountant: the range round one generic pure LDP report
    per user at eps0/2 (absent when skipped), the mean round one projected Laplace report on 4096
    grid levels (at eps0/2, or eps0 alone)."""
    from shuffledp.protocol.accounting import SessionAccountant, generic_guarantee, laplace_mean_guarantee, shuffled_round

    guarantees = [laplace_mean_guarantee(eps0 / rounds, 4096)]
    if rounds == 2:
        guarantees.insert(0, generic_guarantee(eps0 / rounds))
    session = SessionAccountant()
    for g in guarantees:
        session.add_round(g, n)
    return min(session.epsilon(delta), sum(shuffled_round(g, n, delta / rounds).epsilon for g in guarantees))


@pytest.mark.parametrize("path", ["--fast", "--messages"])
@pytest.mark.parametrize("protocol", ["vector-mean", "distribution"])
def test_vector_protocols_report_local_and_central_guarantee(protocol, path, capsys):
    argv = ["simulate", "--protocol", protocol, path, "-n", "300", "-m", "5", "-d", "4", "-e", "4", "-q"]
    doc = json.loads(_run(capsys, *argv, "--json"))
    central = doc["central"]
    assert doc["local"] == {"epsilon0": 4.0, "delta0": 0.0}
    assert central["delta"] == default_delta(300) == doc["shuffledp"]["parameters"]["delta"]
    text = _run(capsys, *argv)
    assert "\nlocal privacy (user-level LDP)   eps0 = 4, delta0 = 0\n" in text
    assert f"\ncentral privacy after shuffling  eps = {central['epsilon']:.4g}, delta = 1e-06   (min(session composition" in text
    if protocol == "vector-mean":
        assert [(r["round"], r["mechanism"], r["accounted_as"], r["report_epsilon0"]) for r in central["rounds"]] == [
            (0, "vector-range", "generic", 2.0), (1, "vector-mean", "laplace-mean", 2.0)]
        assert central["epsilon"] == pytest.approx(_expected_central(4.0, 300, 1e-6), rel=1e-9)
        assert "  round 0 (vector-range): 1 report per user, each 2-LDP, accounted as a generic pure-LDP randomizer: eps " in text
        assert "  round 1 (vector-mean): 1 report per user, each 2-LDP, accounted as a projected Laplace report on 4096 levels (generic bounds and its blanket): eps " in text
    else:  # one-hot data at n = 300: tau' >= the bound, one range bin, so the range round is skipped
        assert [(r["round"], r["mechanism"], r["report_epsilon0"]) for r in central["rounds"]] == [(0, "vector-mean", 4.0)]
        assert central["epsilon"] == pytest.approx(_expected_central(4.0, 300, 1e-6, rounds=1), rel=1e-9)
        assert "  round 0 (vector-mean): 1 report per user, each 4-LDP, accounted as a projected Laplace report on 4096 levels (generic bounds and its blanket): eps " in text
    assert 0 < central["epsilon"] <= 4.0


def test_vector_takes_delta_and_reports_per_n(capsys):
    doc = json.loads(_run(capsys, "vector", "-n", "400", "-d", "4", "-m", "5", "-q", "--delta", "1e-7", "--json"))
    assert doc["central"]["delta"] == 1e-7
    assert doc["central"]["epsilon"] == pytest.approx(_expected_central(4.0, 400, 1e-7), rel=1e-9)
    out = _run(capsys, "vector", "--sweep", "300,600", "-d", "4", "-m", "5", "-q")
    eps = [_expected_central(4.0, n, 1e-6) for n in (300, 600)]
    assert f"central privacy after shuffling (n = 300)  eps = {eps[0]:.4g}, delta = 1e-06" in out
    assert f"central privacy after shuffling (n = 600)  eps = {eps[1]:.4g}, delta = 1e-06" in out
