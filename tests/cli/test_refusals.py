"""Refused before any work: user counts that cannot fit in memory, output paths that cannot be written.

Each refusal is one line on stderr, ``shuffledp <command>: <option>: ...``, exit status 2, and
nothing else: no progress line (no work began), no traceback (``shuffledp/cli/preflight.py``).
"""

from __future__ import annotations

import argparse

import pytest

from shuffledp.cli import main
from shuffledp.cli import preflight
from shuffledp.cli.common import UsageError

HUGE = str(10**15)

#: Every command that takes a user count, with what else it needs to parse.
USER_COUNT_COMMANDS = [
    ["simulate", "--fast"],
    ["simulate", "--messages"],
    ["simulate", "--fast", "--protocol", "vector-sum"],
    ["simulate", "--fast", "--protocol", "instance-optimal"],
    ["simulate", "--fast", "--protocol", "vector-mean"],
    ["vector", "--fast"],
    ["vector", "--messages"],
    ["distribution", "--fast"],
    ["distribution", "--messages"],
    ["up"],
    ["keys", "init", "{tmp}/keys"],
    ["keys", "enroll", "{tmp}/keys"],
    ["clients", "run", "--keys", "{tmp}/keys", "--broker", "127.0.0.1:9"],
    ["analyzer", "run", "--keys", "{tmp}/keys", "--broker", "127.0.0.1:9"],
]


def _one_line(capsys, prefix: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and captured.out == "", captured
    return lines[0]


@pytest.mark.parametrize("argv", USER_COUNT_COMMANDS, ids=[" ".join(a) for a in USER_COUNT_COMMANDS])
def test_a_user_count_beyond_memory_is_refused_at_once_naming_the_bound(argv, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    command = " ".join(argv[:2]) if argv[0] in ("keys", "clients", "analyzer") else argv[0]
    assert main([*argv, "--users", HUGE]) == 2
    line = _one_line(capsys, f"shuffledp {command}: --users: {int(HUGE):,} users need at least ")
    assert "B per user" in line and "at most " in line
    assert not (tmp_path / "keys").exists()  # keys init made nothing


def test_a_sweep_is_checked_at_its_largest_user_count(capsys):
    assert main(["vector", "--fast", "--sweep", f"100,{HUGE}"]) == 2
    _one_line(capsys, f"shuffledp vector: --users: {int(HUGE):,} users")


@pytest.mark.parametrize("argv", [
    ["simulate", "--fast"], ["simulate", "--messages"], ["vector", "--fast"], ["distribution", "--fast"],
    ["keys", "init", "DIR"], ["clients", "run", "--keys", "k", "--broker", "b"], ["analyzer", "run", "--keys", "k", "--broker", "b"],
    ["up"],
])
def test_the_bound_is_the_memory_over_the_bytes_per_user(argv, monkeypatch):
    """At a limit of 64 MiB, the largest count accepted is ``limit // bytes_per_user``, one more is refused."""
    from shuffledp.cli import build_parser

    limit = 64 << 20
    monkeypatch.setattr(preflight, "memory_limit", lambda: limit)
    args = build_parser(argv).parse_args([*argv, "--users", "1"])
    each, _ = preflight.bytes_per_user(args)
    assert each > 0
    largest = int(limit // each)
    args.users = largest
    preflight.check_memory(args)
    args.users = largest + 1
    with pytest.raises(UsageError, match=f"at most {largest:,} users"):
        preflight.check_memory(args)


def test_account_allocates_nothing_per_user():
    """``account`` evaluates closed forms and a PLD in n: an astronomical batch is not refused for memory."""
    assert preflight.bytes_per_user(argparse.Namespace(command="account", users=10**18)) is None


def test_memory_limit_is_at_most_the_physical_memory():
    import os

    assert 0 < preflight.memory_limit() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


#: (arguments, the output option) for every command that writes a file it is given.
OUTPUTS = [
    (["simulate", "--fast", "-n", "1000"], "--plot"),
    (["vector", "--fast", "-n", "1000"], "--plot"),
    (["vector", "--fast", "-n", "1000"], "--output"),
    (["distribution", "--fast", "-n", "1000"], "--plot"),
    (["account", "-e", "1", "-n", "1000"], "--plot"),
    (["audit", "--quick"], "--plot"),
    (["clients", "run", "--keys", "k", "--broker", "127.0.0.1:9", "-n", "4"], "--output"),
    (["analyzer", "run", "--keys", "k", "--broker", "127.0.0.1:9", "-n", "4"], "--output"),
    (["shuffler", "serve", "--keys", "k", "--broker", "127.0.0.1:9", "--spool", "s"], "--stats-file"),
]


@pytest.mark.parametrize(("argv", "option"), OUTPUTS, ids=[f"{a[0]} {o}" for a, o in OUTPUTS])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_run(argv, option, tmp_path, capsys):
    command = " ".join(argv[:2]) if argv[0] in ("clients", "analyzer", "shuffler") else argv[0]
    missing = tmp_path / "no" / "such" / "dir" / "x.png"
    assert main([*argv, option, str(missing)]) == 2
    assert "is not a directory" in _one_line(capsys, f"shuffledp {command}: {option}: cannot write {missing}")
    assert main([*argv, option, str(tmp_path)]) == 2
    _one_line(capsys, f"shuffledp {command}: {option}: {tmp_path} is a directory")


def test_a_plot_type_matplotlib_cannot_write_is_refused_before_the_run(tmp_path, capsys):
    assert main(["simulate", "--fast", "-n", "1000", "--plot", str(tmp_path / "x.nosuchtype")]) == 2
    assert ".png" in _one_line(capsys, "shuffledp simulate: --plot: cannot draw ")


def test_a_read_only_directory_is_refused(tmp_path, capsys):
    import os

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere: nothing to refuse
        pytest.skip("running as root: a read-only directory is writable")
    assert main(["vector", "--fast", "-n", "1000", "--output", str(locked / "r.json")]) == 2
    _one_line(capsys, f"shuffledp vector: --output: cannot write {locked / 'r.json'}: no write permission")
