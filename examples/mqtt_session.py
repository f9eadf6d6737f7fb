"""A session over MQTT with the real services, each its own process.

``shuffledp up`` does every step of a deployment and stops everything at the end:

1. ``shuffledp keys init DIR/keys --users N``: the analyzer's, shuffler's and issuer's
   keys (0600), N enrolled client credentials, and ``public.json`` (what devices pin);
2. a mosquitto broker (``shuffledp.deploy.broker``): TLS, one password per role, an ACL that lets
   each role publish and read only its own topics;
3. ``shuffledp shuffler serve`` (durable SQLite spool), ``shuffledp clients run`` (a fleet
   of N simulated devices) and ``shuffledp analyzer run`` (announces the rounds, opens the
   batches, writes ``result.json`` with every round's signed spec and batch sizes).

This script runs it in a directory it keeps (a new temporary one unless ``--dir`` names
a new or empty one), then reads what the analyzer wrote::

    python examples/mqtt_session.py                                  # 2,000 users
    python examples/mqtt_session.py --dir /tmp/session --users 300

Needs mosquitto (``apt-get install mosquitto``). Audit the result with
``examples/audit_deployment.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from shuffledp.cli.common import deprecated_alias
from shuffledp.size_cap import capped, note


def new_directory() -> Path:
    """A new temporary deployment directory (kept: it is the session's record)."""
    return Path(tempfile.mkdtemp(prefix="shuffledp-session-"))


def run_session(directory: Path, users: int, epsilon: float = 1.0) -> dict:
    """Run one deployment in ``directory`` (new or empty) and return the analyzer's result."""
    command = [sys.executable, "-m", "shuffledp.cli", "up", "--users", str(users), "--epsilon0", str(epsilon),
               "--dir", str(directory)]
    subprocess.run(command, check=True)
    return json.loads((directory / "result.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None,
                        help="deployment directory (new or empty; kept); default: a new temporary one")
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--epsilon0", "-e", type=float, default=1.0, help="local budget eps0 of each user")
    deprecated_alias(parser, "--epsilon", "--epsilon0")  # the shuffledp commands' spelling (docs/cli.md)
    args = parser.parse_args(argv)
    users = capped(args.users)  # SHUFFLEDP_SIZE_CAP (README, testing)
    note([f"--users {args.users} -> {users}"] if users != args.users else [], "mqtt_session.py")
    if args.dir is None:
        args.dir = new_directory()
    print(f"deployment directory {args.dir}", flush=True)
    result = run_session(args.dir, users, args.epsilon0)
    print()
    print(f"session {result['session_id']}: estimate {result['estimate']:.4f} "
          f"(standard error {result['standard_error']:.4f}) from {result['reports']:,} reports")
    for r in result["rounds"]:
        print(f"  round {r['round_id']}: {r['mechanism']}, eps0 {r['epsilon0']:g}, batches {r['batch_sizes']}, "
              f"signed spec {len(r['signed_spec']) // 2} bytes")
    central = result["central"]
    print(f"  central privacy after shuffling: eps = {central['epsilon']:.4g} at delta = {central['delta']:.2g}")
    print(f"  range check: {result['range_check']['status']}")
    print(f"kept {args.dir}: keys/, broker/, spool/, result.json (audit it: examples/audit_deployment.py --dir {args.dir})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
