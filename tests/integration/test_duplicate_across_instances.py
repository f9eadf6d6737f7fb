"""One sealed report counts once per round, however many shuffler instances forward it.

With several shuffler instances each keeps its own admission state, so a sealed report
re-wrapped under a credential assigned to another instance (by the client itself, with a
second credential, or by anyone holding its inner bytes) is admitted by both and reaches
the analyzer in two batches. The analyzer drops the second copy across every batch of the
round (``duplicate-across-batches``), and each batch's size in the round record is the
number of reports the round counts from it, so the accountant never sees a copy as a
member of the crowd.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel, batch_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.credentials import CLIENT_ID_BYTES, assigned_instance
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec, SignedRoundSpec
from shuffledp.protocol.wire.onion import EnvelopeOpener, wrap
from shuffledp.shuffler.service import batch_chunks

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5
#: The reason a copy of a report already counted in another batch of the round is dropped.
CROSS_BATCH_DUPLICATE = "duplicate-across-batches"


def _credential_for(deployment: Deployment, instance: int, spec: RoundSpec) -> bytes:
    """A freshly enrolled credential that the round assigns to ``instance``."""
    while True:
        credential = deployment.enroll()
        if assigned_instance(credential[:CLIENT_ID_BYTES], spec.shuffler_instances, spec.digest) == instance:
            return credential


def _clients_per_instance(deployment: Deployment, each: int, spec: RoundSpec) -> list:
    """Enrolled clients, ``each`` assigned by the round to every one of its instances (the
    assignment is fresh in every round, so they are chosen once the spec is known)."""
    share: Counter = Counter()
    clients = []
    while len(clients) < each * spec.shuffler_instances:
        c = deployment.client(np.array([0.4 * len(clients) - 2.0]), PrivacyLedger(1.0))
        instance = c.instance_for(spec)
        if share[instance] < each:
            share[instance] += 1
            clients.append(c)
    return clients


def _rows(values: np.ndarray) -> list[tuple[int, ...]]:
    return sorted(tuple(int(v) for v in row) for row in values)


async def test_a_report_smuggled_into_a_second_instance_is_counted_once():
    """Real shufflers, two instances: a victim's sealed report, re-wrapped under a credential
    of the other instance, is admitted by both; the analyzer counts it once."""
    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=0.8, grace=5.0)
    sid = coordinator.session_id
    shufflers = [deployment.shuffler(channel, instance=i) for i in range(2)]
    clients: list = []
    tasks = [asyncio.create_task(s.serve()) for s in shufflers]
    honest_sealed: list[bytes] = []
    try:
        await asyncio.sleep(0)

        async def devices():
            specs = await channel.subscribe(spec_topic(sid))
            signed = await specs.get()
            spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
            opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
            clients.extend(_clients_per_instance(deployment, 6, spec))
            victim_sealed = None
            for c in clients:
                instance = c.instance_for(spec)
                for envelope in c.answer(signed):
                    honest_sealed.append(opener.open(envelope).sealed)
                    await channel.publish(reports_topic(sid, spec.round_id, instance), envelope)
                    if instance == 0 and victim_sealed is None:
                        victim_sealed = honest_sealed[-1]
            # the victim's inner sealed report, re-wrapped under a credential of instance 1
            smuggled, _ = wrap(spec, _credential_for(deployment, 1, spec), victim_sealed)
            await channel.publish(reports_topic(sid, spec.round_id, 1), smuggled)
            return spec

        devices_task = asyncio.create_task(devices())
        record = await asyncio.wait_for(
            coordinator.run_round(PARAMS, EPSILON0, min_batch=2, max_batch=16, shuffler_instances=2), 20
        )
        spec = await devices_task
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    share = Counter(c.instance_for(spec) for c in clients)
    assert share == Counter({0: 6, 1: 6})
    # each instance admitted what it was sent: the copy got into both batches
    assert [s.rounds[0].admitted for s in shufflers] == [share[0], share[1] + 1]
    n = len(clients)
    assert record.opened.size == n, "the smuggled copy was counted a second time"
    assert record.opened.rejected == Counter({CROSS_BATCH_DUPLICATE: 1})
    # exactly the honest reports, each once
    assert _rows(record.opened.values) == _rows(deployment.analyzer().open_payloads(honest_sealed, spec).values)
    # each batch's size is what the round counts from it: the copy is in neither total twice
    assert sum(record.batch_sizes) == n and len(record.batch_sizes) == 2
    assert sorted(record.batch_sizes) in (sorted([share[0], share[1]]), sorted([share[0] - 1, share[1] + 1]))


def _signed_round(deployment: Deployment, coordinator, *, min_batch: int, max_batch: int) -> tuple[RoundSpec, bytes]:
    spec = RoundSpec(
        session_id=coordinator.session_id, round_id=0, params=PARAMS, epsilon0=EPSILON0,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, messages_per_user=1,
        min_batch=min_batch, max_batch=max_batch, deadline=2e9, shuffler_instances=2,
    )
    return spec, deployment.analyzer().sign_spec(spec)


def _sealed(deployment: Deployment, spec: RoundSpec, signed: bytes, count: int) -> list[bytes]:
    opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
    return [
        opener.open(deployment.client(np.array([0.5 * i - 2.0]), PrivacyLedger(1.0)).answer(signed)[0]).sealed
        for i in range(count)
    ]


async def _serve_batches(deployment, coordinator, spec, batches: list[list[bytes]], chunk_size: int = 2):
    """The coordinator receives ``batches`` (instance ``i`` publishes ``batches[i]``, in list order)."""
    channel = coordinator.channel
    receiving = asyncio.create_task(coordinator.receive_round(spec))
    await asyncio.sleep(0.05)  # subscribed
    for instance, payloads in enumerate(batches):
        for chunk in batch_chunks(spec, deployment.shuffler_keys, bytes([instance + 1]) * 16, payloads, chunk_size):
            await channel.publish(batch_topic(spec.session_id, spec.round_id, instance), chunk)
    return await asyncio.wait_for(receiving, 10)


async def test_the_second_batch_to_complete_loses_its_copies_and_its_size_says_so():
    """Signed batches with a copy of two reports of batch 0 in batch 1: the copies are dropped
    (and counted), batch 1's size excludes them, and the round holds each report once."""
    deployment = Deployment()
    coordinator = deployment.coordinator(InProcessChannel(), round_timeout=5.0, grace=1.0)
    spec, signed = _signed_round(deployment, coordinator, min_batch=3, max_batch=8)
    first, second = _sealed(deployment, spec, signed, 4), _sealed(deployment, spec, signed, 3)
    record = await _serve_batches(deployment, coordinator, spec, [first, second + first[:2]])
    assert record.batch_sizes == (4, 3) and record.smallest_batch == 3
    assert record.opened.size == 7 and record.opened.rejected == Counter({CROSS_BATCH_DUPLICATE: 2})
    assert _rows(record.opened.values) == _rows(deployment.analyzer().open_payloads(first + second, spec).values)


