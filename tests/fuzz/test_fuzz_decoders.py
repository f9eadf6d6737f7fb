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
  ``batch_payloads`` accepts iff ``codec.decode(data, ShuffledBatch)`` accepts a
  batch of that session and round whose payloads all have the round's sealed size
  (at most ``max_batch`` of them), with equal payloads.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import cbor_raw as raw
import strategies as S
from fuzz_stats import FUZZ, count_case, timed
from shuffledp.protocol import cbor_strict, codec
from shuffledp.protocol.errors import MalformedMessage, ShuffleDPError
from shuffledp.protocol.messages import (
    MAX_BATCH,
    Envelope,
    Report,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.report_format import batch_payloads, report_format

MESSAGE_CLASSES = (RoundSpec, SignedRoundSpec, Report, Envelope, ShuffledBatch)


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


@FUZZ
@given(data=st.one_of(S.maybe_mutated(S.g_padded_report), S.mutated()), round_id=S.round_ids, mech=S.mechanisms,
       session=st.sampled_from(S.SESSIONS), max_batch=st.sampled_from([1, 4, MAX_BATCH]))
def test_padded_and_fast_decoders_only_raise_typed_errors(data, round_id, mech, session, max_batch):
    count_case("padded_and_fast_decoders")
    for cls in MESSAGE_CLASSES:
        attempt(f"codec.decode_padded[{cls.__name__}]", codec.decode_padded, data, cls)
    layout = report_format(round_id, mech)
    attempt("batch_payloads", batch_payloads, data, session, round_id, layout.sealed_size, max_batch)
    attempt("ReportFormat.values", layout.values, data)
    fitted = data[: layout.size] + bytes(max(0, layout.size - len(data)))
    attempt("ReportFormat.values", layout.values, fitted)


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
    """(session, round_id, sealed_size, max_batch, encoded bytes), mostly near-valid batches of that round."""
    session = S.g_session(r)
    round_id = S.g_round_id(r)
    sealed_size = r.int(1, 1024) if r.one_in(4) else report_format(round_id, S.g_mechanism(r)).sealed_size
    source = r.below(10)
    b_session, b_round, b_size = session, round_id, sealed_size
    if source == 0:
        b_session = S.g_session(r)
    elif source == 1:
        b_round = S.g_round_id(r)
    elif source == 2:
        b_size = r.int(1, 1024)
    data = codec.encode(S.g_batch(r, session=b_session, round_id=b_round, sealed_size=b_size, max_count=5))
    if not r.one_in(4):
        def others(rr):
            return codec.encode(S.g_batch(rr, session=session, round_id=round_id, sealed_size=sealed_size, max_count=3))

        data = S.mutate(r, data, others=others, max_ops=2)
    max_batch = MAX_BATCH if r.bool() else r.int(1, 8)
    return session, round_id, sealed_size, max_batch, data


@FUZZ
@given(case=S.seeded(g_batch_case))
def test_batch_reader_agrees_with_general_decoder(case):
    count_case("batch_differential")
    session, round_id, sealed_size, max_batch, data = case
    check_strict_reader(data)
    ok_general, batch = attempt("codec.decode[ShuffledBatch]", codec.decode, data, ShuffledBatch)
    expected = None
    if (
        ok_general
        and batch.session_id == session
        and batch.round_id == round_id
        and len(batch.payloads) <= max_batch
        and all(len(p) == sealed_size for p in batch.payloads)
    ):
        expected = list(batch.payloads)
    ok_fast, payloads = attempt(
        "batch_payloads", batch_payloads, data, session, round_id, sealed_size, max_batch
    )
    got = payloads if ok_fast else None
    assert got == expected, (
        f"fast reader {'accepts' if ok_fast else 'refuses'} ({payloads!r:.200}), general "
        f"{'accepts' if expected is not None else 'refuses'}: {data.hex()} "
        f"(session {session.hex()}, round {round_id}, sealed_size {sealed_size}, max_batch {max_batch})"
    )
    if not ok_fast:
        assert isinstance(payloads, MalformedMessage)
