"""``shuffledp audit``: the report, its verdict and exit code, JSON and the plot."""

from __future__ import annotations


import pytest

from shuffledp.cli.audit import format_audit, plot_audit, run_audit
from shuffledp.cli import main


def test_shuffled_audit_report_passes_on_correct_code(tmp_path):
    result = run_audit(False, "shuffled", 1e-6, 0, shuffled_rounds=20_000, ns=(100, 1000))
    assert result["passed"] and len(result["shuffled"]) == 2 * 2 * 2
    for row in result["shuffled"]:
        assert 0.0 <= row["lower_bound"] <= row["claimed_epsilon"]
        if row["exact_epsilon"] is not None:
            assert row["lower_bound"] <= row["exact_epsilon"]
    text = format_audit(result)
    assert "PASSED" in text and "VIOLATED" not in text
    plot_audit(result, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").stat().st_size > 10_000


def test_a_planted_fault_fails_the_audit_and_names_the_row(monkeypatch, capsys):
    from shuffledp.client import krr

    original = krr.krr_keep_probability
    monkeypatch.setattr(krr, "krr_keep_probability", lambda k, eps: original(k, eps + 0.5))
    result = run_audit(False, "shuffled", 1e-6, 0, shuffled_rounds=10**6, ns=(100,))
    assert not result["passed"]
    violated = [r for r in result["shuffled"] if not r["passed"]]
    assert violated and all(r["mechanism"] == "binary-rr" for r in violated)  # Hadamard's keep is another function
    assert "VIOLATED" in format_audit(result)


def test_cli_json_and_bad_usage(capsys):
    with pytest.raises(SystemExit):  # argparse refuses an unknown part
        main(["audit", "--part", "nothing"])
    with pytest.raises(SystemExit) as exit_:  # refused by the parser, before any work
        main(["audit", "--quick", "--part", "shuffled", "--json", "-q", "--delta", "2.0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "shuffledp audit: argument --delta: expected a number in (0, 1), got 2.0")


def test_claim_part_reads_a_signed_session_file_and_refuses_an_altered_one(tmp_path, capsys):
    import json

    from test_audit_claim import MEAN_BATCHES, MEAN_SPEC, RANGE_BATCHES, RANGE_SPEC, KEY, round_entry, write_session

    good = write_session(tmp_path / "s.json", [round_entry(RANGE_SPEC, RANGE_BATCHES), round_entry(MEAN_SPEC, MEAN_BATCHES)])
    result = run_audit(True, "claim", 1e-6, 0, session=str(good), keys=KEY.hex())
    assert result["passed"] and result["claim"]["passed"] and not result["local"] and result["mechanics"] is None
    assert "claim" in format_audit(result)
    doc = json.loads(good.read_text())
    doc["rounds"][0]["epsilon0"] = 0.1  # a file that says the round was more private than its signed spec
    altered = tmp_path / "altered.json"
    altered.write_text(json.dumps(doc))
    assert main(["audit", "--part", "claim", "--session", str(altered), "--keys", KEY.hex(), "-q"]) == 2
    assert "session-file" in capsys.readouterr().err
    assert main(["audit", "--part", "claim", "-q"]) == 2  # no session file
    assert main(["audit", "--part", "claim", "--session", str(good), "-q"]) == 2  # no key to verify it with


def test_mechanics_part_json_and_a_planted_shuffler_fault_exits_1(capsys):
    import json

    from shuffledp.audit.faults import planted_fault

    assert main(["audit", "--part", "mechanics", "--quick", "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and doc["mechanics"]["passed"] and doc["mechanics"]["transport"] == "in-process"
    with planted_fault("small-batch-release"):
        assert main(["audit", "--part", "mechanics", "--quick", "-q"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "shuffler mechanics failed: min-batch" in out
