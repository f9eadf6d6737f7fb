"""Shared fixtures: a real mosquitto broker for the MQTT tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory) -> str:
    """Start a private mosquitto on a free loopback port; yields ``"127.0.0.1:PORT"``.

    The MQTT tests are part of the suite: a missing broker is a failure, not a skip
    (``.ci/run`` installs mosquitto). Set SHUFFLEDP_SKIP_MQTT=1 to skip them on a
    machine without one.
    """
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if binary is None:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip("mosquitto not installed and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail("mosquitto is not installed (apt-get install mosquitto), or set SHUFFLEDP_SKIP_MQTT=1")
    port = _free_port()
    conf = tmp_path_factory.mktemp("mosquitto") / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                proc.kill()
                pytest.fail(f"mosquitto did not start on port {port}: {out}")
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