async def test_copies_can_push_a_batch_below_min_batch_and_then_it_is_refused():
    """A batch with fewer than ``min_batch`` reports of its own is not a batch the round was
    accounted for: copies of another batch's reports do not make up the number."""
    deployment = Deployment()
    coordinator = deployment.coordinator(InProcessChannel(), round_timeout=1.0, grace=0.5)
    spec, signed = _signed_round(deployment, coordinator, min_batch=3, max_batch=8)
    first, second = _sealed(deployment, spec, signed, 4), _sealed(deployment, spec, signed, 1)
    record = await _serve_batches(deployment, coordinator, spec, [first, second + first[:2]])
    assert record.batch_sizes == (4,) and record.opened.size == 4
    assert coordinator.rejected_batches["batch-too-small"] == 1


async def test_a_refused_batch_cannot_knock_a_report_out_of_another():
    """Copies arriving in a batch that is then refused (too small) claim nothing: the real
    reports in the batch that completes later still count."""
    deployment = Deployment()
    coordinator = deployment.coordinator(InProcessChannel(), round_timeout=1.0, grace=0.5)
    spec, signed = _signed_round(deployment, coordinator, min_batch=3, max_batch=8)
    real = _sealed(deployment, spec, signed, 4)
    junk = [bytes(len(real[0]))] * 3  # fails to open
    # instance 0 (published first) holds two copies of instance 1's reports and junk: too small
    record = await _serve_batches(deployment, coordinator, spec, [real[:2] + junk, real])
    assert record.batch_sizes == (4,) and record.opened.size == 4 and not record.opened.rejected
    assert coordinator.rejected_batches["batch-too-small"] == 1
