"""What the ``shuffledp`` commands share: the parser class and its one-line errors, deprecated
aliases, the default central delta, exit statuses, JSON output, and the services' broker
options, TLS and password handling, logging and run wrapper.

The vocabulary itself (one option name per concept across the commands) is listed in
``docs/cli.md`` and checked by ``tests/cli/test_vocabulary.py``.

Exit statuses: 0 success, 1 the command failed (transport, protocol, a round failed, an
audit claim violated), 2 bad usage or configuration (arguments, key files, password file).
Either error is one line on stderr, ``shuffledp <command>: <message>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

#: Exit statuses (see the module docstring).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Exit status of a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

#: The default central delta: one rule for every command and the Python API
#: (:func:`shuffledp.protocol.accounting.composition.default_central_delta`).
from shuffledp.protocol.accounting.composition import (  # noqa: E402  (no scipy: the accountant loads on use)
    DEFAULT_DELTA_RULE,
    DELTA_CAP,
    DELTA_EXPONENT,
    default_central_delta as default_delta,
)


class UsageError(Exception):
    """Bad arguments or configuration: printed as one line, exit status 2."""


# --------------------------------------------------------------------------- parser


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``shuffledp <command>: <message>``, exit 2.

    Sub-command parsers inherit the class (``add_subparsers`` makes parsers of the parent's type)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:  # named after the command they were given to, not the top-level parser
            prog = f"shuffledp {command_name(namespace)}" if getattr(namespace, "command", None) else self.prog
            print(f"{prog}: unrecognized arguments: {' '.join(extras)}", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        # A required option with a deprecated alias is checked here: either spelling satisfies it.
        missing = [action for action in getattr(self, "_required_with_alias", ())
                   if getattr(namespace, action.dest, None) is None]
        if missing:
            self.error("the following arguments are required: "
                       + ", ".join("/".join(action.option_strings) for action in missing))
        return namespace, extras


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless it is None or the help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new option's ``dest`` and warns (one line on stderr)."""

    def __init__(self, option_strings: list[str], dest: str, *, replacement: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated and will be removed; use {self.replacement}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)
        used = list(getattr(namespace, "_deprecated", None) or [])
        used.append(option_string)
        namespace._deprecated = used  # underscored: not one of the run's parameters (run_info)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, *, hint: str = "") -> argparse.Action:
    """Accept ``old`` as a deprecated spelling of the option ``new`` (already added to ``parser``).

    The alias takes the same value type and choices, stores into the same ``dest``, prints one
    warning line when used, and is named in ``new``'s help; ``hint`` is added to the warning."""
    target = parser._option_string_actions[new]
    if target.required:  # argparse would not count the alias: Parser.parse_known_args checks it
        target.required = False
        setattr(parser, "_required_with_alias", [*getattr(parser, "_required_with_alias", ()), target])
    # type=None (no conversion) is argparse's own default, which typeshed's add_argument does not admit.
    action = parser.add_argument(
        old, dest=target.dest, action=DeprecatedAlias, replacement=new + hint, type=target.type,  # type: ignore[arg-type]
        choices=target.choices, metavar=target.metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
    )
    if target.help and target.help is not argparse.SUPPRESS:
        target.help = f"{target.help} [deprecated alias: {old}]"
    return action


def used_deprecated(args: argparse.Namespace, option: str) -> bool:
    """Whether ``option`` (a deprecated alias) was typed."""
    return option in (getattr(args, "_deprecated", None) or [])


