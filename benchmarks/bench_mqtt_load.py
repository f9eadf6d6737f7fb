"""Load over a real broker: envelopes admitted per second by the shuffler service over MQTT.

A real mosquitto (TLS, passwords, ACL: ``shuffledp.broker.Broker``) carries N
envelopes of one round from a publisher process (the client fleet, its envelopes
sealed beforehand: sealing is the devices' cost, not the shuffler's) to the
shuffler service, which opens, authenticates, de-duplicates, spools (SQLite, WAL,
a file) and receipts them, then releases the signed batch. Measured: the time from
the first envelope published to the batch leaving the shuffler.

Baseline in the same run: the same N payloads of the same size through the same
broker to a subscriber that only counts them. The ratio says how much of the
broker's own throughput the shuffler keeps up with. Target: at least 5,000
envelopes/s admitted. ``SHUFFLEDP_BENCH_PUBLISHERS`` (default 2) sets how many
publishing processes the fleet uses; everything shares this machine's cores.

Run: ``python benchmarks/bench_mqtt_load.py [N]``; writes benchmarks/results/mqtt_load.json.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import write_result

from shuffledp.broker import Broker
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deployment import Deployment
from shuffledp.protocol.channel import batch_topic, reports_topic, spec_topic
from shuffledp.protocol.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.mqtt_channel import MqttChannel
from shuffledp.protocol.randomness import SeededSource
from shuffledp.protocol.sealing import Sealer
from shuffledp.shuffler.spool import SqliteSpool


def _publish(host: str, port: int, options: dict, topic: str, payloads: list[bytes], start_at: float) -> None:
    """The fleet: one connection publishing every payload (QoS 1, a window of in-flight publishes)."""

    async def run() -> None:
        async with MqttChannel(host, port, **options) as channel:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            await channel.publish_many(topic, payloads, window=512)

    asyncio.run(run())


#: Publishing connections of the fleet (each its own process, as devices are separate).
PUBLISHERS = int(os.environ.get("SHUFFLEDP_BENCH_PUBLISHERS", "2"))


class _Fleet:
    def __init__(self, processes: list) -> None:
        self.processes = processes

    def join(self, timeout: float) -> None:
        for p in self.processes:
            p.join(timeout)


def _start_fleet(broker: Broker, topic: str, payloads: list[bytes]) -> tuple[_Fleet, float]:
    start_at = time.time() + 1.5
    ctx = multiprocessing.get_context("spawn")
    processes = [
        ctx.Process(
            target=_publish,
            args=(broker._connect_host(), broker.port, broker.channel_options("client"), topic, payloads[k::PUBLISHERS], start_at),
        )
        for k in range(PUBLISHERS)
    ]
    for p in processes:
        p.start()
    return _Fleet(processes), start_at


async def broker_baseline(broker: Broker, payloads: list[bytes]) -> float:
    """Seconds for the broker alone to carry ``payloads`` to a counting subscriber."""
    topic = reports_topic(os.urandom(16), 0)
    async with MqttChannel(broker._connect_host(), broker.port, **broker.channel_options("shuffler")) as channel:
        sub = await channel.subscribe(topic)
        process, start_at = _start_fleet(broker, topic, payloads)
        received = 0
        while received < len(payloads):
            await sub.get()
            received += 1 + len(sub.get_nowait_all())
        elapsed = time.time() - start_at
    process.join(30)
    return elapsed


async def shuffler_run(broker: Broker, deployment: Deployment, spec: RoundSpec, envelopes: list[bytes], spool_path: Path) -> dict:
    """Seconds from the first envelope published to the released batch, and the shuffler's stats."""
    host = broker._connect_host()
    signed = deployment.analyzer().sign_spec(spec)
    async with MqttChannel(host, broker.port, **broker.channel_options("shuffler")) as shuffler_channel, MqttChannel(
        host, broker.port, **broker.channel_options("analyzer")
    ) as analyzer_channel:
        shuffler = deployment.shuffler(shuffler_channel, spool=SqliteSpool(spool_path))
        batches = await analyzer_channel.subscribe(batch_topic(spec.session_id, spec.round_id))
        specs = await analyzer_channel.subscribe(spec_topic(spec.session_id))
        task = asyncio.create_task(shuffler.run_round(spec, signed))
        await asyncio.wait_for(specs.get(), 10)  # the round is open
        process, start_at = _start_fleet(broker, reports_topic(spec.session_id, spec.round_id), envelopes)
        await asyncio.wait_for(batches.get(), 600)
        released = time.time()
        stats = await task
    process.join(30)
    return {"seconds": released - start_at, "admitted": stats.admitted, "rejected": dict(stats.rejected)}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    deployment = Deployment()
    analyzer = deployment.analyzer()
    spec = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
        analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=n, max_batch=n,
        deadline=time.time() + 3600,
    )
    print(f"sealing {n:,} envelopes ...", file=sys.stderr)
    source, sealer = SeededSource(1), Sealer(spec.analyzer_key)
    means = np.random.default_rng(0).normal(1.7, 0.3, n)
    envelopes = [deployment.client(np.array([y]), PrivacyLedger(1.0), source=source).answer_verified(spec, sealer)[0] for y in means]
    with tempfile.TemporaryDirectory() as work, Broker(Path(work) / "broker") as broker:
        print("broker baseline ...", file=sys.stderr)
        t_broker = asyncio.run(broker_baseline(broker, envelopes))
        print("shuffler over MQTT ...", file=sys.stderr)
        run = asyncio.run(shuffler_run(broker, deployment, spec, envelopes, Path(work) / "spool.db"))
    assert run["admitted"] == n, run
    result = {
        "n": n,
        "envelope_bytes": len(envelopes[0]),
        "broker_only_per_s": n / t_broker,
        "shuffler_admitted_per_s": n / run["seconds"],
        "shuffler_to_broker_ratio": t_broker / run["seconds"],
        "target_per_s": 5000,
        "publishers": PUBLISHERS,
        "rejected": run["rejected"],
    }
    path = write_result("mqtt_load", result)
    print(f"MQTT load, {n:,} envelopes of {result['envelope_bytes']} B from {PUBLISHERS} publishing processes, "
          f"TLS + passwords + ACL, spool on disk, {os.cpu_count()} CPUs")
    print(f"  broker alone (baseline)        {result['broker_only_per_s']:>10,.0f} /s")
    print(f"  shuffler admitted over MQTT    {result['shuffler_admitted_per_s']:>10,.0f} /s "
          f"= {100 * result['shuffler_to_broker_ratio']:.0f} % of the broker alone (target >= 5,000 /s)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
