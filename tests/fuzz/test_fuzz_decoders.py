"""Fuzzing every decoder of the wire format with structure-aware mutations of valid messages.

Properties:

* every decoder returns or raises a :class:`ShuffleDPError` subclass, never anything
  else (an untyped exception fails the test);
* the strict reader does linear work: ``reader.items <= len(data)`` whenever it reads;
* the strict reader accepts exactly the deterministic subset: every canonical
  encoding of a plain value round-trips, and the same value with one rule broken
  (non-shortest width, indefinite length, tag, simple value, NaN/inf, unsorted or
  duplicate key, nesting past MAX_DEPTH) is refused;
* the fast readers agree with the general one: ``ReportFormat.values`` accepts a
  plaintext of the round's size iff ``codec.decode_padded(pt, Report)`` accepts it
  and it is a report of that round and mechanism, with equal values;
  ``read_batch_chunk`` accepts iff ``codec.decode(data, ShuffledBatch)`` accepts a
  chunk of that session and round whose payloads all have the round's sealed size
  (of a batch of at most ``max_batch`` reports), with equal fields, and the digest
  it hashes in place is SHA-256 of the re-encoding with the signature zeroed, so
  ``verify_encoded`` on it accepts exactly the chunks ``verify_signed`` accepts;
* the shuffler's envelope opener agrees with the general one too: for an outer
  layer really sealed to the shuffler around *any* plaintext (an attacker can seal
  anything to the public key: mutated admissions, hostile CBOR, random bytes),
  ``EnvelopeOpener.open`` returns an admission iff the envelope decodes for the
  round at its fixed outer size, the outer layer opens, and the plaintext decodes
  (``codec.decode(pt, Admission)``) to an admission of that round whose sealed
  report has the round's fixed size; it returns exactly that admission.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

import cbor_raw as raw
import strategies as S
from fuzz_stats import FUZZ, count_case, timed
from shuffledp.protocol.wire import cbor_strict, codec
from shuffledp.protocol.errors import BadSignature, MalformedMessage, ShuffleDPError
from shuffledp.protocol.wire.messages import (
    MAX_BATCH,
    Admission,
    Envelope,
    Report,
    RoundSpec,
    ShuffledBatch,
)
from shuffledp.protocol.wire.onion import EnvelopeOpener, envelope_format, envelope_info, verify_encoded, verify_signed
from shuffledp.protocol.wire.report_format import read_batch_chunk, report_format
from shuffledp.protocol.wire.sealing import SUITE

#: Every wire message class (the codec's table: a new type is fuzzed as soon as it exists).
MESSAGE_CLASSES = tuple(cls for cls, _ in codec.MESSAGE_TYPES.values())
SHUFFLER_PUBLIC = S.SHUFFLER_KEYS.signing_public


def _generated_types() -> set:
    """The wire types the valid-message generator (the base of every mutation) makes."""
    seen = set()
    for seed in range(400):
        data = S.g_valid_message(S.Rng(seed))
        try:
            seen.add(type(codec.decode(data)))
        except MalformedMessage:  # a padded report: the general decoder refuses the zero padding
            seen.add(type(codec.decode_padded(data, Report)))
    return seen


# Checked at collection (not as a test: scripts/fuzz.sh spreads its examples over every test here).
if _generated_types() != set(MESSAGE_CLASSES):
    raise AssertionError(f"the fuzz generator misses wire types: {set(MESSAGE_CLASSES) - _generated_types()}")


def attempt(name, decoder, data, *args, **kwargs):
    """``(True, result)`` or ``(False, error)``; any exception that is not a ShuffleDPError propagates."""
    try:
        return True, timed(name, decoder, data, *args, **kwargs)
    except ShuffleDPError as exc:
        return False, exc


def strict_read(data: bytes, max_items=None):
    """Read one item with StrictReader, checking the linear-work bound; ``(ok, value_or_error)``."""
    readers = []

    def read(d):
        reader = cbor_strict.StrictReader(d, max_items=max_items)
        readers.append(reader)
        return reader.read()

    try:
        return attempt("StrictReader.read", read, data)
    finally:
        for reader in readers:
            assert reader.items <= len(data), f"{reader.items} items read from {len(data)} bytes: {data.hex()}"
            assert reader.pos <= len(data)


def check_strict_reader(data: bytes) -> None:
    ok, value = strict_read(data)
    for limit in (0, 1, 5):
        strict_read(data, max_items=limit)
    ok_loads, loaded = attempt("cbor_strict.loads", cbor_strict.loads, data)
    if ok_loads:  # a whole-input item is also what StrictReader reads first, and it re-encodes to itself
        assert ok and value == loaded
        assert raw.encode(loaded) == data, "strict reader accepted a non-canonical encoding"


@FUZZ
@given(data=st.one_of(S.maybe_mutated(), S.mutated(S.g_padded_report)))
def test_strict_reader_on_mutated_messages(data):
    count_case("strict_reader_mutated")
    check_strict_reader(data)


@FUZZ
@given(data=st.one_of(S.hostile_documents, st.binary(max_size=64)))
def test_strict_reader_on_hostile_documents(data):
    count_case("strict_reader_hostile")
    check_strict_reader(data)


@FUZZ
@given(seed=S.seeds)
def test_strict_reader_accepts_exactly_the_canonical_subset(seed):
    count_case("strict_reader_canonical")
    r = S.Rng(seed)
    value = S.g_plain(r)
    data = raw.encode(value)
    ok, loaded = strict_read(data)
    assert ok, f"canonical encoding refused: {loaded}"
    assert loaded == value
    assert timed("cbor_strict.loads", cbor_strict.loads, data) == value
    broken = S.g_noncanonical(r, value)
    ok, _ = strict_read(broken)
    assert not ok, f"non-canonical variant accepted: {broken.hex()}"
    ok, _ = attempt("cbor_strict.loads", cbor_strict.loads, broken)
    assert not ok


@FUZZ
@given(data=S.maybe_mutated())
def test_codec_decode_only_raises_typed_errors(data):
    count_case("codec_decode")
    check_strict_reader(data)
    ok, message = attempt("codec.decode", codec.decode, data)
    if ok:
        assert type(message) in MESSAGE_CLASSES
        assert codec.decode(codec.encode(message)) == message
    for cls in MESSAGE_CLASSES:
        ok_cls, result = attempt(f"codec.decode[{cls.__name__}]", codec.decode, data, cls)
        # pinning the expected type refuses exactly the messages of other types
        assert ok_cls == (ok and type(message) is cls), (cls.__name__, result)
        if ok_cls:
            assert result == message
        attempt(f"codec.decode[{cls.__name__}, max_items=2]", codec.decode, data, cls, max_items=2)
    attempt("codec.decode[max_items=0]", codec.decode, data, max_items=0)
    # other bytes-like inputs decode exactly as bytes do
    for view in (bytearray(data), memoryview(data)):
        ok_view, result = attempt(f"codec.decode[{type(view).__name__}]", codec.decode, view)
        assert ok_view == ok and (not ok or result == message)


@functools.lru_cache(maxsize=256)
def opener_for(session: bytes, round_id: int, mechanism: str) -> EnvelopeOpener:
    """The test shuffler's opener of a round of ``mechanism`` (its outer layer binds the spec's digest)."""
    params, epsilon0, delta0 = S.example_params(mechanism)
    floor = getattr(params, "min_reports", 1)
    spec = RoundSpec(
        session_id=session, round_id=round_id, params=params, epsilon0=epsilon0, delta0=delta0, analyzer_key=bytes(32),
        shuffler_key=S.SHUFFLER_KEYS.hpke_public, shuffler_signing_key=S.SHUFFLER_KEYS.signing_public,
        min_batch=floor, max_batch=floor, messages_per_user=getattr(params, "messages_per_user", 1), deadline=1e12,
    )
    return EnvelopeOpener(S.SHUFFLER_KEYS.hpke_private, spec)


@FUZZ
@given(data=st.one_of(S.maybe_mutated(S.g_padded_report), S.mutated()), round_id=S.round_ids, mech=S.mechanisms,
       session=st.sampled_from(S.SESSIONS), max_batch=st.sampled_from([1, 4, MAX_BATCH]))
def test_padded_and_fast_decoders_only_raise_typed_errors(data, round_id, mech, session, max_batch):
    """Untyped exceptions propagate out of ``attempt`` and fail the test; what a decoder
    accepts must also be what the format says it is."""
    count_case("padded_and_fast_decoders")
    for cls in MESSAGE_CLASSES:
        ok, message = attempt(f"codec.decode_padded[{cls.__name__}]", codec.decode_padded, data, cls)
        if ok:  # a message of the pinned type that round-trips through its own padded encoding
            # (not byte-equal to ``data``: a float field may arrive as an integer, ``float / uint`` in the CDDL)
            assert type(message) is cls
            assert codec.decode_padded(codec.encode(message) + bytes(7), cls) == message
    layout = report_format(round_id, mech)
    ok, chunk = attempt("read_batch_chunk", read_batch_chunk, data, session, round_id, bytes(32), layout.sealed_size,
                        max_batch)
    if ok:  # a chunk of this round, within its bounds, every payload of the round's size
        assert 1 <= chunk.size <= chunk.total <= max_batch and chunk.chunk < chunk.chunks
        assert all(len(p) == layout.sealed_size for p in chunk.payloads) and len(chunk.signature) == 64
    for plaintext in (data, data[: layout.size] + bytes(max(0, layout.size - len(data)))):
        ok, values = attempt("ReportFormat.values", layout.values, plaintext)
        if ok:  # exactly the values the general padded decoder reads, for this round and mechanism
            report = codec.decode_padded(plaintext, Report)
            assert (report.round_id, report.mechanism, report.values) == (round_id, mech, values)
    ok, admission = attempt("EnvelopeOpener.open", opener_for(session, round_id, mech).open, data)
    if ok:  # only the test shuffler's own sealed envelopes of this round open
        assert admission.round_id == round_id and len(admission.sealed) == layout.sealed_size


# ---------------------------------------------------------------------------
# differential: fast report reader vs the general strict decoder
# ---------------------------------------------------------------------------


def g_report_plaintext(r: S.Rng):
    """(round_id, mechanism, plaintext of exactly that round's padded size), mostly near-valid."""
    round_id = S.g_round_id(r)
    mech = S.g_mechanism(r)
    layout = report_format(round_id, mech)
    source = r.below(10)
    src_round, src_mech = round_id, mech
    if source == 0:
        src_round = S.g_round_id(r) if r.bool() else r.pick((round_id ^ 1, max(0, round_id - 1), round_id + 1))
        src_round = min(src_round, 2**63 - 1)
    elif source == 1:
        src_mech = next(m for m in S.MECHANISMS if m != mech)
    encoded = codec.encode(S.g_report(r, src_round, src_mech))
    pt = encoded + bytes(max(0, layout.size - len(encoded)))
    if not r.one_in(5):
        pt = S.mutate(r, pt, others=S.g_padded_report, max_ops=2)
    if len(pt) < layout.size:
        pt = pt + r.pick((b"\x00", b"\x00", b"\x00", b"\x01", b"\xff")) * (layout.size - len(pt))
    return round_id, mech, pt[: layout.size]


@FUZZ
@given(case=S.seeded(g_report_plaintext))
def test_report_reader_agrees_with_general_decoder(case):
    count_case("report_differential")
    round_id, mech, pt = case
    layout = report_format(round_id, mech)
    assert len(pt) == layout.size
    ok_general, report = attempt("codec.decode_padded[Report]", codec.decode_padded, pt, Report)
    expected = report.values if ok_general and report.round_id == round_id and report.mechanism == mech else None
    ok_fast, values = attempt("ReportFormat.values", layout.values, pt)
    got = values if ok_fast else None
    assert got == expected, f"fast reader {got!r} vs general {expected!r} on {pt.hex()} (round {round_id}, {mech})"


# ---------------------------------------------------------------------------
# differential: fast batch reader vs the general strict decoder
# ---------------------------------------------------------------------------


def g_batch_case(r: S.Rng):
    """(session, round_id, spec digest, sealed_size, max_batch, encoded bytes), mostly near-valid chunks of that round.

    Half the chunks are really signed by the test shuffler, so the signature checks
    meet genuine signatures (of mutated chunks, too) as well as random ones.
    """
    session = S.g_session(r)
    round_id = S.g_round_id(r)
    sealed_size = r.int(1, 1024) if r.one_in(4) else report_format(round_id, S.g_mechanism(r)).sealed_size
    source = r.below(10)
    spec_digest = S.g_spec_digest(r)
    b_session, b_round, b_digest, b_size = session, round_id, spec_digest, sealed_size
    if source == 0:
        b_session = S.g_session(r)
    elif source == 1:
        b_round = S.g_round_id(r)
    elif source == 2:
        b_size = r.int(1, 1024)
    elif source == 3:  # another spec of the round
        b_digest = S.g_spec_digest(r)
    signer = S.SHUFFLER_KEYS.signing_private if r.bool() else None
    data = codec.encode(
        S.g_batch(r, session=b_session, round_id=b_round, sealed_size=b_size, max_count=5, signer=signer,
                  spec_digest=b_digest)
    )
    if not r.one_in(4):
        def others(rr):
            return codec.encode(S.g_batch(rr, session=session, round_id=round_id, sealed_size=sealed_size, max_count=3,
                                          spec_digest=spec_digest))

        data = S.mutate(r, data, others=others, max_ops=2)
    max_batch = MAX_BATCH if r.bool() else r.int(1, 8)
    return session, round_id, spec_digest, sealed_size, max_batch, data


@FUZZ
@given(case=S.seeded(g_batch_case))
def test_batch_reader_agrees_with_general_decoder(case):
    count_case("batch_differential")
    session, round_id, spec_digest, sealed_size, max_batch, data = case
    check_strict_reader(data)
    ok_general, batch = attempt("codec.decode[ShuffledBatch]", codec.decode, data, ShuffledBatch)
    expected = None
    if (
        ok_general
        and batch.session_id == session
        and batch.round_id == round_id
        and batch.spec_digest == spec_digest
        and batch.total <= max_batch
        and all(len(p) == sealed_size for p in batch.payloads)
    ):
        expected = (batch.batch_id, batch.chunk, batch.chunks, batch.total, list(batch.payloads), batch.signature)
    ok_fast, chunk = attempt("read_batch_chunk", read_batch_chunk, data, session, round_id, spec_digest, sealed_size,
                             max_batch)
    got = (chunk.batch_id, chunk.chunk, chunk.chunks, chunk.total, chunk.payloads, chunk.signature) if ok_fast else None
    assert got == expected, (
        f"fast reader {'accepts' if ok_fast else 'refuses'} ({chunk!r:.200}), general "
        f"{'accepts' if expected is not None else 'refuses'}: {data.hex()} "
        f"(session {session.hex()}, round {round_id}, sealed_size {sealed_size}, max_batch {max_batch})"
    )
    if not ok_fast:
        assert isinstance(chunk, MalformedMessage)
        return
    # the in-place digest is the digest of the signed form, and both signature checks agree
    zeroed = codec.encode(dataclasses.replace(batch, signature=bytes(64)))
    assert chunk.digest == hashlib.sha256(zeroed).digest(), data.hex()
    ok_encoded = verifies(verify_encoded, SHUFFLER_PUBLIC, ShuffledBatch, chunk.digest, chunk.signature)
    assert ok_encoded == verifies(verify_signed, SHUFFLER_PUBLIC, batch), data.hex()
    # a signature over the same digest under another message type's label never verifies
    if ok_encoded:
        assert not verifies(verify_encoded, SHUFFLER_PUBLIC, Envelope, chunk.digest, chunk.signature)


def verifies(check, *args) -> bool:
    """Whether a signature check passes; it may refuse only with BadSignature (not timed: not a decode)."""
    try:
        check(*args)
    except BadSignature:
        return False
    return True


# ---------------------------------------------------------------------------
# differential: the shuffler's envelope opener vs the general strict decoder
# ---------------------------------------------------------------------------


def g_outer_plaintext(r: S.Rng, round_id: int, fmt) -> bytes:
    """What an attacker seals to the shuffler: mostly a (mutated) admission of the round's length."""
    k = r.below(8)
    if k == 0:
        return r.bytes(fmt.admission_size if r.bool() else r.int(0, 1100))
    if k == 1:
        return raw.encode(S.g_hostile_tree(r))
    a_round = round_id if r.below(4) else r.pick((S.g_round_id(r), round_id ^ 1))
    a_size = fmt.sealed_size if r.below(4) else r.pick((fmt.sealed_size - 1, fmt.sealed_size + 1, r.int(1, 1024)))
    plaintext = codec.encode(S.g_admission(r, round_id=a_round, sealed_size=max(1, a_size)))
    if r.below(4):
        plaintext = S.mutate(r, plaintext, others=lambda rr: codec.encode(S.g_admission(rr, round_id=round_id)),
                             max_ops=2)
    if r.below(4):  # fitted to the round's length, so the outer layer has the round's fixed size
        plaintext = plaintext[: fmt.admission_size] + bytes(max(0, fmt.admission_size - len(plaintext)))
    return plaintext


def g_sealed_envelope_case(r: S.Rng):
    """(session, round_id, mechanism, envelope bytes, the plaintext sealed, the outer ciphertext, and
    whether that ciphertext was sealed to the test shuffler for this session and round)."""
    session = S.g_session(r)
    round_id = S.g_round_id(r)
    mech = S.g_mechanism(r)
    fmt = envelope_format(round_id, mech)
    plaintext = g_outer_plaintext(r, round_id, fmt)
    digest = opener_for(session, round_id, mech).spec.digest
    info_session, info_round, info_digest = session, round_id, digest
    if r.one_in(10):  # sealed for another session, round or spec
        j = r.below(3)
        if j == 0:
            info_session = S.g_session(r)
        elif j == 1:
            info_round = S.g_round_id(r)
        else:
            info_digest = S.g_spec_digest(r)
    key = S.SHUFFLER_KEYS.hpke_public if r.below(10) else S.OTHER_SHUFFLER_KEYS.hpke_public
    outer = SUITE.encrypt(plaintext, X25519PublicKey.from_public_bytes(key),
                          info=envelope_info(info_session, info_round, info_digest))
    e_session, e_round = session, round_id
    if r.one_in(10):  # the header names another session or round
        if r.bool():
            e_session = S.g_session(r)
        else:
            e_round = S.g_round_id(r)
    data = codec.encode(Envelope(e_session, e_round, outer)) if len(outer) <= 2048 else b"\xa0"
    if r.one_in(4):  # the envelope itself mutated (header, outer ciphertext or structure)
        data = S.mutate(r, data, others=lambda rr: codec.encode(S.g_envelope(rr, session=session, round_id=round_id)),
                        max_ops=2)
    return session, round_id, mech, data, plaintext, outer, key == S.SHUFFLER_KEYS.hpke_public and (
        info_session, info_round, info_digest) == (session, round_id, digest)


@FUZZ
@given(case=S.seeded(g_sealed_envelope_case))
def test_envelope_opener_agrees_with_general_decoder(case):
    count_case("envelope_opener_differential")
    session, round_id, mech, data, plaintext, outer, opens = case
    fmt = envelope_format(round_id, mech)
    expected = None
    ok_envelope, envelope = attempt("codec.decode[Envelope]", codec.decode, data, Envelope)
    if (
        ok_envelope
        and (envelope.session_id, envelope.round_id) == (session, round_id)
        and len(envelope.outer) == fmt.outer_size
        and envelope.outer == outer  # any other ciphertext fails the AEAD tag
        and opens
    ):
        ok_admission, admission = attempt("codec.decode[Admission]", codec.decode, plaintext, Admission)
        if ok_admission and admission.round_id == round_id and len(admission.sealed) == fmt.sealed_size:
            expected = admission
    ok_open, opened = attempt("EnvelopeOpener.open", opener_for(session, round_id, mech).open, data)
    got = opened if ok_open else None
    assert got == expected, (
        f"opener {'accepts' if ok_open else 'refuses'} ({opened!r:.200}), reference "
        f"{'accepts' if expected is not None else 'refuses'}: envelope {data.hex()}, plaintext {plaintext.hex()} "
        f"(session {session.hex()}, round {round_id}, {mech})"
    )
