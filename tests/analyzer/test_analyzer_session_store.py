"""A restarted analyzer resumes its session from its durable state and never announces a round twice.

Without the session file, an analyzer restarted with the same session id started again at
round 0 and signed a new spec for it while the first round-0 spec was still answered; with
it, the coordinator writes each round before announcing it and, after a restart, serves the
recorded rounds again under the very same signed bytes, or reads their results back.
"""

from __future__ import annotations

import asyncio
import os
import stat

import numpy as np
import pytest

from shuffledp.analyzer.session_store import COMPLETED, FAILED, SessionMismatch, SessionStore
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, batch_topic
from shuffledp.protocol.errors import BatchTooSmall, InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.shuffler.service import RoundAdmission, batch_chunks

PARAMS = HadamardRangeParams(-4.0, 4.0, 1.0)
N = 6


async def _announcements(channel: InProcessChannel, session_id: bytes, into: list) -> None:
    subscription = await channel.subscribe(announce_topic(session_id))
    while True:
        into.append(await subscription.get())


async def _answer_and_release(deployment: Deployment, channel: InProcessChannel, signed_spec: bytes, spec) -> None:
    """What the shuffler would publish for the round: a batch of N clients' reports."""
    clients = [deployment.client(np.array([0.5 * i]), PrivacyLedger(10.0)) for i in range(N)]
    admission = RoundAdmission(spec, deployment.shuffler_keys, deployment.issuer)
    admission.offer_many([c.answer(signed_spec)[0] for c in clients])
    for chunk in batch_chunks(spec, deployment.shuffler_keys, os.urandom(16), admission.shuffled_payloads(), N):
        await channel.publish(batch_topic(spec.session_id, spec.round_id), chunk)


