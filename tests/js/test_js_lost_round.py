"""JavaScript devices learn of a round lost after its release, end to end, with the real shuffler.

An analyzer that never acknowledges a released batch makes the shuffler give the batch up
``ack_timeout`` after the round's deadline: it signs a second outcome for the round, ``failed``
(``not-acknowledged``), retained over the ``released`` one. A JavaScript device session
(``DeviceSession``, ``js/src/transport/mqtt.ts``) keeps the outcome subscription of a released
round for its ``follow`` period, and every device then records the round as lost in its ledger
(still charged), as the Python fleet does (``tests/mqtt/test_fleet_lost_round.py``).

Real parties over a real mosquitto (TLS, passwords, ACL by role): the shuffler (:class:`Shuffler`
with a short ``ack_timeout``) on its account, the JavaScript devices (``js/test/support/device.mjs``,
one FileLedger each in a temporary folder) on two client accounts; the "analyzer" only signs and
announces the spec, and never acknowledges anything. The test reads the devices' ledger files.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.keys import init_keys, load_analyzer, load_shuffler
from shuffledp.protocol.transport.channel import announce_topic, outcome_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified

from parties import make_spec

from .conftest import JS, _node
from .services import password_file, start_broker

pytestmark = pytest.mark.mqtt

USERS = 6
JS_ACCOUNTS = ("js-lost-1", "js-lost-2")
#: Seconds from the round's announcement to its deadline, after the devices are connected and waiting
#: (they answer well within it: the batch is released once all USERS envelopes are in, at max_batch).
#: The shuffler gives the batch up ACK_TIMEOUT after the deadline, so the test waits this out.
ROUND_SECONDS = 2.0
ACK_TIMEOUT = 0.3
#: The devices' follow period (ms): a safety bound only, they stop once the round failed.
FOLLOW_MS = 20_000
#: Safety limits only: every wait below ends on a message or a process exit.
LIMIT = 30


@pytest.fixture(scope="module")
def broker():
    b = start_broker(JS_ACCOUNTS)
    yield b
    b.close()


def _channel(broker, role: str) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(role))


async def _outcomes(subscription, deployment, words: list[str]) -> RoundOutcome:
    """Collect the round's signed outcomes in ``words`` until the ``failed`` one."""
    while True:
        outcome = decode_verified(await subscription.get(), RoundOutcome, deployment.shuffler_keys.signing_public)
        words.append(outcome.outcome)
        if outcome.outcome == "failed":
            return outcome


async def _ready(stream, lines: list[str]) -> None:
    """Read the devices' log until they say they are connected and waiting for rounds."""
    while True:
        line = await stream.readline()
        if not line:
            raise AssertionError("the JavaScript devices exited before connecting:\n" + "".join(lines))
        lines.append(line.decode(errors="replace"))
        if "waiting for" in lines[-1]:
            return


async def _drain(stream, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace"))


async def test_every_javascript_ledger_records_a_released_round_the_shuffler_then_gave_up(js_package, broker, tmp_path):
    keys = tmp_path / "keys"
    init_keys(keys, clients=USERS)
    shuffler_side, analyzer_side = load_shuffler(keys), load_analyzer(keys)
    deployment = Deployment(analyzer_keys=analyzer_side.analyzer_keys, shuffler_keys=shuffler_side.shuffler_keys,
                            issuer=shuffler_side.issuer, session_id=shuffler_side.session_id)
    sid = deployment.session_id
    (tmp_path / "data.json").write_text(json.dumps([0.5 * i - 1.0 for i in range(USERS)]))
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    accounts = [f"--account={name}:{password_file(broker, tmp_path, name)}" for name in JS_ACCOUNTS]
    devices = await asyncio.create_subprocess_exec(
        _node(), str(JS / "test" / "support" / "device.mjs"), "--keys", str(keys), "--count", str(USERS),
        "--broker", f"mqtts://{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file), *accounts,
        "--data", str(tmp_path / "data.json"), "--rounds", "1", "--budget", "2", "--retry-interval", "500",
        "--follow", str(FOLLOW_MS), "--ledger-dir", str(ledgers), "--expect", "lost", "--timeout", str(LIMIT),
        cwd=JS, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    log: list[str] = []
    words: list[str] = []
    try:
        await asyncio.wait_for(_ready(devices.stderr, log), LIMIT)
        draining = asyncio.create_task(_drain(devices.stderr, log))
        async with _channel(broker, "shuffler") as shuffler_channel, _channel(broker, "analyzer") as analyzer_channel:
            shuffler = deployment.shuffler(shuffler_channel, ack_timeout=ACK_TIMEOUT, republish_interval=0.05)
            outcomes = await analyzer_channel.subscribe(outcome_topic(sid, 0))
            serving = asyncio.create_task(shuffler.serve())
            try:
                spec = make_spec(round_id=0, min_batch=USERS, max_batch=USERS, deadline=time.time() + ROUND_SECONDS,
                                 deployment=deployment)
                await analyzer_channel.publish(announce_topic(sid), deployment.analyzer().sign_spec(spec), retain=True)
                failed = await asyncio.wait_for(_outcomes(outcomes, deployment, words), LIMIT)
                stdout = await asyncio.wait_for(devices.stdout.read(), LIMIT)  # the summary, at exit
                await asyncio.wait_for(asyncio.gather(devices.wait(), draining), LIMIT)
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
    finally:
        if devices.returncode is None:
            devices.kill()
            await devices.wait()
    trace = "".join(log)
    # The shuffler released the batch, then gave it up: the analyzer never acknowledged it.
    assert words == ["released", "failed"], trace
    assert (failed.outcome, failed.reason) == ("failed", "not-acknowledged") and shuffler.expired == 1
    assert shuffler.rounds[0].admitted == USERS
    summary = json.loads(stdout)
    assert devices.returncode == 0 and summary["ok"] and not summary["timed_out"], trace
    # Each session's round: released first (its round ended then), failed afterwards.
    rounds = [r for session in summary["sessions"] for r in session["rounds"]]
    assert len(rounds) == len(JS_ACCOUNTS) and sum(r["admitted"] for r in rounds) == USERS, rounds
    assert all(r["outcomes"] == {"0": "failed:not-acknowledged"} for r in rounds), rounds
    assert all(s["badMessages"] == {} for s in summary["sessions"]), summary["sessions"]
    assert trace.count("[js round-ended] round 0: instance 0: released") == len(JS_ACCOUNTS), trace
    assert trace.count("[js round-lost]") == len(JS_ACCOUNTS), trace
    # Every device's ledger file: the round lost, and still charged.
    files = sorted(ledgers.glob("device-*.json"))
    assert len(files) == USERS
    for path in files:
        state = json.loads(path.read_text())
        assert state["outcomes"] == {f"{sid.hex()}/0": "failed:not-acknowledged"}, (path.name, state)
        assert state["answered"] == [f"{sid.hex()}/0"] and state["spentEpsilon"] == spec.epsilon0, (path.name, state)
