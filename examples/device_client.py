"""Embed the client randomizer in a device loop: read a sensor, answer the session's rounds.

The second user story: someone putting shuffledp on a device. A device holds four things,
set at enrolment: its credential (shown only to the shuffler), the analyzer's signing
key and the shuffler's signing key (pinned: it answers no round a stranger signs, and
no round naming another shuffler), and its privacy ledger (the budget it will spend, in
total, across rounds). Its loop, in :func:`device`:

1. read ``m`` sensor values (here: a simulated thermometer drifting around 21 °C);
2. wait for a signed round spec on the session's spec topic;
3. ``Client.answer(spec)``: verify the signature, check the budget, randomize the local
   mean (OS CSPRNG), pad and seal the report to the analyzer (HPKE), wrap it for the
   shuffler, charge the ledger; publish the envelope(s) to the round's reports topic;
4. read the shuffler's signed outcome of the round (``Client.settle_outcome``): anything on
   the outcome topic that is not the pinned shuffler's word on this round and spec is
   ignored, and a device that hears nothing by the round's deadline (plus a grace period)
   records the round as ``no-outcome`` and goes on.

A device also refuses rounds of another session (a broker can replay any signed spec it
has seen) and rounds whose batch promises fewer users than its floor (``min_batch_floor``:
the crowd the amplification relies on). It sends each envelope once; over a lossy broker,
keep envelopes until the shuffler's signed receipt names them, as ``shuffledp/deploy/fleet.py``
does.

The device code imports only ``shuffledp.client`` and the channel. To run on its own,
this script also starts an analyzer (coordinator) and a shuffler in the same event loop,
on the in-process channel; over MQTT the device code is the same with an
``MqttChannel`` (``shuffledp clients run`` is the fleet version)::

    python examples/device_client.py               # 2,000 devices
    python examples/device_client.py --devices 300
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from shuffledp.client import Client, PrivacyLedger, verified_spec
from shuffledp.protocol.transport.channel import outcome_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.size_cap import capped, note


def thermometer(device_id: int, m: int) -> np.ndarray:
    """``m`` readings of one device's sensor (simulated: each room has its own mean)."""
    rng = np.random.default_rng(device_id)
    return 21.0 + rng.normal(0.0, 1.5) + rng.normal(0.0, 0.3, size=m)


#: Seconds a device waits for a round's outcome after the round's deadline.
OUTCOME_GRACE = 30.0


async def device(channel, session_id: bytes, credential: bytes, analyzer_key: bytes, shuffler_signing_key: bytes,
                 shuffler_key: bytes, readings: np.ndarray, rounds: int, budget: float, min_batch_floor: int) -> list[str]:
    """One device's loop: answer ``rounds`` rounds with its readings; return each round's outcome."""
    ledger = PrivacyLedger(budget)
    # pins both of its shuffler's keys (a spec naming another signing or sealing key is refused),
    # and refuses rounds whose batch holds fewer than min_batch_floor users
    client = Client(readings, analyzer_key, ledger, credential=credential,
                    shuffler_signing_key=shuffler_signing_key, shuffler_key=shuffler_key, min_batch_floor=min_batch_floor)
    specs = await channel.subscribe(spec_topic(session_id))
    outcomes: list[str] = []
    try:
        while len(outcomes) < rounds:
            signed_spec = await specs.get()
            try:
                spec = verified_spec(signed_spec, analyzer_key)  # anything not signed by the analyzer is dropped
                if spec.session_id != session_id:
                    continue  # a genuine spec of another session, replayed here: not this device's round
                if (session_id, spec.round_id) in client.sent:
                    continue  # a re-delivered (retained) spec
                envelopes = client.answer(signed_spec)  # budget check, randomize, seal, wrap, charge the ledger
            except ShuffleDPError as exc:  # forged, expired, over budget, another shuffler: refuse, keep going
                print(f"device refused a round: {exc.reason}: {exc}")
                continue
            outcome = await channel.subscribe(outcome_topic(session_id, spec.round_id, client.instance_for(spec)))
            for envelope in envelopes:
                await channel.publish(reports_topic(session_id, spec.round_id, client.instance_for(spec)), envelope)
            outcomes.append(await _settled_outcome(client, outcome, spec.deadline))
            await outcome.close()
    finally:
        await specs.close()
    return outcomes


async def _settled_outcome(client: Client, outcome, deadline: float) -> str:
    """The round's outcome, from the first message on its topic that the pinned shuffler signed
    about this round and spec; ``no-outcome`` if none arrives by the deadline plus a grace period."""
    try:
        async with asyncio.timeout(max(0.0, deadline - time.time()) + OUTCOME_GRACE):
            while True:
                try:
                    return client.settle_outcome(await outcome.get()).outcome
                except ShuffleDPError:
                    continue  # forged, another round or spec, junk: not the shuffler's word
    except TimeoutError:
        return "no-outcome"


async def run(devices: int, m: int, epsilon: float) -> None:
    from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
    from shuffledp.deploy.deployment import Deployment
    from shuffledp.protocol.transport.channel import InProcessChannel

    channel = InProcessChannel()
    deployment = Deployment()  # the operator's keys; devices get only their credential and the public keys
    readings = [thermometer(i, m) for i in range(devices)]
    shuffler = deployment.shuffler(channel)
    coordinator = deployment.coordinator(channel, round_timeout=120.0)
    config = ScalarMeanConfig(bound=50.0, tau=2.0, epsilon0=epsilon)  # readings in [-50, 50] °C
    shuffler_task = asyncio.create_task(shuffler.serve())
    fleet = [
        asyncio.create_task(device(channel, deployment.session_id, deployment.enroll(), deployment.analyzer_signing_key,
                                   deployment.shuffler_keys.signing_public, deployment.shuffler_keys.hpke_public, r,
                                   rounds=2, budget=epsilon, min_batch_floor=devices // 2))
        for r in readings
    ]
    started = time.perf_counter()
    try:
        outcome, records = await coordinator.run_protocol(ScalarMeanProtocol(config), devices)
        outcomes = await asyncio.gather(*fleet)
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
    truth = float(np.mean([r.mean() for r in readings]))
    print(f"{devices:,} devices, {m} readings each, eps0 = {epsilon:g} per device over both rounds "
          f"({time.perf_counter() - started:.1f} s)")
    print(f"  true mean of the devices' readings  {truth:.3f} °C")
    print(f"  estimate                            {outcome.mean.estimate:.3f} °C "
          f"(standard error {outcome.mean.standard_error:.3f}; range {outcome.found_range.lower:.1f} .. "
          f"{outcome.found_range.upper:.1f}, range check: {'trusted' if outcome.range_check.ok else 'not trusted'})")
    print(f"  rounds per device: {sorted({tuple(o) for o in outcomes})}; batches {[r.smallest_batch for r in records]}")


def main(argv: list[str] | None = None) -> int:
    from shuffledp.cli.common import deprecated_alias  # the command line only: the device code needs no CLI

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--readings", type=int, default=24, help="sensor readings per device (m)")
    parser.add_argument("--epsilon0", "-e", type=float, default=2.0, help="each device's local budget eps0")
    deprecated_alias(parser, "--epsilon", "--epsilon0")  # the shuffledp commands' spelling (docs/cli.md)
    args = parser.parse_args(argv)
    devices = capped(args.devices)  # SHUFFLEDP_SIZE_CAP (README, testing)
    note([f"--devices {args.devices} -> {devices}"] if devices != args.devices else [], "device_client.py")
    asyncio.run(run(devices, args.readings, args.epsilon0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
