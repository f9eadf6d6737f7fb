"""Progress written to a stream that is not a terminal: one readable line per stage and tenth."""

from __future__ import annotations

from shuffledp.progress import progress_bar


def test_plain_lines_name_the_unit_and_a_percent_unit_prints_the_share_alone(capsys):
    with progress_bar(100, unit="%") as step:
        step("auditing", 0)
        step("auditing", 50)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "auditing: 0%" and err[1].startswith("auditing: 50%, ETA ")
    assert not any("%s" in line for line in err)
    with progress_bar(2000, unit="user") as step:
        step("round 0", 1000)
    assert capsys.readouterr().err.startswith("round 0: 1,000/2,000 users (50%)")
