"""Load: 10^5 reports from many devices through a real broker, end to end, against the in-process channel.

The devices' work (randomize, pad, seal to the analyzer, wrap for the shuffler) is
done first, on both cores, and timed on its own: on a real fleet every device seals
its own report in parallel. Then the same N envelopes go through each transport:

* **MQTT**: a real mosquitto (TLS, passwords, ACL: ``shuffledp.deploy.broker.Broker``);
  ``PUBLISHERS`` processes each publish the envelopes of N / PUBLISHERS devices on
  their own connection (QoS 1); the shuffler service (its own connection, a SQLite
  spool on disk) opens, authenticates, de-duplicates, spools and receipts every
  envelope, then releases the signed batch in chunks; the coordinator (its own
  connection) opens the chunks as they arrive and acknowledges. Timed from the first
  envelope published to the last report opened. "Lost" counts envelopes published
  and never admitted.
* **MQTT, packed**: the same, but each publisher sends its envelopes ``--per-message``
  to an MQTT message, back to back (``protocol/wire/envelope_packing.py``; by default as
  many as the broker's client payload limit of 4,096 bytes holds): as a gateway or a
  simulated fleet may. The shuffler splits them and judges every envelope on its own.
* **in-process**: the same shuffler and coordinator code over the in-process
  channel, fed the same envelopes from this process.

Baseline in the same run: the raw HPKE seal+open rate of all cores (two seals and two
opens per report, one process per core): the crypto floor of a report's whole path.
The in-process message path (the devices' sealing on all cores, then admission, then
opening on all cores) is compared with it. Targets: at least 5,000 reports/s over
MQTT end to end, and at least 0.85 of the in-process rate (one envelope per message, and
packed); the in-process message path within 2x of the raw rate. The publishers, the broker,
the shuffler and the coordinator share the machine's cores: the JSON records how many.

Run: ``python benchmarks/bench_mqtt_load.py [N] [--quick] [--out DIR]`` (default N = 100,000;
``--quick``: 100 reports, 2 publishers given 0.5 s instead of 2 s to start and connect before the
clock starts, so a quick run's MQTT rates may include their start-up); writes mqtt_load.json and a
bar chart, mqtt_load.png, into the output folder (default ``bench-out/``). ``--publishers`` (or
``SHUFFLEDP_BENCH_PUBLISHERS``) sets the number of publishing processes (default 4). Needs a
mosquitto binary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import arguments, parse, write_result

from shuffledp.analyzer.coordinator import RoundRecord
from shuffledp.deploy.broker import Broker, default_role_limits
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.protocol.transport.channel import InProcessChannel, reports_topic, spec_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire.envelope_packing import envelopes_per_message, pack_envelopes
from shuffledp.protocol.wire.sealing import SUITE, Sealer, report_info
from shuffledp.shuffler.spool import SqliteSpool

PUBLISHERS = int(os.environ.get("SHUFFLEDP_BENCH_PUBLISHERS", "4"))
QUICK = {"n": 100, "publishers": 2}
#: Seconds the publishing processes get to start and connect before the clock starts (they then
#: all publish at once); the quick run's is shorter (a smoke run: its rates are not the point).
HEAD_START, QUICK_HEAD_START = 2.0, 0.5


# ---------------------------------------------------------------- the devices' work, on every core
_SHARED: dict = {}  # the deployment and spec, inherited by forked sealing workers (keys do not pickle)


def _seal_share(args) -> list[bytes]:
    means, seed = args
    deployment, spec = _SHARED["deployment"], _SHARED["spec"]
    source, sealer = SeededSource(seed), Sealer(spec.analyzer_key)
    return [deployment.client(np.array([y]), PrivacyLedger(1.0), source=source).answer_verified(spec, sealer)[0] for y in means]


def load_round(n: int) -> tuple[Deployment, RoundSpec]:
    """A new deployment and its round 0 of exactly ``n`` Hadamard range reports, open for an hour."""
    deployment = Deployment()
    spec = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=n, max_batch=n,
        deadline=time.time() + 3600,
    )
    return deployment, spec


def seal_all(deployment: Deployment, spec: RoundSpec, n: int) -> tuple[list[bytes], float]:
    means = np.random.default_rng(0).normal(1.7, 0.3, n)
    workers = os.cpu_count() or 1
    _SHARED.update(deployment=deployment, spec=spec)
    shares = [(means[k::workers], k) for k in range(workers)]
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        parts = pool.map(_seal_share, shares)
    return [e for part in parts for e in part], time.perf_counter() - start


def _raw_seal_open(args) -> float:
    """Seconds for ``count`` reports' worth of raw HPKE: two seals and two opens each."""
    count, size = args
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    public, info, payload = key.public_key(), report_info(bytes(16), 0, bytes(32)), bytes(size)
    start = time.perf_counter()
    for _ in range(count):
        for _layer in range(2):
            SUITE.decrypt(SUITE.encrypt(payload, public, info=info), key, info=info)
    return time.perf_counter() - start


