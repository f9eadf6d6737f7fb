"""``shuffledp up --seed S`` prints exactly the estimate of ``shuffledp simulate --seed S``.

``up`` runs the deployment as separate OS processes over a TLS mosquitto (keys, shuffler
service, client fleet, analyzer service); ``simulate`` runs the same protocol in one
process. With the same seed and parameters the two share the users' data
(``population.local_means``), every device's randomizer draws (``engine.seeded_draw``)
and a decoder whose sums are correctly rounded (``decoders.mean_from_reports``), so the estimates are
equal as floats, not merely close. Another seed gives another estimate; a second case
with a non-default data model, m and budget checks those options reach every party.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mqtt

CLI = [sys.executable, "-m", "shuffledp.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
USERS = 400


def run_up(directory: Path, seed: int, options: list[str]) -> tuple[dict, dict]:
    """``shuffledp up``: the analyzer's result.json and the fleet's clients.json."""
    done = subprocess.run([*CLI, "up", "--users", str(USERS), "--seed", str(seed), *options, "--dir", str(directory)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"data and randomizer draws seeded with --seed {seed}" in done.stdout
    return json.loads((directory / "result.json").read_text()), json.loads((directory / "clients.json").read_text())


def run_simulate(seed: int, options: list[str], engine: str) -> dict:
    done = subprocess.run([*CLI, "simulate", "-n", str(USERS), "--seed", str(seed), *options, engine, "--json", "-q"],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "seed,options",
    [(5, []), (6, ["--distribution", "uniform", "--mu", "0.5", "--sigma", "2", "-m", "20", "--epsilon0", "2"])],
    ids=["defaults", "uniform-eps2"],
)
def test_up_prints_the_estimate_simulate_prints_with_the_same_seed(tmp_path, seed, options):
    result, fleet = run_up(tmp_path / "up", seed, options)
    messages = run_simulate(seed, options, "--messages")
    fast = run_simulate(seed, options, "--fast")
    # The same users' data and the same protocol parameters...
    assert fleet["true_mean"] == messages["true_mean"]
    assert result["parameters"]["tau"] == messages["config"]["tau"]
    assert result["parameters"]["epsilon0"] == messages["local_epsilon"]
    assert result["range"] == list(messages["range_found"])
    # ...hence the same estimate, to the last bit, on both of simulate's engines.
    assert result["estimate"] == messages["estimate"] == fast["estimate"]
    assert result["standard_error"] == messages["standard_error"]
    assert result["reports"] == USERS
    # Not vacuous: with another seed, simulate's data and estimate are others.
    other = run_simulate(seed + 10, options, "--fast")
    assert other["true_mean"] != fleet["true_mean"] and other["estimate"] != result["estimate"]
