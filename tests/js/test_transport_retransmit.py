"""JavaScript devices send again, byte for byte, what the shuffler has not receipted, and each report counts once.

The real shuffler is paused (SIGSTOP) as soon as it has relayed round 0's spec: the devices'
envelopes wait at the broker and no receipt comes, so the devices' round loop
(``js/src/transport/mqtt.ts``) sends every envelope again. Once it says so, the shuffler is
resumed: it reads originals and copies, admits each envelope once (an exact copy carries the
same nonce: it is named again, not admitted twice, and not refused as a replay, which a
re-sealed copy would be) and the analyzer opens exactly one report per device.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading

import pytest

from shuffledp.deploy.keys import init_keys
from shuffledp.protocol.transport.channel import spec_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.onion import verified_spec

from .conftest import JS, _node
from .services import CLI, broker_options, password_file, read_json, start, start_broker, tail

pytestmark = pytest.mark.mqtt

USERS = 40
#: Safety limits only: every wait ends on a process's exit, a message or a log line.
TIMEOUT = 120


@pytest.fixture
def broker():
    b = start_broker(("js-1",))
    yield b
    b.close()


async def test_unreceipted_envelopes_are_sent_again_and_admitted_once(js_package, broker, tmp_path, processes):
    keys = tmp_path / "keys"
    public = init_keys(keys, clients=USERS)
    (tmp_path / "data.json").write_text(json.dumps([0.5] * USERS))
    lines: list[str] = []

    def failure(message: str) -> str:
        return "\n".join([message, "--- js ---", *lines[-60:], tail(tmp_path / "shuffler.log"), tail(tmp_path / "analyzer.log")])

    session = public.session_id
    async with MqttChannel(broker.host, broker.port, **broker.channel_options("analyzer")) as watcher:
        specs = await watcher.subscribe(spec_topic(session))
        shuffler = start([*CLI, "shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                          "--spool", str(tmp_path / "spool.db")], tmp_path / "shuffler.log")
        processes.append(shuffler)
        analyzer = start([*CLI, "analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                          "--users", str(USERS), "--round-timeout", "60", "--json",
                          "--output", str(tmp_path / "result.json")], tmp_path / "analyzer.log")
        processes.append(analyzer)
        spec = verified_spec(await asyncio.wait_for(specs.get(), TIMEOUT), public.analyzer_signing_public)
        assert spec.round_id == 0
        # The shuffler relayed the spec (retained) and follows round 0's reports: pause it, then let the
        # devices come. They find the retained spec, answer, and get no receipt until it is resumed.
        os.kill(shuffler.pid, signal.SIGSTOP)
        try:
            device = subprocess.Popen(
                [_node(), str(JS / "test" / "support" / "device.mjs"), "--keys", str(keys), "--count", str(USERS),
                 "--broker", f"mqtts://{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file),
                 f"--account=js-1:{password_file(broker, tmp_path, 'js-1')}", "--data", str(tmp_path / "data.json"),
                 "--retry-interval", "300", "--timeout", str(TIMEOUT), "--output", str(tmp_path / "js.json")],
                cwd=JS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            processes.append(device)
            resent = threading.Event()

            def read_log() -> None:
                copies = 0
                for raw in device.stderr:
                    line = raw.decode(errors="replace").rstrip()
                    lines.append(line)
                    again = re.match(r"\[js retransmitted\] round 0: sent (\d+) envelope", line)
                    copies += int(again.group(1)) if again else 0
                    if copies >= USERS:  # as many copies as envelopes (each sent again, or some twice)
                        resent.set()
                resent.set()  # the process ended: the wait returns and the check says why

            threading.Thread(target=read_log, daemon=True).start()
            assert await asyncio.to_thread(resent.wait, TIMEOUT) and device.poll() is None, failure("nothing sent again")
        finally:
            os.kill(shuffler.pid, signal.SIGCONT)
        assert await asyncio.to_thread(analyzer.wait, TIMEOUT) == 0, failure("the analyzer failed")
    assert await asyncio.to_thread(device.wait, 60) == 0, failure("the devices did not see both rounds released")

    result = read_json(tmp_path / "result.json")
    for r in result["rounds"]:  # one report per device: no copy reached the batch
        assert r["reports"] == USERS and r["batch_sizes"] == [USERS] and r["rejected_reports"] == {}, failure(str(r))
    (session_result,) = read_json(tmp_path / "js.json")["sessions"]
    round0 = session_result["rounds"][0]
    assert round0["retransmitted"] >= USERS, failure(json.dumps(round0))  # as many copies as envelopes, or more
    # Each envelope counted once however many copies: admitted, none refused (no "replay": the same bytes).
    assert (round0["sent"], round0["admitted"], round0["refused"], round0["unacknowledged"]) == (USERS, USERS, {}, 0)
    assert session_result["badMessages"] == {}
    # The shuffler saw the copies and recognised each as a copy of an envelope it had (its nonce, its bytes).
    counted = re.search(rf"round 0 released: {USERS} admitted \((\d+) retransmission\(s\) counted once",
                        (tmp_path / "shuffler.log").read_text())
    assert counted and int(counted.group(1)) >= 1, failure("the shuffler counted no copy")