class RenamedChoices(argparse.Action):
    """A choice option some of whose values were renamed: an old value still works, is stored as its new
    name, and prints one warning line on stderr. ``--help`` lists the current choices and names the old
    values beside them. Give it ``choices`` (the current values) and ``renamed`` (old value -> new)."""

    def __init__(self, option_strings: list[str], dest: str, *, renamed: dict[str, str], choices, **kwargs: Any) -> None:
        current = tuple(choices)
        assert set(renamed.values()) <= set(current) and not set(renamed) & set(current), renamed
        kwargs.setdefault("metavar", "{" + ",".join(current) + "}")
        help_text = kwargs.pop("help", None) or ""
        old = ", ".join(f"{o} (= {n})" for o, n in renamed.items())
        super().__init__(option_strings, dest, choices=current + tuple(renamed), help=f"{help_text} [deprecated: {old}]",
                         **kwargs)
        self.renamed = dict(renamed)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values in self.renamed:
            new = self.renamed[values]
            print(f"{parser.prog}: warning: {option_string} {values} is deprecated and will be removed; "
                  f"use {option_string} {new}", file=sys.stderr)
            namespace._deprecated = [*(getattr(namespace, "_deprecated", None) or []), f"{option_string} {values}"]
            values = new
        setattr(namespace, self.dest, values)


def add_json_option(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as one JSON document on stdout (with a \"shuffledp\" block: version, command, parameters)")


def central_delta_arg(text: str) -> float:
    """``--delta``'s type: a number in (0, 1), else a one-line usage error (exit 2) before any work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text}")
    return value


def delta_help(what: str = "central delta") -> str:
    return f"{what} (default: {DEFAULT_DELTA_RULE})"


def command_name(args: argparse.Namespace) -> str:
    """``args.command`` and its sub-command (``keys init``, ``analyzer run``), as messages name it."""
    parts = [getattr(args, "command", None) or "?"]
    parts += [str(v) for k, v in sorted(vars(args).items()) if k.endswith("_command") and v]
    return " ".join(parts)


def error_message(exc: BaseException) -> str:
    """One line for ``exc``: its reason (for typed errors) and its text."""
    from shuffledp.protocol.errors import InvalidParameter

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, InvalidParameter):
        return f"invalid parameter {text}"
    reason = getattr(exc, "reason", None)
    return f"{reason}: {text}" if reason else text


def exit_status(exc: BaseException) -> int | None:
    """The exit status for an exception a command raised, or None if it is a bug (re-raised)."""
    from shuffledp.deploy.keys import KeyFileError
    from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

    if isinstance(exc, (UsageError, KeyFileError, InvalidParameter)):
        return EXIT_USAGE
    if isinstance(exc, ShuffleDPError):
        return EXIT_FAILED
    return None


def fail(command: str, exc: BaseException | str, status: int) -> int:
    """Print ``shuffledp <command>: <message>`` on stderr; return ``status``."""
    message = exc if isinstance(exc, str) else error_message(exc)
    print(f"shuffledp {command}: {message}", file=sys.stderr)
    return status


def interrupted(command: str) -> int:
    """Ctrl-C: print ``shuffledp <command>: interrupted`` on stderr (the one line a stopped command
    writes, no traceback); return :data:`EXIT_INTERRUPTED`. From here on, another SIGINT ends the
    process at once with the same status (:func:`exit_on_another_interrupt`)."""
    exit_on_another_interrupt()
    return fail(command, "interrupted", EXIT_INTERRUPTED)


def exit_on_another_interrupt() -> None:
    """Make any further SIGINT end the process at once with status 130 and nothing more on stderr.

    The command is already stopping. With Python's own handler, a SIGINT while it winds down (a
    second Ctrl-C, or a signal delivered late) raises ``KeyboardInterrupt`` in the middle of the
    clean-up: a traceback, or, once the interpreter has put SIGINT back to its default at exit,
    death by the signal (status -2, not 130). Only the main thread may set a handler."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(EXIT_INTERRUPTED))


# --------------------------------------------------------------------------- JSON


def json_text(document: Any, args: argparse.Namespace | None = None) -> str:
    """``document`` with the run-info block, as indented JSON."""
    from shuffledp.cli.run_info import with_run_info

    return json.dumps(with_run_info(document, args) if args is not None else document, indent=2, default=float)


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
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


# --------------------------------------------------------------------------- the services: broker


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


