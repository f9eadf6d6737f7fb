"""The shuffler's spool at rest: who can read its files, and what they still hold.

A local user who can read the spool's files must not learn which client sent which
report. The tests read the raw bytes of the ``.db``, ``-wal`` and ``-shm`` files (as
such a user, or someone copying the files, would) and look for every client id,
nonce and sealed report of a round: a positive control first shows that the search
finds them while the round is open, then none may be left once the round is
acknowledged (no client id and no nonce once it is released).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel, acks_topic, announce_topic, batch_topic, reports_topic
from shuffledp.protocol.wire.messages import ShuffledBatch
from shuffledp.protocol.wire.onion import EnvelopeOpener
from shuffledp.shuffler.spool import AdmittedEnvelope, SpoolAccessError, SqliteSpool

import parties
from parties import DEPLOYMENT, SESSION, SHUFFLER_KEYS

ANALYZER = DEPLOYMENT.analyzer()
SIDE_FILES = ("", "-wal", "-shm")


@pytest.fixture(autouse=True)
def permissive_umask():
    """The usual umask (0022): files are 0644 unless the spool makes them private itself."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def raw_files(db_path) -> dict[str, bytes]:
    """The raw bytes of the spool's files that exist now, by suffix."""
    out = {}
    for suffix in SIDE_FILES:
        path = f"{db_path}{suffix}"
        if os.path.exists(path):
            with open(path, "rb") as f:
                out[suffix or ".db"] = f.read()
    return out


def windows(secret: bytes, width: int = 16, step: int = 8) -> list[bytes]:
    """Overlapping pieces of ``secret``: found even when a page boundary splits it."""
    return [secret[i : i + width] for i in range(0, len(secret) - width + 1, step)]


def found(files: dict[str, bytes], secrets: list[bytes]) -> dict[str, int]:
    """How many of ``secrets`` have a piece in each file."""
    return {name: sum(any(w in data for w in windows(s)) for s in secrets) for name, data in files.items()}


class Round:
    """One round's envelopes, and what the spool must not keep: client ids, nonces, sealed reports."""

    def __init__(self, n: int, round_id: int = 0) -> None:
        self.spec = parties.make_spec(round_id=round_id, min_batch=n, max_batch=n, deadline=time.time() + 60)
        self.signed = ANALYZER.sign_spec(self.spec)
        self.envelopes = [DEPLOYMENT.client(np.array([0.1 * i]), PrivacyLedger(9.0)).answer(self.signed)[0] for i in range(n)]
        opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, self.spec)
        opened = [opener.open(e) for e in self.envelopes]
        self.client_ids = [a.credential[:16] for a in opened]
        self.nonces = [a.nonce for a in opened]
        sealed = [a.sealed for a in opened]
        # pieces shared by several reports (a fixed header, if any) name no report: leave them out
        common = {w for s in sealed for w in windows(s) if sum(w in t for t in sealed) > 1}
        self.sealed = [b"".join(w for w in windows(s) if w not in common) for s in sealed]
        self.sealed_pieces = [[w for w in windows(s) if w not in common] for s in sealed]
        assert all(self.sealed_pieces)

    def sealed_found(self, files: dict[str, bytes]) -> dict[str, int]:
        return {name: sum(any(w in data for w in pieces) for pieces in self.sealed_pieces) for name, data in files.items()}

    def linking_found(self, files: dict[str, bytes]) -> dict[str, int]:
        """Client ids and nonces found, per file."""
        ids, nonces = found(files, self.client_ids), found(files, self.nonces)
        return {name: ids[name] + nonces[name] for name in files}


async def run_round(spool_path, r: Round, *, check_released=None):
    """Serve one round with a file-backed spool until the analyzer's acknowledgement; return the shuffler."""
    channel = InProcessChannel()
    batches = await channel.subscribe(batch_topic(SESSION, r.spec.round_id))
    await channel.publish(announce_topic(SESSION), r.signed, retain=True)
    spool = SqliteSpool(spool_path)
    shuffler = DEPLOYMENT.shuffler(channel, spool=spool)
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0.05)
        for envelope in r.envelopes[:-1]:
            await channel.publish(reports_topic(SESSION, r.spec.round_id), envelope)
        deadline = time.monotonic() + 10
        while shuffler.rounds.get(r.spec.round_id) is None or shuffler.rounds[r.spec.round_id].admitted < len(r.envelopes) - 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # the round is open: the spool holds what resuming it needs (the search finds it)
        opened = raw_files(spool_path)
        assert sum(r.linking_found(opened).values()) >= len(r.envelopes) - 1
        assert sum(r.sealed_found(opened).values()) >= len(r.envelopes) - 1
        await channel.publish(reports_topic(SESSION, r.spec.round_id), r.envelopes[-1])
        batch = codec.decode(await asyncio.wait_for(batches.get(), 10), ShuffledBatch)
        if check_released is not None:
            check_released(raw_files(spool_path))
        await channel.publish(acks_topic(SESSION), ANALYZER.acknowledge(r.spec, batch.batch_id))
        while shuffler.acknowledged < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        return shuffler, raw_files(spool_path)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --------------------------------------------------------------------------- modes


