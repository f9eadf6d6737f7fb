"""The spool must write into the files it checked, whatever is renamed above them while SQLite opens them.

SQLite opens the database at the connect, and the write-ahead log (``-wal``, which holds every
admitted row, client id next to report, until a checkpoint) and its index (``-shm``) when WAL mode is
switched on, each by path. A local user who can rename directories above the spool can swap a
directory of their own in at either moment (and back right after, so that a check by path sees
nothing). The spool must then refuse to run (:class:`SpoolAccessError`), not write client-report
links into the attacker's file; and another descriptor of the process on the spool file (a second
connection, an earlier one) must not vouch for what this connect opened.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

import shuffledp.shuffler.spool as spool_module
from shuffledp.shuffler.spool import AdmittedEnvelope, SpoolAccessError, SqliteSpool

from parties import SESSION
from test_spool_at_rest import permissive_umask  # noqa: F401  (the usual 0022 umask)

CLIENT_ID = b"client-id:linked"  # what must never reach the attacker's files
NONCE = b"nonce:of:client1"


class _Swap:
    """The attacker's move: their directory takes the spool directory's name (and gives it back)."""

    def __init__(self, tmp_path, private) -> None:
        self.private = private
        self.moved = tmp_path / "state.moved"
        self.attacker = tmp_path / "attacker"
        self.attacker.mkdir()
        os.chmod(self.attacker, 0o777)
        self.swapped = 0
        self.where = self.attacker  # where the attacker's directory is now

    def plant(self, *suffixes: str) -> None:
        """World-readable files of the attacker's under the spool's names."""
        for suffix in suffixes:
            planted = self.attacker / f"spool.db{suffix}"
            planted.write_bytes(b"")
            os.chmod(planted, 0o666)

    def swap_in(self) -> None:
        os.rename(self.private, self.moved)
        os.rename(self.attacker, self.private)
        self.where = self.private
        self.swapped += 1

    def swap_back(self) -> None:
        os.rename(self.private, self.attacker)
        os.rename(self.moved, self.private)
        self.where = self.attacker

    def link_database(self) -> None:
        """A symbolic link in the attacker's directory to the real database (where it is once moved):
        the database path still leads to the file SQLite opened, so SQLite finds nothing amiss."""
        (self.attacker / "spool.db").symlink_to(self.moved / "spool.db")

    def attacker_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.where.iterdir()) if p.is_file() and not p.is_symlink()}


def _sqlite_that(monkeypatch, connection_class=sqlite3.Connection, before_connect=lambda: None) -> None:
    """The spool module's ``sqlite3``, with ``connect`` making ``connection_class`` connections after
    ``before_connect`` (the attacker's moves at those moments)."""
    real_connect = sqlite3.connect

    class Sqlite:
        def __getattr__(self, name):
            return getattr(sqlite3, name)

        @staticmethod
        def connect(path, *args, **kwargs):
            before_connect()
            return real_connect(path, *args, factory=connection_class, **kwargs)

    monkeypatch.setattr(spool_module, "sqlite3", Sqlite())


def _use_or_refuse(path, swap: _Swap) -> SpoolAccessError:
    """Open the spool; it must refuse. If it does not, admit a client's envelope the way the shuffler
    does and fail with what the attacker's files then hold."""
    try:
        spool = SqliteSpool(path)
    except SpoolAccessError as exc:
        return exc
    try:
        spool.open_round(SESSION, 0, b"spec")
        spool.admit(SESSION, 0, AdmittedEnvelope(CLIENT_ID, NONCE, b"sealed" * 8))
        leaked = {name: data.count(CLIENT_ID) for name, data in swap.attacker_files().items()}
    finally:
        spool.close()
    pytest.fail(f"the spool was not refused; the client id then reached the attacker's files: {leaked}")


@pytest.mark.parametrize("existing", [True, False], ids=["existing-spool", "new-spool"])
def test_a_directory_swapped_in_when_wal_is_switched_on_is_refused(tmp_path, monkeypatch, existing):
    """The swap happens when SQLite opens the log by path (the database already opened, and checked),
    and is undone right after: the log SQLite opened is the attacker's, so the spool refuses before it
    writes anything of a client. A spool file already in WAL mode (a restarted shuffler) opens its log
    at ``PRAGMA journal_mode=WAL``; a new one at its first write (the schema)."""
    private = tmp_path / "state"
    path = private / "spool.db"
    if existing:  # the file is in WAL mode, its -wal and -shm deleted at the last close
        SqliteSpool(path).close()
    else:
        private.mkdir(mode=0o700)
    swap = _Swap(tmp_path, private)
    swap.plant("-wal", "-shm")
    swap.link_database()

    def swapped(run, sql, *args):
        if swap.swapped:
            return run(sql, *args)
        swap.swap_in()
        try:
            return run(sql, *args)
        finally:
            swap.swap_back()

    class SwapAtWal(sqlite3.Connection):
        def execute(self, sql, *args):
            if existing and sql.replace(" ", "").upper() == "PRAGMAJOURNAL_MODE=WAL":
                return swapped(super().execute, sql, *args)
            return super().execute(sql, *args)

        def executescript(self, script):
            if not existing and "CREATE TABLE" in script:
                return swapped(super().executescript, script)
            return super().executescript(script)

    _sqlite_that(monkeypatch, SwapAtWal)
    refused = _use_or_refuse(path, swap)
    assert swap.swapped == 1 and "changed while it was opened" in str(refused)
    assert all(CLIENT_ID not in data for data in swap.attacker_files().values())
    if existing:  # nothing was logged into the attacker's file (a new spool's log got its empty tables)
        assert swap.attacker_files().get("spool.db-wal", b"") == b""

    monkeypatch.undo()  # with no one swapping, the same spool opens and works
    spool = SqliteSpool(path)
    try:
        spool.open_round(SESSION, 0, b"spec")
        spool.admit(SESSION, 0, AdmittedEnvelope(CLIENT_ID, NONCE, b"sealed" * 8))
        assert spool.admitted(SESSION, 0)[0].client_id == CLIENT_ID
    finally:
        spool.close()


def test_another_connection_to_the_spool_file_does_not_vouch_for_this_open(tmp_path, monkeypatch):
    """The process already holds the real spool file (another connection to it): a directory swapped in
    at the connect must still be refused, because the check looks only at what this connect opened."""
    private = tmp_path / "state"
    path = private / "spool.db"
    SqliteSpool(path).close()
    other = sqlite3.connect(path, isolation_level=None)  # e.g. an operator's reader, or an earlier connection
    try:
        assert other.execute("SELECT COUNT(*) FROM rounds").fetchone() == (0,)
        swap = _Swap(tmp_path, private)
        swap.plant("")
        _sqlite_that(monkeypatch, before_connect=swap.swap_in)  # not undone: the path checks see the swap
        refused = _use_or_refuse(path, swap)
        assert swap.swapped == 1 and "changed while it was opened" in str(refused)
        assert all(CLIENT_ID not in data for data in swap.attacker_files().values())
    finally:
        other.close()


def test_a_second_connection_in_the_process_is_accepted_when_nothing_is_swapped(tmp_path):
    """SQLite shares one ``-shm`` descriptor among a process's connections to a database: a spool opened
    while another connection holds the file (no new ``-shm`` descriptor) is not refused."""
    path = tmp_path / "state" / "spool.db"
    first = SqliteSpool(path)
    try:
        first.open_round(SESSION, 0, b"spec")
        second = SqliteSpool(path)
        try:
            assert second.round(SESSION, 0).state == "open"
        finally:
            second.close()
    finally:
        first.close()


def test_a_spool_opened_while_another_of_the_same_file_was_closed_is_accepted(tmp_path):
    """SQLite keeps the descriptor of a connection closed while another connection of the process
    holds the same file, and the next connect reuses it instead of opening the file again: no new
    descriptor appears, and the spool (the same file, at the same path) must still open."""
    path = tmp_path / "spool" / "spool.db"
    first = SqliteSpool(path)
    try:
        first.open_round(SESSION, 0, b"signed spec")
        for _ in range(3):
            second = SqliteSpool(path)  # raised SpoolAccessError ("changed while it was opened") before
            try:
                assert second.round(SESSION, 0).state == "open"
            finally:
                second.close()
        third = SqliteSpool(path)
        try:
            third.open_round(SESSION, 1, b"another signed spec")  # it writes the same file
        finally:
            third.close()
        assert first.round(SESSION, 1).state == "open"
    finally:
        first.close()
