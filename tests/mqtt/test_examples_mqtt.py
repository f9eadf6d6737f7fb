"""The MQTT examples run as written: a session with the real services, then its audit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def test_mqtt_session_then_audit_deployment(tmp_path):
    session = tmp_path / "session"
    done = subprocess.run([sys.executable, str(EXAMPLES / "mqtt_session.py"), "--dir", str(session), "--users", "300"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "central privacy after shuffling" in done.stdout and (session / "result.json").exists()
    audit = subprocess.run([sys.executable, str(EXAMPLES / "audit_deployment.py"), "--dir", str(session)],
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0, (audit.stdout + audit.stderr)[-3000:]
    assert f"audit of {session}: PASSED" in audit.stdout and "shuffledp audit (claim): PASSED" in audit.stdout
