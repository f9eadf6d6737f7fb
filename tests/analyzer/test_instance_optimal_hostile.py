"""Hostile input to the instance-optimal mean's four round mechanisms (``coordinate-tree``,
``shifted-norm``, ``shifted-vector-sum``, ``local-vector``): signed, schema-valid specs a
malicious analyzer could send to a device, and well-formed reports a malicious client (or a
lost envelope) could put in a batch.

Each finding of the review has a test here that failed before its fix; the rest pin down
what was checked and found sound (sizes, ranges, order, accounting).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from shuffledp.analyzer.instance_optimal import local_mean_decode
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mechanisms import check_report_values, randomize_round, report_ranges
from shuffledp.client.quantile_randomizer import shifted_log_norms
from shuffledp.client.range_randomizer import bin_index
from shuffledp.client.summation import encode_vectors, randomize_local_vector, randomize_shifted_vector_sum
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.mechanisms.distributed_noise import DEVICE_MAX_MEAN
from shuffledp.protocol.errors import InvalidParameter, MalformedMessage
from shuffledp.protocol.mechanisms.randomness import MAX_NOISE_SCALE, SeededSource, SystemSource
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.mechanisms.rotation import RandomRotation
from shuffledp.protocol.wire.sealing import Sealer
from shuffledp.protocol.mechanisms.summation_params import DEVICE_MAX_TOTAL_MEAN, choose_vector_sum, skellam_epsilon, smallest_skellam_mu

from parties import DEPLOYMENT, SHUFFLER_KEYS, make_spec

ANALYZER = DEPLOYMENT.analyzer()
EPS_LOCAL, DELTA_LOCAL = 1.0, 1e-6

NORM = m.ShiftedNormParams((0.0, 0.0, 0.0), -10.0, 8.0, 0.125)
TREE = m.CoordinateTreeParams(-4.0, 4.0, 0.25, 3, 7)
LOCAL = m.LocalVectorParams(3, 1.0, 16, 5, smallest_skellam_mu(16, 4, EPS_LOCAL, DELTA_LOCAL), (0.0, 0.0, 0.0))
#: What the summation chooser gives 100 users at (1, 1e-6), shifted.
SHIFTED_SUM = m.ShiftedVectorSumParams(**dataclasses.asdict(choose_vector_sum(100, 1.0, 1e-6, 3, 1.0, 5).params), center=(0.0, 0.0, 0.0))


def _budget(params) -> tuple[float, float]:
    if isinstance(params, m.LocalVectorParams):
        return EPS_LOCAL, DELTA_LOCAL
    if isinstance(params, m.VectorSumParams):
        return 1.0, 1e-6
    return 0.5, 0.0


def _spec(params, round_id: int = 3, epsilon0: float | None = None) -> m.RoundSpec:
    budget, delta0 = _budget(params)
    epsilon0 = budget if epsilon0 is None else epsilon0
    per_user = m.messages_per_user(params)
    floor = getattr(params, "min_reports", 1)
    return make_spec(params, round_id=round_id, min_batch=max(floor, per_user), epsilon0=epsilon0, delta0=delta0, messages_per_user=per_user)


def _client(vector, source=None, ledger=None) -> Client:
    ledger = ledger or PrivacyLedger(100.0, delta_budget=0.9)
    # the summation round is central-only: such a device opts in and pins its shuffler
    return DEPLOYMENT.client(
        np.array([vector], dtype=float), ledger, source=source, accept_central_only=True, shuffler_signing_key=SHUFFLER_KEYS.signing_public,
        shuffler_key=SHUFFLER_KEYS.hpke_public,
    )


def _answer(params, vector, source=None, ledger=None) -> list[bytes]:
    return _client(vector, source, ledger).answer(ANALYZER.sign_spec(_spec(params)))


# --------------------------------------------------------------------------- 1. data of another dimension
@pytest.mark.parametrize("params", [NORM, LOCAL, SHIFTED_SUM], ids=["shifted-norm", "local-vector", "shifted-vector-sum"])
@pytest.mark.parametrize("data_dim", [1, 2, 4])
def test_data_of_another_dimension_is_a_typed_refusal_not_a_broadcast(params, data_dim):
    """The spec is for 3-vectors. A device with 1-vectors must not broadcast its one value to all
    three coordinates and answer (a silent wrong answer), nor 2-vectors raise numpy's untyped
    ValueError: every randomizer checks the dimension, and nothing is charged."""
    ledger = PrivacyLedger(100.0, delta_budget=0.9)
    with pytest.raises(InvalidParameter):
        _answer(params, np.arange(1.0, data_dim + 1.0), ledger=ledger)
    assert ledger.spent_epsilon == 0.0
    _answer(params, [1.0, 2.0, 3.0], ledger=ledger)  # the right dimension is answered


# --------------------------------------------------------------------------- 2. a centre at the edge of doubles
def test_shifted_norm_of_a_distance_past_the_largest_double_is_the_top_bin():
    """``x - center`` overflows for x = -1e308, center = 1e308: the norm is above 2^1024, so the
    user's bin is the top one, not NaN, which bin_index would turn into bin 0 (the
    smallest norms): a wrong answer, though still eps0-LDP."""
    params = m.ShiftedNormParams((1e308, 1e308), -10.0, 8.0, 0.125)
    x = np.array([[-1e308, 0.0], [-1e308, -1e308], [1e308, 1e308], [0.0, 0.0]])
    with np.errstate(all="raise"):
        logs = shifted_log_norms(x, np.asarray(params.center))
    assert not np.isnan(logs).any()
    leaf = bin_index(np.maximum(logs, params.low), params.scalar)
    top = params.scalar.num_bins - 1
    np.testing.assert_array_equal(leaf, [top, top, 0, top])


@pytest.mark.parametrize("params", [LOCAL, SHIFTED_SUM], ids=["local-vector", "shifted-vector-sum"])
def test_a_shift_that_overflows_is_clipped_not_refused(params):
    """A malicious analyzer names center = (1e308, ...). A device whose data lie far on the other
    side (x - center overflows) must not refuse while every other device answers: whether a
    device answers (visible to the broker and, by the batch size, to the analyzer) would tell on
    its data. The shifted vector is clipped onto the ball's sphere in the right direction, as for
    any distance beyond the radius."""
    hostile = type(params)(**{**_fields(params), "center": (1e308, 1e308, 0.0)})
    far = np.array([[-1e308, -1e308, 0.0]])
    assert len(_answer(hostile, far[0], source=SeededSource(1))) == m.messages_per_user(hostile)
    # the encoding is the clipped direction (-1, -1, 0) / sqrt(2) at the full radius
    encoded = encode_vectors(_shift_for_test(far, hostile), hostile, SeededSource(2))
    rotated = RandomRotation(hostile.dim, hostile.rotation_seed).inverse(encoded.astype(float))[0]
    direction = np.array([-1.0, -1.0, 0.0]) / np.sqrt(2.0)
    # randomized rounding moves each of the D coordinates by under 1 grid unit
    assert np.linalg.norm(rotated - hostile.levels * direction) < np.sqrt(hostile.padded_dim)


def _fields(params) -> dict:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def _shift_for_test(x, params):
    from shuffledp.client.summation import shifted_vectors

    return shifted_vectors(x, params)


# --------------------------------------------------------------------------- 3. device time
def test_local_vector_with_every_draw_at_the_device_limit_is_refused_before_sampling():
    """dim = 1024, levels = 1, mu = DEVICE_MAX_MEAN: a valid spec (its Skellam bound is below
    eps0 = 1 at delta0 = 1e-6) whose every per-draw mean is at the device limit, so the per-draw
    check passed and the device drew 2 x 1024 exact Poisson(65,536): about 10 minutes of CPU
    here, far more on a phone. The device now refuses (typed, before drawing, nothing charged)
    when a call's total Poisson mean exceeds DEVICE_MAX_TOTAL_MEAN, the budget vector summation
    already had."""
    params = m.LocalVectorParams(1024, 1.0, 1, 0, DEVICE_MAX_MEAN, (0.0,) * 1024)
    assert skellam_epsilon(params.mu, params.levels, params.padded_dim, DELTA_LOCAL) <= EPS_LOCAL
    ledger = PrivacyLedger(100.0, delta_budget=0.9)
    start = time.perf_counter()
    with pytest.raises(InvalidParameter, match="mu"):
        _answer(params, np.zeros(1024), source=SystemSource(), ledger=ledger)
    assert time.perf_counter() - start < 5.0
    assert ledger.spent_epsilon == 0.0
    # at the total budget a device still answers
    mu = DEVICE_MAX_TOTAL_MEAN / 4
    small = m.LocalVectorParams(3, 1.0, 1, 0, mu, (0.0,) * 3)
    assert len(_answer(small, [0.1, 0.2, 0.3], source=SystemSource())) == 4


# --------------------------------------------------------------------------- 4. a grid scale that overflows
@pytest.mark.parametrize("radius, levels", [(1e-300, 2**32), (5e-324, 1), (1e-309, 1)])
def test_a_radius_whose_grid_scale_overflows_is_refused_at_decode(radius, levels):
    """``levels / radius`` overflowing to inf made every encoding NaN or inf (a device then
    refused from its Bernoulli sampler, the simulation cast inf to int64). Such a spec is now
    refused by the parameters themselves, so it never decodes."""
    for params in (LOCAL, SHIFTED_SUM):
        with pytest.raises(InvalidParameter, match="radius"):
            type(params)(**{**_fields(params), "radius": radius, "levels": levels})
        spec = _spec(params)
        body = codec._to_wire(spec)
        body["params"]["radius"], body["params"]["levels"] = radius, levels
        body["v"], body["t"] = m.WIRE_VERSION, "round-spec"
        import cbor2

        with pytest.raises(MalformedMessage):
            codec.decode(cbor2.dumps(body, canonical=True), m.RoundSpec)
    # the largest scale that stays finite is still a valid grid
    m.LocalVectorParams(3, 2**32 / 1.7e308, 2**32, 0, 4000.0, (0.0,) * 3)


# --------------------------------------------------------------------------- 5. reports a malicious client sends
def _local_batch(n: int, params: m.LocalVectorParams, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, params.dim)) * 0.3 + np.asarray(params.center)
    return randomize_local_vector(x, params, SeededSource(seed)).reshape(-1, 2)


def test_one_user_cannot_fail_the_local_mean_round():
    """The local mean round decoded only batches with exactly one report per user on every
    coordinate; anything else raised and the whole session failed, after every honest device
    had been charged. One credential's D in-range reports all naming coordinate 0, or a single
    report (the round fills at min_batch = users x D and the last user's remaining envelopes
    are refused as round-full), was enough. Each coordinate is now the mean of its own reports."""
    params = m.LocalVectorParams(3, 2.0, 200, 1, 50.0, (1.0, 2.0, 3.0))
    honest = _local_batch(400, params)
    clean, users = local_mean_decode(honest, params)
    assert users == 400
    D, bound = params.padded_dim, params.bound
    unit = params.radius / params.levels
    hostile = {
        "all on coordinate 0": np.array([[0, bound]] * D),
        "one report": np.array([[2, -bound]]),
        "cut off after D - 1": _local_batch(1, params, seed=9)[: D - 1],
    }
    for name, extra in hostile.items():
        estimate, _ = local_mean_decode(np.concatenate([honest, extra]), params)
        # k reports move a rotated coordinate's mean by at most k reports' share, k |value - mean|
        # / (400 + k) <= 2 k bound / (400 + k) grid units; rotating back (orthogonal, then the
        # first dim coordinates) does not lengthen the shift
        k = np.bincount(extra[:, 0], minlength=D)
        limit = np.linalg.norm(2 * k * bound / (400 + k)) * unit
        assert 0 < np.linalg.norm(estimate - clean) <= limit * (1 + 1e-9), name
    with pytest.raises(InvalidParameter):
        local_mean_decode(honest[honest[:, 0] != 2], params)  # a coordinate with no report at all


# --------------------------------------------------------------------------- checked and sound
@pytest.mark.parametrize(
    "params",
    [
        m.CoordinateTreeParams(-1.0, 1.0, 1.0 / 2**20, 1024, 2**64 - 1),  # 1024 coordinates, 2^20 leaves
        m.ShiftedNormParams((1e308,) * 1024, -1000.0, 1000.0, 2000.0 / 2**21),  # MAX_BINS log2 bins
        # the widest values a randomizer draws: mu = MAX_NOISE_SCALE (the samplers refuse more;
        # a device refuses far less) and the most levels it allows at eps0 = MAX_EPSILON
        m.LocalVectorParams(1024, 1.0, 12_431_952, 0, MAX_NOISE_SCALE, (0.0,) * 1024),
    ],
    ids=["tree", "norm", "local"],
)
def test_extreme_specs_answer_in_range_and_pad_to_one_size(params):
    """Every report of the extreme parameters lies in report_ranges, every range is within the
    format's 2^62, and the padded plaintext of the widest allowed values has the round's one size."""
    spec = _spec(params, epsilon0=m.MAX_EPSILON if isinstance(params, m.LocalVectorParams) else None)
    ranges = report_ranges(spec)
    assert all(-(2**62) <= r.low and r.high < 2**62 for r in ranges)
    x = np.array([[-1e308] + [0.0] * (params.dim - 1), [5e-324] * params.dim, [1.0] * params.dim])
    source = SeededSource(4)
    reports = randomize_round(params, spec.epsilon0, spec.delta0, x, source)
    for row in reports.reshape(-1, reports.shape[-1]):
        check_report_values(tuple(int(v) for v in row), ranges)
    layout = report_format(spec.round_id, spec.mechanism)
    sealer = Sealer(spec.analyzer_key)
    sizes = set()
    for pick in ([r.low for r in ranges], [r.high for r in ranges], [0] * len(ranges)):
        plaintext = layout.pad(codec.encode(m.Report(spec.round_id, spec.mechanism, tuple(pick))))
        sizes.add(len(sealer.seal(plaintext, spec.session_id, spec.round_id, spec.digest)))
    assert sizes == {layout.sealed_size}


def test_the_widest_local_vector_range_the_params_allow_fits_the_format():
    """levels = 2^32 and mu = MAX_NOISE_SCALE^2, the largest the parameters accept (no randomizer
    draws such a mu, and the budget check refuses it at any eps0): the value range still lies
    within the format's 2^62, so even such a spec could not make a report that overflows it."""
    widest = m.LocalVectorParams(1024, 1.0, 2**32, 0, MAX_NOISE_SCALE**2, (0.0,) * 1024)
    assert widest.bound < 2**62
    m.Report(0, "local-vector", (1023, -widest.bound))


