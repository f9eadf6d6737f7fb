"""Security tests through a real authenticated TLS broker, with the real parties.

An attacker holding the shuffler's *broker* account (a stolen password, or a
malicious broker) publishes a well-formed batch signed by another key and junk on
the batch topic; an enrolled client replays its envelope, re-wraps another client's
sealed report and goes over its quota. The coordinator must take only the real
shuffler's batch, the shuffler must admit each report once, and nothing of the
outer envelope (credential, nonce) may reach the analyzer.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import batch_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec, ShuffledBatch, SignedRoundSpec
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.onion import EnvelopeOpener, ShufflerKeys, wrap
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.shuffler.service import batch_chunks

pytestmark = pytest.mark.mqtt

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)


async def test_forged_batches_replays_rewraps_and_quota_abuse_over_the_broker(broker):
    deployment = Deployment()
    n = 8
    clients = [deployment.client(np.array([0.2 * i]), PrivacyLedger(1.0)) for i in range(n)]
    connect = lambda role: MqttChannel(broker.host, broker.port, **broker.channel_options(role))  # noqa: E731
    async with connect("analyzer") as a_ch, connect("shuffler") as s_ch, connect("shuffler") as attacker_ch, connect(
        "client"
    ) as c_ch:
        # released at the deadline (max_batch is never reached), which leaves the fleet and the attacks
        # below well over ten times what they take to be judged
        coordinator = deployment.coordinator(a_ch, round_timeout=1.5, grace=10.0)
        shuffler = deployment.shuffler(s_ch)
        sid = deployment.session_id
        seen_batches = await a_ch.subscribe(batch_topic(sid, 0))
        shuffler_task = asyncio.create_task(shuffler.serve())

        async def fleet_and_attacks():
            specs = await c_ch.subscribe(spec_topic(sid))
            signed = await asyncio.wait_for(specs.get(), 10)
            spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
            sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
            # the attacker: a batch signed by an impostor key, an unsigned one, junk
            impostor = batch_chunks(spec, ShufflerKeys.generate(), os.urandom(16), [os.urandom(sealed_size)] * n, 64)[0]
            unsigned = codec.encode(ShuffledBatch(sid, 0, spec.digest, os.urandom(16), 0, 1, n, tuple(os.urandom(sealed_size) for _ in range(n))))
            for junk in (impostor, unsigned, b"\x00" * 100):
                await attacker_ch.publish(batch_topic(sid, 0), junk)
            answers = [c.answer(signed)[0] for c in clients]
            topic = reports_topic(sid, 0)
            opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
            victim_sealed = opener.open(answers[1]).sealed
            abuse = [
                answers[0],  # an exact replay: acknowledged, counted once
                wrap(spec, clients[2].credential, victim_sealed)[0],  # client 2 re-wraps client 1's report
                wrap(spec, clients[3].credential, os.urandom(sealed_size))[0],  # client 3 sends a second report
            ]
            for e in answers + abuse:
                await c_ch.publish(topic, e)
            return answers

        fleet_task = asyncio.create_task(fleet_and_attacks())
        try:
            record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=n, max_batch=n + 3), 30)
            answers = await fleet_task
            await asyncio.sleep(0.3)
        finally:
            shuffler_task.cancel()
            await asyncio.gather(shuffler_task, return_exceptions=True)
        on_the_wire = seen_batches.get_nowait_all()

    assert coordinator.rejected_batches == Counter({"bad-signature": 2, "malformed": 1})
    stats = shuffler.rounds[0]
    assert stats.admitted == n and stats.retransmitted == 1
    assert stats.rejected == Counter({"duplicate": 1, "quota": 1})
    assert record.opened.size == n and not record.opened.rejected
    # the analyzer's input: the real batch carries only sealed reports, no credential, no nonce
    real = [d for d in on_the_wire if d not in (b"\x00" * 100,)]
    batch = next(codec.decode(d, ShuffledBatch) for d in real if codec.decode(d, ShuffledBatch).batch_id == record.batch_id)
    opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, record.spec)
    admissions = [opener.open(a) for a in answers]
    assert Counter(batch.payloads) == Counter(adm.sealed for adm in admissions)
    blob = b"".join(on_the_wire)
    for adm in admissions:
        assert adm.credential not in blob and adm.credential[:16] not in blob and adm.nonce not in blob
