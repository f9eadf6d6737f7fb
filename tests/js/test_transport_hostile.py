"""The JavaScript round loop (``js/src/transport/mqtt.ts``) refuses hostile messages and carries on.

JavaScript devices (``js/test/support/device.mjs``) serve a session of the real Python services
over a real broker while another connection of the shuffler's account (what a compromised
account, or a broker, could send) publishes on every topic the devices read: junk, oversized
payloads, specs and shuffler messages signed by a key nobody pinned, and messages signed by the
real shuffler key but about another spec, round or instance, among them a forged ``failed``
outcome. Each is refused and counted by reason, none ends a round or reaches a ledger, and both
rounds are released with every device's report.

The session has one user more than there are JavaScript devices, and that user (a Python
:class:`~shuffledp.deploy.fleet.Fleet` of one device) starts answering only once the hostile
messages are out: round 0 is released on its report (``max_batch`` is the session's users), so
the devices still follow round 0 when the hostile messages reach them (the broker queued those
to the devices before the last report was even sent), and no round waits out its deadline.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.deploy.keys import init_keys, load_clients, load_shuffler
from shuffledp.protocol.transport.channel import outcome_topic, receipts_topic, spec_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import AdmissionReceipts, RoundOutcome, SignedRoundSpec
from shuffledp.protocol.wire.onion import sign_spec_bytes, signed_encoding, verified_spec
from tests.parties import make_spec

from .conftest import JS, _node
from .services import CLI, broker_options, password_file, read_json, start, start_broker, tail

pytestmark = pytest.mark.mqtt

USERS = 20
#: Safety limits only: every wait ends on a process's exit or a message's arrival.
TIMEOUT = 120


@pytest.fixture
def broker():
    b = start_broker(("js-1",), websocket=True)
    yield b
    b.close()


def hostile_specs(session_id: bytes) -> list[bytes]:
    """Payloads for the spec topic: junk, an empty map, one over the signed spec's 25 KiB limit, and a
    well-formed spec of this session signed by an analyzer key no device pinned."""
    stranger = Deployment(session_id=session_id)
    spec = make_spec(round_id=7, deployment=stranger, epsilon0=0.25)
    spec_bytes = codec.encode(spec)
    forged = codec.encode(SignedRoundSpec(spec_bytes, sign_spec_bytes(stranger.analyzer_keys.signing_private, spec_bytes)))
    return [b"not cbor at all", b"\xa0", b"\xa0" * (26 * 1024), forged]


def hostile_round_messages(spec, shuffler_key: Ed25519PrivateKey) -> dict[str, list[bytes]]:
    """Payloads for round ``spec``'s receipts and outcome topics of instance 0."""
    stranger = Ed25519PrivateKey.generate()
    other_digest = bytes(32)
    zeros = bytes(16)

    def outcome(key, *, digest=spec.digest, round_id=spec.round_id, instance=0) -> bytes:
        return signed_encoding(key, RoundOutcome(spec.session_id, round_id, digest, "failed", "batch-too-small", 0, zeros,
                                                 instance))

    def receipts(key, *, round_id=spec.round_id) -> bytes:
        return signed_encoding(key, AdmissionReceipts(spec.session_id, round_id, spec.digest, (), (), ()))

    return {
        "receipts": [b"junk", receipts(stranger), receipts(shuffler_key, round_id=spec.round_id + 5)],
        "outcome": [b"junk", outcome(stranger), outcome(shuffler_key, digest=other_digest),
                    outcome(shuffler_key, instance=3)],
    }


def last_user(keys: Path, channel: MqttChannel) -> Fleet:
    """A fleet of one Python device holding the session's last credential (the one no JavaScript device holds)."""
    side = load_clients(keys)
    client = Client(np.array([1.0]), side.public.analyzer_signing_public, PrivacyLedger(1.0),
                    credential=side.credentials[USERS], shuffler_signing_key=side.public.shuffler.signing_public,
                    shuffler_key=side.public.shuffler.hpke_public)
    return Fleet(channel, side.session_id, [client], retry_interval=0.5)


