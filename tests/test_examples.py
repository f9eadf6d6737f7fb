"""Every example in examples/ runs as written, in its quick mode (the MQTT ones are in tests/mqtt)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_simulate_and_plot(tmp_path):
    out = run("simulate_and_plot.py", "--quick", "--out", str(tmp_path / "sim.png"))
    assert "10,000" in out and "ok" in out
    assert (tmp_path / "sim.png").stat().st_size > 10_000


def test_device_client():
    out = run("device_client.py", "--devices", "150")
    assert "150 devices" in out and "('released', 'released')" in out and "batches [150, 150]" in out


def test_train_uldp_sgd():
    out = run("train_uldp_sgd.py", "--quick")
    # the example calibrates eps0 to a session epsilon of 2 (bisection to 1 % in eps0)
    session = float(re.search(r"session \(eps, delta\) = \(([0-9.]+),", out).group(1))
    assert 1.9 <= session <= 2.0 and "test accuracy: ULDP-SGD 0." in out
