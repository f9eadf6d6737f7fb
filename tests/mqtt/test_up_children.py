"""``shuffledp up`` killed with SIGKILL takes its parties and its temporary directory with it.

`up` is started as a real process (real mosquitto, shuffler, client fleet and
analyzer); once all four are running it is killed with SIGKILL, which it cannot
catch. Within a few seconds none of its children may remain, and the temporary
deployment directory it made must be gone. A directory given with ``--dir`` belongs
to the user and stays.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent death signal is Linux-only"),
]

CLI = [sys.executable, "-m", "shuffledp.cli"]
PARTIES = ("broker", "shuffler", "clients", "analyzer")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def _naming(directory: Path) -> list[int]:
    """The running processes whose command line names ``directory`` (what could still act on it:
    the parties, and the reaper `up` starts for a temporary directory, which gets it as argv[1])."""
    wanted = os.fsencode(directory)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        if any(arg == wanted for arg in argv) and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _start_up(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, dict[str, int], Path]:
    """Run `up` until its four parties run; the process, their pids and its directory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(temp)}
    process = subprocess.Popen(
        [*CLI, "up", "--users", "400", "--round-timeout", "120", "--timeout", "300", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )
    pids: dict[str, int] = {}
    directory: Path | None = None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert process.stdout is not None
    while len(pids) < len(PARTIES):
        assert time.monotonic() < deadline, "up did not start its parties:\n" + "".join(lines)
        line = process.stdout.readline()
        assert line, "up ended before starting its parties:\n" + "".join(lines)
        lines.append(line)
        if match := re.match(r"\[up\] deployment directory (.+)$", line.rstrip("\n")):
            directory = Path(match.group(1))
        elif match := re.match(r"\[up\] broker: mosquitto pid (\d+)", line):
            pids["broker"] = int(match.group(1))
        elif match := re.match(r"\[up\] (shuffler|clients|analyzer): pid (\d+)$", line.rstrip("\n")):
            pids[match.group(1)] = int(match.group(2))
    assert directory is not None
    # Keep draining its output so a party never blocks writing to it.
    subprocess.Popen(["cat"], stdin=process.stdout, stdout=subprocess.DEVNULL)
    process.stdout.close()
    return process, pids, directory


def _kill_and_wait(process: subprocess.Popen, pids: dict[str, int], gone: Path | None) -> list[str]:
    assert all(_alive(pid) for pid in pids.values()), pids
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids.values()) and (gone is None or not gone.exists()):
            break
        time.sleep(0.1)
    return [name for name, pid in pids.items() if _alive(pid)]


def _cleanup(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_up_killed_leaves_no_party_and_no_temporary_directory(tmp_path):
    process, pids, directory = _start_up(tmp_path)
    try:
        assert directory.parent == tmp_path / "tmp" and directory.is_dir()
        survivors = _kill_and_wait(process, pids, directory)
        assert survivors == [], f"still running after up was killed: {survivors}"
        assert not directory.exists(), f"temporary directory left behind: {sorted(p.name for p in directory.iterdir())}"
    finally:
        _cleanup(pids)


def test_up_killed_leaves_no_party_and_keeps_the_users_directory(tmp_path):
    mine = tmp_path / "mine"
    process, pids, directory = _start_up(tmp_path, "--dir", str(mine))
    try:
        assert directory == mine
        survivors = _kill_and_wait(process, pids, None)
        assert survivors == [], f"still running after up was killed: {survivors}"
        assert _naming(mine) == []  # no reaper (or anything else) left that could remove it later
        assert mine.is_dir() and (mine / "keys").is_dir()
    finally:
        _cleanup(pids)
