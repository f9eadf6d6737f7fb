"""``shuffledp account --plan FILE`` re-derives the session epsilon every simulation prints, to the last digit.

* ``simulate`` (mean, vector-mean, distribution), ``vector`` and ``distribution`` (both estimators)
  include in ``--json`` the session plan they accounted (``"plan"``), and ``account --plan`` on it
  (the plan alone, or the whole ``--json`` document) prints the same epsilon and delta, exactly;
* the Python API gives the same plan object, accounted by the same function;
* the audit's rule for a signed round is the plan table's (one table);
* a malformed plan is refused with one line, exit 2, before any accounting.
"""

from __future__ import annotations

import json

import pytest

from shuffledp.cli import main
from shuffledp.protocol.accounting.composition import account_plan, mechanism_rule, plan_round, session_plan

N = 300


def _json(capsys, *argv: str):
    assert main([*argv, "-q", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _account(capsys, tmp_path, document) -> dict:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    return _json(capsys, "account", "--plan", str(path))["session"]


def _text(capsys, tmp_path, document) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    assert main(["account", "--plan", str(path)]) == 0
    return capsys.readouterr().out


SIMULATE = {
    "mean": ["simulate", "--fast", "-n", str(N), "-m", "5"],
    "mean, wide domain": ["simulate", "--fast", "-n", "1000", "-m", "10", "-B", "1000", "-e", "0.5"],
    "vector-mean": ["simulate", "--protocol", "vector-mean", "--fast", "-n", str(N), "-m", "5", "-d", "4", "-e", "4"],
    "distribution": ["simulate", "--protocol", "distribution", "--fast", "-n", str(N), "-m", "5", "-d", "4", "-e", "4"],
    "vector": ["vector", "--fast", "-n", str(N), "-m", "5", "-d", "4"],
    "vector, range skipped": ["vector", "--fast", "-n", str(N), "-m", "1000", "-d", "4"],
    "vector, paper mode": ["vector", "--fast", "-n", "2000", "-m", "5", "-d", "4", "--mode", "paper"],
}


@pytest.mark.parametrize("case", sorted(SIMULATE))
def test_account_plan_reproduces_the_printed_session_epsilon(case, capsys, tmp_path):
    doc = _json(capsys, *SIMULATE[case])
    printed = doc["central"]
    assert printed["epsilon"] is not None and doc["plan"]["delta"] == printed["delta"]
    for document in (doc["plan"], doc):  # the plan alone, or the whole --json output
        session = _account(capsys, tmp_path, document)
        assert (session["epsilon"], session["delta"]) == (printed["epsilon"], printed["delta"])  # to the last digit
    assert f"session: eps = {printed['epsilon']!r} at delta = {printed['delta']:g}" in _text(capsys, tmp_path, doc)


def test_account_plan_reproduces_both_estimators_of_the_distribution_command(capsys, tmp_path):
    document = _json(capsys, "distribution", "--fast", "-k", "8", "-n", str(N), "-m", "5,200")
    results = document["results"]
    assert len(results) == 2
    for result in results:
        for estimator in result["estimators"]:
            privacy = estimator["privacy"]
            session = _account(capsys, tmp_path, privacy["plan"])
            assert (session["epsilon"], session["delta"]) == (privacy["central"]["epsilon"], privacy["central"]["delta"])
    oracle = results[0]["estimators"][0]["privacy"]["plan"]["rounds"]
    assert [(r["mechanism"], r["params"]["k"]) for r in oracle] == [("block-hadamard-response", 8)]
    # the whole document holds four plans: refused in one line saying where each one is
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(document))
    assert main(["account", "--plan", str(whole)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a document of 2 results" in err[0] and "results[i].estimators[j].privacy.plan" in err[0], err


def test_the_gaussian_plan_claims_no_amplification_either_way(capsys, tmp_path):
    doc = _json(capsys, "simulate", "--fast", "-n", str(N), "-m", "5", "--noise", "gaussian", "--delta0", "1e-6")
    assert doc["central"]["epsilon"] is None
    session = _account(capsys, tmp_path, doc["plan"])
    assert session["epsilon"] is None and "no amplification is claimed" in session["method"]


def test_the_api_gives_the_plan_and_accounts_it_by_the_same_function():
    from shuffledp.simulation import SimulationConfig, run_simulation, session_plan_of
    from shuffledp.simulation.population import Population

    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 5), n=N, epsilon0=1.0)
    result = run_simulation(config)
    assert result.plan == session_plan_of(config.protocol_config(), N, config.delta)
    assert result.as_dict()["plan"] == result.plan
    assert account_plan(json.loads(json.dumps(result.plan))) == result.central


def test_a_plan_may_mix_batches_and_sample_users():
    plan = session_plan([
        plan_round("hadamard-range", 0.5, {"padded_bins": 64}, 2000),
        plan_round("projected-mean", 0.5, {"grid_levels": 4096, "noise": "laplace"}, 1500),
    ], 1e-6)
    mixed = account_plan(plan)
    assert 0 < mixed["epsilon"] < 1.0 and mixed["delta"] == 1e-6
    same = account_plan(session_plan([dict(r, batch=1500) for r in plan["rounds"]], 1e-6))
    assert same["epsilon"] >= mixed["epsilon"]  # fewer users hide each report of round 0
    sampled = session_plan([dict(r, sampling={"rate": 0.1, "scheme": "poisson"}) for r in plan["rounds"]], 1e-6)
    got = account_plan(sampled)
    assert got["basic_composition_epsilon"] is None and got["epsilon"] <= mixed["session_composition_epsilon"]


def test_the_audit_reads_the_same_rule_table():
    from shuffledp.audit.claim import plan_guarantee, plan_params
    from shuffledp.protocol.accounting.composition import round_guarantee
    from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams

    for params in (HadamardRangeParams(-20.0, 20.0, 1.0), ProjectedMeanParams(0.0, 1.0),
                   ProjectedMeanParams(0.0, 1.0, noise="gaussian")):
        mechanism, plan = plan_params(params)
        rule = mechanism_rule(mechanism, 0.5, plan)
        expected = None if isinstance(rule, str) else round_guarantee(rule[0], rule[1], rule[2], rule[4])
        assert plan_guarantee(params, 0.5) == expected


BAD = [
    ("[]", "not a session plan"),
    ('{"format": "other", "version": 1, "delta": 1e-6, "rounds": []}', "format/version"),
    ('{"format": "shuffledp-session-plan", "version": 1, "delta": 2, "rounds": []}', "plan delta"),
    ('{"format": "shuffledp-session-plan", "version": 1, "delta": 1e-6, "rounds": []}', "plan rounds"),
    ('{"format": "shuffledp-session-plan", "version": 1, "delta": 1e-6, "rounds": [{"mechanism": "hadamard-range", '
     '"epsilon0": 1, "params": {"padded_bins": 8}, "batch": 0}]}', "batch"),
    ('{"format": "shuffledp-session-plan", "version": 1, "delta": 1e-6, "rounds": [{"mechanism": "nope", '
     '"epsilon0": 1, "batch": 10}]}', "no accounting rule"),
    ('{"format": "shuffledp-session-plan", "version": 1, "delta": 1e-6, "rounds": [{"mechanism": "generic", '
     '"epsilon0": NaN, "batch": 10}]}', "not JSON"),
    ("not json", "not JSON"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_a_malformed_plan_is_refused_in_one_line(text, message, capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert main(["account", "--plan", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("shuffledp account: ") and message in lines[0], lines


def test_a_plan_names_its_own_delta(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(session_plan([plan_round("generic", 1.0, {}, 1000)], 1e-6)))
    assert main(["account", "--plan", str(path), "--delta", "1e-7"]) == 2
    assert "drop --delta" in capsys.readouterr().err
    assert "--plan FILE" in _help(capsys)


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["account", "--help"])
    return capsys.readouterr().out