def test_a_new_spool_is_0600_files_in_a_0700_directory(tmp_path):
    path = tmp_path / "state" / "spool.db"  # the directory does not exist yet
    spool = SqliteSpool(path)
    spool.open_round(SESSION, 0, b"spec")
    spool.admit(SESSION, 0, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))
    assert mode(path.parent) == 0o700
    for suffix in SIDE_FILES:
        assert os.path.exists(f"{path}{suffix}"), suffix
        assert mode(f"{path}{suffix}") == 0o600, suffix
    spool.close()
    reopened = SqliteSpool(path)  # a restart: the side files are made again, private again
    reopened.round(SESSION, 0)
    assert all(mode(f"{path}{s}") == 0o600 for s in SIDE_FILES if os.path.exists(f"{path}{s}"))
    reopened.close()


@pytest.mark.parametrize("loose", [0o755, 0o750, 0o711, 0o701, 0o770, 0o707, 0o1777], ids=lambda m: f"{m:04o}")
def test_a_directory_other_users_can_reach_is_refused_and_left_untouched(tmp_path, loose):
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, loose)
    with pytest.raises(SpoolAccessError, match=r"open to other users .*chmod 700") as info:
        SqliteSpool(directory / "spool.db")
    assert info.value.reason == "spool-access"
    assert list(directory.iterdir()) == []  # nothing was created in it
    assert stat.S_IMODE(os.stat(directory).st_mode) == loose  # and its mode is the operator's to change


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user takes root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(SpoolAccessError, match="belongs to uid 65534"):
        SqliteSpool(directory / "spool.db")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "spool.db-shm").write_bytes(b"")
    os.chmod(mine / "spool.db-shm", 0o600)
    os.chown(mine / "spool.db-shm", 65534, 65534)  # a side file planted by someone else
    with pytest.raises(SpoolAccessError, match="belongs to uid 65534"):
        SqliteSpool(mine / "spool.db")


def test_a_spool_file_that_is_a_link_is_refused(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    target = private / "elsewhere.db"
    target.write_bytes(b"")
    (private / "spool.db").symlink_to(target)
    with pytest.raises(SpoolAccessError, match="symbolic link"):
        SqliteSpool(private / "spool.db")
    (private / "other.db-wal").symlink_to(target)  # a planted side file
    with pytest.raises(SpoolAccessError, match="symbolic link"):
        SqliteSpool(private / "other.db")


def test_an_older_spool_left_readable_is_made_private_and_keeps_its_rounds(tmp_path):
    """A spool an earlier version wrote (0644 files, a released round's rows still there) opens private and purged."""
    path = tmp_path / "spool.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    from shuffledp.shuffler.spool import _SCHEMA

    db.executescript(_SCHEMA)
    db.execute("INSERT INTO rounds VALUES (?, 0, ?, 'released', NULL)", (SESSION, b"spec"))
    db.execute("INSERT INTO rounds VALUES (?, 1, ?, 'open', NULL)", (SESSION, b"spec"))
    for round_id, fill in ((0, b"\xa0"), (1, b"\xb1")):
        db.execute("INSERT INTO admitted (session_id, round_id, client_id, nonce, sealed) VALUES (?, ?, ?, ?, ?)",
                   (SESSION, round_id, fill * 16, fill * 16, fill * 100))
    db.execute("INSERT INTO batches VALUES (?, ?, 0, 0)", (b"b" * 16, SESSION))
    db.execute("INSERT INTO chunks VALUES (?, 0, ?)", (b"b" * 16, b"chunk"))
    assert mode(path) == 0o644 and mode(f"{path}-wal") == 0o644  # what the umask gave
    spool = SqliteSpool(path)  # while the old process still has it open
    assert all(mode(f"{path}{s}") == 0o600 for s in SIDE_FILES)
    assert spool.admitted(SESSION, 0) == []  # a released round needs no admission rows
    assert [e.client_id for e in spool.admitted(SESSION, 1)] == [b"\xb1" * 16]  # an open round keeps them
    assert [b.chunks for b in spool.unacknowledged()] == [[b"chunk"]]
    db.close()
    files = raw_files(path)
    assert not any(b"\xa0" * 16 in data for data in files.values())
    assert any(b"\xb1" * 16 in data for data in files.values())
    spool.close()


# --------------------------------------------------------------------------- what the files hold


async def test_after_the_acknowledgement_no_client_id_or_report_of_the_round_is_in_the_files(tmp_path):
    path = tmp_path / "spool.db"
    r = Round(60)

    def released(files):
        # the permuted batch is there (the search finds the reports), the client <-> report link is not
        assert sum(r.sealed_found(files).values()) >= len(r.envelopes)
        assert r.linking_found(files) == {name: 0 for name in files}

    shuffler, files = await run_round(path, r, check_released=released)
    assert shuffler.spool.round(SESSION, 0).state == "served"
    assert set(files) == {".db", "-wal", "-shm"} and files["-wal"] == b""  # the log is truncated
    assert r.linking_found(files) == {name: 0 for name in files}
    assert r.sealed_found(files) == {name: 0 for name in files}
    shuffler.spool.close()
    closed = raw_files(path)
    assert r.linking_found(closed) == {n: 0 for n in closed} and r.sealed_found(closed) == {n: 0 for n in closed}


async def test_a_second_round_leaves_the_first_one_nothing_either(tmp_path):
    """Pages reused by a later round must not bring back anything of an earlier one, nor keep the later one's."""
    path = tmp_path / "spool.db"
    first, second = Round(30, round_id=0), Round(30, round_id=1)
    _, files = await run_round(path, first)
    _, files = await run_round(path, second)
    for r in (first, second):
        assert r.linking_found(files) == {n: 0 for n in files} and r.sealed_found(files) == {n: 0 for n in files}


def test_a_log_a_reader_keeps_is_truncated_at_the_next_write(tmp_path):
    """A checkpoint another process's reader blocks is not lost: the spool truncates the log later."""
    path = tmp_path / "spool.db"
    r = Round(20)
    spool = SqliteSpool(path)
    spool.open_round(SESSION, 0, r.signed)
    opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, r.spec)
    admitted = [opener.open(e) for e in r.envelopes]
    spool.admit_many(SESSION, 0, [AdmittedEnvelope(a.credential[:16], a.nonce, a.sealed) for a in admitted])
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM admitted").fetchone()  # holds a snapshot: the log cannot be reset
    started = time.monotonic()
    spool.release(SESSION, 0, b"b" * 16, [b"chunk"])
    assert time.monotonic() - started < 2  # a blocked checkpoint does not stall the service
    assert spool.scrub_pending
    assert sum(r.linking_found(raw_files(path)).values()) > 0  # the log still holds the admitted rows
    reader.execute("COMMIT")
    spool.open_round(SESSION, 1, b"spec")  # any later write ...
    spool.fail(SESSION, 1, "batch-too-small")
    assert not spool.scrub_pending
    files = raw_files(path)
    assert r.linking_found(files) == {n: 0 for n in files}
    reader.close()
    spool.close()


