"""The parties as deployable services: ``shuffledp keys | shuffler | analyzer | clients | up``.

Each party runs as its own process with its own key files (:mod:`shuffledp.deploy.keys`)
and its own broker account, and talks to the others only through the MQTT broker
(TLS verified against ``--ca-file``, password from ``--password-file``, never on
the command line):

* ``shuffledp keys init DIR`` writes a deployment's keys, session id and client
  credentials; ``shuffledp keys enroll DIR --count K`` issues more credentials.
* ``shuffledp shuffler serve`` runs :class:`~shuffledp.shuffler.service.Shuffler`
  on a file-backed :class:`~shuffledp.shuffler.spool.SqliteSpool`: killed (even with
  ``kill -9``) and restarted on the same spool, it resumes open rounds with every
  admitted envelope, re-publishes unacknowledged batches, and never re-opens a
  released round. It logs one line per round outcome and a periodic stats line,
  writes :meth:`Shuffler.stats` as JSON (atomically: temporary file, then rename) to
  ``--stats-file``, and serves Prometheus metrics (:mod:`shuffledp.shuffler.metrics`).
  SIGTERM or SIGINT stops it cleanly: final stats written, spool closed, exit 0.
* ``shuffledp analyzer run`` runs :meth:`Coordinator.scalar_mean` over the broker
  and prints the estimate with per-round statistics; any failure (e.g. a batch
  below ``min_batch``) is one line on stderr and exit status 1.
* ``shuffledp clients run`` runs a simulated fleet (:class:`~shuffledp.deploy.fleet.Fleet`)
  whose devices use the credentials enrolled in ``DIR/credentials.json`` (never
  ``issuer.key``: devices cannot mint credentials), pin the analyzer's signing key
  and the shuffler's signing key from ``public.json``, and retransmit envelopes the
  shuffler has not acknowledged. Each device draws its noise from the OS CSPRNG, unless
  ``--seed`` makes the fleet a reproducible simulation (the data and draws of
  ``shuffledp simulate --seed``).
* ``shuffledp up`` runs the whole deployment on one machine: keys, a real
  mosquitto (:class:`~shuffledp.deploy.broker.Broker`: TLS, passwords, ACL by role), then
  the shuffler, the fleet and the analyzer as separate OS processes
  (``python -m shuffledp.cli ...``); it relays their output, prints the estimate,
  stops everything, and exits 0 only if every party succeeded. With ``--seed S`` the
  estimate is exactly that of ``shuffledp simulate --seed S`` with the same parameters.

Exit statuses: 0 success, 1 the service failed (transport, protocol, a round
failed), 2 bad usage or configuration (arguments, key files, password file).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

#: Exit statuses (see the module docstring).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: How long the analyzer listens for a retained spec showing its session already ran.
SESSION_CHECK_SECONDS = 0.5
#: Users ``shuffledp up`` simulates by default: about 20 s on 2 cores (a device seals ~1 ms per round).
UP_DEFAULT_USERS = 8000


class UsageError(Exception):
    """Bad arguments or configuration: printed as one line, exit status 2."""


# --------------------------------------------------------------------------- shared helpers


def parse_address(address: str, default_port: int) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[V6]:PORT`` as ``(host, port)``; :class:`UsageError` otherwise."""
    host, port = address, str(default_port)
    if address.startswith("["):
        close = address.find("]")
        if close < 0 or (close + 1 < len(address) and address[close + 1] != ":"):
            raise UsageError(f"--broker: bad address {address!r}")
        host, rest = address[1:close], address[close + 2 :]
        port = rest or port
    elif address.count(":") == 1:
        host, port = address.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--broker: must be HOST[:PORT], got {address!r}")
    return host, int(port)


def read_password(path: Path | None) -> str | None:
    """The password in ``path`` (its first line, without the line ending), or None without a file.

    Refuses (:class:`UsageError`, one line) a file another user owns (root aside) or that
    group or others can access (mode & 0o077): the password is a secret like a private key.
    """
    import stat

    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"--password-file: cannot read {path} ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"--password-file: {path} is not a regular file")
        if info.st_uid not in (os.geteuid(), 0):
            raise UsageError(f"--password-file: {path} is owned by uid {info.st_uid}, not by this user "
                             f"(uid {os.geteuid()}); use a file of your own, chmod 600")
        if mode & 0o077:
            raise UsageError(f"--password-file: {path} is accessible by others (mode {mode:04o}); run chmod 600 {path}")
        try:
            text = handle.read(1 << 16).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--password-file: cannot read {path} ({exc})") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise UsageError(f"--password-file: {path} is empty")
    return password


def _add_broker_options(p: argparse.ArgumentParser, role: str) -> None:
    group = p.add_argument_group("broker", f"how this {role} reaches the MQTT broker")
    group.add_argument("--broker", required=True, metavar="HOST[:PORT]",
                       help="the broker's address (port default: 8883 with --ca-file, else 1883)")
    group.add_argument("--username", default=None, help=f"broker account (a {role}-role user of the broker's ACL)")
    group.add_argument("--password-file", type=Path, default=None, metavar="FILE",
                       help="file holding the account's password on its first line (keep it 0600)")
    group.add_argument("--ca-file", type=Path, default=None, metavar="PEM",
                       help="CA certificate to verify the broker's TLS certificate and name against (TLS 1.2+); "
                       "without it the connection is plaintext")
    group.add_argument("--insecure-plaintext", action="store_true",
                       help="allow --password-file without --ca-file to a broker that is not on this host (loopback): "
                       "the password, and every message (specs, reports, batches, acks), then cross the network "
                       "unencrypted, and the broker is not authenticated")


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback: ``localhost``, 127.0.0.0/8 or ::1."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _channel(args: argparse.Namespace, role: str):
    """An unconnected MqttChannel for ``args``' broker options."""
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel

    host, port = parse_address(args.broker, 8883 if args.ca_file else 1883)
    if args.ca_file is not None and not Path(args.ca_file).is_file():
        raise UsageError(f"--ca-file: {args.ca_file} is not a file")
    if (args.password_file is not None and args.ca_file is None and not getattr(args, "insecure_plaintext", False)
            and not _is_loopback(host)):
        raise UsageError(f"--password-file without --ca-file would send the password in clear to {host}; "
                         f"add --ca-file PEM (TLS), or --insecure-plaintext to accept that")
    return MqttChannel(
        host,
        port,
        # Unguessable (128 random bits, no pid): mosquitto hands a session to whoever connects with its client id.
        identifier=f"shuffledp-{role}-{os.urandom(16).hex()}",
        username=args.username,
        password=read_password(args.password_file),
        tls_ca_file=args.ca_file,
    )


def _transport(channel) -> dict[str, Any]:
    return {
        "address": channel.address,
        "connected": channel.connected,
        "reconnects": channel.reconnects,
        "republished": channel.republished,
        "dropped": int(sum(channel.dropped_by_topic.values())),
    }


