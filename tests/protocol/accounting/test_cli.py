"""The ``shuffledp account`` command: text, JSON, plot, and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shuffledp.cli import main


def test_text_output_lists_bounds_and_choice(capsys):
    assert main(["account", "--epsilon0", "4", "--users", "100000"]) == 0
    out = capsys.readouterr().out
    assert "0.5378" in out  # FMT21 closed form at the paper's example
    assert "<- used" in out and "fmt21-numerical" in out
    assert "binary RR floor" in out


def test_json_output_parses(capsys):
    assert main(["account", "-e", "2", "--mechanism", "k-rr", "-k", "6", "-n", "20000", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["round"]["method"] == "blanket"
    assert set(rep["round"]["candidates"]) >= {"fmt21-numerical", "fmt21-closed", "blanket"}
    assert rep["round"]["epsilon"] == min(v for v in rep["round"]["candidates"].values() if v is not None)
    assert rep["session"] is None


def test_json_session_with_rounds_and_sampling(capsys):
    argv = ["account", "-e", "1", "-n", "10000", "--rounds", "5", "--sampling-rate", "0.1", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    s = rep["session"]
    assert s["rounds"] == 5 and s["sampling"] == "poisson"
    assert s["epsilon"] == min(s["epsilon_pld"], s["epsilon_rdp"])


def test_plot_is_written(tmp_path, capsys):
    png = tmp_path / "bounds.png"
    argv = ["account", "-e", "2", "-n", "1000", "--plot", str(png), "--plot-n-max", "100000",
            "--plot-points", "4", "--quiet"]
    assert main(argv) == 0
    assert png.stat().st_size > 1000
    assert "plot written" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "-e", "-1", "-n", "10"],
        ["account", "-e", "1", "-n", "0"],
        ["account", "-e", "1", "-n", "10", "--delta", "2"],
        ["account", "-e", "1", "-n", "10", "--sampling-rate", "0"],
        ["account", "-n", "10"],
    ],
)
def test_argparse_errors_exit_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shuffledp account: "), lines


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["account", "-e", "1", "-n", "10", "--mechanism", "hadamard-response"], "num_bins"),
        (["account", "-e", "1", "-n", "10", "--mechanism", "hadamard-response", "--num-bins", "12"], "power of two"),
        (["account", "-e", "1", "-n", "10", "--mechanism", "gaussian-mean", "--delta0", "1e-6"], "no amplification"),
        (["account", "-e", "1", "-n", "10", "--mechanism", "generic", "--delta0", "1e-6"], "delta0"),
    ],
)
def test_invalid_parameters_give_clean_errors(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_subprocess_error_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "shuffledp.cli", "account", "-e", "1", "-n", "10", "--mechanism", "k-rr"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shuffledp account: invalid parameter "), lines
