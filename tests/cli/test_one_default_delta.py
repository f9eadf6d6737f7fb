"""One default central delta, one rule: the Python API and every command print the same (eps, delta).

* ``min(1e-6, n^-1.1)`` (``protocol/accounting/composition.py::default_central_delta``) is the
  default of ``SimulationConfig``, ``VectorSimulationConfig``, ``DistributionConfig`` and of every
  command's ``--delta``;
* the same configuration run through the API and the CLI prints the same central (eps, delta),
  for every protocol ``simulate`` runs, and for ``vector`` and ``distribution``;
* an invalid delta (``2``, ``1``, ``0``, negative, NaN) is refused before any work: one line, exit 2
  from the commands, :class:`InvalidParameter` from the API.
"""

from __future__ import annotations

import json

import pytest

from shuffledp.cli import main
from shuffledp.protocol.accounting.composition import default_central_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.simulation import SimulationConfig, run_simulation
from shuffledp.simulation.distribution import DistributionConfig, run_distribution
from shuffledp.simulation.population import Population
from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation
from shuffledp.simulation.vector_population import VectorPopulation

N = 300


def _cli(capsys, *argv: str) -> dict:
    assert main([*argv, "--fast", "-q", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_api_and_the_commands_share_one_default_delta():
    from shuffledp.cli.common import default_delta

    assert default_delta is default_central_delta
    scalar = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 5), n=100, epsilon0=1.0)
    vector = VectorSimulationConfig(VectorPopulation("gaussian", 4, 5), 100, 4.0)
    distribution = DistributionConfig(8, 100, 5, 4.0)
    # n^-1.1 alone would be 6.3e-3 at n = 100: the rule caps it at 1e-6
    assert scalar.delta == vector.delta == distribution.central_delta == default_central_delta(100) == 1e-6
    assert default_central_delta(10**6) == pytest.approx(10 ** -6.6)


def _scalar_api():
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 5), n=N, epsilon0=1.0)
    return run_simulation(config).central


def _vector_api(kind: str, dim: int, mu: float, bound: float, eps0: float):
    population = VectorPopulation(kind, dim, 5, mu, 1.0, bound, 1.1)
    return run_vector_simulation(VectorSimulationConfig(population, N, eps0)).central


def _summation_api(protocol: str):
    from shuffledp.simulation.summation import SummationConfig, run_summation

    population = (Population("gaussian", 1.7, 1.0, 20.0, 5) if protocol == "sum"
                  else VectorPopulation("gaussian", 3, 5, 1.7, 1.0, 20.0))
    return run_summation(SummationConfig(protocol, population, N, 1.0, default_central_delta(N)))["central"]


def _instance_optimal_api():
    from shuffledp.simulation.instance_optimal import InstanceOptimalSimulation, run_instance_optimal

    population = VectorPopulation("gaussian", 3, 5, 1.7, 1.0, 20.0)
    privacy = run_instance_optimal(InstanceOptimalSimulation(population, N, 1.0, default_central_delta(N)))["privacy"]
    return {"epsilon": privacy["session_epsilon"], "delta": privacy["session_delta"]}