class _UnsubackRace(logging.Filter):
    """Drops aiomqtt's report of an UNSUBACK whose unsubscribe was cancelled by the channel's close."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "in on_unsubscribe callback" not in record.getMessage()


def _setup_logging(name: str, verbose: bool) -> logging.Logger:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # MqttChannel.close() cancels unsubscribes still in flight; when their UNSUBACK then
    # arrives, aiomqtt logs a KeyError traceback for the unknown message id. Benign.
    logging.getLogger("mqtt").addFilter(_UnsubackRace())
    if not verbose:
        # The services' own INFO lines duplicate the one line per round logged here.
        for noisy in ("shuffledp.shuffler.service", "shuffledp.mqtt", "shuffledp.deploy.fleet"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(name)


def _fail(command: str, exc: BaseException, status: int) -> int:
    reason = getattr(exc, "reason", None)
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"shuffledp {command}: {reason + ': ' if reason else ''}{text}", file=sys.stderr)
    return status


def _closed_socket_callbacks(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: a socket callback that finds its socket already closed
    (EBADF in ``add_reader``/``add_writer``, which aiomqtt schedules when the broker vanishes
    abruptly) is logged at debug level; everything else goes to asyncio's default handler."""
    exc = context.get("exception")
    handle = repr(context.get("handle", ""))
    if isinstance(exc, OSError) and exc.errno == errno.EBADF and ("add_writer" in handle or "add_reader" in handle):
        logging.getLogger("shuffledp.mqtt").debug("socket callback after the connection closed: %s", exc)
        return
    loop.default_exception_handler(context)


def _run(command: str, coroutine_factory: Callable[[], Any]) -> int:
    """Run a service's coroutine; configuration errors exit 2, service failures 1, one line on stderr."""
    from shuffledp.deploy.keys import KeyFileError
    from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(_closed_socket_callbacks)
        return await coroutine_factory()

    try:
        return int(asyncio.run(main()))
    except (UsageError, KeyFileError, InvalidParameter) as exc:
        return _fail(command, exc, EXIT_USAGE)
    except ShuffleDPError as exc:
        return _fail(command, exc, EXIT_FAILED)
    except KeyboardInterrupt:
        print(f"shuffledp {command}: interrupted", file=sys.stderr)
        return 130


