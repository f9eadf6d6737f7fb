"""One round of the real parties over a :class:`NatsCluster` while a node is SIGKILLed at a set moment.

Shared by ``tests/mqtt/test_nats_cluster.py`` and ``scripts/cluster_kills.py``. The shuffler runs
as its own process (:class:`ChildShuffler`: the library's Shuffler on a file-backed spool); the
analyzer's coordinator and a fleet of enrolled devices (:class:`Fleet`, which sends again, byte
for byte, each envelope no receipt names) run here. Each party is on a node of its own, with
every other node as its failover; a device-account watcher on the fleet's node subscribes to the
round's spec before the round starts.

It lives with the tests, not in the package: it holds the analyzer's acknowledgement by replacing
a private method of the coordinator and learns what the shuffler did from the test-only
:class:`ChildShuffler`'s event lines and log; a drill for operators would need a supported hook
for both.

A :class:`Kill` names a moment and a node:

* moment ``receipts``: once the fleet has two receipts messages from the shuffler, with the round
  not yet complete at the analyzer (some reports admitted, others outstanding: the result records
  how many the fleet had receipts for);
* moment ``unacknowledged``: once the analyzer has opened the whole batch, with its
  acknowledgement held in the coordinator (its ``_acknowledge``) until the node is dead, so the
  acknowledgement crosses the cluster after the kill;
* node ``leader``: the node leading the JetStream stream that stores QoS 1 publishes
  (``$MQTT_msgs``) at that moment; ``shuffler`` / ``analyzer``: the node that party was placed on.

Placement follows the kill: for ``leader``, the shuffler is on the stream leader (the kill
takes the leader and the shuffler's connection at once), the fleet on the next node in the ring
(where the shuffler fails over to) and the analyzer on the third; for ``shuffler`` or
``analyzer``, the fleet is on the stream leader and that party on the next node, which does not
lead the stream (the kill takes a connection, not a leader). The fleet's node is never killed.

After the round, a device joins with the killed node first in its address list (it fails
over to a survivor) and reads the spec the broker retains, which must be the one the watcher saw
live. :class:`KillRoundResult` records what a reader checks: reports sent and counted (the
analyzer's valid reports), copies of a report that reached the analyzer (its ``duplicate``
refusals within the batch, copies across batches, batches beyond one), whether every device was
charged exactly once, whether the late device saw the spec, and how the batch ended at the
shuffler (``served``: an acknowledgement arrived after the failover; ``expired``: it gave the batch
up unacknowledged).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.analyzer.service import CROSS_BATCH_DUPLICATE
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.broker import BrokerUsers
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.deploy.nats_cluster import NatsCluster
from shuffledp.protocol.errors import DuplicateReport
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.transport import channel as topics
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.shuffler.spool import SqliteSpool
from tests.mqtt.child_shuffler import ChildShuffler

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5
MOMENTS = ("receipts", "unacknowledged")
NODES = ("leader", "shuffler", "analyzer")
#: The stream NATS stores QoS 1 publishes in.
PUBLISH_STREAM = "$MQTT_msgs"
#: Seconds from the round's announcement to its deadline, and the analyzer's grace after it.
ROUND_TIMEOUT, GRACE = 30.0, 10.0
#: Seconds the shuffler re-publishes an unacknowledged batch after the deadline before giving it up
#: (more than the analyzer's grace, as the shuffler requires): a lost acknowledgement ends as
#: ``expired`` rather than hanging the run.
ACK_TIMEOUT = 15.0
#: Safety limit of every wait beyond the round's own timers (each wait ends on an event).
TIMEOUT = 90.0


@dataclass(frozen=True)
class Kill:
    """SIGKILL the ``node`` (one of :data:`NODES`) at ``moment`` (one of :data:`MOMENTS`)."""

    moment: str
    node: str

    def __post_init__(self) -> None:
        if self.moment not in MOMENTS or self.node not in NODES:
            raise ValueError(f"Kill({self.moment!r}, {self.node!r}): moment in {MOMENTS}, node in {NODES}")


@dataclass(frozen=True)
class KillRoundResult:
    """What one round with a kill did (see the module docstring)."""

    kill: Kill
    #: The node of each party: ``shuffler``, ``analyzer``, ``fleet`` (the spec watcher's too).
    nodes: dict[str, int]
    #: The node the kill took.
    killed: int
    #: Whether it led the publish stream when it was killed.
    killed_leader: bool
    #: The node the shuffler's channel was connected to at the kill, by its log (None: reconnecting).
    shuffler_at_kill: int | None
    #: Envelopes a receipt had confirmed to the fleet at the kill (fewer than ``sent``: reports outstanding).
    receipted_at_kill: int
    sent: int
    counted: int
    duplicates: int
    charged_once: bool
    late_saw_spec: bool
    #: ``served``, ``expired`` or ``unsettled`` (neither within the wait): how the batch ended at the shuffler.
    batch: str
    #: The fleet's signed outcome of the round (``released`` or ``failed:<reason>``), or ``none``.
    outcome: str
    #: Envelopes the fleet sent again because no receipt named them.
    retransmitted: int
    #: Whether the shuffler's log says its channel reconnected to another node.
    shuffler_failed_over: bool
    #: Reconnections of the analyzer's and the fleet's channels.
    analyzer_reconnects: int
    fleet_reconnects: int
    #: Acknowledgements the analyzer sent again because the shuffler published the batch again.
    reacknowledged: int
    #: The spool's state of the round (``served`` once the acknowledgement was written).
    spool_state: str
    #: Whether the spool still holds the round's ciphertext (admitted envelopes or an unacknowledged batch).
    spool_holds_ciphertext: bool
    seconds: float

    @property
    def exactly_once(self) -> bool:
        """Every report counted once, every device charged once, the batch served, the spec seen late."""
        return (self.counted == self.sent and self.duplicates == 0 and self.charged_once and self.late_saw_spec
                and self.batch == "served" and self.outcome == "released" and self.spool_state == "served"
                and not self.spool_holds_ciphertext)


def kill_cluster(directory: Path | None = None) -> NatsCluster:
    """A 3-node cluster (not started) with the accounts a kill round uses: the roles' and a second
    device account (the spec watcher's)."""
    return NatsCluster(directory, users=BrokerUsers.default(("client", "device-2")))


def placement(cluster: NatsCluster, kill: Kill) -> dict[str, int]:
    """The node of each party (``shuffler``, ``analyzer``, ``fleet``), from the publish stream's
    leader and the kill (see the module docstring)."""
    leader = cluster.leader(PUBLISH_STREAM)
    if leader is None:
        raise RuntimeError(f"no running node names a leader of {PUBLISH_STREAM} (no MQTT client connected yet?)")
    ring = [(leader + k) % cluster.nodes for k in range(3)]
    if kill.node == "leader":
        return {"shuffler": ring[0], "fleet": ring[1], "analyzer": ring[2]}
    if kill.node == "shuffler":
        return {"fleet": ring[0], "shuffler": ring[1], "analyzer": ring[2]}
    return {"fleet": ring[0], "analyzer": ring[1], "shuffler": ring[2]}


def _channel(cluster: NatsCluster, index: int, role: str) -> MqttChannel:
    host, port = cluster.addresses[index]
    return MqttChannel(host, port, **cluster.channel_options(role, first=index))


def _connected_node(cluster: NatsCluster, log: Path, identifier: str, placed: int) -> int | None:
    """The node a channel is connected to, by the last of its log lines saying it lost or reached
    a node (``placed`` if it has none); None while it is reconnecting."""
    last = None
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    for line in lines:
        if f"MQTT channel {identifier} " in line and (" reconnected to " in line or " lost the broker " in line):
            last = line
    if last is None:
        return placed
    if " lost the broker " in last:
        return None
    address = last.rsplit(" reconnected to ", 1)[1].strip()
    return next((i for i, (h, p) in enumerate(cluster.addresses) if f"{h}:{p}" == address), None)


async def _wait_receipts(watch, at_least: int) -> None:
    for _ in range(at_least):
        await asyncio.wait_for(watch.get(), TIMEOUT)


async def run_kill_round(cluster: NatsCluster, directory: Path, kill: Kill, *, users: int = 200,
                         seed: int = 3) -> KillRoundResult:
    """One round of ``users`` devices over the running 3-node ``cluster`` (every node up) with
    ``kill``. The shuffler's keys, spool and log go to ``directory``. The killed node is left dead."""
    if cluster.nodes != 3:
        raise ValueError(f"a kill round places three parties on three nodes; the cluster has {cluster.nodes}")
    started = time.monotonic()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # the spool must be private
    if cluster.leader(PUBLISH_STREAM) is None:
        async with _channel(cluster, 0, "client"):  # the first MQTT connection makes the MQTT streams
            pass
    nodes = placement(cluster, kill)
    deployment = Deployment()
    spec_topic = topics.spec_topic(deployment.session_id)
    on_node = SimpleNamespace(host=cluster.addresses[nodes["shuffler"]][0], port=cluster.addresses[nodes["shuffler"]][1],
                              channel_options=lambda role: cluster.channel_options(role, first=nodes["shuffler"]))
    identifier = f"shuffledp-shuffler-{os.urandom(8).hex()}"
    log = directory / "shuffler.log"
    shuffler = ChildShuffler(deployment, on_node, directory, identifier=identifier, tell=("served", "expired"),
                             ack_timeout=ACK_TIMEOUT, log=log)

    watcher = _channel(cluster, nodes["fleet"], "device-2")
    await watcher.connect()
    shuffler.start()
    settled = shuffler.follow(lambda line: line in ("served 0", "expired 0"))  # or the process ended
    clients = [deployment.client(np.array([0.01 * i]), PrivacyLedger(1.0)) for i in range(users)]
    try:
        specs = await watcher.subscribe(spec_topic)
        async with _channel(cluster, nodes["analyzer"], "analyzer") as analyzer_channel, \
                _channel(cluster, nodes["fleet"], "client") as fleet_channel:
            coordinator = deployment.coordinator(analyzer_channel, round_timeout=ROUND_TIMEOUT, grace=GRACE,
                                                 batch_margin=NO_LIVENESS_MARGIN)
            held, go = asyncio.Event(), asyncio.Event()
            if kill.moment == "unacknowledged":
                acknowledge = coordinator._acknowledge

                async def held_acknowledge(spec, batch_ids):
                    held.set()  # the batch is opened; its acknowledgement waits for the kill
                    await go.wait()
                    return await acknowledge(spec, batch_ids)

                coordinator._acknowledge = held_acknowledge
            fleet = Fleet(fleet_channel, deployment.session_id, clients, SeededSource(seed), rate=100.0,
                          retry_interval=0.5)
            watch = await fleet_channel.subscribe(topics.receipts_topic(deployment.session_id, 0))
            fleet_task = asyncio.create_task(fleet.serve(rounds=1))
            round_task = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=users))
            try:
                if kill.moment == "receipts":
                    await _wait_receipts(watch, 2)
                    if round_task.done():  # the round must still be under way at this moment
                        raise RuntimeError("the round ended before its receipts-moment kill")
                else:
                    await asyncio.wait_for(held.wait(), TIMEOUT)
                leader = cluster.leader(PUBLISH_STREAM)
                killed = leader if kill.node == "leader" else nodes[kill.node]
                assert killed is not None and killed != nodes["fleet"], (kill, nodes, leader)
                shuffler_at_kill = _connected_node(cluster, log, identifier, nodes["shuffler"])
                receipted_at_kill = fleet.rounds[0].admitted if 0 in fleet.rounds else 0
                await asyncio.to_thread(cluster.kill, killed)
                go.set()
                record = await asyncio.wait_for(round_task, ROUND_TIMEOUT + TIMEOUT)
                await asyncio.wait_for(fleet_task, TIMEOUT)
            finally:
                for task in (round_task, fleet_task):
                    task.cancel()
                await asyncio.gather(round_task, fleet_task, return_exceptions=True)
            seen_spec = await asyncio.wait_for(specs.get(), TIMEOUT)
            await asyncio.to_thread(settled.wait, ROUND_TIMEOUT + ACK_TIMEOUT + TIMEOUT)
            reacknowledged = coordinator.ack_keeper.resent  # read on until the shuffler settled the batch
            await coordinator.close()
            analyzer_reconnects, fleet_reconnects = analyzer_channel.reconnects, fleet_channel.reconnects
        # a device joining now lists the dead node first: it goes on to a survivor and finds the spec there
        async with _channel(cluster, killed, "client") as late:
            late_spec = await late.retained(spec_topic)
    finally:
        await watcher.close()
        shuffler.stop()
    rejected = record.opened.rejected
    state = fleet.rounds[0]
    spool = SqliteSpool(shuffler.spool_path)
    stored = spool.round(deployment.session_id, 0)
    reconnected = f"MQTT channel {identifier} reconnected to"
    return KillRoundResult(
        kill=kill, nodes=nodes, killed=killed, killed_leader=killed == leader, shuffler_at_kill=shuffler_at_kill,
        receipted_at_kill=receipted_at_kill, sent=users,
        counted=record.opened.size,
        duplicates=rejected[DuplicateReport.reason] + rejected[CROSS_BATCH_DUPLICATE] + sum(record.batch_sizes[1:]),
        charged_once=all(c.ledger.spent_epsilon == EPSILON0 and len(c.ledger.answered) == 1 for c in clients),
        late_saw_spec=late_spec is not None and late_spec == seen_spec,
        batch=next((line.split()[0] for line in shuffler.lines if line in ("served 0", "expired 0")), "unsettled"),
        outcome=state.outcomes.get(0, "none"), retransmitted=state.retransmitted,
        shuffler_failed_over=log.is_file() and reconnected in log.read_text(errors="replace"),
        analyzer_reconnects=analyzer_reconnects, fleet_reconnects=fleet_reconnects, reacknowledged=reacknowledged,
        spool_state=stored.state if stored is not None else "none",
        spool_holds_ciphertext=bool(spool.admitted(deployment.session_id, 0) or spool.unacknowledged()),
        seconds=time.monotonic() - started,
    )
