"""Where the commands met unevenly: one JSON object per command, a useful one-run vector plot,
``account``'s ``n/a`` rows with their reason, and the examples' options spelled as the commands'
(docs/cli.md, "Output of several runs, plots of one" and "Examples")."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from shuffledp.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_vector_run_without_sweep_plots_each_coordinate_and_writes_the_object_it_prints(capsys, tmp_path, monkeypatch):
    import shuffledp.cli.vector as vector_cli

    drawn = []
    monkeypatch.setattr(vector_cli, "save_figure", lambda fig, path: drawn.append(fig))
    output = tmp_path / "r.json"
    argv = ["vector", "-d", "4", "-n", "300", "-m", "5", "-q", "--json", "--plot", str(tmp_path / "p.png"),
            "--output", str(output)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert isinstance(printed, dict) and printed == json.loads(output.read_text())
    (ax,) = drawn[0].axes
    assert ax.get_xlabel() == "coordinate"
    # the true mean and the estimate: one point per coordinate each, not one dot for the run
    assert [len(line.get_xdata()) for line in ax.get_lines()][:2] == [4, 4]


def test_every_na_row_of_account_says_why(capsys):
    assert main(["account", "-e", "1", "-n", "1000", "--no-lower-bound", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    missing = {name for name, value in report["round"]["candidates"].items() if value is None and "(" not in name}
    assert missing and set(report["not_applicable"]) == missing
    assert report["not_applicable"]["rr-exact"] == "binary-rr only"
    assert main(["account", "-e", "1", "-n", "1000", "--no-lower-bound"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " n/a" in line]
    assert len(rows) >= len(missing) and all(line.rstrip().endswith(")") for line in rows), rows


@pytest.mark.parametrize("script,old,new", [
    ("device_client.py", "--epsilon", "--epsilon0"),
    ("simulate_and_plot.py", "--epsilon", "--epsilon0"),
    ("mqtt_session.py", "--epsilon", "--epsilon0"),
    ("train_uldp_sgd.py", "--epsilon", "--central-epsilon"),
])
def test_the_examples_old_epsilon_still_parses_and_warns(script, old, new, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", [script, old, "2", "--help"])  # the alias acts, then --help exits before any work
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    assert exit_.value.code == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [f"{script}: warning: {old} is deprecated and will be removed; use {new}"]
    assert new in captured.out and old in captured.out  # --help names the option and its old spelling