def _write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` so a reader sees the old or the new file, never a partial one.

    The temporary file is made by :func:`tempfile.mkstemp` in ``path``'s directory (an
    unpredictable name, ``O_EXCL | O_NOFOLLOW``, mode 0600), so a symbolic link planted
    there cannot redirect the write; it is fsynced, then renamed over ``path``. The file
    written is therefore mode 0600 (``--stats-file`` and ``--output`` are for the
    operator: read them as the service's user).
    """
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True, default=float)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _on_signals(callback: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)


def _scalar_mean_options(p: argparse.ArgumentParser, *, analyzer: bool) -> None:
    """Data-model and protocol options shared with ``shuffledp simulate`` (same names and defaults)."""
    p.add_argument("--users", "-n", type=int, required=True,
                   help="number of users n" + (" (min_batch defaults to it)" if analyzer else " in the fleet"))
    p.add_argument("--samples", "-m", type=int, default=50, help="samples per user m")
    p.add_argument("--sigma", type=float, default=1.0,
                   help="data spread: its sub-Gaussian proxy, for the default radius" if analyzer else "data spread parameter")
    p.add_argument("--bound", "-B", type=float, default=20.0, help="data bound B: samples lie in [-B, B]")
    if analyzer:
        p.add_argument("--epsilon", "-e", type=float, default=1.0, help="local user-level budget eps0 (both rounds)")
        p.add_argument("--noise", choices=("laplace", "gaussian"), default="laplace", help="mean-round noise")
        p.add_argument("--delta0", type=float, default=0.0, help="local delta (Gaussian noise only)")
        p.add_argument("--tau", type=float, default=None, help="concentration radius (default: from --sigma, -n, -m, --gamma)")
        p.add_argument("--gamma", type=float, default=0.01, help="failure probability for the default radius")
        p.add_argument("--grid-levels", type=int, default=4096, help="levels of the mean round's grid")
        p.add_argument("--delta", type=float, default=1e-6, help="target central delta for the privacy report")
    else:
        from shuffledp.simulation.population import DISTRIBUTIONS

        p.add_argument("--distribution", choices=DISTRIBUTIONS, default="gaussian", help="data distribution")
        p.add_argument("--mu", type=float, default=1.7, help="distribution mean parameter")
        p.add_argument("--seed", type=int, default=None,
                       help="seed the simulated data and the devices' randomizer draws as `shuffledp simulate --seed` "
                       "does (a seeded generator, for simulation only); without it the data are fresh and every "
                       "device draws its noise from the OS CSPRNG")


# --------------------------------------------------------------------------- parsers


def add_parser(subparsers) -> None:
    """Register ``keys``, ``shuffler``, ``analyzer``, ``clients`` and ``up``."""
    fmt = argparse.ArgumentDefaultsHelpFormatter

    keys = subparsers.add_parser(
        "keys", help="create a deployment's key files (analyzer, shuffler, issuer, credentials)",
        description="Create and extend a deployment's key directory (layout: shuffledp/deploy/keys.py docstring).",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    init = keys_sub.add_parser(
        "init", formatter_class=fmt, help="generate all keys, a session id and client credentials",
        description="Generate analyzer keys (X25519 + Ed25519), shuffler keys, the credential issuer key, a "
        "session id and N client credentials into DIR: analyzer.key, shuffler.key, issuer.key (raw bytes) and "
        "credentials.json, all 0600, and public.json with what devices pin (analyzer signing key, shuffler "
        "keys, session id). Refuses to overwrite existing keys unless --force (which replaces them all).",
    )
    init.add_argument("directory", type=Path, metavar="DIR", help="key directory (created 0700)")
    init.add_argument("--clients", type=int, default=100, help="client credentials to issue")
    init.add_argument("--force", action="store_true", help="replace existing keys, public.json and credentials.json")
    init.set_defaults(func=_keys_init)
    enroll = keys_sub.add_parser(
        "enroll", formatter_class=fmt, help="issue more client credentials with issuer.key",
        description="The enrollment service's job: issue COUNT more credentials with DIR/issuer.key and append "
        "them to DIR/credentials.json (replaced atomically). Reads issuer.key, public.json and credentials.json.",
    )
    enroll.add_argument("directory", type=Path, metavar="DIR")
    enroll.add_argument("--count", type=int, required=True, help="credentials to issue")
    enroll.set_defaults(func=_keys_enroll)

    shuffler = subparsers.add_parser("shuffler", help="run the shuffler service",
                                     description="The shuffler as a long-running service.")
    shuffler_sub = shuffler.add_subparsers(dest="shuffler_command", metavar="ACTION", required=True)
    serve = shuffler_sub.add_parser(
        "serve", formatter_class=fmt, help="admit, spool, permute and forward the session's rounds",
        description="Serve the session in --keys over an MQTT broker: verify announced specs, admit envelopes "
        "with valid credentials into a durable SQLite spool (kill -9 and restart on the same --spool resumes "
        "open rounds and re-publishes unacknowledged batches), release permuted, signed batches. Logs one line "
        "per round outcome and a stats line every --log-interval; writes Shuffler.stats() as JSON to "
        "--stats-file every --stats-interval (atomically); serves Prometheus metrics on "
        "http://--metrics-host:--metrics-port/metrics. SIGTERM/SIGINT stop it cleanly (final stats written). "
        "Reads shuffler.key, issuer.key and public.json only.",
    )
    serve.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    _add_broker_options(serve, "shuffler")
    serve.add_argument("--spool", type=Path, required=True, metavar="FILE", help="SQLite spool file (created if missing)")
    serve.add_argument("--durable", action="store_true", help="fsync every commit (survive power loss, not only kill -9)")
    serve.add_argument("--stats-file", type=Path, default=None, metavar="FILE", help="write the JSON stats here")
    serve.add_argument("--stats-interval", type=float, default=10.0, metavar="S", help="seconds between stats-file writes")
    serve.add_argument("--log-interval", type=float, default=60.0, metavar="S", help="seconds between stats log lines")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="P",
                       help="serve Prometheus metrics on this port (0: a free port, logged)")
    serve.add_argument("--metrics-host", default="127.0.0.1", help="address the metrics endpoint binds to")
    serve.add_argument("--chunk-size", type=int, default=16384, help="reports per signed batch chunk")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes opening envelopes' outer layers in large bursts (decisions stay in order)")
    serve.add_argument("--republish-interval", type=float, default=30.0, metavar="S",
                       help="seconds between re-publications of unacknowledged batches")
    serve.add_argument("--instance", type=int, default=0, help="which of a round's shuffler instances this process is")
    serve.add_argument("--verbose", "-v", action="store_true", help="debug logging (MQTT included)")
    serve.set_defaults(func=_shuffler_serve)

    analyzer = subparsers.add_parser("analyzer", help="run the analyzer (coordinator) against the shuffler",
                                     description="The analyzer as a command.")
    analyzer_sub = analyzer.add_subparsers(dest="analyzer_command", metavar="ACTION", required=True)
    run = analyzer_sub.add_parser(
        "run", aliases=["serve"], formatter_class=fmt, help="run one protocol session and print its estimate",
        description="Run the session in --keys: announce each round to the shuffler over the broker, open the "
        "signed batch it forwards, acknowledge it, and print the estimate with per-round statistics (reports "
        "opened, rejected reports and rejected batch messages by reason). A session runs once: if the broker "
        "shows one of its rounds already, the run is refused. Any failure (e.g. a batch below min_batch) is "
        "one line on stderr and exit status 1. Reads analyzer.key and public.json only.",
    )
    run.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    _add_broker_options(run, "analyzer")
    run.add_argument("--protocol", choices=("scalar-mean",), default="scalar-mean",
                     help="the protocol: scalar range -> mean (Girgis et al. 2022, Algorithm 1)")
    _scalar_mean_options(run, analyzer=True)
    run.add_argument("--min-batch", type=int, default=None,
                     help="smallest batch of valid reports a round accepts (default: --users less a liveness margin of "
                          "max(8, users/100), at most half of them: so many junk or silent clients cannot fail a round)")
    run.add_argument("--max-batch", type=int, default=None,
                     help="largest batch (default: --users, so the shuffler releases as soon as every user has answered)")
    run.add_argument("--shuffler-instances", type=int, default=1,
                     help="shuffler instances per round (each must reach min_batch on its own)")
    run.add_argument("--round-timeout", type=float, default=60.0, metavar="S", help="each round's deadline, from its announcement")
    run.add_argument("--grace", type=float, default=5.0, metavar="S", help="extra wait for the batch after the deadline")
    run.add_argument("--workers", type=int, default=1, help="processes opening large batches")
    run.add_argument("--state", type=Path, default=None, metavar="FILE",
                     help="the session's durable state (SQLite, 0600; default KEYS/analyzer-state.db): a restarted "
                          "analyzer resumes its session from it and never announces a round twice")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--output", type=Path, default=None, metavar="FILE", help="also write the JSON result here")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(func=_analyzer_run)

    clients = subparsers.add_parser("clients", aliases=["client"], help="run a simulated fleet of enrolled clients",
                                    description="Simulated devices as one process.")
    clients_sub = clients.add_subparsers(dest="clients_command", metavar="ACTION", required=True)
    fleet = clients_sub.add_parser(
        "run", formatter_class=fmt, help="answer the session's rounds with N simulated devices",
        description="Simulate N devices answering the session in --keys over the broker. Each device uses one "
        "credential enrolled in DIR/credentials.json (the first N; never issuer.key: devices cannot mint "
        "credentials), pins the analyzer's and the shuffler's signing keys from public.json, keeps its own "
        "privacy ledger (--budget), and sends its envelope again if the shuffler's signed receipt does not "
        "come (the shuffler counts a copy once). Data: N users with m samples each; with --seed S the data and "
        "the randomizer draws are those of `shuffledp simulate --seed S` (a seeded generator), without it every "
        "device draws from the OS CSPRNG. Exits 0 once --rounds rounds were answered and released, 1 if one "
        "failed or --timeout passed.",
    )
    fleet.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    _add_broker_options(fleet, "client")
    _scalar_mean_options(fleet, analyzer=False)
    fleet.add_argument("--budget", type=float, default=1.0, help="each device's local epsilon budget (its ledger)")
    fleet.add_argument("--delta-budget", type=float, default=0.0, help="each device's local delta budget")
    fleet.add_argument("--min-batch-floor", type=int, default=1, help="devices refuse rounds whose min_batch is below this")
    fleet.add_argument("--rounds", type=int, default=2, help="rounds to answer (scalar-mean has 2)")
    fleet.add_argument("--rate", type=float, default=0.0, help="envelopes per second per round (0: as fast as possible)")
    fleet.add_argument("--retry-interval", type=float, default=2.0, metavar="S",
                       help="seconds before an envelope without a receipt is sent again (doubling per copy)")
    fleet.add_argument("--timeout", type=float, default=0.0, metavar="S", help="give up after S seconds (0: never)")
    fleet.add_argument("--output", type=Path, default=None, metavar="FILE", help="write a JSON summary here")
    fleet.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    fleet.set_defaults(func=_clients_run)

    up = subparsers.add_parser(
        "up", formatter_class=fmt, help="run a whole deployment on this machine (broker, shuffler, clients, analyzer)",
        description="Write keys, start a real mosquitto (TLS, passwords, ACL by role) with shuffledp.deploy.broker, "
        "then run the shuffler, a fleet of N simulated clients and the analyzer as separate processes "
        "(python -m shuffledp.cli ...), relay their output, print the estimate, stop everything. Exit status 0 "
        "only if every party succeeded. With --seed S the estimate is exactly that of `shuffledp simulate --seed S` "
        "with the same data model, -n, -m and --epsilon. Needs the mosquitto binaries.",
    )
    from shuffledp.simulation.population import DISTRIBUTIONS

    up.add_argument("--users", "-n", type=int, default=UP_DEFAULT_USERS, help="simulated users")
    up.add_argument("--samples", "-m", type=int, default=50, help="samples per user m")
    up.add_argument("--distribution", choices=DISTRIBUTIONS, default="gaussian", help="data distribution")
    up.add_argument("--mu", type=float, default=1.7, help="distribution mean parameter")
    up.add_argument("--sigma", type=float, default=1.0, help="distribution spread parameter")
    up.add_argument("--bound", "-B", type=float, default=20.0, help="data bound B")
    up.add_argument("--epsilon", "-e", type=float, default=1.0, help="local budget eps0 of the session")
    up.add_argument("--seed", type=int, default=None,
                    help="seed the simulated data and the devices' randomizer draws: the estimate is then exactly "
                    "that of `shuffledp simulate --seed` with the same parameters; without it the data are fresh "
                    "and every device draws its noise from the OS CSPRNG")
    up.add_argument("--dir", type=Path, default=None, metavar="DIR",
                    help="deployment directory, kept afterwards (must be empty or new); default: a temporary one")
    up.add_argument("--keep", action="store_true", help="keep the temporary deployment directory")
    up.add_argument("--round-timeout", type=float, default=60.0, metavar="S", help="each round's deadline")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S", help="stop everything after S seconds")
    up.set_defaults(func=_up)


# --------------------------------------------------------------------------- keys


def _keys_init(args: argparse.Namespace) -> int:
    from shuffledp.deploy.keys import KeyFileError, init_keys

    try:
        public = init_keys(args.directory, clients=args.clients, force=args.force)
    except KeyFileError as exc:
        return _fail("keys init", exc, EXIT_USAGE)
    print(
        f"wrote {args.directory}: analyzer.key, shuffler.key, issuer.key, credentials.json ({args.clients} client "
        f"credential(s)) (0600), public.json; session {public.session_id.hex()}"
    )
    return EXIT_OK


def _keys_enroll(args: argparse.Namespace) -> int:
    from shuffledp.deploy.keys import KeyFileError, enroll

    try:
        total = enroll(args.directory, args.count)
    except KeyFileError as exc:
        return _fail("keys enroll", exc, EXIT_USAGE)
    print(f"issued {args.count} credential(s); {args.directory}/credentials.json now holds {total}")
    return EXIT_OK


# --------------------------------------------------------------------------- shuffler


def _round_line(r: dict[str, Any]) -> str:
    rejected = ", ".join(f"{k} {v}" for k, v in r["rejected"].items()) or "none"
    extra = []
    if r.get("resumed"):
        extra.append(f"{r['resumed']} resumed from the spool")
    if r.get("retransmitted"):
        extra.append(f"{r['retransmitted']} retransmission(s) counted once")
    admitted = f"{r['admitted']} admitted" + (f" ({', '.join(extra)})" if extra else "")
    outcome = r["outcome"]
    if outcome == "forwarded":
        return f"round {r['round_id']} released: {admitted}, {r['forwarded']} forwarded in {r['chunks']} chunk(s); rejected: {rejected}"
    if outcome == "served":
        return f"round {r['round_id']} served: the analyzer acknowledged its batch"
    if outcome == "open":
        return f"round {r['round_id']} open" + (f": {r['resumed']} envelope(s) resumed from the spool" if r.get("resumed") else "")
    return f"round {r['round_id']} failed ({outcome}): {admitted}; rejected: {rejected}"


def _stats_line(stats: dict[str, Any]) -> str:
    outcomes = [r["outcome"] for r in stats["rounds"]]
    released = sum(o in ("forwarded", "served") for o in outcomes)
    failed = sum(o not in ("open", "forwarded", "served") for o in outcomes)
    rejected = ", ".join(f"{k} {v}" for k, v in stats["rejected_total"].items()) or "none"
    transport = stats.get("transport", {})
    return (
        f"stats: {len(outcomes)} round(s) ({outcomes.count('open')} open, {released} released, "
        f"{outcomes.count('served')} served, {failed} failed), {stats['admitted_total']} admitted, rejected {rejected}, "
        f"{stats['acknowledged_batches']} ack(s), {stats['republished_batches']} batch(es) republished; "
        f"mqtt {'connected' if transport.get('connected') else 'DISCONNECTED'}, {transport.get('reconnects', 0)} reconnect(s)"
    )


async def _shuffler_serve_async(args: argparse.Namespace) -> int:
    import sqlite3

    from shuffledp.deploy.fleet import cancel_and_wait
    from shuffledp.deploy.keys import load_shuffler
    from shuffledp.protocol.errors import TransportError
    from shuffledp.shuffler.metrics import MetricsServer, render_metrics
    from shuffledp.shuffler.service import Shuffler
    from shuffledp.shuffler.spool import SpoolError, SqliteSpool

    log = _setup_logging("shuffler", args.verbose)
    if args.stats_interval <= 0 or args.log_interval <= 0:
        raise UsageError("--stats-interval and --log-interval must be > 0")
    side = load_shuffler(args.keys)
    channel = _channel(args, "shuffler")
    try:
        spool = SqliteSpool(args.spool, durable_against_power_loss=args.durable)
    except (sqlite3.Error, SpoolError) as exc:
        raise UsageError(f"--spool: cannot open {args.spool} ({exc})") from None
    metrics = None
    try:
        resumable = [r.round_id for r in spool.rounds("open") if r.session_id == side.session_id]
        unacked = [b.round_id for b in spool.unacknowledged() if b.session_id == side.session_id]
        try:
            shuffler = Shuffler(
                channel, side.session_id, side.analyzer_signing_key, side.shuffler_keys, side.issuer,
                spool=spool, chunk_size=args.chunk_size, republish_interval=args.republish_interval,
                instance=args.instance, workers=args.workers,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None

        def snapshot() -> dict[str, Any]:
            stats = shuffler.stats()
            stats.update(transport=_transport(channel), instance=args.instance, spool=str(args.spool),
                         pid=os.getpid(), written_at=time.time())
            return stats

        if args.metrics_port is not None:
            metrics = MetricsServer(lambda: render_metrics(shuffler.stats(), _transport(channel)),
                                    host=args.metrics_host, port=args.metrics_port)
            try:
                await metrics.start()
            except OSError as exc:
                metrics = None
                raise UsageError(f"--metrics-port: cannot listen on {args.metrics_host}:{args.metrics_port} ({exc})") from None
        await channel.connect()
        log.info(
            "serving session %s (instance %d) on %s%s; spool %s: %d open round(s) to resume, %d unacknowledged batch(es)%s",
            side.session_id.hex(), args.instance, channel.address, " (TLS)" if args.ca_file else "", args.spool,
            len(resumable), len(unacked), f"; metrics on {metrics.url}" if metrics else "",
        )
        stop = asyncio.Event()
        _on_signals(stop.set)
        serve = asyncio.create_task(shuffler.serve(), name="shuffler-serve")
        watch = asyncio.create_task(_watch_shuffler(snapshot, args, log), name="shuffler-watch")
        stopping = asyncio.create_task(stop.wait())
        status = EXIT_OK
        try:
            await asyncio.wait({serve, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if serve.done():
                error = serve.exception() if not serve.cancelled() else None
                log.error("shuffler stopped: %s", error or "serve() returned")
                status = EXIT_FAILED
            else:
                log.info("signal received: stopping")
        finally:
            await cancel_and_wait([serve, watch, stopping])  # re-cancels: one cancel can be lost on 3.11
            final = snapshot()
            if args.stats_file is not None:
                _write_json_atomic(args.stats_file, final)
            log.info(_stats_line(final))
        log.info("stopped%s", f"; final stats in {args.stats_file}" if args.stats_file else "")
        return status
    finally:
        if metrics is not None:
            await metrics.close()
        try:
            await channel.close()
        except TransportError:
            pass
        spool.close()


async def _watch_shuffler(snapshot: Callable[[], dict[str, Any]], args: argparse.Namespace, log: logging.Logger) -> None:
    """Log each round's changes of outcome, a stats line every --log-interval, the stats file every --stats-interval."""
    loop = asyncio.get_running_loop()
    seen: dict[int, str] = {}
    republished = earlier_acks = 0
    next_write = loop.time()
    next_log = loop.time() + args.log_interval
    while True:
        stats = snapshot()
        for r in stats["rounds"]:
            before = seen.get(r["round_id"])
            if before == r["outcome"]:
                continue
            if r["outcome"] == "served" and before not in ("forwarded",):
                log.info(_round_line({**r, "outcome": "forwarded"}))
            log.info(_round_line(r))
            seen[r["round_id"]] = r["outcome"]
        if stats["republished_batches"] > republished:
            log.info("re-published %d unacknowledged batch(es)", stats["republished_batches"] - republished)
            republished = stats["republished_batches"]
        # Acks of batches released before this process started (rounds it never ran itself).
        earlier = stats["acknowledged_batches"] - sum(r["outcome"] == "served" for r in stats["rounds"])
        if earlier > earlier_acks:
            log.info("the analyzer acknowledged %d batch(es) released before this process started", earlier - earlier_acks)
            earlier_acks = earlier
        now = loop.time()
        if args.stats_file is not None and now >= next_write:
            try:
                _write_json_atomic(args.stats_file, stats)
            except OSError as exc:
                log.warning("cannot write %s: %s", args.stats_file, exc)
            next_write = now + args.stats_interval
        if now >= next_log:
            log.info(_stats_line(stats))
            next_log = now + args.log_interval
        await asyncio.sleep(min(0.2, args.stats_interval))


def _shuffler_serve(args: argparse.Namespace) -> int:
    return _run("shuffler serve", lambda: _shuffler_serve_async(args))


# --------------------------------------------------------------------------- analyzer


def _coordinator_class():
    from shuffledp.analyzer.coordinator import Coordinator

    class RoundStatsCoordinator(Coordinator):
        """A Coordinator that records the batch messages rejected during each round, and applies
        the command's ``max_batch`` and ``shuffler_instances`` to every round ``scalar_mean`` runs."""

        def __init__(self, *args: Any, max_batch: int | None, shuffler_instances: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_batch = max_batch
            self.shuffler_instances = shuffler_instances
            #: Batch messages rejected during each round run so far, in order, by reason.
            self.round_rejections: list[dict[str, int]] = []

        async def run_round(self, params, epsilon0, min_batch, *, delta0: float = 0.0, max_batch=None, shuffler_instances=None):
            from collections import Counter

            before = Counter(self.rejected_batches)
            try:
                return await super().run_round(
                    params, epsilon0, min_batch, delta0=delta0,
                    max_batch=max_batch if max_batch is not None else self.max_batch,
                    shuffler_instances=shuffler_instances if shuffler_instances is not None else self.shuffler_instances,
                )
            finally:
                self.round_rejections.append(dict(sorted((Counter(self.rejected_batches) - before).items())))

    return RoundStatsCoordinator


def _open_session_store(args: argparse.Namespace, session_id: bytes, config: dict[str, Any]):
    """The analyzer's session file (``--state``, default ``KEYS/analyzer-state.db``) and whether this
    session is being resumed; a clear refusal if its parameters changed or a round of it failed."""
    import sqlite3

    from shuffledp.analyzer.session_store import FAILED, SessionMismatch, SessionStore
    from shuffledp.protocol.errors import InvalidParameter

    path = args.state if args.state is not None else Path(args.keys) / "analyzer-state.db"
    try:
        store = SessionStore(path)
    except (InvalidParameter, OSError, sqlite3.Error) as exc:
        raise UsageError(f"--state: cannot use {path}: {exc}") from None
    try:
        resumed = store.check_config(session_id, config)
        failed = [r.round_id for r in store.rounds(session_id) if r.state == FAILED]
    except SessionMismatch as exc:
        store.close()
        raise UsageError(f"{exc}; to run other parameters, start a new session: shuffledp keys init {args.keys} "
                         "--force, and restart the shuffler and clients") from None
    if failed:
        store.close()
        raise UsageError(
            f"session {session_id.hex()} already ran (its round {failed[0]} failed); a session runs once: create a "
            f"new one with `shuffledp keys init {args.keys} --force` and restart the shuffler and clients")
    return store, resumed


async def _session_round_seen(channel, session_id: bytes, analyzer_signing_key: bytes) -> int | None:
    """The round id of a spec of this session the broker still retains (signed by us), if any."""
    from shuffledp.client.client import verified_spec
    from shuffledp.protocol.transport.channel import spec_topic
    from shuffledp.protocol.errors import ShuffleDPError

    subscription = await channel.subscribe(spec_topic(session_id))
    try:
        data = await asyncio.wait_for(subscription.get(), SESSION_CHECK_SECONDS)
    except asyncio.TimeoutError:
        return None
    finally:
        await subscription.close()
    try:
        spec = verified_spec(data, analyzer_signing_key)
    except ShuffleDPError:
        return None  # not ours: says nothing about the session
    return spec.round_id if spec.session_id == session_id else None


def _kib(count: int) -> str:
    return f"{count / 1024:.1f} KiB" if count < 1 << 20 else f"{count / (1 << 20):.1f} MiB"


def format_analyzer_result(result: dict[str, Any]) -> str:
    """The human-readable form of ``analyzer run``'s result."""
    p = result["parameters"]
    lines = [
        f"shuffledp analyzer run: {result['protocol']}, session {result['session_id']}, "
        f"min_batch {result['min_batch']}, eps0 {p['epsilon0']:g} ({p['noise']} noise), tau {p['tau']:.4g}",
    ]
    for r in result["rounds"]:
        rejected = ", ".join(f"{k} {v}" for k, v in r["rejected_reports"].items()) or "none"
        messages = ", ".join(f"{k} {v}" for k, v in r["rejected_batch_messages"].items()) or "none"
        lines.append(
            f"  round {r['round_id']}  {r['mechanism']:<15} eps0 {r['epsilon0']:.4g}   {r['reports']:,} reports opened "
            f"in {r['chunks']} chunk(s), {_kib(r['batch_bytes'])}; rejected reports: {rejected}; "
            f"rejected batch messages: {messages}"
        )
    lo, hi = result["range"]
    lines.append(f"  range found   [{lo:.4f}, {hi:.4f}]")
    if result.get("range_check"):
        from shuffledp.analyzer.range_check import format_range_check

        lines.append(f"  range check   {format_range_check(result['range_check'])}")
    lines.append(f"  estimate      {result['estimate']:.6f}   (standard error {result['standard_error']:.6f}, n = {result['reports']:,})")
    central = result.get("central")
    if central is not None:
        if central.get("epsilon") is None:
            lines.append(f"  central privacy   {central['method']}")
        else:
            lines.append(
                f"  central privacy   eps = {central['epsilon']:.4g}, delta = {central['delta']:.3g} after shuffling "
                f"(accounted at the smallest batch, n = {central['accounted_at_n']:,}; local eps0 = {result['parameters']['epsilon0']:g})"
            )
    lines.append(f"  {result['seconds']:.2f} s")
    return "\n".join(lines)


async def _analyzer_run_async(args: argparse.Namespace) -> int:
    from shuffledp.analyzer.coordinator import service_batch_bounds
    from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol, concentration_radius
    from shuffledp.analyzer.service import Analyzer
    from shuffledp.deploy.keys import load_analyzer
    from shuffledp.simulation import central_guarantee_at
    from shuffledp.protocol.errors import ShuffleDPError

    log = _setup_logging("analyzer", args.verbose)
    if args.users < 2:
        raise UsageError("--users: need at least 2")
    if args.shuffler_instances < 1:
        raise UsageError("--shuffler-instances: must be >= 1")
    if args.shuffler_instances > 1 and args.min_batch is None:
        raise UsageError("--min-batch is required with several shuffler instances (each batch must reach it)")
    # Every enrolled credential may answer (and the round is released when all have); a margin of them
    # may send junk or nothing without failing the round (analyzer/coordinator.py::service_batch_bounds).
    default_min, default_max = service_batch_bounds(args.users)
    min_batch = args.min_batch if args.min_batch is not None else default_min
    max_batch = args.max_batch if args.max_batch is not None else max(default_max, min_batch)
    tau = args.tau if args.tau is not None else min(args.bound, concentration_radius(args.sigma, args.users, args.samples, args.gamma))
    config = ScalarMeanConfig(bound=args.bound, tau=tau, epsilon0=args.epsilon, delta0=args.delta0,
                              noise=args.noise, grid_levels=args.grid_levels)
    side = load_analyzer(args.keys)
    store, resumed = _open_session_store(args, side.session_id, {
        "protocol": args.protocol, "users": args.users, "min_batch": min_batch, "max_batch": max_batch,
        "shuffler_instances": args.shuffler_instances, "bound": config.bound, "tau": config.tau,
        "epsilon0": config.epsilon0, "delta0": config.delta0, "noise": config.noise, "grid_levels": config.grid_levels,
    })
    channel = _channel(args, "analyzer")
    started = time.time()
    analyzer = Analyzer(side.analyzer_keys, workers=args.workers)
    try:
        await channel.connect()
        if resumed:
            log.info("session %s: resuming from %s (%s)", side.session_id.hex(), store.path,
                     ", ".join(f"round {r.round_id} {r.state}" for r in store.rounds(side.session_id)) or "no round yet")
        else:
            seen = await _session_round_seen(channel, side.session_id, side.analyzer_keys.signing_public)
            if seen is not None:  # run before, without this state file: it cannot be resumed
                raise UsageError(
                    f"session {side.session_id.hex()} already ran (the broker holds its round {seen}); a session runs "
                    f"once: create a new one with `shuffledp keys init {args.keys} --force` and restart the shuffler and clients"
                )
        coordinator = _coordinator_class()(
            channel, analyzer, side.shuffler_identity, session_id=side.session_id,
            round_timeout=args.round_timeout, grace=args.grace,
            max_batch=max_batch, shuffler_instances=args.shuffler_instances, store=store,
        )
        log.info("session %s: scalar-mean with min_batch %d over %s", side.session_id.hex(), min_batch, channel.address)
        # The decoder's sums are correctly rounded: the estimate depends on the reports' multiset only, not on
        # the shuffler's order, so with the same data and draws it is `shuffledp simulate`'s to the last bit.
        outcome, records = await coordinator.run_protocol(ScalarMeanProtocol(config), min_batch)
    finally:
        store.close()
        analyzer.close()
        try:
            await channel.close()
        except ShuffleDPError:
            pass
    rounds = []
    for record, rejections in zip(records, coordinator.round_rejections):
        spec = record.spec
        rounds.append({
            "round_id": spec.round_id,
            "mechanism": spec.mechanism,
            "epsilon0": spec.epsilon0,
            "delta0": spec.delta0,
            "min_batch": spec.min_batch,
            "max_batch": spec.max_batch,
            "shuffler_instances": spec.shuffler_instances,
            "reports": record.opened.size,
            "batch_sizes": list(record.batch_sizes),
            "smallest_batch": record.smallest_batch,
            "failed_instances": record.failed_instances,
            "chunks": record.chunks,
            "batch_bytes": record.batch_bytes,
            "rejected_reports": dict(sorted(record.opened.rejected.items())),
            "rejected_batch_messages": rejections,
            # The bytes the analyzer announced: `shuffledp audit --session` verifies the round's claim from them.
            "signed_spec": record.signed_spec.hex(),
        })
    result = {
        "protocol": args.protocol,
        "session_id": side.session_id.hex(),
        # For information only: an auditor verifies the signed specs against a key it trusts (public.json).
        "analyzer_signing_key": side.analyzer_keys.signing_public.hex(),
        "min_batch": min_batch,
        "parameters": {"bound": config.bound, "tau": config.tau, "epsilon0": config.epsilon0, "delta0": config.delta0,
                       "noise": config.noise, "grid_levels": config.grid_levels},
        "estimate": outcome.mean.estimate,
        "standard_error": outcome.mean.standard_error,
        "reports": outcome.mean.n,
        "range": [outcome.found_range.lower, outcome.found_range.upper],
        "range_check": outcome.range_check.as_dict() if outcome.range_check else None,
        "rounds": rounds,
        "seconds": time.time() - started,
    }
    smallest = min(r["smallest_batch"] for r in rounds)
    result["central"] = {"accounted_at_n": smallest, **central_guarantee_at(config, smallest, args.delta)}
    from shuffledp.cli.run_info import with_run_info

    result = with_run_info(result, args)
    if args.output is not None:
        _write_json_atomic(args.output, result)
    print(json.dumps(result, indent=2, default=float) if args.json else format_analyzer_result(result), flush=True)
    return EXIT_OK


def _analyzer_run(args: argparse.Namespace) -> int:
    return _run("analyzer run", lambda: _analyzer_run_async(args))


# --------------------------------------------------------------------------- clients


async def _clients_run_async(args: argparse.Namespace) -> int:
    import numpy as np

    from shuffledp.client.client import Client
    from shuffledp.client.ledger import PrivacyLedger
    from shuffledp.deploy.fleet import Fleet, cancel_and_wait
    from shuffledp.simulation.engine import seeded_draw
    from shuffledp.deploy.keys import load_clients
    from shuffledp.simulation.population import Population, local_means
    from shuffledp.protocol.errors import ShuffleDPError

    log = _setup_logging("clients", args.verbose)
    if args.users < 1 or args.rounds < 1 or args.rate < 0 or args.retry_interval <= 0 or args.timeout < 0:
        raise UsageError("need --users >= 1, --rounds >= 1, --rate >= 0, --retry-interval > 0, --timeout >= 0")
    if args.seed is not None and args.seed < 0:
        raise UsageError("--seed: must be >= 0")
    side = load_clients(args.keys, args.users)
    population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
    # With --seed, the data and the draws of `shuffledp simulate --seed` (one shared definition of each);
    # without it, fresh data, and every device draws its own noise from the OS CSPRNG (Client's default source).
    seeded = args.seed is not None
    data_seed = args.seed if seeded else np.random.SeedSequence().entropy
    means, true_mean = local_means(population, args.users, data_seed)
    clients = [
        Client(
            np.array([y]), side.public.analyzer_signing_public,
            PrivacyLedger(args.budget, args.delta_budget), credential=credential,
            shuffler_signing_key=side.public.shuffler.signing_public, shuffler_key=side.public.shuffler.hpke_public,
            min_batch_floor=args.min_batch_floor,
        )
        for y, credential in zip(means, side.credentials)
    ]
    channel = _channel(args, "client")
    await channel.connect()
    fleet = Fleet(channel, side.session_id, clients, draw=seeded_draw(args.seed) if seeded else None,
                  rate=args.rate, retry_interval=args.retry_interval, on_event=log.info)
    log.info("%d device(s) of session %s on %s, waiting for rounds (true mean of their data %.6f; %s)",
             args.users, side.session_id.hex(), channel.address, true_mean,
             f"data and draws seeded with --seed {args.seed}" if seeded else "draws from the OS CSPRNG")
    serve = asyncio.create_task(fleet.serve(args.rounds), name="fleet-serve")
    stop = asyncio.Event()
    _on_signals(stop.set)
    stopping = asyncio.create_task(stop.wait())
    finished = False
    try:
        await asyncio.wait({serve, stopping}, timeout=args.timeout or None, return_when=asyncio.FIRST_COMPLETED)
        if serve.done():
            serve.result()  # a bug in the fleet surfaces here, with its traceback
            finished = True
        elif stopping.done():
            log.info("signal received: stopping")
        else:
            log.error("timed out after %g s with %d of %d round(s) answered", args.timeout, len(fleet.rounds), args.rounds)
    finally:
        await cancel_and_wait([serve, stopping])
        try:
            await channel.close()
        except ShuffleDPError:
            pass
    rounds = [fleet.rounds[r] for r in sorted(fleet.rounds)]
    ok = finished and len(rounds) == args.rounds and all(r.released for r in rounds)
    summary = {
        "session_id": side.session_id.hex(),
        "users": args.users,
        "true_mean": true_mean,
        "population_mean": population.mean,
        "rounds": [r.as_dict() for r in rounds],
        "bad_messages": dict(fleet.bad_messages),
        "devices_with_lost_rounds": sum(1 for c in clients if c.ledger.lost_rounds()),
        "seed": args.seed,
        "randomness": (f"seeded numpy PCG64, --seed {args.seed} (simulation: the draws of `shuffledp simulate --seed "
                       f"{args.seed}`)") if seeded else "OS CSPRNG (each device's own draws, as on a real device)",
        "ok": ok,
    }
    if args.output is not None:
        _write_json_atomic(args.output, summary)
    print(f"fleet: {args.users} device(s), true mean of their data {true_mean:.6f}; "
          f"{sum(r.released for r in rounds)} of {args.rounds} round(s) released", flush=True)
    return EXIT_OK if ok else EXIT_FAILED


