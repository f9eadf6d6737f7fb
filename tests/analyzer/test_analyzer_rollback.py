"""An analyzer whose state file is rolled back never signs a second spec for a round id.

The session file records each round before it is announced, so a restarted analyzer serves
a round again under the very same signed bytes. A copy of that file restored from before a
round was recorded would let it sign a *new* spec for that round id. Two things stop it:

* the round high-water mark, kept outside the state file (by default beside it; for
  ``analyzer run``, in the key directory), which the store advances before any spec of a
  round leaves and checks before it records a new one;
* ``analyzer run``'s broker check, run on a resumed session too: a spec of this session
  the broker retains for a round the state file does not hold (with the same bytes) refuses
  the run, one line, exit status 2.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shuffledp.analyzer.session_store import HIGH_WATER_FILE, SessionMismatch, SessionStore
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams

PARAMS = HadamardRangeParams(-4.0, 4.0, 1.0)
N = 6
CLI = [sys.executable, "-m", "shuffledp.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


async def _announcements(channel, session_id: bytes, into: list, arrived: asyncio.Event) -> None:
    subscription = await channel.subscribe(announce_topic(session_id))
    while True:
        into.append(await subscription.get())
        arrived.set()


def _restore(path: Path, backup: Path) -> None:
    """Put the older copy of the state file back, as an operator restoring a backup would (its logs gone)."""
    shutil.copyfile(backup, path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def test_a_state_file_restored_from_before_round_0_cannot_make_a_second_round_0_spec(tmp_path):
    deployment = Deployment()
    channel = InProcessChannel()
    path = tmp_path / "analyzer-state.db"
    seen: list[bytes] = []
    arrived = asyncio.Event()
    watcher = asyncio.create_task(_announcements(channel, deployment.session_id, seen, arrived))
    try:
        store = SessionStore(path)
        store.check_config(deployment.session_id, {"epsilon0": 8.0})
        store.close()
        backup = tmp_path / "older-copy.db"
        shutil.copyfile(path, backup)  # the session started, no round yet

        first = deployment.coordinator(channel, store=SessionStore(path), round_timeout=30)
        task = asyncio.create_task(first.run_round(PARAMS, 8.0, N))
        await asyncio.wait_for(arrived.wait(), 5)  # round 0 is out
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        first.store.close()
        assert len(seen) == 1

        _restore(path, backup)
        restored = SessionStore(path)
        assert restored.rounds(deployment.session_id) == []  # the file alone no longer knows round 0
        second = deployment.coordinator(channel, store=restored, round_timeout=30)
        with pytest.raises(SessionMismatch, match=r"round 0 .* already announced .*rolled back"):
            await asyncio.wait_for(second.run_round(PARAMS, 8.0, N), 5)
        await asyncio.sleep(0)  # a publish, had there been one, is delivered synchronously
        assert len(seen) == 1  # no second spec was signed or announced
        assert restored.rounds(deployment.session_id) == []  # and none was recorded
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_the_high_water_mark_lets_a_resumed_round_be_served_again_and_the_next_round_go_out(tmp_path):
    """The mark refuses only a round id the file does not hold: a resumed round is served under its own
    bytes, and the next round id is announced as usual."""
    deployment = Deployment()
    channel = InProcessChannel()
    path = tmp_path / "analyzer-state.db"
    seen: list[bytes] = []
    arrived = asyncio.Event()
    watcher = asyncio.create_task(_announcements(channel, deployment.session_id, seen, arrived))
    try:
        first = deployment.coordinator(channel, store=SessionStore(path), round_timeout=30)
        task = asyncio.create_task(first.run_round(PARAMS, 8.0, N))
        await asyncio.wait_for(arrived.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        first.store.close()
        arrived.clear()
        second = deployment.coordinator(channel, store=SessionStore(path), round_timeout=30)
        task = asyncio.create_task(second.run_round(PARAMS, 8.0, N))
        await asyncio.wait_for(arrived.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert seen[1] == seen[0]  # the same signed bytes
        assert second.store.high_water(deployment.session_id) == 0
        # another session in the same directory has its own mark
        other = Deployment()
        assert second.store.high_water(other.session_id) is None
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def test_the_high_water_file_is_private_and_a_forged_one_is_refused(tmp_path):
    path = tmp_path / "analyzer-state.db"
    store = SessionStore(path)
    session = bytes(16)
    store.advance_high_water(session, 3)
    mark = tmp_path / HIGH_WATER_FILE
    assert (mark.stat().st_mode & 0o777) == 0o600
    store.advance_high_water(session, 1)  # never goes back
    assert store.high_water(session) == 3
    store.close()
    os.chmod(mark, 0o644)
    with pytest.raises(InvalidParameter, match="readable by no one else"):
        SessionStore(path).high_water(session)
    os.chmod(mark, 0o600)
    mark.write_text("not json")
    with pytest.raises(InvalidParameter, match="high-water file is unreadable"):
        SessionStore(path).high_water(session)


# ---------------------------------------------------------------------------------- analyzer run


@pytest.fixture
def broker():
    from shuffledp.deploy.broker import Broker, BrokerUsers, find_binary

    find_binary("mosquitto")
    b = Broker(users=BrokerUsers.default(("client",)))
    b.start()
    yield b
    b.close()


def _broker_options(broker, tmp_path: Path) -> list[str]:
    options = broker.channel_options("analyzer")
    secret = tmp_path / "analyzer.password"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{options['password']}\n")
    return ["--broker", f"{broker.host}:{broker.port}", "--ca-file", str(options["tls_ca_file"]),
            "--username", str(options["username"]), "--password-file", str(secret)]


def _roll_back(state: Path) -> None:
    """The state file as an older copy had it: the session's configuration, no round."""
    import sqlite3

    db = sqlite3.connect(state)
    db.execute("DELETE FROM rounds")
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


