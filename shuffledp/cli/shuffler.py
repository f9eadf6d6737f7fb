"""``shuffledp shuffler serve``: the shuffler as a long-running service.

Runs :class:`~shuffledp.shuffler.service.Shuffler` on a file-backed
:class:`~shuffledp.shuffler.spool.SqliteSpool`: killed (even with ``kill -9``) and restarted
on the same spool, it resumes open rounds with every admitted envelope, re-publishes
unacknowledged batches, and never re-opens a released round. It logs one line per round
outcome and a periodic stats line (on stderr), writes :meth:`Shuffler.stats` as JSON
(atomically: temporary file, then rename) to ``--stats-file``, and serves Prometheus metrics
(:mod:`shuffledp.shuffler.metrics`). SIGTERM or SIGINT stops it cleanly: final stats written
(and printed with ``--json``), spool closed, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from shuffledp.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    HelpFormatter,
    UsageError,
    add_broker_options,
    add_json_option,
    json_text,
    mqtt_channel,
    on_signals,
    run_service,
    setup_logging,
    transport_stats,
    write_json_atomic,
)


def add_parser(subparsers) -> None:
    fmt = HelpFormatter

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
        "http://--metrics-host:--metrics-port/metrics. SIGTERM/SIGINT stop it cleanly (final stats written, and "
        "printed as JSON with --json; the log is on stderr). "
        "Reads shuffler.key, issuer.key and public.json only.",
    )
    serve.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    add_broker_options(serve, "shuffler")
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
    add_json_option(serve, "the final stats, on stopping,")
    serve.set_defaults(func=_shuffler_serve)


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
    from shuffledp.cli.run_info import with_run_info

    log = setup_logging("shuffler", args.verbose)
    if args.stats_interval <= 0 or args.log_interval <= 0:
        raise UsageError("--stats-interval and --log-interval must be > 0")
    side = load_shuffler(args.keys)
    channel = mqtt_channel(args, "shuffler")
    # The analyzer's announcements and acknowledgements on a connection of their own, whose broker
    # queue no client account can fill (see Shuffler): the same account, a second client id.
    control = channel.companion("control")
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
                instance=args.instance, workers=args.workers, control_channel=control,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None

        def snapshot() -> dict[str, Any]:
            stats = shuffler.stats()
            stats.update(transport=transport_stats(channel), control_transport=transport_stats(control), instance=args.instance, spool=str(args.spool),
                         pid=os.getpid(), written_at=time.time())
            return with_run_info(stats, args)

        if args.metrics_port is not None:
            metrics = MetricsServer(lambda: render_metrics(shuffler.stats(), transport_stats(channel)),
                                    host=args.metrics_host, port=args.metrics_port)
            try:
                await metrics.start()
            except OSError as exc:
                metrics = None
                raise UsageError(f"--metrics-port: cannot listen on {args.metrics_host}:{args.metrics_port} ({exc})") from None
        await channel.connect()
        await control.connect()
        log.info(
            "serving session %s (instance %d) on %s%s; spool %s: %d open round(s) to resume, %d unacknowledged batch(es)%s",
            side.session_id.hex(), args.instance, channel.address, " (TLS)" if args.ca_file else "", args.spool,
            len(resumable), len(unacked), f"; metrics on {metrics.url}" if metrics else "",
        )
        stop = asyncio.Event()
        on_signals(stop.set)
        serve = asyncio.create_task(shuffler.serve(), name="shuffler-serve")
        changes = _ChangeLog(log)
        watch = asyncio.create_task(_watch_shuffler(snapshot, args, log, changes), name="shuffler-watch")
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
            changes.update(final)  # what changed since the watcher's last look is logged too
            if args.stats_file is not None:
                write_json_atomic(args.stats_file, final)
            log.info(_stats_line(final))
        log.info("stopped%s", f"; final stats in {args.stats_file}" if args.stats_file else "")
        if args.json:
            print(json_text(final), flush=True)
        return status
    finally:
        if metrics is not None:
            await metrics.close()
        for opened in (control, channel):
            try:
                await opened.close()
            except TransportError:
                pass
        spool.close()


class _ChangeLog:
    """Logs each round's changes of outcome, re-published batches and acknowledgements of earlier
    batches, each once, from successive stats snapshots."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.seen: dict[int, str] = {}
        self.republished = 0
        self.earlier_acks = 0

    def update(self, stats: dict[str, Any]) -> None:
        for r in stats["rounds"]:
            before = self.seen.get(r["round_id"])
            if before == r["outcome"]:
                continue
            if r["outcome"] == "served" and before not in ("forwarded",):
                self.log.info(_round_line({**r, "outcome": "forwarded"}))
            self.log.info(_round_line(r))
            self.seen[r["round_id"]] = r["outcome"]
        if stats["republished_batches"] > self.republished:
            self.log.info("re-published %d unacknowledged batch(es)", stats["republished_batches"] - self.republished)
            self.republished = stats["republished_batches"]
        # Acks of batches released before this process started (rounds it never ran itself).
        earlier = stats["acknowledged_batches"] - sum(r["outcome"] == "served" for r in stats["rounds"])
        if earlier > self.earlier_acks:
            self.log.info("the analyzer acknowledged %d batch(es) released before this process started", earlier - self.earlier_acks)
            self.earlier_acks = earlier


async def _watch_shuffler(snapshot: Callable[[], dict[str, Any]], args: argparse.Namespace, log: logging.Logger,
                          changes: _ChangeLog) -> None:
    """Log each round's changes of outcome (``changes``), a stats line every --log-interval, the stats file every --stats-interval."""
    loop = asyncio.get_running_loop()
    next_write = loop.time()
    next_log = loop.time() + args.log_interval
    while True:
        stats = snapshot()
        changes.update(stats)
        now = loop.time()
        if args.stats_file is not None and now >= next_write:
            try:
                write_json_atomic(args.stats_file, stats)
            except OSError as exc:
                log.warning("cannot write %s: %s", args.stats_file, exc)
            next_write = now + args.stats_interval
        if now >= next_log:
            log.info(_stats_line(stats))
            next_log = now + args.log_interval
        await asyncio.sleep(min(0.2, args.stats_interval))


def _shuffler_serve(args: argparse.Namespace) -> int:
    return run_service("shuffler serve", lambda: _shuffler_serve_async(args))