CASES = {
    "mean": (["simulate", "-n", str(N), "-m", "5"], _scalar_api, lambda d: d["central"]),
    "vector-mean": (["simulate", "--protocol", "vector-mean", "-n", str(N), "-m", "5", "-d", "4", "-e", "4"],
                    lambda: _vector_api("gaussian", 4, 1.7, 20.0, 4.0), lambda d: d["central"]),
    "distribution": (["simulate", "--protocol", "distribution", "-n", str(N), "-m", "5", "-d", "4", "-e", "4"],
                     lambda: _vector_api("categorical", 4, 1.7, 20.0, 4.0), lambda d: d["central"]),
    "sum": (["simulate", "--protocol", "sum", "-n", str(N), "-m", "5"], lambda: _summation_api("sum"),
            lambda d: d["central"]),
    "vector-sum": (["simulate", "--protocol", "vector-sum", "-n", str(N), "-m", "5", "-d", "3"],
                   lambda: _summation_api("vector-sum"), lambda d: d["central"]),
    "instance-optimal": (["simulate", "--protocol", "instance-optimal", "-n", str(N), "-m", "5", "-d", "3"],
                         _instance_optimal_api,
                         lambda d: {"epsilon": d["privacy"]["session_epsilon"], "delta": d["privacy"]["session_delta"]}),
    "vector command": (["vector", "-n", str(N), "-m", "5", "-d", "4"],
                       lambda: _vector_api("gaussian", 4, 0.5, 4.0, 4.0), lambda d: d["central"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_api_and_the_cli_print_the_same_central_epsilon_and_delta(case, capsys):
    argv, api, printed = CASES[case]
    cli = printed(_cli(capsys, *argv))
    got = api()
    assert (cli["epsilon"], cli["delta"]) == (got["epsilon"], got["delta"])
    assert cli["epsilon"] is not None and cli["delta"] <= default_central_delta(N) == 1e-6


def test_the_distribution_command_and_the_api_print_the_same_guarantees(capsys):
    docs = _cli(capsys, "distribution", "-k", "8", "-n", str(N), "-m", "5")
    api = run_distribution(DistributionConfig(8, N, 5, 4.0))
    for cli_row, api_row in zip(docs["results"][0]["estimators"], api["estimators"], strict=True):
        cli_c, api_c = cli_row["privacy"]["central"], api_row["privacy"]["central"]
        assert (cli_c["epsilon"], cli_c["delta"]) == (api_c["epsilon"], api_c["delta"]) and api_c["delta"] == 1e-6


def test_the_example_prints_each_epsilon_with_its_delta(capsys, tmp_path):
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "simulate_and_plot.py"))
    assert example["main"](["--quick", "--out", str(tmp_path / "sim.png")]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[-3:] == ["central", "eps", "delta"]
    for row in rows:
        n = int(row.split()[0].replace(",", ""))
        central = run_simulation(SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), n=n, epsilon0=1.0, seed=1)).central
        assert row.split()[-2:] == [f"{central['epsilon']:.4g}", f"{central['delta']:.2g}"] and central["delta"] == 1e-6


INVALID = ["2", "1", "0", "-0.5", "nan", "inf"]
COMMANDS = {
    "simulate": ["simulate", "-n", "100", "-m", "5"],
    "simulate vector-mean": ["simulate", "--protocol", "vector-mean", "-n", "100", "-d", "4", "-m", "5"],
    "simulate sum": ["simulate", "--protocol", "sum", "-n", "100", "-m", "5"],
    "vector": ["vector", "-n", "100", "-d", "4", "-m", "5"],
    "distribution": ["distribution", "-k", "8", "-n", "100", "-m", "5"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("value", INVALID)
def test_an_invalid_delta_is_refused_before_any_work(command, value, capsys):
    # Refused by the argument parser (the message says so), so before any work starts.
    with pytest.raises(SystemExit) as exit_:
        main([*COMMANDS[command], "--fast", "-q", "--delta", value])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0] == f"shuffledp {command.split()[0]}: argument --delta: expected a number in (0, 1), got {value}"


@pytest.mark.parametrize("value", [2.0, 1.0, 0.0, -1e-9, float("nan"), True])
def test_the_api_refuses_an_invalid_delta(value):
    from shuffledp.simulation.instance_optimal import InstanceOptimalSimulation
    from shuffledp.simulation.summation import SummationConfig

    population, vectors = Population("gaussian", 1.7, 1.0, 20.0, 5), VectorPopulation("gaussian", 3, 5)
    makers = [
        lambda: SimulationConfig(population, n=100, epsilon0=1.0, central_delta=value),
        lambda: VectorSimulationConfig(vectors, 100, 4.0, central_delta=value),
        lambda: DistributionConfig(8, 100, 5, 4.0, delta=value),
        lambda: SummationConfig("sum", population, 100, 1.0, value),
        lambda: InstanceOptimalSimulation(vectors, 100, 1.0, value),
    ]
    for make in makers:
        with pytest.raises(InvalidParameter, match="delta"):
            make()


def test_the_simulation_guide_shows_what_its_example_prints(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "api" / "simulate.md").read_text(encoding="utf-8")
    example = re.search(r"## Example\n\n```python\n(.*?)```\n\nIt prints:\n\n```text\n(.*?)```", guide, re.S)
    assert example, "docs/api/simulate.md: the first example and its printed output"
    script = tmp_path / "example.py"
    script.write_text(example.group(1), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == example.group(2)
    assert "at delta 1.0e-06" in done.stdout  # the default rule at n = 500, not 500^-1.1 = 1.1e-3


@pytest.mark.parametrize("value", INVALID)
def test_up_refuses_an_invalid_delta_before_starting_anything(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--delta", value])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [f"shuffledp up: argument --delta: expected a number in (0, 1), got {value}"]
