"""Delivery latency of large messages through a real authenticated TLS mosquitto.

Each round opens a shuffler and an analyzer channel, subscribes the analyzer to a
batch topic, publishes one message of ``--mib`` MiB and times its delivery. A
delivery slower than ``--slow`` seconds is reported with the state of the
receiver's paho client (a whole packet read but not handled means the read loop
stalled; see :func:`shuffledp.protocol.transport.mqtt_channel.handle_completed_packets`).

Stalls appear under CPU load, so run it with ``--load`` (busy processes beside it)::

    python scripts/mqtt_large_message_soak.py --rounds 200 --load 3   # ~2-5 min

Exit status 1 if any delivery was slower than ``--slow``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time

from tqdm import tqdm

from shuffledp.deploy.broker import Broker, BrokerUsers
from shuffledp.protocol.transport.channel import batch_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

TOPIC = batch_topic(bytes.fromhex("00aa"), 0)


def _spin() -> None:
    while True:
        pass


def _receiver_state(channel: MqttChannel) -> str:
    conn = channel._conn
    if conn is None:
        return "no connection"
    packet = conn.client._client._in_packet
    return f"paho in-packet: command {packet['command']:#x}, {len(packet['packet'])} bytes read, {packet['to_process']} to read"


async def soak(broker: Broker, rounds: int, mib: int, slow: float) -> list[float]:
    payload = bytes(range(256)) * (mib * 4096)
    latencies: list[float] = []
    for round_ in tqdm(range(rounds), desc=f"{mib} MiB deliveries", unit="msg"):
        async with MqttChannel(broker.host, broker.port, **broker.channel_options("shuffler")) as sender, MqttChannel(
            broker.host, broker.port, **broker.channel_options("analyzer")
        ) as receiver:
            subscription = await receiver.subscribe(TOPIC)
            start = time.perf_counter()
            await sender.publish(TOPIC, payload)
            try:
                got = await asyncio.wait_for(subscription.get(), timeout=slow)
            except asyncio.TimeoutError:
                tqdm.write(f"round {round_}: no delivery within {slow:g} s; {_receiver_state(receiver)}")
                got = await asyncio.wait_for(subscription.get(), timeout=120)
            latencies.append(time.perf_counter() - start)
            if got != payload:
                raise SystemExit(f"round {round_}: the payload arrived altered")
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--mib", type=int, default=8, help="message size, MiB")
    parser.add_argument("--slow", type=float, default=5.0, help="a delivery slower than this (s) is a failure")
    parser.add_argument("--load", type=int, default=0, help="busy processes to run beside it")
    args = parser.parse_args(argv)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for process in spinners:
        process.start()
    broker = Broker(users=BrokerUsers.default(("client",)))
    broker.start()
    try:
        latencies = asyncio.run(soak(broker, args.rounds, args.mib, args.slow))
    finally:
        broker.close()
        for process in spinners:
            process.terminate()
    latencies.sort()
    slow = sum(t > args.slow for t in latencies)
    print(
        f"{len(latencies)} deliveries of {args.mib} MiB: median {latencies[len(latencies) // 2]:.3f} s, "
        f"worst {latencies[-1]:.3f} s; {slow} slower than {args.slow:g} s"
    )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
