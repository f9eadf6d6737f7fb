"""No-power rows of ``shuffledp audit``: the runs-needed formula, the rows' text and JSON, the progress total, the plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from shuffledp.audit.local import _lower_bound, audit_local, krr_case, run_audit as run_local
from shuffledp.audit.power import POWER, detection_power, power_fields, rates_at_claim, runs_needed
from shuffledp.cli import main
from shuffledp.cli import audit as cli_audit
from shuffledp.cli.audit import audit_figure, audit_work, format_audit, plot_audit, run_audit, work_total


def rr_rates(epsilon: float, k: int = 2) -> tuple[float, float]:
    """k-RR's event {report == 0} under x = 0 and x' = 1: ratio exactly e^eps (a mechanism at its claim)."""
    return math.exp(epsilon) / (math.exp(epsilon) + k - 1), 1.0 / (math.exp(epsilon) + k - 1)


REPEATS = 400
#: The simulated power may fall short of POWER only by sampling noise: 4 standard deviations of a fraction.
TOLERANCE = 4 * math.sqrt(POWER * (1 - POWER) / REPEATS)


@pytest.mark.parametrize("p,q,delta,confidence", [
    (*rr_rates(0.5), 0.0, 0.95),
    (*rr_rates(0.05), 0.0, 1 - 0.05 / 36),
    (0.001 * math.exp(4.0), 0.001, 1e-6, 1 - 0.05 / 92),  # a rare event at eps = 4, family-wise confidence
])
def test_runs_needed_gives_a_positive_bound_with_the_stated_power(p, q, delta, confidence):
    n = runs_needed(p, q, delta, confidence)
    rng = np.random.default_rng(20260101)
    k1 = rng.binomial(n, p, REPEATS)
    k2 = rng.binomial(n, q, REPEATS)
    positive = np.mean(_lower_bound(k1, n, k2, n, delta, confidence) > 0)
    assert positive >= POWER - TOLERANCE
    assert abs(positive - detection_power(p, q, n, delta, confidence)) <= 4 * math.sqrt(0.25 / REPEATS)
    # near the smallest such number: half as many runs fall clearly short
    assert detection_power(p, q, n // 2, delta, confidence) < POWER - 0.1
    # the closed form (normal approximation) it starts from is within a few per cent of it
    from scipy.stats import norm

    s_p, s_q = math.sqrt(p * (1 - p)), math.sqrt(q * (1 - q))
    n0 = ((norm.ppf(1 - (1 - confidence) / 2) * (s_p + s_q) + norm.ppf(POWER) * math.hypot(s_p, s_q)) / (p - q - delta)) ** 2
    assert n0 <= n <= 1.35 * n0 + 10


def test_runs_needed_on_the_real_randomizer_at_its_claim():
    """The shipped k-RR leaks exactly its claim on its event: with runs_needed trials per input the
    local audit's bound is positive in about POWER of the seeds (binomial tolerance at 1e-3)."""
    case = krr_case(0.5)
    p, q = rr_rates(0.5, 16)
    n = runs_needed(p, q, 0.0, 0.95)
    seeds = 80
    positive = sum(run_local(case, trials=n, seed=s).epsilon_lb > 0 for s in range(seeds))
    assert positive > binom.ppf(1e-3, seeds, POWER)


def test_no_leak_no_number_and_rates_at_the_claim():
    assert runs_needed(0.3, 0.3) is None and runs_needed(0.3, 0.29, delta=0.02) is None
    assert rates_at_claim(10, 0, 100, 1.0, 0.0) == pytest.approx((0.1, 0.1 / math.e))
    assert rates_at_claim(0, 0, 100, 1.0, 0.0) is None
    p, q = rates_at_claim(30, 20, 100, 1.0, 1e-6)
    assert q == 0.2 and p == pytest.approx(0.2 * math.e + 1e-6)
    assert power_fields(0.3, 30, 20, 100, 1.0, 0.0, 0.95) == {
        "no_power": False, "runs_needed": None, "runs_needed_observed": None, "power": POWER, "power_detail": ""}
    fields = power_fields(0.0, 30, 20, 100, 1.0, 0.0, 0.95)
    assert fields["no_power"] and fields["runs_needed"] == runs_needed(0.2 * math.e, 0.2) < fields["runs_needed_observed"]
    assert power_fields(0.0, 0, 0, 100, 1.0, 0.0, 0.95)["power_detail"].startswith("the event never occurred")


def separated_but_weak_row() -> dict:
    """A recorded no-power row of a 1,000-round audit (binary RR, n = 100, eps0 = 1, claim 0.4837 exact)
    whose event did separate the inputs on its selection sample: 40 and 32 of 1,000 evaluation rounds in
    ``C >= 36``, a bound of 0, so the runs needed to show a leak at the claim are known (5,421). Whether
    a tiny audit draws such a row is chance (a few per cent of seeds), so the fixture carries one."""
    from shuffledp.audit.shuffled import ShuffledAudit, claimed_central

    claimed, method, exact = claimed_central("binary-rr", 1.0, 100, 1e-6)
    row = ShuffledAudit(mechanism="binary-rr", n=100, epsilon0=1.0, delta=1e-6, rounds=1000, claimed_epsilon=claimed,
                        claimed_method=method, exact_epsilon=exact, lower_bound=0.0,
                        event="count of [report = 1 (x = 0, x' = 1)] >= 36", confidence=1 - 0.05 / 8, seconds=0.0,
                        count_hit=40, count_other=32).as_dict()
    row["num_bins"] = 2
    row["verdict"] = cli_audit.verdict(row)
    return row


