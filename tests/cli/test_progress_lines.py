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


def test_a_long_run_is_announced_once_with_its_projection():
    """The projection is elapsed / share: 2 s for 5 % is 40 s, past the 30 s threshold; 2 s for
    10 % is 20 s, not announced; under a second measured, nothing is projected yet."""
    from shuffledp.progress import ANNOUNCE_AFTER, duration_text, estimate_line

    assert estimate_line(2.0, 0.05) == "this run takes about 40 s (projected from the rate of its first 5%; Ctrl-C stops it)"
    assert 2.0 / 0.1 < ANNOUNCE_AFTER and estimate_line(2.0, 0.1) is None
    assert estimate_line(0.5, 0.001) is None and estimate_line(5.0, 1.0) is None
    assert [duration_text(s) for s in (45, 720, 12600)] == ["45 s", "12 min", "3.5 h"]
