"""``shuffledp analyzer run``: the analyzer (coordinator) of one protocol session.

Runs :meth:`Coordinator.run_protocol` (the scalar range -> mean protocol) over the broker
and prints the estimate with per-round statistics, rounds numbered by their wire round id
(from 0); any failure (e.g. a batch below ``min_batch``) is one line on stderr and exit
status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any

from shuffledp.cli.common import (
    EXIT_OK,
    HelpFormatter,
    UsageError,
    add_broker_options,
    add_json_option,
    add_scalar_mean_options,
    default_delta,
    json_text,
    mqtt_channel,
    run_service,
    setup_logging,
    write_json_atomic,
)


def add_parser(subparsers) -> None:
    fmt = HelpFormatter

    analyzer = subparsers.add_parser("analyzer", help="run the analyzer (coordinator) against the shuffler",
                                     description="The analyzer as a command.")
    analyzer_sub = analyzer.add_subparsers(dest="analyzer_command", metavar="ACTION", required=True)
    run = analyzer_sub.add_parser(
        "run", aliases=["serve"], formatter_class=fmt, help="run one protocol session and print its estimate",
        description="Run the session in --keys: announce each round to the shuffler over the broker, open the "
        "signed batch it forwards, acknowledge it, and print the estimate with per-round statistics (reports "
        "opened, rejected reports and rejected batch messages by reason). A session runs once: if the broker "
        "shows one of its rounds already, the run is refused, unless it resumes the session from its state file "
        "(--state), which must then record that round with the same signed bytes. Any failure (e.g. a batch below min_batch) is "
        "one line on stderr and exit status 1. Reads analyzer.key and public.json only.",
    )
    run.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    add_broker_options(run, "analyzer")
    run.add_argument("--protocol", choices=("scalar-mean",), default="scalar-mean",
                     help="the protocol: scalar range -> mean (Girgis et al. 2022, Algorithm 1)")
    add_scalar_mean_options(run, analyzer=True)
    run.add_argument("--min-batch", type=int, default=None,
                     help="smallest batch of valid reports a round accepts (default: --users less a liveness margin of "
                          "max(8, users/100), at most half of them: so many junk or silent clients cannot fail a round)")
    run.add_argument("--max-batch", type=int, default=None,
                     help="largest batch (default: --users, so the shuffler releases as soon as every user has answered)")
    run.add_argument("--shuffler-instances", type=int, default=1,
                     help="shuffler instances per round (each must reach min_batch on its own)")
    run.add_argument("--round-timeout", type=float, default=60.0, metavar="S", help="each round's deadline, from its announcement")
    run.add_argument("--grace", type=float, default=5.0, metavar="S", help="extra wait for the batch after the deadline")
    run.add_argument("--linger", type=float, default=0.0, metavar="S",
                     help="seconds to stay after the last round, acknowledging again any batch the shuffler publishes "
                          "again (its acknowledgement was lost). On a broker cluster, where a node that dies can lose "
                          "an acknowledgement, set it above the shuffler's --republish-interval. Default 0: exit at once")
    run.add_argument("--workers", type=int, default=1, help="processes opening large batches")
    run.add_argument("--state", type=Path, default=None, metavar="FILE",
                     help="the session's durable state (SQLite, 0600; default KEYS/analyzer-state.db): a restarted "
                          "analyzer resumes its session from it and never announces a round twice (a file rolled back "
                          "from an older copy is refused: KEYS/analyzer-high-water.json, and the broker's retained "
                          "spec, remember the rounds announced)")
    add_json_option(run)
    run.add_argument("--output", type=Path, default=None, metavar="FILE", help="also write the JSON result here")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(func=_analyzer_run)


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


def _new_session_hint(args: argparse.Namespace) -> str:
    return f"create a new one with `shuffledp keys init {args.keys} --force` and restart the shuffler and clients"


def _open_session_store(args: argparse.Namespace, session_id: bytes, config: dict[str, Any]):
    """The analyzer's session file (``--state``, default ``KEYS/analyzer-state.db``, its round high-water
    mark in ``KEYS``) and whether this session is being resumed; a clear refusal if its parameters
    changed, a round of it failed, or the file no longer records a round the mark says was announced
    (it was rolled back or replaced)."""
    import sqlite3

    from shuffledp.analyzer.session_store import FAILED, HIGH_WATER_FILE, SessionMismatch, SessionStore
    from shuffledp.protocol.errors import InvalidParameter

    path = args.state if args.state is not None else Path(args.keys) / "analyzer-state.db"
    try:
        store = SessionStore(path, high_water=Path(args.keys) / HIGH_WATER_FILE)
        rolled_back = store.rolled_back(session_id)
    except (InvalidParameter, OSError, sqlite3.Error) as exc:
        raise UsageError(f"--state: cannot use {path}: {exc}") from None
    if rolled_back is not None:
        store.close()
        raise UsageError(
            f"session {session_id.hex()}: the state file {path} does not record round {rolled_back}, which this "
            f"analyzer announced (its high-water mark in {store.high_water_path}): the file was rolled back or "
            f"replaced, and a round id is never announced twice; {_new_session_hint(args)}")
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


async def _session_round_seen(channel, session_id: bytes, analyzer_signing_key: bytes) -> tuple[int, bytes] | None:
    """The round id and signed bytes of a spec of this session the broker still retains (signed by us), if any."""
    from shuffledp.client.client import verified_spec
    from shuffledp.protocol.transport.channel import spec_topic
    from shuffledp.protocol.errors import ShuffleDPError

    data = await channel.retained(spec_topic(session_id))
    if data is None:
        return None
    try:
        spec = verified_spec(data, analyzer_signing_key)
    except ShuffleDPError:
        return None  # not ours: says nothing about the session
    return (spec.round_id, data) if spec.session_id == session_id else None


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
    from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN, service_batch_bounds
    from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol, concentration_radius
    from shuffledp.analyzer.service import Analyzer
    from shuffledp.deploy.keys import load_analyzer
    from shuffledp.simulation import central_guarantee_at
    from shuffledp.protocol.errors import ShuffleDPError

    log = setup_logging("analyzer", args.verbose)
    if args.users < 2:
        raise UsageError("--users: need at least 2")
    if not 0 <= args.linger < math.inf:
        raise UsageError(f"--linger: must be a finite number of seconds >= 0, got {args.linger}")
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
    config = ScalarMeanConfig(bound=args.bound, tau=tau, epsilon0=args.epsilon0, delta0=args.delta0,
                              noise=args.noise, grid_levels=args.grid_levels)
    side = load_analyzer(args.keys)
    store, resumed = _open_session_store(args, side.session_id, {
        "protocol": args.protocol, "users": args.users, "min_batch": min_batch, "max_batch": max_batch,
        "shuffler_instances": args.shuffler_instances, "bound": config.bound, "tau": config.tau,
        "epsilon0": config.epsilon0, "delta0": config.delta0, "noise": config.noise, "grid_levels": config.grid_levels,
    })
    channel = mqtt_channel(args, "analyzer")
    started = time.time()
    analyzer = Analyzer(side.analyzer_keys, workers=args.workers)
    try:
        await channel.connect()
        # Fresh or resumed, the broker's word first: a spec of this session it retains (the shuffler relays
        # the latest round it opened) must be one this state file records, byte for byte; else the session
        # ran without this file, or the file was rolled back, and going on would sign a second spec for a round id.
        seen = await _session_round_seen(channel, side.session_id, side.analyzer_keys.signing_public)
        if seen is not None:
            seen_round, seen_bytes = seen
            stored = store.round(side.session_id, seen_round)
            if not resumed:  # run before, without this state file: it cannot be resumed
                raise UsageError(
                    f"session {side.session_id.hex()} already ran (the broker holds its round {seen_round}); a session "
                    f"runs once: {_new_session_hint(args)}")
            if stored is None or stored.signed_spec != seen_bytes:
                raise UsageError(
                    f"session {side.session_id.hex()}: the broker holds round {seen_round}'s spec, which the state file "
                    f"{store.path} does not record: the file was rolled back or replaced, and a round id is never "
                    f"announced twice; {_new_session_hint(args)}")
        if resumed:
            log.info("session %s: resuming from %s (%s)", side.session_id.hex(), store.path,
                     ", ".join(f"round {r.round_id} {r.state}" for r in store.rounds(side.session_id)) or "no round yet")
        coordinator = _coordinator_class()(
            channel, analyzer, side.shuffler_identity, session_id=side.session_id,
            round_timeout=args.round_timeout, grace=args.grace,
            max_batch=max_batch, shuffler_instances=args.shuffler_instances, store=store,
            batch_margin=NO_LIVENESS_MARGIN,  # the bounds above already hold the margin (service_batch_bounds)
        )
        log.info("session %s: scalar-mean with min_batch %d over %s", side.session_id.hex(), min_batch, channel.address)
        # The decoder's sums are correctly rounded: the estimate depends on the reports' multiset only, not on
        # the shuffler's order, so with the same data and draws it is `shuffledp simulate`'s to the last bit.
        outcome, records = await coordinator.run_protocol(ScalarMeanProtocol(config), min_batch)
        if args.linger > 0:
            log.info("session %s: staying %g s for batches published again (--linger)", side.session_id.hex(), args.linger)
            await asyncio.sleep(args.linger)
        await coordinator.close()
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
        # where tau came from, for the verdict's guarantee (alpha + gamma, or alpha for a user-given tau)
        "range_check": ({**outcome.range_check.as_dict(), "tau_from": "user" if args.tau is not None else "data model",
                         "gamma": None if args.tau is not None else args.gamma} if outcome.range_check else None),
        "rounds": rounds,
        "seconds": time.time() - started,
    }
    smallest = min(r["smallest_batch"] for r in rounds)
    if args.delta is None:
        args.delta = default_delta(args.users)  # recorded with the parameters
    result["central"] = {"accounted_at_n": smallest, **central_guarantee_at(config, smallest, args.delta)}
    from shuffledp.cli.run_info import with_run_info

    result = with_run_info(result, args)
    if args.output is not None:
        write_json_atomic(args.output, result)
    print(json_text(result) if args.json else format_analyzer_result(result), flush=True)
    return EXIT_OK


def _analyzer_run(args: argparse.Namespace) -> int:
    return run_service("analyzer run", lambda: _analyzer_run_async(args))
