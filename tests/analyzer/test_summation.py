"""Multi-message summation end to end: estimates against their exact error, the wire, the shuffler's quota.

Statistical tolerances come from the theory. A standardized error ``z = (estimate - truth) / sd``
(``sd`` the exact standard deviation) has mean 0 and variance 1; over ``R`` independent
runs the sample mean has standard deviation ``1/sqrt(R)`` and the sample variance
``sqrt((kappa - 1) / R)``, ``kappa`` the kurtosis: at most 6 here (the discrete Laplace's
is ``6 - O((1-alpha)^2)``, rounding and the Bernoulli sums lighten the tails). The bounds
are 5 of those standard deviations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.analyzer.summation import (
    IncompleteShares,
    SummationProtocol,
    clipped_sum,
    decode_scalar_sum,
    decode_vector_sum,
    scalar_clipped_sum,
    scalar_rounding_variance,
    vector_rounding_variance,
    vector_sum_variance,
)
from shuffledp.client.client import UntrustedRound
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.summation import randomize_modular_sum, randomize_vector_sum
from shuffledp.deploy.deployment import Deployment
from shuffledp.simulation.engine import run_fast
from shuffledp.protocol.transport.channel import InProcessChannel
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.onion import EnvelopeOpener
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum, choose_vector_sum, scalar_sum_variance
from shuffledp.shuffler.service import RoundAdmission

EPS, DELTA = 1.0, 1e-6
KURTOSIS = 6.0


def _check_standardized(z: np.ndarray) -> None:
    r = len(z)
    assert abs(z.mean()) <= 5.0 / math.sqrt(r), z.mean()
    assert abs(z.var() - 1.0) <= 5.0 * math.sqrt((KURTOSIS - 1.0) / r), z.var()


def test_scalar_sum_error_matches_its_exact_variance():
    n, runs = 2000, 2000
    x = np.random.default_rng(5).beta(2, 5, n) * 3.0 - 1.0  # some values outside [-1, 1]: clipped
    choice = choose_scalar_sum(n, EPS, DELTA, -1.0, 1.0)
    protocol = SummationProtocol(choice.params, EPS, DELTA)
    truth = scalar_clipped_sum(x, choice.params)
    sd = math.sqrt(scalar_sum_variance(choice.params, EPS, scalar_rounding_variance(x, choice.params)))
    z = np.array([(run_fast(protocol, x, seed).result.estimate.sum - truth) / sd for seed in range(runs)])
    _check_standardized(z)


def test_vector_sum_error_matches_its_exact_variance():
    n, runs = 400, 200
    rng = np.random.default_rng(6)
    x = rng.normal(0.2, 0.4, (n, 6))
    choice = choose_vector_sum(n, EPS, DELTA, 6, 1.0, rotation_seed=99)
    protocol = SummationProtocol(choice.params, EPS, DELTA)
    truth = clipped_sum(x, 1.0)
    expected = vector_sum_variance(choice.params, vector_rounding_variance(x, choice.params))
    ratios = np.array([np.sum((run_fast(protocol, x, seed).result.estimate.sum - truth) ** 2) / expected for seed in range(runs)])
    # ||e||^2 / E||e||^2 over 6 near-Gaussian coordinates of (nearly) equal variance: variance 2/6 per run
    assert abs(ratios.mean() - 1.0) <= 5.0 * math.sqrt(2.0 / 6.0 / runs), ratios.mean()


def test_reversed_noise_convention_would_fail_the_variance_test():
    """The test above has power: drawn with the failure probability, the noise all but vanishes."""
    n = 2000
    choice = choose_scalar_sum(n, EPS, DELTA, -1.0, 1.0)
    sd = math.sqrt(scalar_sum_variance(choice.params, EPS, 0.0))
    alpha = math.exp(-EPS / choice.params.precision)
    rng = np.random.default_rng(1)
    wrong = rng.negative_binomial(1.0 / n, alpha, (200, n)).sum(1) - rng.negative_binomial(1.0 / n, alpha, (200, n)).sum(1)
    step = (choice.params.upper - choice.params.lower) / choice.params.precision
    with pytest.raises(AssertionError):
        _check_standardized(wrong * step / sd)


def test_shares_decode_only_when_complete():
    choice = choose_scalar_sum(100, EPS, DELTA, 0.0, 1.0)
    shares = randomize_modular_sum(np.full(100, 0.5), choice.params, EPS, SeededSource(1))
    assert shares.shape == (100, choice.params.messages, 1)
    assert shares.min() >= 0 and shares.max() < choice.params.modulus
    decode_scalar_sum(shares.reshape(-1, 1), choice.params)
    with pytest.raises(IncompleteShares):
        decode_scalar_sum(shares.reshape(-1, 1)[1:], choice.params)
    vchoice = choose_vector_sum(300, EPS, DELTA, 3, 1.0, rotation_seed=1)
    rows = randomize_vector_sum(np.zeros((300, 3)), vchoice.params, SeededSource(2)).reshape(-1, 2)
    decode_vector_sum(rows, vchoice.params)
    with pytest.raises(IncompleteShares):
        decode_vector_sum(rows[1:], vchoice.params)
    swapped = rows.copy()
    swapped[0, 0] = (swapped[0, 0] + 1) % vchoice.params.padded_dim  # one share moved to another coordinate
    with pytest.raises(IncompleteShares):
        decode_vector_sum(swapped, vchoice.params)


def test_device_randomizer_gives_valid_shares():
    """The OS CSPRNG path (exact Skellam, double-precision Pólya) draws in range and decodes."""
    choice = choose_scalar_sum(50, EPS, DELTA, 0.0, 1.0)
    shares = randomize_modular_sum(np.array([0.3]), choice.params, EPS, SystemSource())
    assert shares.shape == (1, choice.params.messages, 1)
    assert ((0 <= shares) & (shares < choice.params.modulus)).all()
    vchoice = choose_vector_sum(300, EPS, DELTA, 3, 1.0, rotation_seed=1)
    rows = randomize_vector_sum(np.array([[0.1, 0.2, 0.3]]), vchoice.params, SystemSource())
    assert rows.shape == (1, vchoice.params.messages_per_user, 2)
    assert sorted(rows[0, :, 0].tolist()) == sorted(list(range(4)) * vchoice.params.messages)


def _spec_for(deployment: Deployment, params, round_id: int = 0):
    from parties import make_spec

    return make_spec(params=params, epsilon0=EPS, delta0=DELTA, messages_per_user=params.messages_per_user,
                     round_id=round_id, deployment=deployment, min_batch=params.min_reports, max_batch=params.min_reports)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_a_client_sends_every_share_in_its_own_envelope_of_one_size(kind):
    """No size differs and no two messages share an HPKE encapsulation: nothing links one user's shares."""
    deployment = Deployment()
    if kind == "scalar":
        params = choose_scalar_sum(1000, EPS, DELTA, 0.0, 1.0).params
        samples = [[0.9], [0.1]]
    else:
        params = choose_vector_sum(1000, EPS, DELTA, 3, 1.0, rotation_seed=4).params
        samples = [[[0.9, 0.0, 0.1]], [[-0.5, 0.5, 0.0]]]
    spec = _spec_for(deployment, params)
    signed = deployment.analyzer().sign_spec(spec)
    opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
    sizes, keys = set(), set()
    for data in samples:
        client = deployment.client(np.array(data), PrivacyLedger(EPS, DELTA), **_central(deployment))
        envelopes = client.answer(signed)
        assert len(envelopes) == params.messages_per_user
        assert (client.ledger.spent_epsilon, client.ledger.spent_delta) == pytest.approx((EPS, DELTA))  # once for all its shares
        for env in envelopes:
            sizes.add(len(env))
            keys.add(opener.open(env).sealed[:32])
    assert len(sizes) == 1
    assert len(keys) == len(samples) * params.messages_per_user


