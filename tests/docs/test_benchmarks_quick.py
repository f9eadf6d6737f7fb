"""Every benchmark script runs in ``--quick`` mode and writes a readable result.

Each ``benchmarks/*.py`` script (found by glob, so a new one is covered without editing
this file; ``_common.py`` is the shared helper) runs with ``--quick --out <tmp>``: it must
exit 0 and write at least one JSON file there, each one parsing and carrying the metadata
block (version, commit, cores, parameters, quick). A script that draws a figure must write
it to the same folder. Nothing here measures or asserts a speed: a quick run is a smoke run
of the same code paths.

A script runs as ``python SCRIPT --quick --out <tmp>`` runs it, in its own process, but forked
from one interpreter that has already imported the slow modules (``script_forks.py``; Linux): its
own working directory, environment, ``sys.argv``, ``sys.path[0]``, standard streams and process
group, ``__main__`` and the interpreter's own exit; only the start-up (about a second of imports
a script) is shared. The default-output-folder test starts ``python SCRIPT`` itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shuffledp
from tests.forked_scripts import ScriptForks

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
#: The slow imports the scripts share (numpy, scipy, dp-accounting, matplotlib's figures, the
#: accountant, the parties): imported once by the runner, before it forks a child per script. Not
#: ``matplotlib.pyplot`` (a script must import it itself; what it costs above these is negligible).
PRELOAD = ("numpy", "scipy.optimize", "scipy.special", "scipy.stats", "dp_accounting", "matplotlib.figure",
           "matplotlib.backends.backend_agg", "tqdm", "shuffledp.protocol.accounting.session",
           "shuffledp.protocol.accounting.shuffle_round", "shuffledp.analyzer.coordinator", "shuffledp.client",
           "shuffledp.simulation.engine")
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "_common.py")
#: Seconds a quick run may take before the case fails (quick runs take a few seconds alone;
#: this leaves room for a loaded 2-core machine running other tests at the same time).
TIMEOUT = 150
#: Scripts that need a mosquitto binary (bench_broker_cluster.py: and nats-server).
NEEDS_BROKER = {"bench_mqtt_load.py", "bench_broker_cluster.py"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    env["MPLBACKEND"] = "Agg"
    return env


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python SCRIPT --quick ARGS`` in ``cwd``, a process started afresh."""
    proc = subprocess.run([sys.executable, str(script), "--quick", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    _check_exit(script, proc.returncode, proc.stdout, proc.stderr)
    return proc


def _check_exit(script: Path, status: int, stdout: str, stderr: str, timed_out: bool = False) -> None:
    assert status == 0 and not timed_out, (
        f"{script.name} --quick {f'ran past {TIMEOUT} s' if timed_out else f'exited {status}'}\n"
        f"--- stdout (tail)\n{stdout[-3000:]}\n--- stderr (tail)\n{stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def script_forks(tmp_path_factory: pytest.TempPathFactory):
    """The runner for this module's quick runs (started once per test process)."""
    runner = ScriptForks(PRELOAD, _env(), tmp_path_factory.mktemp("script-forks") / "stderr", cwd=ROOT)
    yield runner
    runner.close()


def _check_metadata(path: Path, out: Path) -> None:
    result = json.loads(path.read_text())
    meta = result.get("metadata")
    assert isinstance(meta, dict), f"{path.name}: no metadata block"
    assert meta["shuffledp_version"] == shuffledp.__version__
    assert "git" in meta
    if meta["git"] is not None:  # null outside a git checkout
        assert re.fullmatch(r"[0-9a-f]{40}", meta["git"]["commit"]) and isinstance(meta["git"]["dirty"], bool)
    assert isinstance(meta["cores_usable"], int) and meta["cores_usable"] >= 1
    assert isinstance(meta["cpu_count"], int) and meta["cpu_count"] >= meta["cores_usable"]
    assert meta["python"].count(".") == 2
    assert meta["quick"] is True
    arguments = meta["parameters"]["arguments"]
    assert arguments["quick"] is True and Path(arguments["out"]) == out
    assert isinstance(meta["parameters"]["sizes"], dict)
    assert set(result) - {"metadata"}, f"{path.name}: metadata and nothing else"


def _results_state() -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in (BENCHMARKS / "results").glob("*")}


def test_every_script_is_found():
    assert len(SCRIPTS) >= 16 and all(p.name.startswith(("bench_", "tightness_")) for p in SCRIPTS)


@pytest.mark.parametrize(
    "script",
    [pytest.param(p, id=p.name, marks=[pytest.mark.mqtt] if p.name in NEEDS_BROKER else []) for p in SCRIPTS],
)
@pytest.mark.timeout(TIMEOUT + 30)
def test_quick_run_writes_results(script: Path, tmp_path: Path, script_forks: ScriptForks):
    if script.name in NEEDS_BROKER:
        from shuffledp.deploy.broker import BrokerError, find_binary

        try:
            find_binary("mosquitto")
        except BrokerError as exc:
            if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
                pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
            pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    out = tmp_path / "out"
    committed = _results_state()
    run = script_forks.run(script, ["--quick", "--out", str(out)], cwd=tmp_path, timeout=TIMEOUT)
    _check_exit(script, run.status, run.stdout, run.stderr, run.timed_out)
    written = sorted(out.glob("*.json"))
    assert written, f"{script.name} --quick wrote no JSON into {out}"
    for path in written:
        _check_metadata(path, out)
    if re.search(r"save_figure|savefig", script.read_text()):
        figures = list(out.glob("*.png"))
        assert figures and all(f.stat().st_size > 1000 for f in figures), f"{script.name}: no figure in {out}"
    assert _results_state() == committed, "a run with --out changed benchmarks/results/"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the run wrote outside its --out folder"


PROBE = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran"))
print(os.getcwd(), sys.argv[1:], sys.path[0], __name__, os.environ["MPLBACKEND"])
if sys.argv[1] == "raise":
    raise RuntimeError("probe failed")
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_run_is_the_scripts_own_process(tmp_path: Path, script_forks: ScriptForks):
    """What the quick runs rely on: the fork takes the script's directory, arguments, import path,
    ``__main__`` and environment, and ends as its interpreter would (status, atexit, a traceback)."""
    probe = tmp_path / "scripts" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    run = script_forks.run(probe, ["3"], cwd=tmp_path, timeout=TIMEOUT)
    assert (run.status, run.timed_out) == (3, False)
    assert run.stdout.splitlines() == [f"{tmp_path} ['3'] {probe.parent} __main__ Agg", "atexit ran"]
    failed = script_forks.run(probe, ["raise"], cwd=tmp_path, timeout=TIMEOUT)
    assert failed.status == 1 and failed.stderr.rstrip().endswith("RuntimeError: probe failed")


def test_default_output_folder_is_bench_out_under_the_working_directory(tmp_path: Path):
    script = BENCHMARKS / "bench_fast_path.py"
    _run(script, cwd=tmp_path)
    written = list((tmp_path / "bench-out").glob("*.json"))
    assert [p.name for p in written] == ["fast_path.json"]
    _check_metadata(written[0], Path("bench-out"))


def test_benchmark_text_describes_the_software_not_its_development():
    for path in [*SCRIPTS, BENCHMARKS / "_common.py"]:
        hits = re.findall(r"(?i)\bissues?\s*#?\d+", path.read_text())
        assert not hits, f"{path.name} names a development ticket: {hits}"