async def test_a_restarted_analyzer_serves_the_same_spec_then_replays_the_recorded_result(tmp_path):
    deployment = Deployment()
    channel = InProcessChannel()
    path = tmp_path / "analyzer-state.db"
    seen: list[bytes] = []
    watcher = asyncio.create_task(_announcements(channel, deployment.session_id, seen))
    try:
        # the first analyzer announces round 0 and dies before any batch arrives
        first = deployment.coordinator(channel, store=SessionStore(path), round_timeout=30)
        task = asyncio.create_task(first.run_round(PARAMS, 8.0, N))
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert [r.state for r in SessionStore(path).rounds(deployment.session_id)] == ["announced"]

        # restarted: round 0 is served under the very same signed bytes, and completes
        second = deployment.coordinator(channel, store=SessionStore(path), round_timeout=5)
        task = asyncio.create_task(second.run_round(PARAMS, 8.0, N))
        async with asyncio.timeout(5):
            while len(seen) < 2:
                await asyncio.sleep(0.01)
        assert seen[1] == seen[0]  # never a second spec for round 0
        stored = SessionStore(path).round(deployment.session_id, 0)
        await _answer_and_release(deployment, channel, seen[0], stored.spec)
        record = await asyncio.wait_for(task, 10)
        assert record.opened.size == N and record.spec.epsilon0 == 8.0
        assert SessionStore(path).round(deployment.session_id, 0).state == COMPLETED

        # restarted again: the round's recorded result, nothing announced
        third = deployment.coordinator(channel, store=SessionStore(path), round_timeout=5)
        replayed = await third.run_round(PARAMS, 8.0, N)
        await asyncio.sleep(0.05)
        assert len(seen) == 2
        assert np.array_equal(replayed.opened.values, record.opened.values)
        assert (replayed.batch_sizes, replayed.signed_spec, replayed.spec) == (record.batch_sizes, seen[0], record.spec)
        # and round 1 is a new round id
        assert third._next_round == 1
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_restarted_analyzer_asking_another_round_0_is_refused_and_announces_nothing(tmp_path):
    """The attack the durable state stops: the same session's round 0 re-announced at another epsilon0."""
    deployment = Deployment()
    channel = InProcessChannel()
    path = tmp_path / "analyzer-state.db"
    seen: list[bytes] = []
    watcher = asyncio.create_task(_announcements(channel, deployment.session_id, seen))
    try:
        first = deployment.coordinator(channel, store=SessionStore(path), round_timeout=0.2, grace=0.1)
        with pytest.raises(BatchTooSmall):  # nobody answers: the round fails, and is recorded so
            await first.run_round(PARAMS, 8.0, N)
        assert SessionStore(path).round(deployment.session_id, 0).state == FAILED
        await asyncio.sleep(0.05)
        assert len(seen) == 1
        with pytest.raises(SessionMismatch, match="other parameters"):
            await deployment.coordinator(channel, store=SessionStore(path)).run_round(PARAMS, 0.5, N)
        with pytest.raises(BatchTooSmall, match="failed before this analyzer restarted"):
            await deployment.coordinator(channel, store=SessionStore(path)).run_round(PARAMS, 8.0, N)
        await asyncio.sleep(0.05)
        assert len(seen) == 1  # neither restart announced anything
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def test_the_store_refuses_a_round_id_twice_and_a_changed_configuration(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    session = bytes(16)
    assert store.check_config(session, {"epsilon0": 1.0}) is False
    assert store.check_config(session, {"epsilon0": 1.0}) is True
    with pytest.raises(SessionMismatch, match="epsilon0"):
        store.check_config(session, {"epsilon0": 2.0})
    store.announce(session, 0, b"spec")
    with pytest.raises(SessionMismatch, match="already announced"):
        store.announce(session, 0, b"another spec")
    store.fail(session, 0)
    with pytest.raises(SessionMismatch):  # failed is final
        store.fail(session, 0)


def test_the_state_file_is_private(tmp_path):
    path = tmp_path / "state.db"
    SessionStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(InvalidParameter, match="0600"):
        SessionStore(path)
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(OSError):  # never followed
        SessionStore(link)
    assert not (tmp_path / "elsewhere.db").exists()



class _Killed(Exception):
    """Stands for the process being killed."""


class _DiesAtTheAck(InProcessChannel):
    """An in-process channel whose process "dies" when it publishes its first acknowledgement."""

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if topic.endswith("/acks"):
            raise _Killed("killed at the acknowledgement")
        await super().publish(topic, payload, retain=retain)


async def test_a_round_is_recorded_before_its_batch_is_acknowledged_and_acknowledged_again_on_resume(tmp_path):
    """The shuffler deletes a batch once acknowledged: a result not yet written by then would be lost
    and the session could not go on. So the result is written first, and a resumed session
    acknowledges the recorded batch again (the process may have died in between)."""
    deployment = Deployment()
    channel = _DiesAtTheAck()
    path = tmp_path / "analyzer-state.db"
    seen: list[bytes] = []
    watcher = asyncio.create_task(_announcements(channel, deployment.session_id, seen))
    try:
        first = deployment.coordinator(channel, store=SessionStore(path), round_timeout=5)
        task = asyncio.create_task(first.run_round(PARAMS, 8.0, N))
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0.01)
        store = SessionStore(path)
        await _answer_and_release(deployment, channel, seen[0], store.round(deployment.session_id, 0).spec)
        with pytest.raises(_Killed):
            await asyncio.wait_for(task, 10)
        assert store.round(deployment.session_id, 0).state == COMPLETED  # written before the acknowledgement
        recorded = store.round(deployment.session_id, 0).result.batch_ids

        healthy = InProcessChannel()
        acks = await healthy.subscribe(f"shuffledp/{deployment.session_id.hex()}/acks")
        again = deployment.coordinator(healthy, store=store)
        await again.run_round(PARAMS, 8.0, N)
        from shuffledp.protocol.wire import codec
        from shuffledp.protocol.wire.messages import BatchAck

        ack = codec.decode(await asyncio.wait_for(acks.get(), 5), BatchAck)
        assert (ack.batch_id,) == recorded and ack.spec_digest == store.round(deployment.session_id, 0).spec.digest
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def test_a_state_file_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(InvalidParameter, match="writable by no one else"):
        SessionStore(shared / "state.db")
    assert not (shared / "state.db").exists()


def test_a_planted_log_file_is_refused_and_never_replayed(tmp_path):
    """A ``-wal`` file left beside the session file by anyone (mode 0666 here) is refused: SQLite
    would replay it into the session, and the analyzer would resume from rounds it never ran."""
    path = tmp_path / "state.db"
    SessionStore(path).close()
    planted = tmp_path / "state.db-wal"
    planted.write_bytes(b"not ours")
    planted.chmod(0o666)
    with pytest.raises(InvalidParameter, match="-wal"):
        SessionStore(path)
    assert planted.read_bytes() == b"not ours"


async def test_a_spec_planted_in_the_state_file_is_never_served(tmp_path):
    """A resumed round's stored spec must verify under the analyzer's own key."""
    deployment = Deployment()
    path = tmp_path / "state.db"
    store = SessionStore(path)
    other = Deployment(session_id=deployment.session_id)  # another analyzer key, same session
    coordinator = other.coordinator(InProcessChannel())
    from shuffledp.protocol.wire.messages import RoundSpec

    forged = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=PARAMS, epsilon0=8.0,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=N, max_batch=N, deadline=1e12,
    )
    store.announce(deployment.session_id, 0, coordinator.analyzer.sign_spec(forged))
    from shuffledp.protocol.errors import BadSignature

    with pytest.raises(BadSignature):
        await deployment.coordinator(InProcessChannel(), store=store).run_round(PARAMS, 8.0, N)
