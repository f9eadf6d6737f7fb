"""The claim audit (``shuffledp/audit/claim.py``): a session file built from real signed specs and
batch sizes, its per-round and session guarantees recomputed from the accountant, and every way a
session file can be wrong refused with a typed error (or, for short batches, reported as a violation).

The end-to-end check that ``analyzer run --output`` writes verifiable signed specs is in
``tests/mqtt/test_services.py::test_up_runs_a_whole_deployment_and_prints_the_estimate``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from parties import DEPLOYMENT, PARAMS, make_spec, quota_params
from shuffledp.audit.claim import (
    claim_report,
    format_claim,
    load_session,
    round_guarantee,
    trusted_analyzer_key,
    verify_session,
)
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.accounting import (
    SessionAccountant,
    generic_guarantee,
    hadamard_response_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)
from shuffledp.protocol.errors import InvalidParameter, SessionFileError, ShuffleDPError
from shuffledp.protocol.wire.messages import ProjectedMeanParams, RoundSpec
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum

DELTA = 1e-6
KEY = DEPLOYMENT.analyzer_signing_key
EPS0 = 1.0
#: The scalar-mean protocol's two rounds, as `analyzer run` announces them, and the batches delivered.
RANGE_SPEC = make_spec(PARAMS, round_id=0, min_batch=1000, max_batch=1200, epsilon0=EPS0)
MEAN_SPEC = make_spec(ProjectedMeanParams(-1.0, 1.0), round_id=1, min_batch=1000, max_batch=1200, epsilon0=EPS0)
RANGE_BATCHES, MEAN_BATCHES = [1000], [1100]


def round_entry(spec: RoundSpec, batch_sizes: list[int], signer: Deployment = DEPLOYMENT) -> dict:
    """One round as ``analyzer run --output`` records it (the fields the audit reads)."""
    return {
        "round_id": spec.round_id,
        "mechanism": spec.mechanism,
        "epsilon0": spec.epsilon0,
        "delta0": spec.delta0,
        "min_batch": spec.min_batch,
        "max_batch": spec.max_batch,
        "shuffler_instances": spec.shuffler_instances,
        "reports": sum(batch_sizes),
        "batch_sizes": batch_sizes,
        "smallest_batch": min(batch_sizes),
        "signed_spec": signer.analyzer().sign_spec(spec).hex(),
    }


def write_session(path: Path, rounds: list[dict], **extra) -> Path:
    doc = {"protocol": "scalar-mean", "session_id": DEPLOYMENT.session_id.hex(),
           "analyzer_signing_key": KEY.hex(), "rounds": rounds, **extra}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def session_file(tmp_path_factory) -> Path:
    return write_session(tmp_path_factory.mktemp("claim") / "session.json",
                         [round_entry(RANGE_SPEC, RANGE_BATCHES), round_entry(MEAN_SPEC, MEAN_BATCHES)])


@pytest.fixture(scope="module")
def report(session_file) -> dict:
    return claim_report(load_session(session_file), KEY, DELTA, lower_rounds=10**6, seed=0)


def test_each_round_is_accounted_as_the_accountant_does_at_its_smallest_batch(report):
    hadamard, mean = report["rounds"]
    range_local = hadamard_response_guarantee(EPS0, PARAMS.padded_bins)
    mean_local = laplace_mean_guarantee(EPS0, MEAN_SPEC.params.grid_levels)
    assert round_guarantee(RANGE_SPEC) == range_local and round_guarantee(MEAN_SPEC) == mean_local
    for row, local, n in ((hadamard, range_local, min(RANGE_BATCHES)), (mean, mean_local, min(MEAN_BATCHES))):
        direct = shuffled_round(local, n, DELTA)
        assert row["users"] == n and row["smallest_batch"] == n
        assert row["central_epsilon"] == direct.epsilon and row["method"] == direct.method
        assert row["central_delta"] == DELTA
        assert (row["epsilon0"], row["delta0"]) == (EPS0, 0.0)
        assert 0 < row["central_epsilon"] < EPS0  # shuffling amplifies
        assert row["passed"] and row["violations"] == []
    assert report["passed"] and report["session_id"] == DEPLOYMENT.session_id.hex()


def test_the_session_composes_the_rounds(report):
    rows, session = report["rounds"], report["session"]
    locals_ = [(hadamard_response_guarantee(EPS0, PARAMS.padded_bins), min(RANGE_BATCHES)),
               (laplace_mean_guarantee(EPS0, MEAN_SPEC.params.grid_levels), min(MEAN_BATCHES))]
    naive = sum(shuffled_round(local, n, DELTA / 2).epsilon for local, n in locals_)  # basic composition at delta
    accountant = SessionAccountant()
    for local, n in locals_:
        accountant.add_round(local, n)
    assert session["session_composition_epsilon"] == pytest.approx(accountant.epsilon(DELTA), rel=1e-12)
    assert session["basic_composition_epsilon"] == pytest.approx(naive, rel=1e-12)
    assert max(r["central_epsilon"] for r in rows) <= session["epsilon"] <= naive
    assert session["delta"] == DELTA


def test_a_hadamard_range_round_gets_a_lower_bound_below_its_claim(report):
    hadamard, mean = report["rounds"]
    assert hadamard["lower_bound"] is not None and 0 < hadamard["lower_bound"] <= hadamard["central_epsilon"]
    assert hadamard["lower_over_claim"] == pytest.approx(hadamard["lower_bound"] / hadamard["central_epsilon"])
    assert hadamard["lower_bound_audit"]["n"] == min(RANGE_BATCHES)
    assert mean["lower_bound"] is None and "no lower-bound audit" in mean["lower_bound_note"]
    text = format_claim(report)
    assert text.startswith("shuffledp audit (claim): PASSED") and "VIOLATED" not in text


def test_a_batch_below_min_batch_is_a_violation_not_a_crash(tmp_path):
    short = write_session(tmp_path / "short.json", [round_entry(RANGE_SPEC, [1000, 640])])
    result = claim_report(load_session(short, KEY), KEY, DELTA, lower_rounds=None)
    row = result["rounds"][0]
    assert not row["passed"] and not result["passed"]
    assert any("below the signed min_batch 1000" in v for v in row["violations"])
    # the figures shown are the honest ones, at the batch actually delivered
    local = hadamard_response_guarantee(EPS0, PARAMS.padded_bins)
    assert row["users"] == 640 and row["central_epsilon"] == shuffled_round(local, 640, DELTA).epsilon
    assert "VIOLATED" in format_claim(result) and "FAILED" in format_claim(result)


def test_tampered_fields_are_refused(session_file, tmp_path):
    doc = json.loads(session_file.read_text())
    for name, value in (("epsilon0", 0.5), ("delta0", 1e-9), ("min_batch", 10), ("mechanism", "projected-mean"), ("round_id", 7)):
        tampered = json.loads(json.dumps(doc))
        tampered["rounds"][0][name] = value
        path = tmp_path / f"tampered-{name}.json"
        path.write_text(json.dumps(tampered))
        with pytest.raises(SessionFileError, match=f"recorded {name}"):
            load_session(path, KEY)
        with pytest.raises(SessionFileError, match=f"recorded {name}"):
            claim_report(load_session(path), KEY, DELTA, lower_rounds=None)  # verified there too


def test_a_spec_signed_by_another_key_is_refused(session_file, tmp_path):
    stranger = Deployment(session_id=DEPLOYMENT.session_id)
    with pytest.raises(SessionFileError, match="does not verify") as caught:
        load_session(session_file, stranger.analyzer_signing_key)  # the auditor trusts another key
    assert isinstance(caught.value.__cause__, ShuffleDPError)
    forged = write_session(tmp_path / "forged.json", [round_entry(RANGE_SPEC, RANGE_BATCHES, signer=stranger)])
    with pytest.raises(SessionFileError, match="does not verify"):
        claim_report(load_session(forged), KEY, DELTA, lower_rounds=None)
    doc = json.loads(session_file.read_text())
    last = int(doc["rounds"][1]["signed_spec"][-2:], 16)
    doc["rounds"][1]["signed_spec"] = doc["rounds"][1]["signed_spec"][:-2] + f"{last ^ 0x01:02x}"  # a flipped signature bit
    (tmp_path / "flipped.json").write_text(json.dumps(doc))
    with pytest.raises(SessionFileError, match="round #1"):
        load_session(tmp_path / "flipped.json", KEY)


def test_unreadable_session_files_are_typed_errors(session_file, tmp_path):
    text = session_file.read_text()
    (tmp_path / "truncated.json").write_text(text[: len(text) // 2])
    with pytest.raises(SessionFileError, match="not JSON"):
        load_session(tmp_path / "truncated.json")
    with pytest.raises(SessionFileError, match="missing"):
        load_session(tmp_path / "absent.json")
    cases = {
        "no-rounds": {"rounds": []},
        "rounds-not-a-list": {"rounds": {"0": 1}},
        "no-signed-spec": {"rounds": [{k: v for k, v in round_entry(RANGE_SPEC, [1000]).items() if k != "signed_spec"}]},
        "not-hex": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "signed_spec": "zz"}]},
        "garbage-spec": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "signed_spec": "a0"}]},
        "bad-batches": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "batch_sizes": [-1]}]},
        "no-batches": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "batch_sizes": []}]},
        "wrong-smallest": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "smallest_batch": 2000}]},
        "bool-epsilon": {"rounds": [{**round_entry(RANGE_SPEC, [1000]), "epsilon0": True}]},
        "not-an-object": [1, 2],
    }
    for name, doc in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(SessionFileError):
            load_session(path, KEY)
    (tmp_path / "nan.json").write_text(text.replace('"epsilon0": 1.0', '"epsilon0": NaN', 1))
    with pytest.raises(SessionFileError, match="not JSON"):
        load_session(tmp_path / "nan.json")


def test_sessions_are_matched_to_the_expected_session(session_file, tmp_path):
    assert verify_session(load_session(session_file), KEY, session_id=DEPLOYMENT.session_id).verified
    with pytest.raises(SessionFileError, match="session"):
        verify_session(load_session(session_file), KEY, session_id=bytes(16))
    doc = json.loads(session_file.read_text())
    doc["session_id"] = bytes(16).hex()
    (tmp_path / "other.json").write_text(json.dumps(doc))
    with pytest.raises(SessionFileError, match="the file's session_id"):
        load_session(tmp_path / "other.json", KEY)
    twice = write_session(tmp_path / "twice.json", [round_entry(RANGE_SPEC, [1000])] * 2)
    with pytest.raises(SessionFileError, match="twice"):
        load_session(twice, KEY)
    with pytest.raises(InvalidParameter):
        claim_report(load_session(session_file), KEY, 0.0)
    with pytest.raises(InvalidParameter):
        claim_report(load_session(session_file), KEY[:16], DELTA)


def test_unamplified_rounds_compose_by_their_own_guarantee(tmp_path):
    """Gaussian reports and summation claim no amplification: their (eps0, delta0) adds to the session."""
    summation = choose_scalar_sum(100, 1.0, DELTA, 0.0, 1.0).params
    gaussian = make_spec(ProjectedMeanParams(-1.0, 1.0, "gaussian"), round_id=1, min_batch=500, epsilon0=2.0, delta0=1e-7)
    summed = make_spec(summation, round_id=2, min_batch=summation.min_reports, epsilon0=1.0, delta0=DELTA,
                       messages_per_user=summation.messages)
    vector = make_spec(quota_params(4), round_id=3, min_batch=400, epsilon0=1.0, messages_per_user=4)
    range_round = dataclasses.replace(RANGE_SPEC, min_batch=500)
    assert round_guarantee(gaussian) is None and round_guarantee(summed) is None
    assert round_guarantee(vector) == generic_guarantee(1.0)
    path = write_session(tmp_path / "mixed.json", [
        round_entry(range_round, [500]), round_entry(gaussian, [500]),
        round_entry(summed, [summation.min_reports]), round_entry(vector, [402]),
    ])
    result = claim_report(load_session(path, KEY), KEY, DELTA, lower_rounds=None)
    rows = {r["round_id"]: r for r in result["rounds"]}
    assert (rows[1]["central_epsilon"], rows[1]["central_delta"]) == (2.0, 1e-7) and rows[1]["method"].startswith("local")
    assert (rows[2]["central_epsilon"], rows[2]["central_delta"]) == (1.0, DELTA) and rows[2]["users"] == 100
    assert rows[3]["users"] == 100  # 402 reports of 4 per user: 100 whole users
    assert rows[3]["central_epsilon"] == shuffled_round(generic_guarantee(1.0), 100, DELTA).epsilon
    session = result["session"]
    assert session["amplified_rounds"] == 2
    assert session["epsilon"] == pytest.approx(min(session["session_composition_epsilon"], session["basic_composition_epsilon"]) + 3.0)
    assert session["delta"] == pytest.approx(DELTA + 1e-7 + DELTA)
    assert result["passed"]


def test_a_summation_batch_short_of_its_users_has_no_claim(tmp_path):
    summation = choose_scalar_sum(100, 1.0, DELTA, 0.0, 1.0).params
    summed = make_spec(summation, round_id=0, min_batch=summation.min_reports, epsilon0=1.0, delta0=DELTA,
                       messages_per_user=summation.messages)
    path = write_session(tmp_path / "sum.json", [round_entry(summed, [summation.min_reports - summation.messages])])
    result = claim_report(load_session(path, KEY), KEY, DELTA, lower_rounds=None)
    assert result["rounds"][0]["central_epsilon"] is None and not result["passed"]
    assert result["session"]["epsilon"] is None


def test_the_analyzers_published_claim_is_checked_where_comparable(session_file, tmp_path, report):
    doc = json.loads(session_file.read_text())
    honest = report["session"]["epsilon"]
    for published, covers in ((honest * 1.5, True), (honest / 2, False)):
        doc["central"] = {"accounted_at_n": 1000, "epsilon": published, "delta": DELTA}
        (tmp_path / "central.json").write_text(json.dumps(doc))
        result = claim_report(load_session(tmp_path / "central.json"), KEY, DELTA, lower_rounds=None)
        assert result["analyzer_claim"]["covers"] is covers and result["passed"] is covers


def test_the_trusted_key_comes_from_a_keys_directory_or_hex(tmp_path):
    from shuffledp.deploy.keys import init_keys

    public = init_keys(tmp_path / "keys")
    assert trusted_analyzer_key(tmp_path / "keys") == public.analyzer_signing_public
    assert trusted_analyzer_key(KEY.hex()) == KEY
    with pytest.raises(InvalidParameter):
        trusted_analyzer_key("not-a-key")


def test_a_lower_bound_of_zero_says_it_had_no_power(session_file):
    # 100 rounds cannot separate the two inputs' outputs at this batch: the bound is 0, and the text
    # says how many rounds a leak at the claim would need, rather than showing the row as confirmed.
    weak = claim_report(load_session(session_file), KEY, DELTA, lower_rounds=100, seed=0)
    hadamard = weak["rounds"][0]
    assert hadamard["lower_bound"] == 0.0 and hadamard["lower_bound_audit"]["no_power"]
    needed = hadamard["lower_bound_audit"]["runs_needed"]
    assert needed is None or needed > 100
    text = format_claim(weak)
    assert "lower bound: no power at 100 rounds" in text