def raw_both_cores(n: int, size: int) -> float:
    workers = os.cpu_count() or 1
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_raw_seal_open, [(n // workers, size)] * workers)
    return time.perf_counter() - start


# ---------------------------------------------------------------- the two transports
def _publish(host: str, port: int, options: dict, topic: str, payloads: list[bytes], start_at: float) -> None:
    async def run() -> None:
        async with MqttChannel(host, port, **options) as channel:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            await channel.publish_many(topic, payloads, window=128)

    asyncio.run(run())


async def _serve_round(deployment: Deployment, spec: RoundSpec, shuffler_channel, analyzer_channel, feed, spool) -> tuple[RoundRecord, float, int]:
    """Open the round at the shuffler, start ``feed()``, return the record, the seconds and the shuffler's admitted count."""
    shuffler = deployment.shuffler(shuffler_channel, spool=spool, workers=os.cpu_count() or 1)  # outer opens on every core
    analyzer = deployment.analyzer(workers=None)  # opens large chunks on every core
    coordinator = deployment.coordinator(analyzer_channel, round_timeout=600.0, grace=60.0, analyzer=analyzer)
    specs = await analyzer_channel.subscribe(spec_topic(spec.session_id))
    receiving = asyncio.create_task(coordinator.receive_round(spec))
    serving = asyncio.create_task(shuffler.run_round(spec, deployment.analyzer().sign_spec(spec)))
    await asyncio.wait_for(specs.get(), 30)  # the round is open at the shuffler
    await asyncio.sleep(0.2)
    started = await feed()
    record = await asyncio.wait_for(receiving, 900)
    elapsed = time.time() - started
    stats = await serving
    analyzer.close()
    shuffler.close()
    return record, elapsed, stats.admitted


async def over_mqtt(broker: Broker, deployment: Deployment, spec: RoundSpec, envelopes: list[bytes], spool: Path,
                    publishers: int, per_message: int = 1, head_start: float = HEAD_START):
    """One round over ``broker``: ``publishers`` processes publish ``envelopes`` (``per_message`` to an MQTT
    message), all starting ``head_start`` seconds after they are launched (time to connect); the clock starts then."""
    host = broker._connect_host()
    topic = reports_topic(spec.session_id, spec.round_id)

    async def feed() -> float:
        start_at = time.time() + head_start  # every publisher connected and waiting
        ctx = multiprocessing.get_context("spawn")
        shares = [list(pack_envelopes(envelopes[k::publishers], per_message)) for k in range(publishers)]
        feed.processes = [
            ctx.Process(target=_publish, args=(host, broker.port, broker.channel_options("client"), topic, shares[k], start_at))
            for k in range(publishers)
        ]
        for p in feed.processes:
            p.start()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        return start_at

    async with MqttChannel(host, broker.port, **broker.channel_options("shuffler")) as s_ch, MqttChannel(
        host, broker.port, **broker.channel_options("analyzer")
    ) as a_ch:
        result = await _serve_round(deployment, spec, s_ch, a_ch, feed, SqliteSpool(spool))
    for p in feed.processes:
        p.join(60)
    return result


async def in_process(deployment: Deployment, spec: RoundSpec, envelopes: list[bytes], spool: Path):
    channel = InProcessChannel()
    topic = reports_topic(spec.session_id, spec.round_id)

    async def feed() -> float:
        started = time.time()

        async def push() -> None:
            for start in range(0, len(envelopes), 1024):
                for e in envelopes[start : start + 1024]:
                    await channel.publish(topic, e)
                await asyncio.sleep(0)  # let the shuffler work as devices keep sending

        feed.task = asyncio.create_task(push())
        return started

    return await _serve_round(deployment, spec, channel, channel, feed, SqliteSpool(spool))


def plot_rates(result: dict, path: Path) -> None:
    """Bars of reports per second for each path, the baseline and the target, from one run."""
    plt = pyplot()
    rows = [
        ("raw HPKE\n2 seals + 2 opens", result["raw_hpke_seal_open_per_s_all_cores"], "0.6"),
        ("devices' sealing", result["devices_seal_per_s_all_cores"], "tab:blue"),
        ("in-process\nadmitted to opened", result["in_process_reports_per_s_end_to_end"], "tab:green"),
        ("in-process message\npath incl. sealing", result["in_process_reports_per_s_with_sealing"], "tab:olive"),
        ("MQTT end to end\n(TLS, ACL, spool)", result["mqtt_reports_per_s_end_to_end"], "tab:red"),
        (f"MQTT, {result['per_message']} envelopes\nper message", result["mqtt_packed_reports_per_s_end_to_end"], "tab:purple"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([r[0] for r in rows], [r[1] for r in rows], color=[r[2] for r in rows])
    ax.axhline(result["targets"]["mqtt_reports_per_s"], color="tab:red", linestyle="--", linewidth=1, label="MQTT target")
    for i, (_, value, _) in enumerate(rows):
        ax.text(i, value, f"{value:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("reports per second")
    ax.set_title(f"{result['n']:,} reports on {result['cpus']} CPUs, same run (lost over MQTT: {result['mqtt_lost']})")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(loc="upper right", fontsize=8)
    save_figure(fig, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, quick=f"{QUICK['n']} reports, {QUICK['publishers']} publishers, a "
                                      f"{QUICK_HEAD_START:g} s head start (a smoke run)")
    parser.add_argument("n", nargs="?", type=int, default=100_000, help="reports in the round (default 100,000)")
    parser.add_argument("--publishers", type=int, default=PUBLISHERS, help="publishing processes (default %(default)s)")
    parser.add_argument("--per-message", type=int, default=None,
                        help="envelopes per MQTT message in the packed run (default: as many as the client payload limit holds)")
    args = parse(parser, argv)
    sizes = dict(QUICK) if args.quick else {"n": args.n, "publishers": args.publishers}
    n, publishers = sizes["n"], sizes["publishers"]
    head_start = QUICK_HEAD_START if args.quick else HEAD_START
    deployment, spec = load_round(n)
    with progress_bar(5, unit="step") as step:
        step("sealing (the devices' work)", 0)
        envelopes, t_seal = seal_all(deployment, spec, n)
        step("raw HPKE baseline", 1)
        t_raw = raw_both_cores(n, 80)
        step("over MQTT", 1)
        with tempfile.TemporaryDirectory() as work:
            limits = default_role_limits()  # every publishing process is one connection of the client account
            limits["client"] = dataclasses.replace(limits["client"], max_connections=publishers)
            per_message = args.per_message or envelopes_per_message(len(envelopes[0]), limits["client"].max_payload)
            with Broker(Path(work) / "broker", role_limits=limits) as broker:
                mqtt_record, t_mqtt, mqtt_admitted = asyncio.run(
                    over_mqtt(broker, deployment, spec, envelopes, Path(work) / "mqtt.db", publishers,
                              head_start=head_start)
                )
            step(f"over MQTT, {per_message} envelopes per message", 1)
            with Broker(Path(work) / "broker-packed", role_limits=limits) as broker:
                packed_record, t_packed, packed_admitted = asyncio.run(
                    over_mqtt(broker, deployment, spec, envelopes, Path(work) / "mqtt-packed.db", publishers, per_message,
                              head_start)
                )
            step("in-process", 1)
            local_record, t_local, local_admitted = asyncio.run(in_process(deployment, spec, envelopes, Path(work) / "local.db"))
            step("done", 1)
    result = {
        "n": n,
        "publishers": publishers,
        "cpus": os.cpu_count(),
        "envelope_bytes": len(envelopes[0]),
        "devices_seal_per_s_all_cores": n / t_seal,
        "raw_hpke_seal_open_per_s_all_cores": n / t_raw,
        "mqtt_reports_per_s_end_to_end": n / t_mqtt,
        "mqtt_lost": n - mqtt_admitted,
        "mqtt_opened": mqtt_record.opened.size,
        "in_process_reports_per_s_end_to_end": n / t_local,
        "in_process_opened": local_record.opened.size,
        "mqtt_to_in_process_ratio": t_local / t_mqtt,
        "per_message": per_message,
        "mqtt_packed_reports_per_s_end_to_end": n / t_packed,
        "mqtt_packed_lost": n - packed_admitted,
        "mqtt_packed_opened": packed_record.opened.size,
        "mqtt_packed_to_in_process_ratio": t_local / t_packed,
        "processes": {"publishers": publishers, "broker": 1, "shuffler": "1 (its outer opens on a pool of one worker per core)",
                      "coordinator": "1 (its inner opens on a pool of one worker per core)"},
        "in_process_reports_per_s_with_sealing": n / (t_seal + t_local),
        "in_process_to_raw_ratio": t_raw / (t_seal + t_local),
        "targets": {"mqtt_reports_per_s": 5000, "mqtt_to_in_process_ratio_at_least": 0.85, "in_process_to_raw_ratio_at_least": 0.5},
    }
    path = write_result(args, "mqtt_load", result, sizes=sizes)
    plot_rates(result, path.with_suffix(".png"))
    print(f"load: {n:,} reports, envelopes of {result['envelope_bytes']} B, {publishers} publishing processes, {result['cpus']} CPUs")
    print(f"  devices' sealing (all cores, done first)   {result['devices_seal_per_s_all_cores']:>9,.0f} /s")
    print(f"  raw HPKE 2x seal + 2x open (all cores)     {result['raw_hpke_seal_open_per_s_all_cores']:>9,.0f} /s (baseline)")
    print(f"  in-process, admitted to opened             {result['in_process_reports_per_s_end_to_end']:>9,.0f} /s")
    print(f"  in-process message path incl. sealing      {result['in_process_reports_per_s_with_sealing']:>9,.0f} /s "
          f"= {result['in_process_to_raw_ratio']:.2f} x raw (target >= 0.5, i.e. within 2x)")
    print(f"  MQTT (TLS, ACL, spool on disk), end to end {result['mqtt_reports_per_s_end_to_end']:>9,.0f} /s "
          f"= {result['mqtt_to_in_process_ratio']:.2f} x in-process (target >= 5,000 /s, >= 0.85 x); lost {result['mqtt_lost']}")
    print(f"  MQTT, {per_message} envelopes per message      {result['mqtt_packed_reports_per_s_end_to_end']:>9,.0f} /s "
          f"= {result['mqtt_packed_to_in_process_ratio']:.2f} x in-process; lost {result['mqtt_packed_lost']}")
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