def test_the_shuffler_admits_m_shares_per_credential_and_no_more():
    deployment = Deployment()
    params = choose_scalar_sum(1000, EPS, DELTA, 0.0, 1.0).params
    spec = _spec_for(deployment, params)
    client = deployment.client(np.array([0.4]), PrivacyLedger(10.0, 1e-3), **_central(deployment))
    envelopes = client.answer(deployment.analyzer().sign_spec(spec))
    extra = deployment.client(np.array([0.4]), PrivacyLedger(10.0, 1e-3), **_central(deployment))
    extra.credential = client.credential  # a device replaying its credential for one more share
    more = extra.answer(deployment.analyzer().sign_spec(spec))[:1]
    admission = RoundAdmission(spec, deployment.shuffler_keys, deployment.issuer)
    receipts = admission.offer_many(envelopes + more)
    assert len(receipts.admitted) == params.messages
    assert receipts.reasons == ["quota"] and admission.stats.rejected == {"quota": 1}


def test_envelopes_of_a_summation_round_on_the_wire_have_one_size():
    """Over the message engine: every byte count on the reports topic is one envelope size."""
    import asyncio

    from shuffledp.simulation.engine import run_messages_on

    n = 60
    params = choose_scalar_sum(n, EPS, DELTA, 0.0, 1.0).params
    sizes: list[int] = []

    class Recording(InProcessChannel):
        async def publish(self, topic, payload, **kw):
            if topic.endswith("/reports"):
                sizes.append(len(payload))
            await super().publish(topic, payload, **kw)

    channel = Recording()
    x = np.linspace(0.0, 1.0, n)
    run = asyncio.run(run_messages_on(SummationProtocol(params, EPS, DELTA), x, (channel, channel, channel), seed=2))
    assert len(sizes) == n * params.messages and len(set(sizes)) == 1
    assert run.rounds[0].reports == n * params.messages and run.rounds[0].envelope_bytes == sum(sizes)


