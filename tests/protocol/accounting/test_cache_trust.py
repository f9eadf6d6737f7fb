"""Whoever can write the accounting cache cannot choose the epsilon it returns.

Rows are written as an attacker would: straight into the SQLite file. Modes are checked after
first use, a cache others can write is ignored, and every input of the key (the accountant's
code, the block Hadamard response parameters, the library versions) moves it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from shuffledp.cli import main
from shuffledp.protocol.accounting import binary_rr_guarantee, shuffled_round
from shuffledp.protocol.accounting import cache
from shuffledp.protocol.accounting.shuffle_round import _shuffled_round

from .test_cache import counting


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "private" / "accounting.sqlite"
    monkeypatch.setenv(cache.ENV, str(path))
    return path



def tamper(path: Path, rewrite) -> int:
    """Rewrite the JSON value of every stored row of every table, as anyone able to write the file could."""
    changed = 0
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            if "value" not in columns:
                continue
            for rowid, value in db.execute(f"SELECT rowid, value FROM {table}").fetchall():
                new = rewrite(json.loads(value))
                if new is not None:
                    db.execute(f"UPDATE {table} SET value = ? WHERE rowid = ?", (json.dumps(new), rowid))
                    changed += 1
    return changed


def forge_round(doc: dict):
    """A round answer claiming epsilon = 1e-9, exact (the incident: below the certified floor)."""
    if not (isinstance(doc, dict) and "method" in doc and "candidates" in doc):
        return None
    doc = dict(doc, epsilon=1e-9, lower_bound=1e-9, method="rr-exact")
    doc["candidates"] = dict(doc["candidates"], **{"rr-exact": 1e-9})
    return doc


def test_a_planted_value_is_never_printed(cache_file, capsys):
    argv = ["account", "-e", "1", "-n", "1000", "--mechanism", "binary-rr", "--json", "--no-lower-bound"]
    assert main(argv) == 0
    true = json.loads(capsys.readouterr().out)["round"]
    assert true["epsilon"] > 0.03
    assert tamper(cache_file, forge_round) >= 1
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)["round"]
    assert printed["epsilon"] == true["epsilon"] and printed["method"] == true["method"]
    assert "failed authentication" in captured.err
    # and the library call gives the computed value, not the planted one
    assert shuffled_round(binary_rr_guarantee(1.0), 1000, 1e-6) == _shuffled_round(binary_rr_guarantee(1.0), 1000, 1e-6)


def test_a_forged_or_missing_tag_is_refused_and_replaced(cache_file):
    compute, calls = counting({"epsilon": 0.25})
    assert cache.cached("k", {"n": 3}, compute) == {"epsilon": 0.25}
    key = cache.key_of("k", {"n": 3})
    with sqlite3.connect(cache_file) as db:  # a row the attacker wrote with a tag of their own
        db.execute(f"UPDATE {cache.TABLE} SET value = ?, tag = ? WHERE key = ?",
                   (json.dumps({"epsilon": 1e-9}), "00" * 32, key))
    assert cache.cached("k", {"n": 3}, compute) == {"epsilon": 0.25}
    assert len(calls) == 2
    assert cache.cached("k", {"n": 3}, compute) == {"epsilon": 0.25}  # the recomputed row replaced it
    assert len(calls) == 2
    # a row under another key, tagged with a key the attacker guessed
    other = cache.key_of("k", {"n": 4})
    with sqlite3.connect(cache_file) as db:
        db.execute(f"INSERT INTO {cache.TABLE} VALUES (?, ?, ?, 0)",
                   (other, '{"epsilon": 1e-9}', cache.tag_of(b"\0" * 32, other, '{"epsilon": 1e-9}')))
    assert cache.cached("k", {"n": 4}, compute) == {"epsilon": 0.25}
    assert len(calls) == 3


def test_files_are_private_from_the_start(cache_file):
    old = os.umask(0)  # whatever the umask, the cache's modes are its own
    try:
        compute, _ = counting({"epsilon": 1.0})
        cache.cached("k", {"n": 1}, compute)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(cache_file.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cache.key_path(cache_file)).st_mode) == 0o600
    assert len(cache.key_path(cache_file).read_bytes()) == cache.KEY_BYTES
    for suffix in cache.SIDECARS:
        side = cache_file.with_name(cache_file.name + suffix)
        if side.exists():
            assert stat.S_IMODE(os.stat(side).st_mode) == 0o600


@pytest.mark.parametrize("target", ["directory", "database", "key"])
def test_a_cache_others_can_write_is_not_used(cache_file, capsys, target):
    compute, calls = counting({"epsilon": 0.5})
    cache.cached("k", {"n": 1}, compute)
    path = cache_file.parent if target == "directory" else cache_file if target == "database" else cache.key_path(cache_file)
    os.chmod(path, 0o777 if target == "directory" else 0o666)
    tamper(cache_file, lambda doc: {"epsilon": 1e-9})
    assert cache.cached("k", {"n": 1}, compute) == {"epsilon": 0.5}
    assert cache.cached("k", {"n": 1}, compute) == {"epsilon": 0.5}
    assert len(calls) == 3  # computed afresh each time
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not used" in err[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_cache_owned_by_another_user_is_not_used(cache_file, capsys):
    compute, calls = counting({"epsilon": 0.5})
    cache.cached("k", {"n": 1}, compute)
    os.chown(cache_file, 65534, 65534)
    cache.cached("k", {"n": 1}, compute)
    assert len(calls) == 2
    assert "owned by another user" in capsys.readouterr().err


def test_the_key_moves_with_the_libraries_and_the_shared_parameters(cache_file, monkeypatch):
    import numpy

    compute, calls = counting({"epsilon": 1.0})
    cache.cached("k", {"n": 10}, compute)
    cache.cached("k", {"n": 10}, compute)
    assert len(calls) == 1
    monkeypatch.setattr(numpy, "__version__", numpy.__version__ + "+other")
    cache.cached("k", {"n": 10}, compute)
    assert len(calls) == 2
    monkeypatch.undo()
    monkeypatch.setenv(cache.ENV, str(cache_file))
    import dp_accounting  # noqa: F401  (the version is read from its metadata)

    monkeypatch.setattr(cache, "_dp_accounting_version", lambda: "0.0-other")
    cache.cached("k", {"n": 10}, compute)
    assert len(calls) == 3


def test_the_source_digest_covers_the_block_hadamard_parameters(monkeypatch):
    """``protocol/mechanisms/hadamard_response_params.py`` sets the block count and ``t`` the bounds use: a change to it
    must change the key."""
    before = cache.source_digest()
    real = Path.read_bytes

    def edited(self):
        data = real(self)
        return data + b"\n# edited\n" if self.name == "hadamard_response_params.py" else data

    cache.source_digest.cache_clear()
    monkeypatch.setattr(Path, "read_bytes", edited)
    try:
        assert cache.source_digest() != before
    finally:
        monkeypatch.undo()
        cache.source_digest.cache_clear()
    assert cache.source_digest() == before


def test_a_non_ascii_tag_is_a_failed_authentication_not_a_crash(cache_file):
    compute, calls = counting({"epsilon": 0.5})
    question = {"q": "non-ascii tag"}
    assert cache.cached("test", question, compute) == {"epsilon": 0.5}
    with sqlite3.connect(cache_file) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        table = next(t for t in tables if "tag" in [r[1] for r in db.execute(f"PRAGMA table_info({t})")])
        db.execute(f"UPDATE {table} SET tag = ?", ("é" * 64,))
    assert cache.cached("test", question, compute) == {"epsilon": 0.5}
    assert len(calls) == 2  # recomputed, not returned and not raised


def test_the_cache_never_changes_the_mode_of_a_directory_it_is_named_in(tmp_path, monkeypatch):
    """Pointing the cache at a file in an existing directory of the user's (a project folder,
    $HOME) must not narrow that directory's mode."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    monkeypatch.setenv(cache.ENV, str(home / "accounting.sqlite"))
    compute, _ = counting({"epsilon": 0.25})
    assert cache.cached("test", {"q": "dir mode"}, compute) == {"epsilon": 0.25}
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o755