def _clients_run(args: argparse.Namespace) -> int:
    return _run("clients run", lambda: _clients_run_async(args))


# --------------------------------------------------------------------------- up


def _say(text: str) -> None:
    print(f"[up] {text}", flush=True)


async def _relay(name: str, stream: asyncio.StreamReader) -> None:
    while True:
        line = await stream.readline()
        if not line:
            return
        print(f"[{name}] {line.decode('utf-8', 'replace').rstrip()}", flush=True)


async def _wait(process: asyncio.subprocess.Process, timeout: float) -> int | None:
    try:
        return await asyncio.wait_for(process.wait(), timeout)
    except asyncio.TimeoutError:
        return None


async def _stop(process: asyncio.subprocess.Process, timeout: float = 10.0) -> int:
    """SIGTERM the process (if it runs), SIGKILL it after ``timeout``; its exit status."""
    if process.returncode is None:
        process.terminate()
        if await _wait(process, timeout) is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode


#: Run by `up` beside its parties when it made a temporary directory: it reads the parties'
#: "pid start-time" lines from a pipe only `up` holds and, for each, opens a pidfd at once and
#: keeps it only if the process behind it still has that start time (field 22 of
#: /proc/PID/stat): the pidfd then names that process for good, so a pid the kernel reuses later
#: is never signalled. At EOF without "done" (`up` died, e.g. by SIGKILL) it sends SIGTERM
#: through the pidfds to the parties still running (on Linux they already got it as their parent
#: death signal), waits for them to end and removes the directory.
_UP_REAPER = """
import os, select, shutil, signal, sys, time
base, fd = sys.argv[1], int(sys.argv[2])
made = os.lstat(base)  # the directory `up` made: never remove another one found at that path
def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
parties, done = [], False
with os.fdopen(fd, "rb") as pipe:
    for line in pipe:
        words = line.split()
        if words == [b"done"]:
            done = True
        elif len(words) == 2 and words[0].isdigit():
            try:
                pidfd = os.pidfd_open(int(words[0]))
            except OSError:
                continue  # already gone
            if start_time(int(words[0])) == words[1]:
                parties.append(pidfd)
            else:
                os.close(pidfd)  # the pid names another process now
def alive(pidfd):
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)  # a pidfd turns readable when its process ends
if not done:
    for pidfd in parties:
        if alive(pidfd):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + 30.0
    while any(alive(pidfd) for pidfd in parties) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        now = os.lstat(base)
    except OSError:
        now = None
    if now is not None and (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
        shutil.rmtree(base, ignore_errors=True)
"""


