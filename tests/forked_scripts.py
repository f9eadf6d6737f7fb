"""Test support: the client of ``tests/docs/script_forks.py``, which runs Python scripts each in a fresh
fork of one interpreter that has imported the slow modules once.

:class:`ScriptForks` starts the runner (one per test process; scripts run one at a time) and runs
``python SCRIPT ARGS`` through it: the script's own process, working directory, environment,
standard streams, process group and exit, sharing only the preloaded modules. Where the runner
cannot work (no ``os.fork`` or ``os.pidfd_open``: not Linux), each script is started afresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The runner script.
RUNNER = Path(__file__).resolve().parent / "docs" / "script_forks.py"


@dataclasses.dataclass
class ForkedRun:
    """What a script's run left: its exit status, standard streams, and whether it ran past the timeout."""

    status: int
    stdout: str
    stderr: str
    timed_out: bool


class ScriptForks:
    """The runner, started with ``preload`` imported, in ``cwd``, with ``env`` (also every script's
    environment); its own errors (a failed import) go to ``stderr_path``."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], stderr_path: Path, cwd: Path) -> None:
        self.env = env
        self.stderr_path = stderr_path
        self.process: subprocess.Popen | None = None
        if hasattr(os, "fork") and hasattr(os, "pidfd_open"):
            with stderr_path.open("w") as stderr:
                self.process = subprocess.Popen([sys.executable, str(RUNNER), *preload], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)

    def run(self, script: Path, args: list[str], cwd: Path, timeout: float) -> ForkedRun:
        """``python SCRIPT ARGS`` in ``cwd``, as a fresh fork of the runner; killed past ``timeout`` seconds."""
        if self.process is None:
            return self._run_afresh(script, args, cwd, timeout)
        with tempfile.TemporaryDirectory(prefix="script-forks-") as logs:
            stdout, stderr = Path(logs) / "stdout", Path(logs) / "stderr"
            request = {"script": str(script), "args": args, "cwd": str(cwd), "env": self.env,
                       "stdout": str(stdout), "stderr": str(stderr), "timeout": timeout}
            answer = ""
            if self.process.poll() is None:
                assert self.process.stdin is not None and self.process.stdout is not None
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
                answer = self.process.stdout.readline()
            assert answer, f"the script runner ended ({self.process.wait()}): {self.stderr_path.read_text()[-3000:]}"
            result = json.loads(answer)
            return ForkedRun(result["status"], stdout.read_text(errors="replace"), stderr.read_text(errors="replace"),
                             result["timed_out"])

    def _run_afresh(self, script: Path, args: list[str], cwd: Path, timeout: float) -> ForkedRun:
        try:
            proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=self.env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return ForkedRun(-9, str(exc.stdout or ""), str(exc.stderr or ""), True)
        return ForkedRun(proc.returncode, proc.stdout, proc.stderr, False)

    def close(self) -> None:
        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=60)