def add_broker_options(p: argparse.ArgumentParser, role: str) -> None:
    group = p.add_argument_group("broker", f"how this {role} reaches the MQTT broker")
    group.add_argument("--broker", required=True, metavar="HOST[:PORT][,HOST[:PORT]...]",
                       help="the broker's address (port default: 8883 with --ca-file, else 1883); for a clustered "
                       "broker, its nodes separated by commas: the first is tried first, and a lost connection is "
                       "re-established to the next node")
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
    group.add_argument("--connect-retry", type=float, default=FIRST_CONNECT_RETRY, metavar="S",
                       help="try a first connection that fails as it does while a broker starts or restarts "
                       "(refused, reset, timed out) again, with exponential back-off (0.1 s doubling to 5 s), for up "
                       "to S seconds, one log line per attempt (0: once); refused credentials and a certificate "
                       "that fails verification are reported at once. After the first connection, a lost one is "
                       "re-established for as long as the service runs")
    group.add_argument("--subscribe-qos", type=int, choices=(0, 1), default=1,
                       help="QoS of this party's subscriptions (publishes are QoS 1): 0 for a NATS cluster, where "
                       "each QoS 1 subscription is a replicated JetStream consumer (shuffledp.deploy.nats_cluster)")


#: Seconds a service tries its first connection to the broker (``--connect-retry``).
FIRST_CONNECT_RETRY = 30.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback: ``localhost``, 127.0.0.0/8 or ::1."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def mqtt_channel(args: argparse.Namespace, role: str):
    """An unconnected MqttChannel for ``args``' broker options."""
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel

    default_port = 8883 if args.ca_file else 1883
    addresses = [parse_address(address.strip(), default_port) for address in args.broker.split(",")]
    (host, port), failover = addresses[0], addresses[1:]
    if args.ca_file is not None and not Path(args.ca_file).is_file():
        raise UsageError(f"--ca-file: {args.ca_file} is not a file")
    if (args.password_file is not None and args.ca_file is None and not getattr(args, "insecure_plaintext", False)
            and not all(is_loopback(h) for h, _ in addresses)):
        raise UsageError(f"--password-file without --ca-file would send the password in clear to {host}; "
                         f"add --ca-file PEM (TLS), or --insecure-plaintext to accept that")
    retry = getattr(args, "connect_retry", FIRST_CONNECT_RETRY)
    if not 0 <= retry < float("inf"):
        raise UsageError(f"--connect-retry: must be a number of seconds >= 0, got {retry}")
    return MqttChannel(
        host,
        port,
        first_connect_retry=retry,
        # Unguessable (128 random bits, no pid): mosquitto hands a session to whoever connects with its client id.
        identifier=f"shuffledp-{role}-{os.urandom(16).hex()}",
        username=args.username,
        password=read_password(args.password_file),
        tls_ca_file=args.ca_file,
        failover=failover,
        subscribe_qos=getattr(args, "subscribe_qos", 1),
    )


def transport_stats(channel) -> dict[str, Any]:
    return {
        "address": channel.address,
        "connected": channel.connected,
        "reconnects": channel.reconnects,
        "republished": channel.republished,
        "dropped": int(sum(channel.dropped_by_topic.values())),
    }