def process_start_time(pid: int) -> bytes | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/PID/stat), as the bytes
    written there: with the pid, it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


async def _start_up_reaper(base: Path) -> int:
    """Start the reaper of a temporary deployment directory; the write end of its pipe."""
    read_end, write_end = os.pipe()
    try:
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _UP_REAPER, str(base), str(read_end), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, pass_fds=(read_end,),
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return write_end


async def _up_async(args: argparse.Namespace) -> int:
    import contextlib
    import shutil
    import tempfile

    from shuffledp.deploy.broker import Broker, BrokerError, BrokerUsers, parent_death_signal
    from shuffledp.deploy.keys import init_keys
    from shuffledp.simulation.population import Population
    from shuffledp.simulation import SimulationConfig

    if args.users < 2:
        raise UsageError("--users: need at least 2")
    if args.seed is not None and args.seed < 0:
        raise UsageError("--seed: must be >= 0")
    # The configuration `shuffledp simulate` builds from the same options (it checks the data model and
    # derives the radius tau), so the analyzer runs the protocol simulate runs.
    population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
    simulated = SimulationConfig(population=population, n=args.users, epsilon0=args.epsilon)
    tau = simulated.radius
    started = time.monotonic()
    temporary = args.dir is None
    reaper: int | None = None  # pipe to the reaper of the temporary directory
    if temporary:
        base = Path(tempfile.mkdtemp(prefix="shuffledp-up-"))
        if not args.keep:
            try:
                reaper = await _start_up_reaper(base)
            except BaseException:
                shutil.rmtree(base, ignore_errors=True)
                raise

        def watch(pid: int) -> None:
            started_at = process_start_time(pid)  # read while `up` still holds the child: its pid is not reused yet
            if reaper is not None and started_at is not None:
                with contextlib.suppress(OSError):
                    os.write(reaper, f"{pid} ".encode() + started_at + b"\n")
    else:
        base = Path(args.dir)
        if base.exists() and (not base.is_dir() or any(base.iterdir())):
            raise UsageError(f"--dir: {base} exists and is not an empty directory")
        base.mkdir(mode=0o700, parents=True, exist_ok=True)

        def watch(pid: int) -> None:
            pass
    broker: Broker | None = None
    processes: dict[str, asyncio.subprocess.Process] = {}
    relays: list[asyncio.Task] = []
    codes: dict[str, int | None] = {}
    interrupted = False
    try:
        _say(f"deployment directory {base}")
        public = init_keys(base / "keys", clients=args.users)
        _say(f"keys: session {public.session_id.hex()}, {args.users} client credentials (keys/, private files 0600)")
        _say(f"data and randomizer draws seeded with --seed {args.seed}, as `shuffledp simulate --seed {args.seed}`"
             if args.seed is not None else "fresh data; every device draws its noise from the OS CSPRNG")
        # Started from this (the main) thread: Linux sends the parent death signal when the
        # thread that forked a child ends, and this one lasts as long as `up`.
        broker = Broker(base / "broker", users=BrokerUsers.default(), die_with_parent=True)
        try:
            broker.start()
        except BrokerError as exc:
            raise UsageError(f"cannot start mosquitto: {exc}") from None
        assert broker.pid is not None
        watch(broker.pid)
        _say(f"broker: mosquitto pid {broker.pid} on {broker.host}:{broker.port} (TLS 1.2+, passwords, ACL by role)")
        secrets = base / "secrets"
        secrets.mkdir(mode=0o700)
        common = ["--keys", str(base / "keys"), "--broker", f"{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file)]
        accounts = {}
        for role in ("analyzer", "shuffler", "client"):
            options = broker.channel_options(role)
            path = secrets / f"{role}.password"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"{options['password']}\n")
            accounts[role] = ["--username", str(options["username"]), "--password-file", str(path)]
        python = [sys.executable, "-m", "shuffledp.cli"]
        commands = {
            "shuffler": [*python, "shuffler", "serve", *common, *accounts["shuffler"], "--spool", str(base / "spool" / "shuffler.db"),
                         "--stats-file", str(base / "shuffler-stats.json"), "--stats-interval", "1", "--metrics-port", "0"],
            "clients": [*python, "clients", "run", *common, *accounts["client"], "--users", str(args.users),
                        "--samples", str(args.samples), "--distribution", args.distribution, "--mu", repr(args.mu),
                        "--sigma", repr(args.sigma), "--bound", repr(args.bound), "--budget", repr(args.epsilon),
                        *(["--seed", str(args.seed)] if args.seed is not None else []),
                        "--output", str(base / "clients.json")],
            "analyzer": [*python, "analyzer", "run", *common, *accounts["analyzer"], "--users", str(args.users),
                         "--samples", str(args.samples), "--bound", str(args.bound), "--tau", repr(tau),
                         "--epsilon", str(args.epsilon), "--round-timeout", str(args.round_timeout),
                         "--output", str(base / "result.json")],
        }
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name, command in commands.items():
            # Each party in its own session: a Ctrl-C at the terminal reaches `up` only, which
            # then stops the parties in order (the analyzer and clients first, the shuffler last).
            # Should `up` die without stopping them (SIGKILL), Linux sends each SIGTERM.
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=parent_death_signal(),
            )
            processes[name] = process
            watch(process.pid)
            relays.append(asyncio.create_task(_relay(name, process.stdout)))
            _say(f"{name}: pid {process.pid}")
        remaining = args.timeout - (time.monotonic() - started)
        codes["analyzer"] = await _wait(processes["analyzer"], max(1.0, remaining))
        if codes["analyzer"] is None:
            _say(f"timed out after {args.timeout:g} s")
        # The fleet ends once the last round's outcome reaches it; it has nothing to wait for if the analyzer failed.
        codes["clients"] = await _wait(processes["clients"], 15.0 if codes["analyzer"] == 0 else 0.5)
        if codes["clients"] is None:
            codes["clients"] = await _stop(processes["clients"])
            codes["clients"] = codes["clients"] if codes["analyzer"] != 0 else EXIT_FAILED
        _say("stopping the shuffler (SIGTERM)")
        codes["shuffler"] = await _stop(processes["shuffler"])
    except asyncio.CancelledError:
        _say("interrupted: stopping everything")
        interrupted = True
    finally:
        for name in ("analyzer", "clients", "shuffler"):
            if name in processes:
                status = await _stop(processes[name])
                codes[name] = codes.get(name) if codes.get(name) is not None else status
        await asyncio.gather(*relays, return_exceptions=True)
        if broker is not None:
            await asyncio.to_thread(broker.stop)
            _say("broker stopped")
    try:
        result = json.loads((base / "result.json").read_text()) if codes.get("analyzer") == 0 else None
        fleet = json.loads((base / "clients.json").read_text()) if (base / "clients.json").exists() else None
    except (OSError, ValueError):
        result = fleet = None
    if result is not None:
        truth = f"; true mean of the simulated data {fleet['true_mean']:.6f}, error {result['estimate'] - fleet['true_mean']:+.6f}" if fleet else ""
        _say(f"estimate {result['estimate']:.6f} (standard error {result['standard_error']:.6f}, n = {result['reports']:,}){truth}")
    ok = not interrupted and all(codes.get(name) == 0 for name in ("analyzer", "clients", "shuffler"))
    _say(
        f"{'done' if ok else 'interrupted' if interrupted else 'FAILED'} in {time.monotonic() - started:.1f} s: "
        + ", ".join(f"{name} exit {codes.get(name)}" for name in ("analyzer", "clients", "shuffler"))
    )
    if reaper is not None:  # told first: the reaper never removes a path `up` already removed
        with contextlib.suppress(OSError):
            os.write(reaper, b"done\n")
        os.close(reaper)
    if temporary and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        _say(f"kept {base} (keys, broker, spool/, shuffler-stats.json, result.json, clients.json)")
    return 130 if interrupted else EXIT_OK if ok else EXIT_FAILED


def _up(args: argparse.Namespace) -> int:
    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        _on_signals(task.cancel)
        return await _up_async(args)

    return _run("up", main)
