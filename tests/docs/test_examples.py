"""Every example runs as examples/README.md shows it, and prints what it should.

The commands are the lines of examples/README.md's shell block, run as written (bash, a
fresh directory linking the repository, ``SHUFFLEDP_SIZE_CAP`` set: see
tests/docs/test_docs_run.py); the two that start a broker are in
tests/mqtt/test_examples_mqtt.py. A documented example without a check here fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_docs_run import NOT_ON_A_DEVICE, ROOT, SIZE_CAP, commands_of, run_doc_command, workdir  # noqa: E402


def example_script(command) -> str:
    return re.match(r"python examples/(\w+\.py)", command.code).group(1)


def check_simulate_and_plot(out: str, cwd: Path) -> None:
    # the documented n = 2,000 ... 1,000,000, capped: every n up to the cap, then the cap
    ns = [n for n in (2_000, 10_000, 100_000, 1_000_000) if n < SIZE_CAP] + [SIZE_CAP]
    for n in ns:
        # estimate, |error|, RMSE theory, range check (trusted / not trusted), central eps, its delta
        row = re.search(rf"^\s*{n:,}\s+(-?[0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(trusted|not trusted)\s+(\S+)\s+(\S+)\s*$",
                        out, re.MULTILINE)
        assert row, f"no row for n = {n:,}:\n{out}"
        error, rmse = float(row.group(2)), float(row.group(3))
        assert error < 6 * rmse, f"n = {n:,}: |error| {error} is more than 6 theoretical RMSEs ({rmse})"
    assert "plot written to simulate_and_plot.png" in out
    assert (cwd / "simulate_and_plot.png").stat().st_size > 10_000


def check_embed_client(out: str, cwd: Path) -> None:
    assert re.search(r"device sent 1 envelope of \d+ bytes", out)
    assert "ledger: spent eps 0.5 of 0.5" in out and "answering again is refused" in out
    assert "shuffler admitted client" in out and re.search(r"analyzer opened: Hadamard row \d+, bit [+-]1", out)


def check_js_device(out: str, cwd: Path) -> None:
    # the JavaScript device's lines and the Python parties' view of what it sent, in the order of the round
    order = [
        r"\[js device\] verified round 0 \(hadamard-range, eps0 0\.5\)",
        r"\[js device\] sent 1 envelope of \d+ bytes",
        r"\[js device\] ledger file: spent eps 0\.5 of 0\.5, before anything left the device",
        r"shuffler admitted client [0-9a-f]{8}\.\.\.: nonce [0-9a-f]{8}\.\.\., sealed report of \d+ bytes",
        r"analyzer opened: Hadamard row \d+, bit [+-]1",
        r"\[js device\] shuffler receipts: 1 of 1 admitted; outcome released",
        r"\[js device\] answering again is refused: round [0-9a-f]{32}/0 was already answered",
        r"the device's ledger file holds: spent eps 0\.5 of 0\.5, outcomes \{'[0-9a-f]{32}/0': 'released'\}",
    ]
    at = 0
    for pattern in order:
        found = re.compile(pattern).search(out, at)
        assert found, f"{pattern!r} missing (or out of order) in:\n{out}"
        at = found.end()
    # the Hadamard row of the round's one padded bin count: 40 / (2 * 0.8) = 25 bins, padded to 32
    assert int(re.search(r"Hadamard row (\d+)", out).group(1)) < 32, out


def check_device_client(out: str, cwd: Path) -> None:
    devices = min(2000, SIZE_CAP)
    assert f"{devices:,} devices" in out and "('released', 'released')" in out, out
    assert f"batches [{devices}, {devices}]" in out, out


def check_train_uldp_sgd(out: str, cwd: Path) -> None:
    # the example calibrates eps0 to a session epsilon of 2 (bisection to 1 % in eps0)
    session = float(re.search(r"session \(eps, delta\) = \(([0-9.]+),", out).group(1))
    assert 1.9 <= session <= 2.0, out
    assert re.search(r"test accuracy: ULDP-SGD 0\.\d+, non-private 0\.\d+", out), out


#: What each documented example must print (besides exiting 0).
CHECKS = {
    "simulate_and_plot.py": check_simulate_and_plot,
    "embed_client.py": check_embed_client,
    "js_device.py": check_js_device,
    "device_client.py": check_device_client,
    "train_uldp_sgd.py": check_train_uldp_sgd,
}


@pytest.mark.parametrize("command", commands_of("examples"), ids=lambda c: example_script(c))
def test_example_runs_as_documented(command, tmp_path):
    check = CHECKS.get(example_script(command))
    assert check is not None, f"examples/README.md runs {example_script(command)}: add a check of its output here"
    cwd = workdir(tmp_path)
    done = run_doc_command(command, tmp_path, cwd)
    check(done.stdout, cwd)


def test_embed_client_runs_on_the_device_install(tmp_path):
    """examples/embed_client.py with only what ``pip install shuffledp`` brings: no scipy, MQTT, plots, tqdm."""
    program = (
        "import importlib.abc, runpy, sys\n"
        "class NotOnADevice(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {NOT_ON_A_DEVICE!r}:\n"
        "            raise ModuleNotFoundError(f'{name} is not installed on a device', name=name)\n"
        "sys.meta_path.insert(0, NotOnADevice())\n"
        f"runpy.run_path({str(ROOT / 'examples' / 'embed_client.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    check_embed_client(done.stdout, tmp_path)
