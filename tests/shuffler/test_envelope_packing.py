"""Several envelopes in one message (protocol/wire/envelope_packing.py): the shuffler splits a
message of k times the round's envelope size and judges every envelope on its own, as if it had
come alone; anything else is one envelope, or refused with its reason."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from shuffledp.protocol.errors import InvalidParameter, MessageTooLarge
from shuffledp.protocol.transport.channel import InProcessChannel, receipts_topic, reports_topic
from shuffledp.protocol.wire.envelope_packing import (
    MAX_ENVELOPES_PER_MESSAGE,
    envelopes_per_message,
    pack_envelopes,
    unpack_envelopes,
)
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.wire.wire_size import envelope_bytes
from shuffledp.shuffler.service import RoundAdmission

from parties import ISSUER, SHUFFLER_KEYS, credential, envelope, make_spec, nonce


def _sealed(i: int, spec) -> bytes:
    return i.to_bytes(report_format(spec.round_id, spec.mechanism).sealed_size, "big")


def _envelopes(spec, count: int, first: int = 0) -> list[bytes]:
    return [envelope(spec, credential(first + i), _sealed(first + i, spec), nonce(first + i)) for i in range(count)]


def test_pack_and_unpack_are_inverse_and_sized():
    spec = make_spec()
    size = envelope_bytes(spec.mechanism, spec.round_id)
    envelopes = _envelopes(spec, 25)
    assert {len(e) for e in envelopes} == {size}
    packed = list(pack_envelopes(envelopes, 11))
    assert [len(p) for p in packed] == [11 * size, 11 * size, 3 * size]
    assert unpack_envelopes(packed, size) == envelopes
    assert unpack_envelopes(envelopes, size) == envelopes  # one envelope per message: unchanged
    assert envelopes_per_message(size, 4096) == 4096 // size
    assert envelopes_per_message(10, 10**6) == MAX_ENVELOPES_PER_MESSAGE
    for bad in (0, MAX_ENVELOPES_PER_MESSAGE + 1):
        with pytest.raises(InvalidParameter):
            list(pack_envelopes(envelopes, bad))
    with pytest.raises(InvalidParameter):
        list(pack_envelopes([envelopes[0], envelopes[1][:-1]], 2))  # two sizes: not one round's
    with pytest.raises(InvalidParameter):
        envelopes_per_message(size, size - 1)


def test_a_packed_message_is_admitted_envelope_by_envelope():
    spec = make_spec(max_batch=500)
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER)
    good = _envelopes(spec, 10)
    tampered = bytearray(_envelopes(spec, 1, first=10)[0])
    tampered[len(tampered) // 2] ^= 1  # inside the outer layer: it no longer opens
    mixed = good[:5] + [bytes(tampered)] + good[5:]
    receipts = admission.offer_many([b"".join(mixed)])
    assert receipts.admitted == [nonce(i) for i in range(10)]
    assert admission.stats.admitted == 10 and admission.stats.rejected == Counter({"unsealable": 1})
    # Each envelope keeps its own checks: the same ten again are retransmissions, counted once.
    again = admission.offer_many(list(pack_envelopes(good, 4)))
    assert again.admitted == [nonce(i) for i in range(10)] and admission.stats.admitted == 10
    assert admission.stats.retransmitted == 10
    # A credential's quota holds across the envelopes of one message.
    second = envelope(spec, credential(20), _sealed(21, spec), nonce(21))
    first = envelope(spec, credential(20), _sealed(20, spec), nonce(20))
    receipts = admission.offer_many([first + second])
    assert receipts.admitted == [nonce(20)] and receipts.refused == [nonce(21)] and receipts.reasons == ["quota"]


def test_what_is_not_whole_envelopes_is_refused_once():
    spec = make_spec(max_batch=500)
    size = envelope_bytes(spec.mechanism, spec.round_id)
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER)
    too_many = b"".join(_envelopes(spec, 1)) * (MAX_ENVELOPES_PER_MESSAGE + 1)
    ragged = b"".join(_envelopes(spec, 2))[: int(1.5 * size)]
    assert isinstance(unpack_envelopes([too_many], size)[0], MessageTooLarge)
    admission.offer_many([too_many, ragged])
    assert admission.stats.admitted == 0
    assert sum(admission.stats.rejected.values()) == 2 and admission.stats.rejected["too-large"] >= 1


def test_the_shuffler_service_takes_packed_messages_on_its_channel():
    from shuffledp.deploy.deployment import Deployment

    async def main() -> None:
        deployment = Deployment()
        channel = InProcessChannel()
        spec = make_spec(max_batch=12, min_batch=12, deployment=deployment)
        shuffler = deployment.shuffler(channel)
        receipts = await channel.subscribe(receipts_topic(spec.session_id, spec.round_id))
        serving = asyncio.create_task(shuffler.run_round(spec, deployment.analyzer().sign_spec(spec)))
        await asyncio.sleep(0.05)
        issuer = deployment.issuer
        items = [envelope(spec, credential(i, issuer), _sealed(i, spec), nonce(i))
                 for i in range(12)]
        for message in pack_envelopes(items, 5):
            await channel.publish(reports_topic(spec.session_id, spec.round_id), message)
        stats = await asyncio.wait_for(serving, 10)
        assert stats.admitted == 12 and stats.outcome == "forwarded" and not stats.rejected
        assert receipts.get_nowait_all()  # signed receipts name them
        shuffler.close()

    asyncio.run(main())