async def test_hostile_messages_are_refused_counted_and_the_rounds_still_complete(js_package, broker, tmp_path, processes):
    keys = tmp_path / "keys"
    public = init_keys(keys, clients=USERS + 1)  # the JavaScript devices hold the first USERS credentials
    shuffler_key = load_shuffler(keys).shuffler_keys.signing_private
    (tmp_path / "data.json").write_text(json.dumps([1.0] * USERS))
    device = subprocess.Popen(
        [_node(), str(JS / "test" / "support" / "device.mjs"), "--keys", str(keys), "--count", str(USERS),
         "--broker", f"mqtts://{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file),
         f"--account=js-1:{password_file(broker, tmp_path, 'js-1')}", "--data", str(tmp_path / "data.json"),
         "--retry-interval", "1000", "--timeout", str(TIMEOUT), "--output", str(tmp_path / "js.json")],
        cwd=JS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    processes.append(device)
    lines: list[str] = []
    ready, following_round0 = threading.Event(), threading.Event()

    def read_log() -> None:
        for raw in device.stderr:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if "waiting for 2 round(s)" in line:
                ready.set()
            if "[js round-answered] round 0 " in line:  # subscribed to round 0's receipts and outcome, answered
                following_round0.set()
        ready.set()  # the process ended: the waits below return and the checks say why
        following_round0.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    assert await asyncio.to_thread(ready.wait, TIMEOUT) and device.poll() is None, "\n".join(lines)

    def failure(message: str) -> str:
        return "\n".join([message, "--- js ---", *lines[-80:], tail(tmp_path / "shuffler.log"), tail(tmp_path / "analyzer.log")])

    session = public.session_id
    async with MqttChannel(broker.host, broker.port, **broker.channel_options("shuffler")) as hostile, \
            MqttChannel(broker.host, broker.port, **broker.channel_options("analyzer")) as watcher, \
            MqttChannel(broker.host, broker.port, **broker.channel_options("client")) as python_device:
        for payload in hostile_specs(session):
            await hostile.publish(spec_topic(session), payload)
        specs = await watcher.subscribe(spec_topic(session))
        processes.append(start([*CLI, "shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                                "--spool", str(tmp_path / "spool.db")], tmp_path / "shuffler.log"))
        # One user more than there are devices: each round stays open until the last user's report,
        # which is sent only once the hostile messages below are out.
        analyzer = start([*CLI, "analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                          "--users", str(USERS + 1), "--round-timeout", "30", "--json",
                          "--output", str(tmp_path / "result.json")], tmp_path / "analyzer.log")
        processes.append(analyzer)
        while True:  # the shuffler's relayed spec of round 0 (the hostile ones above were not retained)
            spec = verified_spec(await asyncio.wait_for(specs.get(), TIMEOUT), public.analyzer_signing_public)
            if spec.round_id == 0:
                break
        assert await asyncio.to_thread(following_round0.wait, TIMEOUT) and device.poll() is None, failure("no answer")
        for kind, payloads in hostile_round_messages(spec, shuffler_key).items():
            topic = (receipts_topic if kind == "receipts" else outcome_topic)(session, 0, 0)
            for payload in payloads:
                await hostile.publish(topic, payload)
        last = asyncio.create_task(last_user(keys, python_device).serve(2))  # round 0 is released on its report
        try:
            assert await asyncio.to_thread(analyzer.wait, TIMEOUT) == 0, failure("the analyzer failed")
            last_rounds = await asyncio.wait_for(last, TIMEOUT)
        finally:
            last.cancel()
            await asyncio.gather(last, return_exceptions=True)
    assert [(r.admitted, r.released) for r in last_rounds] == [(1, True), (1, True)], failure(str(last_rounds))
    assert await asyncio.to_thread(device.wait, 60) == 0, failure("the devices did not see both rounds released")
    reader.join(10)

    summary = read_json(tmp_path / "js.json")
    (result,) = summary["sessions"]
    assert summary["ok"] and summary["devices_with_lost_rounds"] == 0, failure(json.dumps(summary))
    assert [(r["roundId"], r["admitted"], r["outcomes"]) for r in result["rounds"]] == [
        (0, USERS, {"0": "released"}), (1, USERS, {"0": "released"})], failure(json.dumps(result))
    assert result["badMessages"] == {
        "spec-malformed": 2,            # junk; an empty map (no fields)
        "spec-too-large": 1,            # over the signed spec's 25 KiB
        "spec-bad-signature": 1,        # a spec signed by an analyzer nobody pinned
        "receipts-malformed": 1,
        "receipts-bad-signature": 1,    # signed by a key that is not the spec's shuffler key
        "receipts-other-round": 1,      # the shuffler's signature, but about round 5
        "outcome-malformed": 1,
        "outcome-bad-signature": 1,     # a forged "failed" outcome: the round was not ended by it
        "outcome-other-spec": 1,        # the shuffler's signature, about another spec
        "outcome-other-round": 1,       # the shuffler's signature, but instance 3's outcome on instance 0's topic
    }, failure(json.dumps(result["badMessages"]))
    assert "internal-error" not in "\n".join(lines)


def test_a_refused_password_or_an_unknown_ca_is_one_typed_line_over_tls_and_wss(js_package, broker, tmp_path):
    keys = tmp_path / "keys"
    init_keys(keys, clients=1)
    (tmp_path / "data.json").write_text("[1.0]")
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not the password\n")
    wrong.chmod(0o600)
    other_ca = tmp_path / "other"
    from shuffledp.deploy.broker import generate_tls

    other_ca.mkdir()
    generate_tls(other_ca)

    def run(account: str, ca_file, url: str, timeout: str = "30") -> subprocess.CompletedProcess:
        return subprocess.run(
            [_node(), str(JS / "test" / "support" / "device.mjs"), "--keys", str(keys), "--count", "1",
             "--broker", url, "--ca-file", str(ca_file), f"--account={account}",
             "--data", str(tmp_path / "data.json"), "--timeout", timeout],
            cwd=JS, capture_output=True, text=True, timeout=60)

    right = f"js-1:{password_file(broker, tmp_path, 'js-1')}"
    for url in (f"mqtts://{broker.host}:{broker.port}", broker.websocket_url):
        refused = run(f"js-1:{wrong}", broker.ca_file, url)
        assert refused.returncode == 1 and "device.mjs: transport: not authorised" in refused.stderr, refused.stderr
        untrusted = run(right, other_ca / "ca.crt", url)
        assert untrusted.returncode == 1 and "TLS certificate verification failed" in untrusted.stderr, untrusted.stderr
        # Control: the right password and CA connect (no session runs here, so it stops at its --timeout,
        # which device.mjs counts from the moment its connections are open).
        connected = run(right, broker.ca_file, url, timeout="0.1")
        assert "[js connected] connected to" in connected.stderr and '"timed_out":true' in connected.stdout, connected.stderr
