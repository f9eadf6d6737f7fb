"""The README's commands that need a broker, run as written (the rest: tests/docs/test_docs_run.py).

``shuffledp up`` runs as printed. A command that names a broker directory (``--broker
broker/``) runs where ``broker/`` is a running broker's directory, as the README says
(made by :class:`shuffledp.deploy.broker.Broker`, on a free port). The services walkthrough runs
as one bash script exactly as printed, background jobs and all, with ``set -e``; it uses
the fixed ports it prints (8883, 9464), so runs of it take turns (a lock file) and a port
some other program holds fails the test with that reason. Whatever a command leaves
running is killed when it ends or times out.
"""

from __future__ import annotations

import fcntl
import re
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from shuffledp.deploy.broker import Broker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
from test_docs_run import commands_of, run_doc_command, workdir  # noqa: E402

pytestmark = pytest.mark.mqtt


def fixed_ports(text: str) -> list[int]:
    """The TCP ports a documented script binds by number (``--port N``, ``--metrics-port N``)."""
    return sorted({int(p) for p in re.findall(r"--(?:metrics-)?port\s+(\d+)", text) if int(p) > 0})


@contextmanager
def ports_held(ports: list[int]):
    """One documented script at a time on these ports (a lock file), and each port free to bind."""
    if not ports:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "shuffledp-docs-fixed-ports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for port in ports:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        s.bind(("127.0.0.1", port))
                    except OSError as exc:
                        pytest.fail(f"port {port}, which the README's commands use as written, is taken ({exc})")
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.mark.parametrize("command", commands_of("mqtt"), ids=lambda c: c.id)
def test_broker_command_runs_as_written(command, tmp_path, mosquitto):
    cwd = workdir(tmp_path)
    named = re.search(r"--broker\s+([\w./-]+/)(?:\s|$)", command.code)
    if named and not command.script:
        # `--broker DIR/`: the directory of a running broker, as `python -m shuffledp.deploy.broker DIR` makes it
        broker = Broker(cwd / named.group(1))
        broker.start()
        try:
            run_doc_command(command, tmp_path, cwd)
        finally:
            broker.close()
        return
    with ports_held(fixed_ports(command.text)):
        done = run_doc_command(command, tmp_path, cwd)
    if command.script:
        # each audit's verdict line: `shuffledp audit[ --quick]: PASSED (seed ...)`
        audits = re.findall(r"^shuffledp audit(?: --quick)?: (PASSED|FAILED) ", done.stdout, re.MULTILINE)
        assert audits and set(audits) == {"PASSED"}, done.stdout[-4000:]
        assert len(audits) == len(re.findall(r"^shuffledp audit\b", command.text, re.MULTILINE)), done.stdout[-4000:]
