"""Fixtures for the tests of the JavaScript device client (``js/``, the npm package
``@shuffledp/client``) against the Python parties.

``js_package`` is the package's folder with its dependencies installed from the committed
lock file (``npm ci``) and its TypeScript compiled (``dist/``). ``scripts/test.sh`` does both
before pytest starts; the fixture does them only where they are missing (a plain ``pytest``
run), under a file lock so that parallel test processes build once. Node is required: a
missing ``node`` is a failure, not a skip (set SHUFFLEDP_SKIP_JS=1 to skip these tests on a
machine without Node).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "js"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("SHUFFLEDP_SKIP_JS") == "1":
            pytest.skip("no node on PATH and SHUFFLEDP_SKIP_JS=1")
        pytest.fail("node (>= 20) is needed for the JavaScript client's tests; or set SHUFFLEDP_SKIP_JS=1")
    return node


def build_js_package() -> Path:
    """``npm ci`` where ``node_modules`` is missing and ``tsc`` where ``dist`` is older than a source."""
    _node()
    lock = JS / ".build.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if not (JS / "node_modules").is_dir():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, capture_output=True)
        sources = list((JS / "src").rglob("*.ts"))
        newest = max(path.stat().st_mtime for path in sources)
        built = JS / "dist" / "index.js"
        if not built.exists() or built.stat().st_mtime < newest:
            result = subprocess.run(["npx", "tsc", "-p", "tsconfig.json"], cwd=JS, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.fail(f"the JavaScript client does not compile:\n{result.stdout}\n{result.stderr}")
            built.touch()
    return JS


@pytest.fixture(scope="session")
def js_package() -> Path:
    """The compiled JavaScript package folder (``js/``)."""
    return build_js_package()


def run_node(script: str | Path, *args: str, input: bytes | None = None, timeout: float = 600) -> bytes:
    """Run a Node script (an ES module) with ``args``; its stdout, or a failure that shows its stderr."""
    result = subprocess.run(
        [_node(), str(script), *args], cwd=JS, input=input, capture_output=True, timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(f"node {script} exited {result.returncode}:\n{result.stderr.decode(errors='replace')}")
    return result.stdout


def run_node_json(script: str | Path, request: object, timeout: float = 600) -> object:
    """Send ``request`` as JSON on stdin to a Node script and read its JSON answer from stdout."""
    return json.loads(run_node(script, input=json.dumps(request).encode(), timeout=timeout))


@pytest.fixture
def processes():
    """Processes a test starts (append them); any still running at the end is resumed (it may have
    been paused with SIGSTOP) and killed, by its own pid."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(10)
