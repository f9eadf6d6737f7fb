"""``shuffledp clients run``: a simulated fleet of enrolled devices as one process.

The devices (:class:`~shuffledp.deploy.fleet.Fleet`) use the credentials enrolled in
``DIR/credentials.json`` (never ``issuer.key``: devices cannot mint credentials), pin the
analyzer's signing key and the shuffler's signing key from ``public.json``, and retransmit
envelopes the shuffler has not acknowledged. Each device draws its noise from the OS CSPRNG,
unless ``--seed`` makes the fleet a reproducible simulation (the data and draws of
``shuffledp simulate --seed``).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from pathlib import Path

from shuffledp.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    HelpFormatter,
    UsageError,
    add_broker_options,
    add_json_option,
    add_scalar_mean_options,
    json_text,
    mqtt_channel,
    on_signals,
    run_service,
    setup_logging,
    write_json_atomic,
)


def add_parser(subparsers) -> None:
    fmt = HelpFormatter

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
        "device draws from the OS CSPRNG. While it runs, and for --follow seconds after its last round, the fleet "
        "follows every released round's signed outcome: a batch the shuffler later gives up (the analyzer never "
        "acknowledged it) is recorded as lost in each device's ledger. Exits 0 once --rounds rounds were answered "
        "and released, 1 if one failed (or was lost after its release) or --timeout passed.",
    )
    fleet.add_argument("--keys", type=Path, required=True, metavar="DIR", help="key directory (shuffledp keys init)")
    add_broker_options(fleet, "client")
    add_scalar_mean_options(fleet, analyzer=False)
    fleet.add_argument("--budget", type=float, default=1.0, help="each device's local epsilon budget (its ledger)")
    fleet.add_argument("--delta-budget", type=float, default=0.0, help="each device's local delta budget")
    fleet.add_argument("--min-batch-floor", type=int, default=1, help="devices refuse rounds whose min_batch is below this")
    fleet.add_argument("--rounds", "-T", type=int, default=2, help="rounds to answer (scalar-mean has 2)")
    fleet.add_argument("--rate", type=float, default=0.0, help="envelopes per second per round (0: as fast as possible)")
    fleet.add_argument("--pack", type=int, default=8, metavar="K",
                       help="envelopes per MQTT message on first transmission, as one gateway for many devices "
                            "(1..64; 8 fits the broker's 4,096-byte client limit for every mechanism; 1: one each)")
    fleet.add_argument("--retry-interval", type=float, default=2.0, metavar="S",
                       help="seconds before an envelope without a receipt is sent again (doubling per copy)")
    fleet.add_argument("--follow", type=float, default=0.0, metavar="S",
                       help="after the last round ended, keep following released rounds' outcomes for S seconds, to "
                            "record a batch the shuffler gives up unacknowledged (its ack timeout, 600 s by default, "
                            "runs from the round's deadline); stops early once every followed round failed "
                            "(default 0: stop with the last round)")
    fleet.add_argument("--timeout", type=float, default=0.0, metavar="S", help="give up after S seconds (0: never)")
    fleet.add_argument("--output", type=Path, default=None, metavar="FILE", help="write a JSON summary here")
    fleet.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    add_json_option(fleet, "the summary")
    fleet.set_defaults(func=_clients_run)


async def _clients_run_async(args: argparse.Namespace) -> int:
    import numpy as np

    from shuffledp.client.client import Client
    from shuffledp.client.ledger import PrivacyLedger
    from shuffledp.deploy.fleet import Fleet, cancel_and_wait
    from shuffledp.simulation.engine import seeded_draw
    from shuffledp.deploy.keys import load_clients
    from shuffledp.simulation.population import Population, local_means
    from shuffledp.protocol.errors import ShuffleDPError

    log = setup_logging("clients", args.verbose)
    if (args.users < 1 or args.rounds < 1 or args.rate < 0 or args.retry_interval <= 0 or args.timeout < 0
            or not args.follow >= 0):
        raise UsageError("need --users >= 1, --rounds >= 1, --rate >= 0, --retry-interval > 0, --timeout >= 0, --follow >= 0")
    if not 1 <= args.pack <= 64:
        raise UsageError(f"--pack: must be in [1, 64], got {args.pack}")
    if args.seed is not None and args.seed < 0:
        raise UsageError("--seed: must be >= 0")
    side = load_clients(args.keys, args.users)
    population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
    # With --seed, the data and the draws of `shuffledp simulate --seed` (one shared definition of each);
    # without it, fresh data, and every device draws its own noise from the OS CSPRNG (Client's default source).
    seeded = args.seed is not None
    data_seed = args.seed if seeded else secrets.randbits(128)  # fresh entropy, as SeedSequence() draws it
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
    channel = mqtt_channel(args, "client")
    await channel.connect()
    fleet = Fleet(channel, side.session_id, clients, draw=seeded_draw(args.seed) if seeded else None,
                  rate=args.rate, retry_interval=args.retry_interval, pack=args.pack, on_event=log.info,
                  follow=args.follow)
    log.info("%d device(s) of session %s on %s, waiting for rounds (true mean of their data %.6f; %s)",
             args.users, side.session_id.hex(), channel.address, true_mean,
             f"data and draws seeded with --seed {args.seed}" if seeded else "draws from the OS CSPRNG")
    serve = asyncio.create_task(fleet.serve(args.rounds), name="fleet-serve")
    stop = asyncio.Event()
    on_signals(stop.set)
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
    from shuffledp.cli.run_info import with_run_info

    summary = with_run_info(summary, args)
    if args.output is not None:
        write_json_atomic(args.output, summary)
    if args.json:
        print(json_text(summary), flush=True)
        return EXIT_OK if ok else EXIT_FAILED
    print(f"fleet: {args.users} device(s), true mean of their data {true_mean:.6f}; "
          f"{sum(r.released for r in rounds)} of {args.rounds} round(s) released", flush=True)
    return EXIT_OK if ok else EXIT_FAILED


def _clients_run(args: argparse.Namespace) -> int:
    return run_service("clients run", lambda: _clients_run_async(args))
