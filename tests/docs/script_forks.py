"""Run Python scripts as ``python SCRIPT ARGS...`` runs them, each in a fresh fork of one interpreter
that has imported the slow modules once.

Started as ``python script_forks.py MODULE...``: imports every MODULE, then reads requests, one JSON
object a line on stdin (``script``, ``args``, ``cwd``, ``env``, ``stdout``, ``stderr``: file paths,
``timeout``: seconds). For each it forks a child that becomes the script's process: a process group
of its own, the request's working directory and environment (the inherited one replaced), stdin
from ``/dev/null``, stdout and stderr to the given files, ``sys.argv = [script, *args]`` and
``sys.path[0]`` the script's folder, then ``runpy.run_path(script, run_name="__main__")``. The child
then leaves through the interpreter's own exit, as the script's process would: non-daemon threads
joined, ``atexit`` handlers run, an uncaught exception printed with status 1, ``SystemExit`` with
the status the script gives.

The runner waits for the child (on its pidfd; past ``timeout`` seconds, or if the runner is
interrupted, the child's process group is killed) and answers one JSON line: ``status`` (as
:mod:`subprocess` reports it: negative for a signal), ``cpu_seconds`` (user + system of the child
and of the processes it waited for) and ``timed_out``. A child shares nothing with the runner or
another child but the modules imported before the fork: what it saves is the interpreter's start
and those imports, about a second a script.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import sys
import threading


def _become_script(request: dict) -> None:
    """In the child: take the script's process state, then run the script as ``__main__``."""
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    script = request["script"]
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


def _wait(pid: int, timeout: float) -> dict:
    """Wait for the child ``pid``; its status and CPU time. Its process group is killed past ``timeout``,
    or if the runner is interrupted while it waits (Ctrl-C reaches the runner, not the child's group)."""
    ended = False
    try:
        pidfd = os.pidfd_open(pid)
        try:
            ended = bool(select.select([pidfd], [], [], timeout)[0])
        finally:
            os.close(pidfd)
    finally:
        if not ended:
            os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    return {"status": os.waitstatus_to_exitcode(status), "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "timed_out": not ended}


def main(modules: list[str]) -> None:
    for name in modules:
        __import__(name)
    if threading.active_count() != 1:  # a fork copies only the forking thread: a child could deadlock
        raise SystemExit(f"importing {modules} started threads: cannot fork safely")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_script(request)
            sys.exit(0)  # the script returned: the interpreter's normal exit
        os.setpgid(pid, pid)  # as the child does: its group exists before any kill
        print(json.dumps(_wait(pid, float(request["timeout"]))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
