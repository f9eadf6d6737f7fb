"""Every JSON document a command prints names the version that made it and every parameter."""

from __future__ import annotations

import json

import pytest

from shuffledp import __version__
from shuffledp.cli import main

COMMANDS = [
    (["simulate", "--fast", "-n", "2000", "--seed", "3"], "simulate", {"users": 2000, "seed": 3}),
    (["simulate", "--protocol", "sum", "--fast", "-n", "2000"], "simulate", {"protocol": "sum"}),
    (["account", "--epsilon0", "1", "--users", "1000", "--delta", "1e-6"], "account", {"epsilon0": 1.0, "delta": 1e-6}),
    (["vector", "-d", "4", "-n", "2000"], "vector", {"dim": 4}),
    (["distribution", "-k", "8", "-n", "2000", "-m", "1,10"], "distribution", {"symbols": 8}),
    (["vector", "-d", "2", "-m", "2", "--sweep", "300,600"], "vector", {"sweep": "300,600"}),
]


@pytest.mark.parametrize("argv, command, expected", COMMANDS, ids=[" ".join(c[0][:3]) for c in COMMANDS])
def test_json_output_carries_version_command_and_parameters(capsys, argv, command, expected):
    assert main([*argv, "--json", "--quiet"] if "account" not in argv else [*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)  # one object, as every command prints (several results under "results")
    if "results" in doc:
        assert len(doc["results"]) == 2 and all("shuffledp" not in r for r in doc["results"])
    for d in [doc]:
        info = d["shuffledp"]
        assert info["version"] == __version__
        assert info["command"] == command
        for key, value in expected.items():
            assert info["parameters"][key] == value, key
        assert "json" in info["parameters"]  # defaults are named too, not only what was typed


def test_a_capped_run_says_so_in_its_json(capsys, monkeypatch):
    """SHUFFLEDP_SIZE_CAP rewrites sizes in place: the saved parameters must say they were capped."""
    monkeypatch.setenv("SHUFFLEDP_SIZE_CAP", "2000")
    assert main(["simulate", "--fast", "-n", "5000", "--json", "--quiet"]) == 0
    info = json.loads(capsys.readouterr().out)["shuffledp"]
    assert info["parameters"]["users"] == 2000
    assert info["parameters"]["size_cap"] == {"cap": 2000, "changes": ["--users 5000 -> 2000"]}
