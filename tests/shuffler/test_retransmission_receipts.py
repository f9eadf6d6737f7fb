"""Signed acknowledgements of retransmitted envelopes are bounded per envelope and round.

An exact retransmission of an admitted envelope is acknowledged again (its client may have
missed the receipt) and counted once. Every receipt is signed and goes to every device of the
round, so without a bound one valid credential buys signed answers without limit by sending its
admitted envelope again and again, the way forged credentials did before their refusals were
bounded. Each admitted envelope is acknowledged again at most ``RETRANSMISSION_ACKS`` times a
round; later copies are dropped unanswered and still counted.
"""

from __future__ import annotations

from shuffledp.shuffler.service import RETRANSMISSION_ACKS, RoundAdmission

from parties import ISSUER, SHUFFLER_KEYS, credential, envelope, make_spec, nonce
from shuffledp.protocol.wire.report_format import report_format

COPIES = 2000


def sealed(i: int, spec) -> bytes:
    return i.to_bytes(report_format(spec.round_id, spec.mechanism).sealed_size, "big")


def test_one_admitted_envelope_sent_again_and_again_gets_a_bounded_number_of_receipts():
    spec = make_spec(max_batch=100)
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER)
    mine = envelope(spec, credential(7), sealed(1, spec), nonce(1))
    first = admission.offer_many([mine])
    assert first.admitted == [nonce(1)]
    named = []
    for start in range(0, COPIES, 50):  # in bursts, as the service takes them
        named += admission.offer_many([mine] * 50).admitted
    assert named == [nonce(1)] * RETRANSMISSION_ACKS, f"{len(named)} signed acknowledgements for one envelope"
    assert admission.stats.admitted == 1 and admission.stats.retransmitted == COPIES  # counted, once admitted
    # another device's envelope is still admitted and acknowledged, and its own retransmission too
    other = envelope(spec, credential(8), sealed(2, spec), nonce(2))
    assert admission.offer_many([other]).admitted == [nonce(2)]
    assert admission.offer_many([other]).admitted == [nonce(2)]


def test_a_device_that_missed_its_receipt_is_acknowledged_again():
    spec = make_spec(max_batch=100)
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER)
    mine = envelope(spec, credential(7), sealed(1, spec), nonce(1))
    admission.offer_many([mine])
    for _ in range(RETRANSMISSION_ACKS):
        assert admission.offer_many([mine]).admitted == [nonce(1)]
