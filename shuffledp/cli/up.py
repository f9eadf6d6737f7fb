"""``shuffledp up``: a whole deployment on this machine.

Writes keys, starts a real mosquitto (:class:`~shuffledp.deploy.broker.Broker`: TLS,
passwords, ACL by role; with ``--broker-nodes N`` a local cluster of N NATS servers instead,
:class:`~shuffledp.deploy.nats_cluster.NatsCluster`, every party given every node), then the shuffler, the fleet and the analyzer as separate OS
processes (``python -m shuffledp.cli ...``); relays their output, prints the estimate, stops
everything, and exits 0 only if every party succeeded. With ``--seed S`` the estimate is
exactly that of ``shuffledp simulate --seed S`` with the same parameters. With ``--json`` the
parties' output and the progress lines go to stderr and stdout holds one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from shuffledp.cli.common import (
    EXIT_FAILED,
    central_delta_arg,
    EXIT_INTERRUPTED,
    EXIT_OK,
    HelpFormatter,
    UsageError,
    add_json_option,
    default_delta,
    delta_help,
    deprecated_alias,
    json_text,
    on_signals,
    run_service,
)

#: Users ``shuffledp up`` simulates by default: about 20 s on 2 cores (a device seals ~1 ms per round).
UP_DEFAULT_USERS = 8000
#: Seconds between the shuffler's re-publications of an unacknowledged batch on a broker cluster
#: (`--broker-nodes` > 1), where a dying node can lose an acknowledgement; the analyzer lingers twice that.
CLUSTER_REPUBLISH_INTERVAL = 3.0


def add_parser(subparsers) -> None:
    fmt = HelpFormatter

    up = subparsers.add_parser(
        "up", formatter_class=fmt, help="run a whole deployment on this machine (broker, shuffler, clients, analyzer)",
        description="Write keys, start a real mosquitto (TLS, passwords, ACL by role) with shuffledp.deploy.broker, "
        "then run the shuffler, a fleet of N simulated clients and the analyzer as separate processes "
        "(python -m shuffledp.cli ...), relay their output, print the estimate, stop everything. Each party tries "
        "its first connection to the broker again, with back-off, for up to 30 s (a broker restarting meanwhile "
        "does not end it), and re-establishes a lost connection for as long as it runs. Exit status 0 "
        "only if every party succeeded. With --seed S the estimate is exactly that of `shuffledp simulate --seed S` "
        "with the same data model, -n, -m and --epsilon0. Needs the mosquitto binaries (nats-server with --broker-nodes).",
    )
    from shuffledp.simulation.population import DISTRIBUTIONS

    up.add_argument("--users", "-n", type=int, default=UP_DEFAULT_USERS, help="simulated users")
    up.add_argument("--samples", "-m", type=int, default=50, help="samples per user m")
    up.add_argument("--distribution", choices=DISTRIBUTIONS, default="gaussian", help="data distribution")
    up.add_argument("--mu", type=float, default=1.7, help="distribution mean parameter")
    up.add_argument("--sigma", type=float, default=1.0, help="distribution spread parameter")
    up.add_argument("--bound", "-B", type=float, default=20.0, help="data bound B")
    up.add_argument("--epsilon0", "-e", type=float, default=1.0, help="local budget eps0 of the session")
    deprecated_alias(up, "--epsilon", "--epsilon0")
    up.add_argument("--delta", type=central_delta_arg, default=None, help=delta_help("central delta of the analyzer's privacy report"))
    up.add_argument("--seed", type=int, default=None,
                    help="seed the simulated data and the devices' randomizer draws: the estimate is then exactly "
                    "that of `shuffledp simulate --seed` with the same parameters; without it the data are fresh "
                    "and every device draws its noise from the OS CSPRNG")
    up.add_argument("--dir", type=Path, default=None, metavar="DIR",
                    help="deployment directory, kept afterwards (must be empty or new); default: a temporary one")
    up.add_argument("--keep", action="store_true", help="keep the temporary deployment directory")
    up.add_argument("--round-timeout", type=float, default=60.0, metavar="S", help="each round's deadline")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S", help="stop everything after S seconds")
    up.add_argument("--broker-nodes", type=int, default=1, metavar="N",
                    help="1: one mosquitto (default); N >= 3: a cluster of N NATS servers with MQTT and JetStream on "
                    "this host (shuffledp.deploy.nats_cluster: TLS, passwords, ACL by role, retained messages and "
                    "sessions replicated to 3 nodes); each party is given every node and moves to the next "
                    "when its node dies. Needs the nats-server binary")
    add_json_option(up, "the outcome (the estimate, the analyzer's result, the fleet's summary, exit statuses)")
    up.set_defaults(func=_up)


def _sayer(out):
    """Progress lines, ``[up] TEXT``, on ``out`` (stdout; stderr with ``--json``)."""

    def say(text: str) -> None:
        print(f"[up] {text}", file=out, flush=True)

    return say


async def _relay(name: str, stream: asyncio.StreamReader, out=None) -> None:
    while True:
        line = await stream.readline()
        if not line:
            return
        print(f"[{name}] {line.decode('utf-8', 'replace').rstrip()}", file=out or sys.stdout, flush=True)


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
    from shuffledp.deploy.nats_cluster import SUBSCRIBE_QOS, NatsCluster
    from shuffledp.deploy.keys import init_keys
    from shuffledp.simulation.population import Population
    from shuffledp.simulation import SimulationConfig

    progress = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the JSON document only
    say = _sayer(progress)
    if args.users < 2:
        raise UsageError("--users: need at least 2")
    if args.seed is not None and args.seed < 0:
        raise UsageError("--seed: must be >= 0")
    if args.broker_nodes != 1 and args.broker_nodes < 3:
        raise UsageError("--broker-nodes: 1 (mosquitto) or at least 3 (a NATS cluster keeps a quorum of its "
                         "replicas when one node dies only from 3 nodes on)")
    # The configuration `shuffledp simulate` builds from the same options (it checks the data model and
    # derives the radius tau), so the analyzer runs the protocol simulate runs.
    population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
    simulated = SimulationConfig(population=population, n=args.users, epsilon0=args.epsilon0)
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
    broker: Broker | NatsCluster | None = None
    processes: dict[str, asyncio.subprocess.Process] = {}
    relays: list[asyncio.Task] = []
    codes: dict[str, int | None] = {}
    interrupted = False
    try:
        say(f"deployment directory {base}")
        public = init_keys(base / "keys", clients=args.users)
        say(f"keys: session {public.session_id.hex()}, {args.users} client credentials (keys/, private files 0600)")
        say(f"data and randomizer draws seeded with --seed {args.seed}, as `shuffledp simulate --seed {args.seed}`"
             if args.seed is not None else "fresh data; every device draws its noise from the OS CSPRNG")
        # Started from this (the main) thread: Linux sends the parent death signal when the
        # thread that forked a child ends, and this one lasts as long as `up`.
        if args.broker_nodes == 1:
            broker = Broker(base / "broker", users=BrokerUsers.default(), die_with_parent=True)
        else:
            broker = NatsCluster(base / "broker", nodes=args.broker_nodes, users=BrokerUsers.default(), die_with_parent=True)
        try:
            broker.start()
        except BrokerError as exc:
            raise UsageError(f"cannot start {'mosquitto' if args.broker_nodes == 1 else 'the NATS cluster'}: {exc}") from None
        if isinstance(broker, NatsCluster):
            pids = [broker.pid(i) for i in range(broker.nodes)]
            for pid in pids:
                assert pid is not None
                watch(pid)
            say(f"broker: {broker.nodes} nats-server nodes (pids {', '.join(map(str, pids))}) on "
                f"{broker.broker_argument()} (MQTT over TLS 1.2+, passwords, ACL by role, {broker.replicas} replicas)")
            addresses = ["--broker", broker.broker_argument(), "--subscribe-qos", str(SUBSCRIBE_QOS)]
        else:
            assert broker.pid is not None
            watch(broker.pid)
            say(f"broker: mosquitto pid {broker.pid} on {broker.host}:{broker.port} (TLS 1.2+, passwords, ACL by role)")
            addresses = ["--broker", f"{broker.host}:{broker.port}"]
        secrets = base / "secrets"
        secrets.mkdir(mode=0o700)
        common = ["--keys", str(base / "keys"), *addresses, "--ca-file", str(broker.ca_file)]
        accounts = {}
        for role in ("analyzer", "shuffler", "client"):
            options = broker.channel_options(role)
            path = secrets / f"{role}.password"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"{options['password']}\n")
            accounts[role] = ["--username", str(options["username"]), "--password-file", str(path)]
        python = [sys.executable, "-m", "shuffledp.cli"]
        # On a cluster a node that dies can lose the analyzer's acknowledgement of a batch: the shuffler
        # publishes an unacknowledged batch again every few seconds, and the analyzer stays that long
        # after its last round to acknowledge it again (analyzer/ack_keeper.py).
        republish = ["--republish-interval", str(CLUSTER_REPUBLISH_INTERVAL)] if args.broker_nodes > 1 else []
        linger = ["--linger", str(2 * CLUSTER_REPUBLISH_INTERVAL)] if args.broker_nodes > 1 else []
        commands = {
            "shuffler": [*python, "shuffler", "serve", *common, *accounts["shuffler"], "--spool", str(base / "spool" / "shuffler.db"),
                         "--stats-file", str(base / "shuffler-stats.json"), "--stats-interval", "1", "--metrics-port", "0", *republish],
            "clients": [*python, "clients", "run", *common, *accounts["client"], "--users", str(args.users),
                        "--samples", str(args.samples), "--distribution", args.distribution, "--mu", repr(args.mu),
                        "--sigma", repr(args.sigma), "--bound", repr(args.bound), "--budget", repr(args.epsilon0),
                        *(["--seed", str(args.seed)] if args.seed is not None else []),
                        "--output", str(base / "clients.json")],
            "analyzer": [*python, "analyzer", "run", *common, *accounts["analyzer"], "--users", str(args.users),
                         "--samples", str(args.samples), "--bound", str(args.bound), "--tau", repr(tau),
                         "--epsilon0", str(args.epsilon0), "--round-timeout", str(args.round_timeout),
                         *(["--delta", repr(args.delta)] if args.delta is not None else []),
                         *linger, "--output", str(base / "result.json")],
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
            assert process.stdout is not None  # opened as a pipe
            relays.append(asyncio.create_task(_relay(name, process.stdout, progress)))
            say(f"{name}: pid {process.pid}")
        remaining = args.timeout - (time.monotonic() - started)
        codes["analyzer"] = await _wait(processes["analyzer"], max(1.0, remaining))
        if codes["analyzer"] is None:
            say(f"timed out after {args.timeout:g} s")
        # The fleet ends once the last round's outcome reaches it; it has nothing to wait for if the analyzer failed.
        codes["clients"] = await _wait(processes["clients"], 15.0 if codes["analyzer"] == 0 else 0.5)
        if codes["clients"] is None:
            codes["clients"] = await _stop(processes["clients"])
            codes["clients"] = codes["clients"] if codes["analyzer"] != 0 else EXIT_FAILED
        say("stopping the shuffler (SIGTERM)")
        codes["shuffler"] = await _stop(processes["shuffler"])
    except asyncio.CancelledError:
        say("interrupted: stopping everything")
        interrupted = True
    finally:
        for name in ("analyzer", "clients", "shuffler"):
            if name in processes:
                status = await _stop(processes[name])
                codes[name] = codes.get(name) if codes.get(name) is not None else status
        await asyncio.gather(*relays, return_exceptions=True)
        if broker is not None:
            await asyncio.to_thread(broker.stop)
            say("broker stopped")
    try:
        result = json.loads((base / "result.json").read_text()) if codes.get("analyzer") == 0 else None
        fleet = json.loads((base / "clients.json").read_text()) if (base / "clients.json").exists() else None
    except (OSError, ValueError):
        result = fleet = None
    if result is not None:
        truth = f"; true mean of the simulated data {fleet['true_mean']:.6f}, error {result['estimate'] - fleet['true_mean']:+.6f}" if fleet else ""
        say(f"estimate {result['estimate']:.6f} (standard error {result['standard_error']:.6f}, n = {result['reports']:,}){truth}")
    ok = not interrupted and all(codes.get(name) == 0 for name in ("analyzer", "clients", "shuffler"))
    say(
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
        say(f"kept {base} (keys, broker, spool/, shuffler-stats.json, result.json, clients.json)")
    if args.json:
        if args.delta is None:
            args.delta = default_delta(args.users)  # the analyzer's default: recorded with the parameters
        print(json_text({
            "ok": ok,
            "interrupted": interrupted,
            "exit_statuses": {name: codes.get(name) for name in ("analyzer", "clients", "shuffler")},
            "seconds": time.monotonic() - started,
            "directory": None if temporary and not args.keep else str(base),
            "estimate": result["estimate"] if result else None,
            "standard_error": result["standard_error"] if result else None,
            "true_mean": fleet["true_mean"] if fleet else None,
            "analyzer": result,
            "clients": fleet,
        }, args), flush=True)
    if interrupted:  # the one line on stderr of every command stopped by Ctrl-C (its transcript aside)
        print("shuffledp up: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK if ok else EXIT_FAILED


def _up(args: argparse.Namespace) -> int:
    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        on_signals(task.cancel)
        return await _up_async(args)

    return run_service("up", main)
