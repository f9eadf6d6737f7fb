"""``shuffledp keys init | enroll``: a deployment's key files.

``shuffledp keys init DIR`` writes a deployment's keys, session id and client credentials
(layout: :mod:`shuffledp.deploy.keys`); ``shuffledp keys enroll DIR --users K`` issues K
more credentials with the issuer key.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shuffledp.cli.common import EXIT_OK, HelpFormatter, add_json_option, deprecated_alias, json_text


def add_parser(subparsers) -> None:
    fmt = HelpFormatter
    keys = subparsers.add_parser(
        "keys", help="create a deployment's key files (analyzer, shuffler, issuer, credentials)",
        description="Create and extend a deployment's key directory (layout: shuffledp/deploy/keys.py docstring).",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    init = keys_sub.add_parser(
        "init", formatter_class=fmt, help="generate all keys, a session id and client credentials",
        description="Generate analyzer keys (X25519 + Ed25519), shuffler keys, the credential issuer key, a "
        "session id and one client credential per user into DIR: analyzer.key, shuffler.key, issuer.key (raw "
        "bytes) and credentials.json, all 0600, and public.json with what devices pin (analyzer signing key, "
        "shuffler keys, session id). Refuses to overwrite existing keys unless --force (which replaces them all).",
    )
    init.add_argument("directory", type=Path, metavar="DIR", help="key directory (created 0700)")
    init.add_argument("--users", "-n", type=int, default=100, help="number of users: client credentials to issue")
    deprecated_alias(init, "--clients", "--users")
    init.add_argument("--force", action="store_true", help="replace existing keys, public.json and credentials.json")
    add_json_option(init, "what was written")
    init.set_defaults(func=_keys_init)
    enroll = keys_sub.add_parser(
        "enroll", formatter_class=fmt, help="issue more client credentials with issuer.key",
        description="The enrollment service's job: issue credentials for --users more users with DIR/issuer.key and "
        "append them to DIR/credentials.json (replaced atomically). Reads issuer.key, public.json and credentials.json.",
    )
    enroll.add_argument("directory", type=Path, metavar="DIR")
    enroll.add_argument("--users", "-n", type=int, required=True, help="number of users: credentials to issue")
    deprecated_alias(enroll, "--count", "--users")
    add_json_option(enroll, "what was issued")
    enroll.set_defaults(func=_keys_enroll)


def _keys_init(args: argparse.Namespace) -> int:
    from shuffledp.deploy.keys import init_keys

    public = init_keys(args.directory, clients=args.users, force=args.force)  # KeyFileError: exit 2 (cli.main)
    if args.json:
        print(json_text({
            "directory": str(args.directory), "session_id": public.session_id.hex(), "users": args.users,
            "files": ["analyzer.key", "shuffler.key", "issuer.key", "credentials.json", "public.json"],
        }, args))
        return EXIT_OK
    print(
        f"wrote {args.directory}: analyzer.key, shuffler.key, issuer.key, credentials.json ({args.users} client "
        f"credential(s)) (0600), public.json; session {public.session_id.hex()}"
    )
    return EXIT_OK


def _keys_enroll(args: argparse.Namespace) -> int:
    from shuffledp.deploy.keys import enroll

    total = enroll(args.directory, args.users)  # KeyFileError: exit 2 (cli.main)
    if args.json:
        print(json_text({"directory": str(args.directory), "issued": args.users, "total": total}, args))
        return EXIT_OK
    print(f"issued {args.users} credential(s); {args.directory}/credentials.json now holds {total}")
    return EXIT_OK