def test_a_spec_that_would_release_fewer_users_noise_is_refused():
    """A malicious analyzer naming many users (tiny noise shares) but a small batch: clients refuse it."""
    params = choose_scalar_sum(1000, EPS, DELTA, 0.0, 1.0).params
    with pytest.raises(InvalidParameter, match="min_batch"):
        _spec_for_batch(params, params.min_reports - 1)
    _spec_for_batch(params, params.min_reports)


def _spec_for_batch(params, min_batch):
    from parties import make_spec

    return make_spec(params=params, epsilon0=EPS, delta0=DELTA, messages_per_user=params.messages_per_user,
                     min_batch=min_batch, max_batch=params.min_reports)


def _central(deployment: Deployment) -> dict:
    """Client options of a device that answers central-only rounds: opt in, and pin the shuffler."""
    return {"accept_central_only": True, "shuffler_signing_key": deployment.shuffler_keys.signing_public,
            "shuffler_key": deployment.shuffler_keys.hpke_public}


def test_a_device_answers_summation_only_if_it_opted_in_and_pinned_its_shuffler():
    deployment = Deployment()
    params = choose_scalar_sum(1000, EPS, DELTA, 0.0, 1.0).params
    signed = deployment.analyzer().sign_spec(_spec_for(deployment, params))
    default = deployment.client(np.array([0.4]), PrivacyLedger(EPS, DELTA))
    with pytest.raises(UntrustedRound, match="no local guarantee"):
        default.answer(signed)
    assert default.ledger.spent_epsilon == 0.0
    with pytest.raises(InvalidParameter, match="pin"):
        deployment.client(np.array([0.4]), PrivacyLedger(EPS, DELTA), accept_central_only=True)
    other = Deployment()  # a device pinned to another shuffler
    pinned_elsewhere = deployment.client(
        np.array([0.4]), PrivacyLedger(EPS, DELTA), accept_central_only=True, shuffler_signing_key=other.shuffler_keys.signing_public,
        shuffler_key=other.shuffler_keys.hpke_public,
    )
    with pytest.raises(UntrustedRound, match="pinned"):
        pinned_elsewhere.answer(signed)
    assert len(deployment.client(np.array([0.4]), PrivacyLedger(EPS, DELTA), **_central(deployment)).answer(signed)) == params.messages


def test_the_device_floor_counts_users_not_reports():
    deployment = Deployment()
    params = choose_scalar_sum(1000, EPS, DELTA, 0.0, 1.0).params  # min_batch = 1000 users x M reports
    signed = deployment.analyzer().sign_spec(_spec_for(deployment, params))
    strict = deployment.client(np.array([0.4]), PrivacyLedger(EPS, DELTA), min_batch_floor=1001, **_central(deployment))
    with pytest.raises(UntrustedRound, match="1000 users"):
        strict.answer(signed)
    ok = deployment.client(np.array([0.4]), PrivacyLedger(EPS, DELTA), min_batch_floor=1000, **_central(deployment))
    assert len(ok.answer(signed)) == params.messages


def test_clipping_to_the_ball_is_exact_for_any_finite_vector():
    """Rows near the largest double clip to the radius (a naive norm overflows and clips them to zero)."""
    from shuffledp.client.summation import clip_to_ball

    x = np.array([[1.7e308, 1.7e308, -1.7e308], [0.3, 0.4, 0.0], [0.0, 0.0, 0.0], [3.0, 4.0, 0.0], [1e-300, 0.0, 0.0]])
    with np.errstate(over="raise", divide="raise", invalid="raise", under="ignore"):
        y = clip_to_ball(x, 1.0)
    np.testing.assert_allclose(np.linalg.norm(y[:4], axis=1), [1.0, 0.5, 0.0, 1.0], rtol=1e-12)
    np.testing.assert_array_equal(y[[1, 2, 4]], x[[1, 2, 4]])  # inside the ball: unchanged (tiny rows too)
    np.testing.assert_allclose(y[3], [0.6, 0.8, 0.0], rtol=1e-12)
    np.testing.assert_allclose(y[0], np.array([1.0, 1.0, -1.0]) / np.sqrt(3.0), rtol=1e-12)
