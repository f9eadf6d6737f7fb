"""The range check's words match what its derivation proves (``analyzer/range_check.py``, *Guarantee*).

* the verdict reads as a test result, "trusted at level ..." or "not trusted: ...", never as a
  fact about the data ("OK: the range holds users");
* the printed guarantee is the joint probability, P(the range holds no user AND it is reported
  trusted) <= 0.001 + gamma, with gamma's value when tau comes from the data model, and no gamma
  term (the assumption named instead) when the user gave tau.
"""

from __future__ import annotations

import pytest

from shuffledp.analyzer.range_check import format_range_check, guarantee_text
from shuffledp.cli import main

HARD = ["simulate", "--fast", "-q", "-n", "2000", "-B", "1000", "-m", "10", "-e", "0.5"]
JOINT = "P(the range holds no user AND it is reported trusted)"


def _out(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _check_line(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  range check (analyzer's own)"))
    return lines[start:start + 2]


def test_a_trusted_run_reads_as_a_test_result_with_the_joint_bound_and_gamma(capsys):
    text = _out(capsys, *HARD, "--seed", "1")
    head, guarantee = _check_line(text)
    assert head.startswith("  range check (analyzer's own)  trusted at level 0.011: the test rejected \"the range holds no user\"")
    assert guarantee == (f"      guarantee: {JOINT} <= 0.001 + gamma = 0.011 (gamma = 0.01: the chance, under the data model, "
                         "that some user's local mean lies farther than tau from the mean); a joint probability over runs, "
                         "not the chance that a range reported trusted is empty")
    assert "OK" not in text and "UNTRUSTED" not in text and "the range holds users" not in text


def test_an_untrusted_run_reads_as_not_trusted(capsys):
    text = _out(capsys, *HARD, "--seed", "12")  # this seed's range holds none of the users
    head, guarantee = _check_line(text)
    assert head.startswith("  range check (analyzer's own)  not trusted: the test could not reject \"the range holds no user\"")
    assert guarantee.startswith(f"      guarantee: {JOINT} <= 0.001 + gamma = 0.011")
    assert "(not trusted: the range check could not reject that the range holds no user)" in text
    assert "UNTRUSTED" not in text


def test_a_user_given_tau_has_no_gamma_term(capsys):
    head, guarantee = _check_line(_out(capsys, *HARD, "--seed", "1", "--tau", "2"))
    assert head.startswith("  range check (analyzer's own)  trusted at level 0.001: ")
    assert guarantee.startswith(f"      guarantee: {JOINT} <= 0.001, for users whose local means span less than the "
                                "range's width 6 tau (tau given by the user")
    assert "gamma =" not in guarantee and "no gamma term" in guarantee


def test_without_tau_s_origin_the_spread_event_is_named():
    check = {"status": "ok", "trust_alpha": 0.001}
    assert guarantee_text(check).startswith(f"{JOINT} <= 0.001 + P(the users' local means span 6 tau or more)")


@pytest.mark.parametrize("status,head", [("ok", "trusted at level 0.01 ("), ("untrusted", "not trusted: 1 of 4 coordinates")])
def test_the_vector_check_reads_as_a_test_result(status, head):
    check = {"status": status, "coordinates": 4, "warned_coordinates": [] if status == "ok" else [2], "alpha": 0.01,
             "fewest_reports": 100, "users_needed": 50, "smallest_margin": 0.1}
    line = format_range_check(check)
    assert line.startswith(head) and "AND it passes) <= 0.01" in line