@pytest.fixture(scope="module")
def weak_result():
    """A shuffled audit far too small for its large n: rows with no power, and rows with a positive bound;
    and :func:`separated_but_weak_row`."""
    result = run_audit(False, "shuffled", 1e-6, 0, shuffled_rounds=1000, ns=(100, 10_000))
    result["shuffled"].append(separated_but_weak_row())
    result["no_power_rows"] += 1
    return result


def test_no_power_rows_in_text_and_json(weak_result, monkeypatch, capsys):
    rows = weak_result["shuffled"]
    weak = [r for r in rows if r["lower_bound"] == 0]
    assert weak and len(weak) < len(rows) and weak_result["passed"]
    for r in rows:
        assert r["no_power"] is (r["lower_bound"] == 0)
        assert r["verdict"] == ("no power" if r["no_power"] else "ok")
        if r["runs_needed"] is not None:
            assert r["no_power"] and r["runs_needed"] > r["rounds"]  # a leak at the claim needs more than were run
        elif r["no_power"]:
            assert r["power_detail"]
    assert weak_result["no_power_rows"] == len(weak)
    text = format_audit(weak_result)
    table = [line for line in text.splitlines() if line.startswith("  binary-rr") or line.startswith("  hadamard-range")]
    assert sum(line.endswith("no power") for line in table) == len(weak)
    assert sum(line.endswith("  ok") for line in table) == len(rows) - len(weak)
    assert f"{len(weak)} row(s) with no power" in text
    needed = next(r for r in weak if r["runs_needed"] is not None)
    assert f"from {needed['runs_needed']:,} rounds per sample" in text
    monkeypatch.setattr(cli_audit, "run_audit", lambda *a, **k: weak_result)
    assert main(["audit", "--part", "shuffled", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert [r["verdict"] for r in doc["shuffled"]] == [r["verdict"] for r in rows]
    assert all({"no_power", "runs_needed", "runs_needed_observed", "power", "power_detail"} <= set(r) for r in doc["shuffled"])
    assert out.err == ""  # this stand-in reports no progress


def test_local_rows_carry_the_power_fields():
    rows = [r.as_dict() for r in audit_local(trials=300, system_trials=0, epsilons=[0.5], gaussian_stress=())]
    for r in rows:
        best = max(r["epsilon_lb"], r["epsilon_param"] or 0.0)
        assert r["no_power"] is (best == 0)
    assert any(r["no_power"] for r in rows)


def test_progress_total_is_the_work_done():
    """The bar's 100 % is exactly the work of the parts that run: every part's calls add up to it."""
    for part, kwargs in (
        ("shuffled", {"shuffled_rounds": 500, "ns": (100, 1000)}),
        ("local", {"local_options": {"trials": 500, "system_trials": 50, "epsilons": [1.0], "gaussian_stress": ()}}),
        ("mechanics", {}),
    ):
        steps: list[tuple[str, float]] = []
        run_audit(True, part, 1e-6, 0, progress=lambda stage, units: steps.append((stage, units)), **kwargs)
        assert sum(u for _, u in steps) == pytest.approx(100.0, abs=1e-6), part
        assert all(u >= 0 for _, u in steps)
    work = audit_work(False, "all")
    assert set(work) == {"local", "shuffled", "summation", "mechanics"}
    assert len(work["shuffled"]) == 12 and len(work["summation"]) == 6 and work_total(work) > 10 * work_total(audit_work(True, "all")) / 20


def test_progress_bar_on_stderr_with_a_total_unless_quiet(weak_result, monkeypatch, capsys):
    def fake(*args, progress=None, **kwargs):
        if progress is not None:
            progress("shuffled", 100.0)
        return weak_result

    monkeypatch.setattr(cli_audit, "run_audit", fake)
    assert main(["audit", "--part", "shuffled"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == ["shuffled: 100%"] and "no power" in out.out
    for quiet in (["-q"], ["--quiet"], ["--json", "-q"]):
        main(["audit", "--part", "shuffled", *quiet])
        assert capsys.readouterr().err == ""
    main(["audit", "--part", "shuffled", "--json"])  # progress on stderr with --json too, the document on stdout
    out = capsys.readouterr()
    assert out.err.splitlines() == ["shuffled: 100%"] and json.loads(out.out)["shuffled"]


def test_plot_one_panel_per_part_with_zero_bounds_marked(weak_result, tmp_path):
    from shuffledp.audit.summation import summation_rows

    result = dict(weak_result)
    fig = audit_figure(result)
    assert len(fig.axes) == 1
    markers = [line.get_marker() for line in fig.axes[0].get_lines()]
    assert "v" in markers  # the zero bounds, at the floor
    result["local"] = run_audit(False, "local", 1e-6, 0, local_options={
        "trials": 300, "system_trials": 0, "epsilons": [0.5, 4.0], "gaussian_stress": ()})["local"]
    result["summation"] = summation_rows(True, 0, settings=((100, 1.0),), rounds=300)
    fig = audit_figure(result)
    assert len(fig.axes) == 3
    assert [ax.get_legend() is not None for ax in fig.axes] == [True] * 3
    path = tmp_path / "audit.png"
    assert plot_audit(result, str(path))
    from PIL import Image

    width, height = Image.open(path).size
    assert 1500 <= width <= 2400 and 500 <= height <= 1000
    assert audit_figure({**result, "local": [], "shuffled": [], "summation": []}) is None