# --------------------------------------------------------------------------- a directory swapped in after the checks


def _plant_attacker_cache(attacker: Path, question: dict) -> bytes:
    """A cache directory a local attacker prepared: a key they know and a row claiming epsilon = 1e-9
    tagged under it (files that pass the path checks: a regular 0600 file in a 0700 directory of ours,
    as anything of ours moved there would). The planted database's bytes."""
    attacker.mkdir(mode=0o700)
    key = b"\x42" * cache.KEY_BYTES
    fd = os.open(attacker / "accounting.sqlite.key", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, key)
    os.close(fd)
    os.close(os.open(attacker / "accounting.sqlite", os.O_CREAT | os.O_WRONLY, 0o600))
    row_key = cache.key_of("k", question)
    forged = json.dumps({"epsilon": 1e-9})
    with sqlite3.connect(attacker / "accounting.sqlite") as db:
        db.execute(f"CREATE TABLE {cache.TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL, tag TEXT NOT NULL, "
                   "created REAL NOT NULL)")
        db.execute(f"INSERT INTO {cache.TABLE} VALUES (?, ?, ?, 0)", (row_key, forged, cache.tag_of(key, row_key, forged)))
    db.close()
    return (attacker / "accounting.sqlite").read_bytes()


def test_a_directory_swapped_in_after_the_checks_does_not_give_the_key_or_the_answer(cache_file, monkeypatch):
    """A local user who can rename entries of the directory above the cache swaps their own directory in
    after the cache checked its directory and before it opens the key: the cache must go on with the
    directory it checked (or refuse), never read the attacker's key and return their row."""
    question = {"n": 7}
    compute, calls = counting({"epsilon": 0.5})
    assert cache.cached("k", question, compute) == {"epsilon": 0.5}  # the real cache holds the real answer
    private = cache_file.parent
    attacker = private.with_name("attacker")
    planted = _plant_attacker_cache(attacker, question)
    real_open = os.open
    swapped = []

    def open_then_swap(path, flags, *args, **kwargs):
        if not swapped and str(path).endswith(".key") and not flags & os.O_CREAT:  # opening the checked key
            swapped.append(1)
            os.rename(private, private.with_name("private.moved"))
            os.rename(attacker, private)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_then_swap)
    answer = cache.cached("k", question, compute)
    monkeypatch.undo()
    assert swapped
    assert answer == {"epsilon": 0.5}  # not the planted 1e-9
    assert (private / "accounting.sqlite").read_bytes() == planted  # the attacker's file was neither used nor written


