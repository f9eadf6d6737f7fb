"""Clients set up in bulk are the clients set up one by one, and answer the same way."""

from __future__ import annotations

import time

import numpy as np
import pytest

from shuffledp.client.client import Client, PreparedRound
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.wire.onion import EnvelopeOpener
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.wire.sealing import Sealer, open_sealed

FIELDS = ("analyzer_signing_key", "credential", "shuffler_signing_key", "shuffler_key", "min_batch_floor",
          "accept_central_only", "sent", "clock")


@pytest.mark.parametrize("shape", [(7,), (7, 3)])
def test_many_is_one_by_one(shape):
    deployment = Deployment()
    values = np.random.default_rng(1).normal(size=shape)
    options = {"accept_central_only": True, "shuffler_signing_key": deployment.shuffler_keys.signing_public,
               "shuffler_key": deployment.shuffler_keys.hpke_public, "min_batch_floor": 3}
    credentials = [deployment.enroll() for _ in range(len(values))]
    bulk = Client.many(values, deployment.analyzer_signing_key, [PrivacyLedger(1.0) for _ in values], credentials, **options)
    single = [Client(v[None], deployment.analyzer_signing_key, PrivacyLedger(1.0), credential=c, **options)
              for v, c in zip(values, credentials)]
    for a, b in zip(bulk, single):
        assert type(a.local_mean) is type(b.local_mean)
        np.testing.assert_array_equal(a.local_mean, b.local_mean)
        assert all(getattr(a, f) == getattr(b, f) for f in FIELDS)
        assert type(a.source) is type(b.source)
        assert vars(a).keys() == vars(b).keys()  # no attribute one way of setting up has and the other lacks
    assert len({id(c.source) for c in bulk}) == len(bulk)  # each device its own source
    assert len(deployment.clients(values, [PrivacyLedger(1.0) for _ in values], **options)) == len(values)


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.zeros((2, 2, 2)), np.array([], dtype=float), np.array(["a", "b"])])
def test_many_refuses_what_the_constructor_refuses(bad):
    deployment = Deployment()
    n = len(bad)
    with pytest.raises(InvalidParameter):
        Client.many(bad, deployment.analyzer_signing_key, [PrivacyLedger(1.0)] * n, [deployment.enroll()] * n)
    with pytest.raises(InvalidParameter):
        Client.many(np.zeros(3), deployment.analyzer_signing_key, [PrivacyLedger(1.0)] * 2, [deployment.enroll()] * 3)


def test_a_prepared_round_answers_as_the_client_does_and_is_shared_only_for_the_same_objects():
    deployment = Deployment()
    analyzer = deployment.analyzer()
    spec = RoundSpec(session_id=deployment.session_id, round_id=2, params=HadamardRangeParams(-4.0, 4.0, 1.0), epsilon0=1.0,
                     analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
                     shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=5, deadline=time.time() + 600)
    sealer = Sealer(spec.analyzer_key)
    prepared = PreparedRound.of(spec, sealer)
    assert PreparedRound.of(spec, sealer) is prepared
    assert PreparedRound.of(spec, Sealer(spec.analyzer_key)) is not prepared
    opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
    layout = report_format(spec.round_id, spec.mechanism)
    clients = [deployment.client(np.array([y]), PrivacyLedger(5.0)) for y in (0.5, -1.0, 3.0)]
    for client in clients:
        values = np.array([[3, -1]])
        envelopes = client.answer_verified(spec, sealer, values, prepared=prepared)
        (admission,) = [opener.open(e) for e in envelopes]
        assert admission.credential == client.credential and client.sent[(spec.session_id, spec.round_id)].nonces == [admission.nonce]
        plain = open_sealed(analyzer.keys.hpke_private, admission.sealed, spec.session_id, spec.round_id, spec.digest)
        assert layout.values(plain) == (3, -1)
        assert client.ledger.remaining_epsilon == pytest.approx(4.0)  # charged once, after sealing
    other = RoundSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "round_id": 3})
    with pytest.raises(InvalidParameter):
        clients[0].answer_verified(other, sealer, np.array([[3, -1]]), prepared=prepared)


def test_many_refuses_bad_shared_settings_and_bad_ledgers_or_credentials_as_the_constructor_does():
    deployment = Deployment()
    key, values = deployment.analyzer_signing_key, np.zeros(2)
    ledgers, credentials = PrivacyLedger.many(1.0, 0.0, 2), deployment.issuer.issue_many(2)
    for options in ({"shuffler_key": deployment.shuffler_keys.hpke_public},  # one pinned key without the other
                    {"accept_central_only": True}):  # central-only rounds without a pinned shuffler
        with pytest.raises(InvalidParameter):
            Client(values[:1], key, ledgers[0], credential=credentials[0], **options)
        with pytest.raises(InvalidParameter):
            Client.many(values, key, ledgers, credentials, **options)
    with pytest.raises(InvalidParameter, match="ledger"):
        Client.many(values, key, [ledgers[0], object()], credentials)
    with pytest.raises(InvalidParameter, match="credential"):
        Client.many(values, key, ledgers, [credentials[0], credentials[1][:-1]])


def test_ledgers_made_in_bulk_are_ledgers_made_one_by_one_and_share_nothing():
    bulk = PrivacyLedger.many(2.5, 1e-6, 4)
    assert bulk == [PrivacyLedger(2.5, 1e-6) for _ in range(4)]
    assert vars(bulk[1]).keys() == vars(PrivacyLedger(2.5, 1e-6)).keys()
    bulk[1].spend(b"s" * 16, 0, 1.0, 0.0)
    assert [ledger.remaining_epsilon for ledger in bulk] == [2.5, 1.5, 2.5, 2.5]
    assert len({id(ledger.answered) for ledger in bulk}) == len({id(ledger._lock) for ledger in bulk}) == 4
    assert PrivacyLedger.many(1.0, 0.0, 0) == []
    for bad in ((-1.0, 0.0, 2), (1.0, 1.0, 2), (1.0, 0.0, -1), (1.0, 0.0, 2.0)):
        with pytest.raises(InvalidParameter):
            PrivacyLedger.many(*bad)


def test_credentials_issued_in_bulk_verify_and_are_distinct():
    issuer = Deployment().issuer
    credentials = issuer.issue_many(50)
    assert len(set(credentials)) == 50
    assert [issuer.verify(c) for c in credentials] == [c[:16] for c in credentials]
    assert issuer.issue_many(0) == []
    with pytest.raises(InvalidParameter):
        issuer.issue_many(-1)