@pytest.mark.mqtt
@pytest.mark.parametrize("what_is_left", ["high-water mark", "broker's retained spec", "nothing rolled back"])
async def test_analyzer_run_on_a_rolled_back_state_file_refuses_before_announcing(broker, tmp_path, what_is_left):
    """``analyzer run`` killed after announcing round 0 (relayed by the shuffler, retained), its state
    file then rolled back to before round 0: the restarted run is refused, one line, exit 2, and
    announces nothing, whether the high-water mark or only the broker's retained spec remembers round 0.
    With the file intact, the restarted run passes the same checks and serves round 0 under its own bytes
    (no shuffler answers here: it ends at round 0's deadline, exit 1)."""
    from shuffledp.deploy.keys import init_keys
    from shuffledp.protocol.transport.channel import spec_topic
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel

    keys = tmp_path / "keys"
    public = init_keys(keys, clients=4)
    session = public.session_id
    command = [*CLI, "analyzer", "run", "--keys", str(keys), *_broker_options(broker, tmp_path), "--users", "4",
               "--round-timeout", "1", "--grace", "1"]
    async with MqttChannel(broker.host, broker.port, **broker.channel_options("shuffler")) as shuffler:
        announced = await shuffler.subscribe(announce_topic(session))
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        try:
            round0 = await asyncio.wait_for(announced.get(), 60)
        finally:
            first.kill()
            first.wait(10)
        # what the shuffler does with an announcement: relay the signed spec to the clients, retained
        await shuffler.publish(spec_topic(session), round0, retain=True)
        if what_is_left != "nothing rolled back":
            _roll_back(keys / "analyzer-state.db")
        if what_is_left == "high-water mark":
            await shuffler.publish(spec_topic(session), b"", retain=True)  # the broker forgot (a restart)
        elif what_is_left == "broker's retained spec":
            (keys / HIGH_WATER_FILE).unlink()  # the key directory rolled back with it
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, env=ENV)
        later = announced.get_nowait_all()
    assert later in ([], [round0]), "a second spec was announced for round 0"
    lines = done.stderr.strip().splitlines()
    if what_is_left == "nothing rolled back":
        assert later == [round0]  # served again, the same bytes
        assert done.returncode == 1 and "batch-too-small: round 0" in lines[-1], done.stderr
        return
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "round 0" in lines[0] and "rolled back" in lines[0] and "keys init" in lines[0], lines[0]