def test_a_database_swapped_in_while_sqlite_opens_it_is_refused(cache_file, monkeypatch, capsys):
    """SQLite opens the database by path (it resolves ``/proc/self/fd/...`` back into a path name), so a
    swap in that window is caught afterwards: the file SQLite holds must be the one checked."""
    question = {"n": 8}
    compute, calls = counting({"epsilon": 0.5})
    assert cache.cached("k", question, compute) == {"epsilon": 0.5}
    private = cache_file.parent
    attacker = private.with_name("attacker")
    planted = _plant_attacker_cache(attacker, question)
    real_connect = sqlite3.connect

    class SwappingSqlite:
        """sqlite3, whose open resolves the path the cache passes, then meets the attacker's swap."""

        def __getattr__(self, name):
            return getattr(sqlite3, name)

        swapped = False

        @classmethod
        def connect(cls, path, *args, **kwargs):
            resolved = os.path.realpath(path)
            if not cls.swapped:
                cls.swapped = True
                os.rename(private, private.with_name("private.moved"))
                os.rename(attacker, private)
            return real_connect(resolved, *args, **kwargs)

    monkeypatch.setattr(cache, "sqlite3", SwappingSqlite())
    answer = cache.cached("k", question, compute)
    monkeypatch.undo()
    assert answer == {"epsilon": 0.5} and len(calls) == 2  # computed afresh, not read from either file
    assert (private / "accounting.sqlite").read_bytes() == planted  # nothing written into the attacker's file
    assert "changed while it was opened" in capsys.readouterr().err
