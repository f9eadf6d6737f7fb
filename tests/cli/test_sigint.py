"""Ctrl-C in the middle of each long-running command: exit status 130 and one line on stderr.

Each command runs as a real process, started as a shell starts one (SIGINT unblocked and at its
default, in a process group of its own), at a size it cannot finish in the time the test takes.
Once a line proves it is mid-run (its first progress line, or a service's first attempt to
reach its broker), SIGINT goes to its whole process group, as a terminal sends it: the message
engine's worker processes get it too. What stderr shows after the signal must be the command's
one line, ``shuffledp <command>: interrupted``, and nothing else but progress lines the command
had already under way when the signal came (a progress line and the signal cross; the test
cannot tell them apart, so it admits them, and only them). No traceback, from the command or
any of its workers.

The waits are on those lines; the time limits only turn a hang into a failure.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

#: A progress line of ``shuffledp.progress`` (stage: count[/total unit (share)][, ETA]), its
#: estimate line, or a service's log line (``HH:MM:SS logger: ...``).
PROGRESS = re.compile(r"^(.+: [\d,]+(%|/[\d,]+ [\w-]+ \(\d+%\)| [\w-]+)?(, ETA \d+ s)?|this run takes about .+"
                      r"|\d\d:\d\d:\d\d shuffledp[.\w]*: .+)$")
#: Seconds to wait for the mid-run line, and then for the exit: failure detection only.
LIMIT = 120


def _as_from_a_terminal() -> None:
    """In the child before exec: SIGINT unblocked and at its default, as a shell starts a command
    (a test worker's mask and dispositions would otherwise be inherited across exec)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _lines(stream, name: str, sink: queue.Queue) -> None:
    for line in stream:
        sink.put((name, line.rstrip("\n")))
    sink.put((name, None))


def interrupt_mid_run(argv: list[str], mid_run: re.Pattern, *, stream: str = "stderr",
                      cwd: Path | None = None) -> tuple[int, list[str], list[str]]:
    """Run ``shuffledp ARGV``; once a line of ``stream`` matches ``mid_run``, send SIGINT to its
    process group. Returns the exit status, the stderr lines before the signal and those after."""
    env = {k: v for k, v in os.environ.items() if k != "SHUFFLEDP_SIZE_CAP"}
    proc = subprocess.Popen([sys.executable, "-m", "shuffledp.cli", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    sink: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_lines, args=(getattr(proc, name), name, sink), daemon=True)
               for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    before: list[str] = []
    after: list[str] = []
    ended = 0
    try:
        deadline = time.monotonic() + LIMIT
        signalled = False
        while not signalled:
            name, line = sink.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                ended += 1
                assert ended < 2, f"{argv} ended before a line matched {mid_run.pattern}:\n" + "\n".join(before)
                continue
            if name == "stderr":
                before.append(line)
            if name == stream and mid_run.search(line):
                os.killpg(proc.pid, signal.SIGINT)
                signalled = True
        while ended < 2:
            name, line = sink.get(timeout=LIMIT)
            if line is None:
                ended += 1
            elif name == "stderr":
                after.append(line)
        return proc.wait(timeout=LIMIT), before, after
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_one_line(command: str, status: int, before: list[str], after: list[str]) -> None:
    expected = f"shuffledp {command}: interrupted"
    others = [line for line in after if not PROGRESS.match(line)]
    shown = "\n".join(["--- before the signal:", *before[-5:], "--- after:", *after])
    assert status == 130, shown
    assert others == [expected] and after[-1] == expected, shown
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in after), shown


PROGRESS_LINE = re.compile(r": [\d,]+")

#: (command, arguments, the line that proves it is mid-run). Sizes that take minutes to finish:
#: each run is stopped at its first progress line, so what it costs is its start.
COMMANDS = [
    ("simulate", ["simulate", "--fast", "-n", "20000000"], PROGRESS_LINE),
    # 20,000 users: the message engine seals on worker processes (more than 4,096 users, 2 CPUs or more)
    ("simulate", ["simulate", "--messages", "-n", "20000"], re.compile(r"^sealed users: ")),
    ("vector", ["vector", "--fast", "-n", "20000000", "-d", "16"], PROGRESS_LINE),
    ("distribution", ["distribution", "--fast", "-n", "1000000", "-m", "10000"], PROGRESS_LINE),
    ("audit", ["audit", "--quick", "--json"], PROGRESS_LINE),
]


@pytest.mark.parametrize(("command", "argv", "mid_run"), COMMANDS, ids=[" ".join(c[1][:2]) for c in COMMANDS])
def test_ctrl_c_mid_run_is_one_line_and_status_130(command, argv, mid_run):
    assert_one_line(command, *interrupt_mid_run(argv, mid_run))


#: A service still trying its first connection (to a port nothing listens on) is mid-run.
RETRYING = re.compile(r"cannot connect to the MQTT broker .* trying again")


@pytest.mark.parametrize("service", ["analyzer run", "clients run", "shuffler serve"])
def test_ctrl_c_while_a_service_connects_is_one_line_and_status_130(service, tmp_path):
    from shuffledp.deploy.keys import init_keys

    init_keys(tmp_path / "keys", clients=4)
    spool = tmp_path / "private"
    spool.mkdir(mode=0o700)
    options = {"analyzer run": ["-n", "4"], "clients run": ["-n", "4"], "shuffler serve": ["--spool", str(spool / "spool")]}
    argv = [*service.split(), "--keys", str(tmp_path / "keys"), "--broker", "127.0.0.1:9", "--connect-retry", "600",
            *options[service]]
    assert_one_line(service, *interrupt_mid_run(argv, RETRYING))


@pytest.mark.mqtt
def test_ctrl_c_during_up_is_one_line_and_status_130():
    """`up` writes its transcript on stdout (without --json) and, stopped, the one line on stderr."""
    status, before, after = interrupt_mid_run(["up", "--users", "400", "--round-timeout", "120"],
                                              re.compile(r"^\[up\] analyzer: pid \d+"), stream="stdout")
    assert_one_line("up", status, before, after)


def test_another_sigint_while_a_stopped_command_winds_down_exits_130_without_a_traceback():
    """After the one line, a second Ctrl-C (or a SIGINT delivered late) during the clean-up ends the
    process at once with status 130: without this it raised KeyboardInterrupt mid-clean-up (a
    traceback, or death by the signal at interpreter exit)."""
    code = ("import os, signal, time\n"
            "from shuffledp.cli.common import interrupted\n"
            "status = interrupted('audit')\n"
            "os.kill(os.getpid(), signal.SIGINT)  # arrives while the command winds down\n"
            "time.sleep(30)\n"
            "raise SystemExit(status)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT,
                          preexec_fn=_as_from_a_terminal)
    assert done.returncode == 130 and done.stderr.splitlines() == ["shuffledp audit: interrupted"], done.stderr


def test_an_interrupt_that_crossed_a_library_s_embedded_python_still_exits_130_under_python_m(tmp_path):
    """A ``KeyboardInterrupt`` that leaves code run through CPython's ``PyRun_*`` API sets a process-wide
    flag, and ``python -m`` then ends the process by SIGINT (status -2) even though the command caught
    the interrupt and returned 130: seen in ``audit --quick`` under load. ``console_main`` clears it."""
    (tmp_path / "stopped_command.py").write_text(
        "import ctypes, sys\n"
        "import shuffledp.cli as cli\n"
        "from shuffledp.cli.common import interrupted\n"
        "def main(argv=None):\n"
        "    ctypes.pythonapi.PyRun_SimpleString(b'raise KeyboardInterrupt')  # a library's embedded code, interrupted\n"
        "    return interrupted('audit')\n"
        "cli.main = main\n"
        "sys.exit(cli.console_main())\n")
    done = subprocess.run([sys.executable, "-m", "stopped_command"], capture_output=True, text=True, timeout=LIMIT,
                          cwd=tmp_path, preexec_fn=_as_from_a_terminal)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1] == "shuffledp audit: interrupted"