@pytest.mark.parametrize("params", [TREE, NORM, LOCAL, SHIFTED_SUM], ids=["tree", "norm", "local", "sum"])
def test_message_count_order_and_length_do_not_depend_on_the_data(params):
    """Every device sends messages_per_user envelopes of one length, and a vector round's messages
    name the coordinates in the same order whatever the data."""
    spec = _spec(params)
    signed = ANALYZER.sign_spec(spec)
    lengths, orders = set(), set()
    for i, x in enumerate(([0.0, 0.0, 0.0], [1e300, -1e300, 5.0], [1e-300, 0.0, -3.0])):
        envelopes = _client(x, source=SeededSource(i)).answer(signed)
        assert len(envelopes) == m.messages_per_user(params)
        lengths.update(len(e) for e in envelopes)
        if isinstance(params, (m.LocalVectorParams, m.VectorSumParams)):
            rows = randomize_round(params, spec.epsilon0, spec.delta0, np.array([x]), SeededSource(i))[0]
            orders.add(tuple(rows[:, 0]))
    assert len(lengths) == 1
    assert len(orders) <= 1


def test_shifted_vector_sum_reports_are_the_shifted_summation():
    """Subtracting a public centre is the only difference from vector-sum (same sensitivity)."""
    x = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 0.0]])
    center = np.array([0.5, -1.0, 2.0])
    params = m.ShiftedVectorSumParams(**{**_fields(SHIFTED_SUM), "center": tuple(center)})
    base = m.VectorSumParams(**{k: v for k, v in _fields(SHIFTED_SUM).items() if k != "center"})
    from shuffledp.client.summation import randomize_vector_sum

    np.testing.assert_array_equal(
        randomize_shifted_vector_sum(x, params, SeededSource(3)), randomize_vector_sum(x - center, base, SeededSource(3))
    )
