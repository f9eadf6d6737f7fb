"""Audit a deployment: its claimed privacy, recomputed from what it signed, and the shuffler's mechanics.

The third user story: someone auditing a shuffled deployment. Given a session directory
(``examples/mqtt_session.py`` or ``shuffledp up --dir DIR``):

1. **The claim** (``shuffledp audit --part claim``): every round of ``DIR/result.json`` is
   checked against its *signed* spec (with the analyzer key from ``DIR/keys/public.json``,
   never the one the file names), accounted at the batch sizes the shuffler delivered,
   composed into the session's (eps, delta), and the Hadamard range round gets an
   empirical lower bound beside its claim;
2. **The mechanics** (``shuffledp audit --part mechanics``): a shuffler is run against
   real and hostile clients and checked for uniform output positions, one length per
   round, nothing but sealed reports reaching the analyzer, the minimum batch, quotas and
   replays. To audit the shuffler *process* of a live deployment instead, run
   ``shuffledp audit --part mechanics --broker BROKER --keys KEYS --shuffler-service``.

Without ``--dir`` (or with a new or empty one) it first runs a session with
``examples/mqtt_session.py`` (needs mosquitto) and audits that. Exit status 0 if both pass::

    python examples/audit_deployment.py                       # a new session in a temporary directory, audited
    python examples/audit_deployment.py --dir /tmp/session    # the session kept there (runs one if it is empty)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from shuffledp.cli.audit import format_audit, run_audit

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None,
                        help="a session directory (run one there if new or empty); default: a new temporary one")
    parser.add_argument("--users", type=int, default=2000, help="users of the session run when DIR is empty")
    args = parser.parse_args(argv)
    if args.dir is None or not (args.dir / "result.json").exists():
        from shuffledp.size_cap import capped, note

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mqtt_session import new_directory, run_session

        users = capped(args.users)  # SHUFFLEDP_SIZE_CAP (README, testing)
        note([f"--users {args.users} -> {users}"] if users != args.users else [], "audit_deployment.py")
        if args.dir is None:
            args.dir = new_directory()
        print(f"running a session in {args.dir} ({users:,} users) to audit", flush=True)
        run_session(args.dir, users)
    claim = run_audit(True, "claim", 1e-6, 0, session=str(args.dir / "result.json"), keys=str(args.dir / "keys"))
    print(format_audit(claim))
    mechanics = run_audit(True, "mechanics", 1e-6, 0)
    print(format_audit(mechanics))
    passed = claim["passed"] and mechanics["passed"]
    print(f"\naudit of {args.dir}: {'PASSED' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
