"""``shuffledp simulate --protocol NAME``: every protocol from the command line, JSON and plot, typed errors."""

from __future__ import annotations

import json

import pytest

from shuffledp.cli import main


@pytest.mark.parametrize(
    "protocol,extra",
    [("sum", []), ("vector-sum", ["-d", "2"]), ("scalar-mean", []), ("vector-mean", ["-d", "4", "-e", "4"]), ("distribution", ["-d", "4", "-e", "4"])],
)
@pytest.mark.parametrize("path", ["--fast", "--messages"])
def test_every_protocol_runs_on_both_paths(protocol, extra, path, capsys, tmp_path):
    plot = tmp_path / "p.png"
    n = "400" if protocol == "vector-sum" else "300"
    code = main(["simulate", "--protocol", protocol, path, "-n", n, "-m", "5", "-q", "--json", "--plot", str(plot), *extra])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    if protocol in ("scalar-mean", "vector-mean", "distribution"):
        assert out["config"]["path"] == path[2:]
        if protocol != "scalar-mean":  # within 6 exact RMSEs (fixed seed)
            assert out["l2_error"] <= 6 * out["mse_theory"] ** 0.5
        else:
            assert plot.stat().st_size > 10_000
        return
    assert plot.stat().st_size > 10_000
    assert out["path"] == path[2:] and out["protocol"] == protocol
    assert out["central"]["split_delta"] + out["central"]["noise_delta"] <= out["central"]["delta"]
    assert out["messages"] == int(n) * out["messages_per_user"]
    assert out["rejected_at_shuffler"] == {} and out["rejected_at_analyzer"] == {}
    # within 6 exact RMSEs (a fixed seed; the distribution is checked in tests/analyzer/test_summation.py)
    assert out["error_l2"] <= 6 * out["rmse_theory"]


def test_summation_refusals_are_typed(capsys):
    assert main(["simulate", "--protocol", "sum", "-n", "2", "-q"]) == 2
    assert "users" in capsys.readouterr().err
    assert main(["simulate", "--protocol", "vector-sum", "-n", "300", "--radius", "-1", "-q"]) == 2
    assert "radius" in capsys.readouterr().err
    assert main(["simulate", "--protocol", "sum", "--fast", "--broker", "127.0.0.1", "-n", "300", "-q"]) == 2
    assert "broker" in capsys.readouterr().err
