"""``shuffledp up --broker-nodes 3`` (the parties over a local 3-node NATS cluster, each given
every node) prints the estimate ``shuffledp up`` prints over one mosquitto, for the same seed.

With a seed, the users' data and every device's randomizer draws are fixed, and
``tests/mqtt/test_up_matches_simulate.py`` shows that ``up`` over one mosquitto prints, to the
last bit, the estimate of ``shuffledp simulate`` with that seed. So this test compares the
cluster's ``up`` with ``simulate`` (the cheap side of that equality): the estimate depends on
the broker only if the broker loses, duplicates or alters a report, and equal floats show the
cluster tier carries the round exactly as mosquitto does.
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
USERS = 2000
SEED = 7


def run_up(directory: Path, options: list[str]) -> tuple[dict, str]:
    """``shuffledp up``: the analyzer's result.json and the line ``up`` printed with the estimate."""
    done = subprocess.run([*CLI, "up", "--users", str(USERS), "--seed", str(SEED), *options, "--dir", str(directory)],
                          capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[up] estimate ")]
    assert len(lines) == 1, done.stdout[-3000:]
    return json.loads((directory / "result.json").read_text()), lines[0]


def run_simulate(seed: int) -> dict:
    done = subprocess.run([*CLI, "simulate", "-n", str(USERS), "--seed", str(seed), "--fast", "--json", "-q"],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_up_on_a_nats_cluster_prints_the_estimate_of_up_on_mosquitto(tmp_path):
    cluster, cluster_line = run_up(tmp_path / "cluster", ["--broker-nodes", "3"])
    single = run_simulate(SEED)  # = up over one mosquitto, to the last bit (test_up_matches_simulate.py)
    assert cluster["estimate"] == single["estimate"] and cluster["standard_error"] == single["standard_error"]
    assert f"{single['estimate']:.6f}" in cluster_line
    assert cluster["reports"] == USERS
    # not vacuous: another seed's estimate is another
    assert run_simulate(SEED + 1)["estimate"] != cluster["estimate"]
    # the cluster run really ran on three nodes (their configs and logs are in its broker directory)
    broker = tmp_path / "cluster" / "broker"
    assert sorted(p.name for p in broker.glob("node*.log")) == ["node0.log", "node1.log", "node2.log"]
    assert "--broker-nodes: 1 (mosquitto) or at least 3" in subprocess.run(
        [*CLI, "up", "--broker-nodes", "2"], capture_output=True, text=True, timeout=60, env=ENV).stderr
