"""``import shuffledp.client`` must not load scipy, aiomqtt or the analyzer (ARCHITECTURE.md)."""

import subprocess
import sys


def test_client_import_is_device_safe():
    code = (
        "import sys, shuffledp.client; "
        "bad = [m for m in ('scipy', 'aiomqtt', 'paho', 'matplotlib', 'dp_accounting', 'shuffledp.analyzer',"
        " 'shuffledp.shuffler', 'shuffledp.protocol.accounting') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"device import pulled in: {out.stdout.strip()}"