def add_scalar_mean_options(p: argparse.ArgumentParser, *, analyzer: bool) -> None:
    """Data-model and protocol options shared with ``shuffledp simulate`` (same names and defaults)."""
    p.add_argument("--users", "-n", type=int, required=True,
                   help="number of users n" + (" (min_batch defaults to it)" if analyzer else " in the fleet"))
    p.add_argument("--samples", "-m", type=int, default=50, help="samples per user m")
    p.add_argument("--sigma", type=float, default=1.0,
                   help="data spread: its sub-Gaussian proxy, for the default radius" if analyzer else "data spread parameter")
    p.add_argument("--bound", "-B", type=float, default=20.0, help="data bound B: samples lie in [-B, B]")
    if analyzer:
        p.add_argument("--epsilon0", "-e", type=float, default=1.0, help="local user-level budget eps0 (both rounds)")
        deprecated_alias(p, "--epsilon", "--epsilon0")
        p.add_argument("--noise", choices=("laplace", "gaussian"), default="laplace", help="mean-round noise")
        p.add_argument("--delta0", type=float, default=0.0, help="local delta (Gaussian noise only)")
        p.add_argument("--tau", type=float, default=None, help="concentration radius (default: from --sigma, -n, -m, --gamma)")
        p.add_argument("--gamma", type=float, default=0.01, help="failure probability for the default radius")
        p.add_argument("--grid-levels", type=int, default=4096, help="levels of the mean round's grid")
        p.add_argument("--delta", type=central_delta_arg, default=None, help=delta_help("central delta of the privacy report"))
    else:
        from shuffledp.simulation.population import DISTRIBUTIONS

        p.add_argument("--distribution", choices=DISTRIBUTIONS, default="gaussian", help="data distribution")
        p.add_argument("--mu", type=float, default=1.7, help="distribution mean parameter")
        p.add_argument("--seed", type=int, default=None,
                       help="seed the simulated data and the devices' randomizer draws as `shuffledp simulate --seed` "
                       "does (a seeded generator, for simulation only); without it the data are fresh and every "
                       "device draws its noise from the OS CSPRNG")


# --------------------------------------------------------------------------- the services: running


def setup_logging(name: str, verbose: bool) -> logging.Logger:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not verbose:
        # The services' own INFO lines duplicate the one line per round logged here.
        for noisy in ("shuffledp.shuffler.service", "shuffledp.mqtt", "shuffledp.deploy.fleet"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(name)


#: The event-loop calls aiomqtt schedules for its socket (from paho's connect thread too).
_SOCKET_CALLS = ("add_writer", "add_reader", "remove_writer", "remove_reader")


def _closed_socket_callbacks(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler, for what aiomqtt leaves to it: one debug line, no traceback.

    * A socket callback (``add_reader``/``add_writer``/``remove_*``, which aiomqtt schedules,
      partly from paho's connect thread) that fails because its socket was closed, its file
      descriptor reused, or the selector changed under it (``OSError``, ``KeyError: '7 is not
      registered'``, ``ValueError``) when the broker vanished or restarted: the channel has
      already seen the connection go, and reconnects.
    * aiomqtt's record of a disconnection nobody read ("Future exception was never retrieved"
      with an aiomqtt error): the channel learned of it another way.

    Everything else goes to asyncio's default handler."""
    mqtt_errors: tuple[type[BaseException], ...]
    try:
        from aiomqtt import MqttError
        mqtt_errors = (MqttError,)
    except ImportError:  # a command run without the mqtt extra: nothing of aiomqtt's to quiet
        mqtt_errors = ()

    exc = context.get("exception")
    handle = repr(context.get("handle", ""))
    if isinstance(exc, (OSError, KeyError, ValueError)) and any(call in handle for call in _SOCKET_CALLS):
        logging.getLogger("shuffledp.mqtt").debug("socket callback after the connection closed: %s: %s",
                                                  type(exc).__name__, exc)
        return
    if mqtt_errors and isinstance(exc, mqtt_errors) and "future" in context and "handle" not in context:
        logging.getLogger("shuffledp.mqtt").debug("a closed connection's reason, unread: %s: %s", type(exc).__name__, exc)
        return
    loop.default_exception_handler(context)


def run_service(command: str, coroutine_factory: Callable[[], Any]) -> int:
    """Run a service's coroutine; configuration errors exit 2, service failures 1, one line on stderr."""

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(_closed_socket_callbacks)
        return await coroutine_factory()

    try:
        return int(asyncio.run(main()))
    except KeyboardInterrupt:
        return interrupted(command)
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        return fail(command, exc, status)


def on_signals(callback: Callable[[], object]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)
