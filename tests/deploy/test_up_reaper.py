"""The watcher `shuffledp up` starts beside its parties signals only the processes it was told
of: a pid is bound to its process's start time and held as a pidfd, so a pid the kernel has
given to another process since is never signalled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from shuffledp.cli.up import _start_up_reaper, process_start_time

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds and /proc are Linux's")


def _wait_gone(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


async def test_the_watcher_ends_the_parties_it_was_told_of_and_no_other_process(tmp_path):
    base = tmp_path / "deployment"
    base.mkdir(mode=0o700)
    party = subprocess.Popen(["sleep", "60"])
    bystander = subprocess.Popen(["sleep", "60"])  # stands for a process that got a reused pid
    try:
        pipe = await _start_up_reaper(base)
        os.write(pipe, f"{party.pid} ".encode() + process_start_time(party.pid) + b"\n")
        # the bystander's pid with another start time: what the watcher would read had the
        # party behind this pid ended and the kernel handed the pid to the bystander
        wrong = str(int(process_start_time(bystander.pid)) + 1).encode()
        os.write(pipe, f"{bystander.pid} ".encode() + wrong + b"\n")
        os.close(pipe)  # `up` died without saying "done"
        assert _wait_gone(party, 10), "the party was not ended"
        time.sleep(0.3)
        assert bystander.poll() is None, "a process the watcher was not told of was signalled"
        deadline = time.monotonic() + 10
        while base.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not base.exists()
    finally:
        for p in (party, bystander):
            p.kill()
            p.wait()


async def test_after_done_the_watcher_signals_nothing(tmp_path):
    base = tmp_path / "deployment"
    base.mkdir(mode=0o700)
    party = subprocess.Popen(["sleep", "60"])
    try:
        pipe = await _start_up_reaper(base)
        os.write(pipe, f"{party.pid} ".encode() + process_start_time(party.pid) + b"\ndone\n")
        os.close(pipe)
        time.sleep(0.5)
        assert party.poll() is None and base.exists()
    finally:
        party.kill()
        party.wait()
