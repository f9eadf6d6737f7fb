"""``shuffledp audit``: the report, its verdict and exit code, JSON and the plot."""

from __future__ import annotations


import pytest

from shuffledp.audit_cli import format_audit, plot_audit, run_audit
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
    assert main(["audit", "--quick", "--part", "shuffled", "--json", "-q", "--delta", "2.0"]) == 2
    assert "delta" in capsys.readouterr().err