_KILLED_BEFORE_CHECKPOINT = textwrap.dedent(
    """
    import hashlib, os, signal, sys
    from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool
    path, count = sys.argv[1], int(sys.argv[2])
    h = lambda *parts: hashlib.sha256(repr(parts).encode()).digest()
    spool = SqliteSpool(path)
    spool.open_round(bytes(range(16)), 0, b"spec")
    spool.admit_many(bytes(range(16)), 0, [AdmittedEnvelope(h("client", i)[:16], h("nonce", i)[:16], h("sealed", i) * 3)
                                           for i in range(count)])
    SqliteSpool._scrub = lambda self: os.kill(os.getpid(), signal.SIGKILL)  # dies right after the commit
    spool.release(bytes(range(16)), 0, b"b" * 16, [b"chunk"])
    """
)


def test_a_shuffler_killed_before_its_checkpoint_leaves_nothing_once_restarted(tmp_path):
    path = tmp_path / "spool.db"
    child = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_CHECKPOINT, str(path), "40"], timeout=60)
    assert child.returncode == -signal.SIGKILL
    client_ids = [hashlib.sha256(repr(("client", i)).encode()).digest()[:16] for i in range(40)]
    assert sum(found(raw_files(path), client_ids).values()) > 0  # the killed process left them in the log
    spool = SqliteSpool(path)  # the restart
    assert spool.round(SESSION, 0).state == "released" and [b.chunks for b in spool.unacknowledged()] == [[b"chunk"]]
    files = raw_files(path)
    assert found(files, client_ids) == {n: 0 for n in files}
    spool.close()


def test_a_directory_swapped_in_between_the_checks_and_the_open_is_refused(tmp_path, monkeypatch):
    """A local user who can rename directories above the spool swaps in their own directory
    (a world-readable spool file in it) after the spool's checks and before SQLite opens the
    file by path: the spool must refuse, not write client-report links into the attacker's file."""
    import shuffledp.shuffler.spool as spool_module

    private = tmp_path / "state"
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    os.chmod(attacker, 0o777)
    planted = attacker / "spool.db"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)
    real_connect = sqlite3.connect

    class SwappingSqlite:
        """sqlite3, whose connect is preceded by the attacker's swap."""

        def __getattr__(self, name):
            return getattr(sqlite3, name)

        @staticmethod
        def connect(path, *args, **kwargs):
            os.rename(private, tmp_path / "state.moved")
            os.rename(attacker, private)
            return real_connect(path, *args, **kwargs)

    monkeypatch.setattr(spool_module, "sqlite3", SwappingSqlite())
    with pytest.raises(SpoolAccessError, match="changed while it was opened"):
        SqliteSpool(private / "spool.db")
