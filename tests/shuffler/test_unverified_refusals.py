"""Receipts for refusals that name no verified client are bounded per round.

Anyone who can publish to a round's reports topic can seal envelopes to the shuffler with a
credential that does not verify. Refusals of a verified credential are capped per credential
(``REFUSALS_PER_CREDENTIAL``), then dropped unanswered; refusals whose credential does not
verify have no client id to charge, so they are charged together: a round's receipts name at
most ``UNVERIFIED_REFUSALS_PER_ROUND`` of them, and the rest are refused unanswered (still
counted). An honest device always holds a valid credential, so its refusals are never among
them.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, receipts_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.wire.messages import AdmissionReceipts
from shuffledp.protocol.wire.onion import decode_verified
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.shuffler.service import UNVERIFIED_REFUSALS_PER_ROUND, RoundAdmission

from parties import DEPLOYMENT, ISSUER, SHUFFLER_KEYS, credential, envelope, make_spec, nonce

FLOOD = 2000


def sealed(i: int, spec) -> bytes:
    return i.to_bytes(report_format(spec.round_id, spec.mechanism).sealed_size, "big")


def forged(i: int) -> bytes:
    """A credential that does not verify: a flipped tag bit, another issuer's, or a revoked one."""
    if i % 3 == 0:
        good = bytearray(credential(10_000 + i))
        good[-1] ^= 1
        return bytes(good)
    if i % 3 == 1:
        return CredentialIssuer.generate().issue()
    return credential(1)  # revoked below


def test_a_flood_of_forged_credentials_gets_a_bounded_number_of_named_refusals():
    spec = make_spec(max_batch=10 * FLOOD)
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, revoked=frozenset({(1).to_bytes(16, "big")}))
    flood = [envelope(spec, forged(i), sealed(100 + i, spec), nonce(100 + i)) for i in range(FLOOD // 4)]
    honest = envelope(spec, credential(2), sealed(1, spec), nonce(1))
    named: list[bytes] = []
    admitted: list[bytes] = []
    for start in range(0, len(flood), 50):  # in bursts, as the service takes them
        receipts = admission.offer_many(flood[start : start + 50] + ([honest] if start == 200 else []))
        named += receipts.refused
        admitted += receipts.admitted
    assert admitted == [nonce(1)]  # the honest device in the middle of the flood is admitted and told so
    assert len(named) == UNVERIFIED_REFUSALS_PER_ROUND  # the flood's first refusals are named, then no more
    assert admission.stats.rejected == Counter({"bad-credential": len(flood)})  # every refusal is counted
    # an honest device's refusal names a verified client: still named after the flood
    receipts = admission.offer_many([envelope(spec, credential(2), sealed(2, spec), nonce(2))])
    assert list(zip(receipts.refused, receipts.reasons)) == [(nonce(2), "quota")]


async def test_the_shuffler_signs_receipts_for_a_bounded_number_of_forged_credentials():
    """End to end through the service: 2,000 forged envelopes and one honest one."""
    channel = InProcessChannel()
    spec = make_spec(max_batch=10 * FLOOD)
    shuffler = DEPLOYMENT.shuffler(channel)
    flood = [envelope(spec, forged(3 * i), sealed(100 + i, spec), nonce(100 + i)) for i in range(FLOOD)]
    honest = envelope(spec, credential(2), sealed(1, spec), nonce(1))
    specs = await channel.subscribe(spec_topic(spec.session_id))
    receipts_sub = await channel.subscribe(receipts_topic(spec.session_id, spec.round_id))
    task = asyncio.create_task(shuffler.serve())
    try:
        await channel.publish(announce_topic(spec.session_id), DEPLOYMENT.analyzer().sign_spec(spec), retain=True)  # as announced
        await asyncio.wait_for(specs.get(), 10)  # the round is open
        for data in [*flood, honest]:
            await channel.publish(reports_topic(spec.session_id, spec.round_id), data)
        messages: list[AdmissionReceipts] = []
        async with asyncio.timeout(30):  # until the receipt naming the honest envelope, published last
            while not any(nonce(1) in m.admitted for m in messages):
                data = await receipts_sub.get()
                messages.append(decode_verified(data, AdmissionReceipts, SHUFFLER_KEYS.signing_public))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    refused = [n for m in messages for n in m.refused]
    assert len(refused) == UNVERIFIED_REFUSALS_PER_ROUND, f"{len(refused)} forged envelopes got a signed refusal"
    assert shuffler.rounds[spec.round_id].rejected == Counter({"bad-credential": FLOOD})
    assert shuffler.rounds[spec.round_id].admitted == 1
