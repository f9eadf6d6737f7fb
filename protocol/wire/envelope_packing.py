"""Several envelopes of one round in one transport message.

Every envelope of a round has one fixed size ``E`` (``wire_size.envelope_bytes``), so a
message on the round's reports topic whose length is ``k E`` with ``1 <= k <=``
:data:`MAX_ENVELOPES_PER_MESSAGE` *is* ``k`` envelopes, back to back: no header, no
framing to parse. A publisher that holds many envelopes (a multi-message device, a
gateway, a simulated fleet) may send them so; the shuffler splits the message
(:func:`unpack_envelopes`) and judges every envelope on its own, exactly as if it had
come alone: its own outer layer, credential, nonce, quota and receipt.

What a packed message reveals. Its length reveals ``k``, which the publisher chose;
nothing inside depends on a user's value, since every envelope has the round's fixed
size. A device that packs its own ``M`` messages reveals ``M``, which the round's spec
already makes public (``messages_per_user``); a gateway reveals how many envelopes it
relays, which one message per envelope would reveal too. The shuffler learns that
the ``k`` envelopes came in one message: it already learns each envelope's credential
when it opens the outer layer. The analyzer sees none of it: the shuffler permutes the
admitted sealed reports one by one (``shuffler/service.py``).

Why it matters: a transport's cost is mostly per message (MQTT: a packet, a PUBACK and
a callback each), so packing ``k`` envelopes divides it by ``k``
(``benchmarks/bench_mqtt_load.py`` measures both).
"""

from __future__ import annotations

from typing import Iterable, Iterator

from shuffledp.protocol.errors import InvalidParameter, MessageTooLarge

#: Most envelopes one transport message may carry.
MAX_ENVELOPES_PER_MESSAGE = 64


def envelopes_per_message(envelope_size: int, payload_limit: int) -> int:
    """How many envelopes of ``envelope_size`` bytes fit in one message of at most ``payload_limit``
    bytes (the broker's limit for the publisher's role), at most :data:`MAX_ENVELOPES_PER_MESSAGE`."""
    if envelope_size < 1 or payload_limit < envelope_size:
        raise InvalidParameter("payload_limit", f"{payload_limit} B cannot carry one envelope of {envelope_size} B")
    return min(MAX_ENVELOPES_PER_MESSAGE, payload_limit // envelope_size)


def pack_envelopes(envelopes: Iterable[bytes], per_message: int) -> Iterator[bytes]:
    """The envelopes, ``per_message`` to a message (the last one may hold fewer), each message their
    concatenation. Every envelope must have the size of the first (one round's envelopes do)."""
    if not 1 <= per_message <= MAX_ENVELOPES_PER_MESSAGE:
        raise InvalidParameter("per_message", f"must be in [1, {MAX_ENVELOPES_PER_MESSAGE}], got {per_message!r}")
    size = None
    group: list[bytes] = []
    for envelope in envelopes:
        if size is None:
            size = len(envelope)
        elif len(envelope) != size:
            raise InvalidParameter("envelopes", f"one round's envelopes have one size: got {len(envelope)} B after {size} B")
        group.append(envelope)
        if len(group) == per_message:
            yield b"".join(group)
            group = []
    if group:
        yield b"".join(group)


def unpack_envelopes(payloads: Iterable[bytes], envelope_size: int) -> list[bytes]:
    """Every envelope in ``payloads`` as the shuffler admits them: a payload of ``k`` times
    ``envelope_size`` bytes (``2 <= k <=`` :data:`MAX_ENVELOPES_PER_MESSAGE`) becomes its ``k``
    envelopes; any other payload is passed on whole, for the envelope opener to judge (and refuse,
    with its typed reason, if it is not one envelope). A payload of more envelopes than allowed is
    replaced by a :class:`MessageTooLarge` for the caller to count, never split."""
    out: list = []
    for payload in payloads:
        if not isinstance(payload, bytes):  # hostile input of another type: the opener refuses it, typed
            out.append(payload)
            continue
        length = len(payload)
        if length > envelope_size and length % envelope_size == 0:
            count = length // envelope_size
            if count > MAX_ENVELOPES_PER_MESSAGE:
                out.append(MessageTooLarge(f"{count} envelopes in one message, over {MAX_ENVELOPES_PER_MESSAGE}"))
                continue
            view = memoryview(payload)
            out.extend(bytes(view[i : i + envelope_size]) for i in range(0, length, envelope_size))
        else:
            out.append(payload)
    return out


__all__ = ["MAX_ENVELOPES_PER_MESSAGE", "envelopes_per_message", "pack_envelopes", "unpack_envelopes"]
