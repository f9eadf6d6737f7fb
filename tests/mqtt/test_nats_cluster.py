"""The clustered broker tier (:class:`shuffledp.deploy.nats_cluster.NatsCluster`): three real
``nats-server`` nodes with MQTT and JetStream on loopback.

* the roles' accounts work across nodes (a message published through one node is delivered by
  another), the ACL translated from ``TOPIC_ACCESS`` refuses what it refuses, a retained spec is
  served by every node, and ``MqttChannel`` skips a dead address on its first connection;
* the node leading the stream of QoS 1 publishes, with the shuffler on it, SIGKILLed mid-round
  (receipts outstanding, the batch not yet out): the shuffler fails over to another node
  (``MqttChannel(failover=...)``) while the survivors elect new leaders, the round completes with
  every report counted once and every client charged once, and a device joining after the kill,
  on another node, still gets the round's spec.

A missing ``nats-server`` is a failure, as a missing mosquitto is (``scripts/test.sh`` installs
both); SHUFFLEDP_SKIP_MQTT=1 skips.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.broker import BrokerError, BrokerUsers, free_port
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.deploy.nats_cluster import NatsCluster, find_nats_server, mqtt_filter_to_subject
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.transport import channel as topics
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from tests.mqtt.child_shuffler import ChildShuffler
from tests.mqtt.test_faults import EPSILON0, PARAMS, _check_exactly_once, _served, _wait_receipts

pytestmark = pytest.mark.mqtt


def _cluster(directory: Path | None = None) -> NatsCluster:
    try:
        find_nats_server()
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    return NatsCluster(directory, users=BrokerUsers.default(("client", "device-2")))


def _on_node(cluster: NatsCluster, index: int, role: str) -> MqttChannel:
    """A channel of ``role`` connected first to node ``index``, the other nodes as its failover."""
    host, port = cluster.addresses[index]
    return MqttChannel(host, port, **cluster.channel_options(role, first=index))


async def _retained_once_replicated(channel: MqttChannel, topic: str, attempts: int = 200) -> bytes | None:
    """The message retained on ``topic`` as ``channel``'s node serves it, asked again while that node
    has none yet. NATS stores a retained message in a replicated stream before the PUBACK, but each
    node learns of it from that stream asynchronously (its own consumer), so a node other than the
    publisher's may answer 'none' for a few milliseconds. Each attempt waits for the broker's UNSUBACK
    (:meth:`MqttChannel.retained`), not for a clock."""
    for _ in range(attempts):
        found = await channel.retained(topic)
        if found is not None:
            return found
    return None


def test_mqtt_filters_map_to_the_subjects_nats_matches():
    assert mqtt_filter_to_subject("shuffledp/+/+/+/reports") == "shuffledp.*.*.*.reports"
    assert mqtt_filter_to_subject("a/#") == "a.>"
    assert mqtt_filter_to_subject("a.b/c") == "a//b.c"  # NATS writes an MQTT '.' as '//'
    with pytest.raises(ValueError):
        mqtt_filter_to_subject("a/#/b")


async def test_roles_across_nodes_acl_and_retained_spec():
    session = os.urandom(8)
    with _cluster() as cluster:
        # the client's first address is a port nothing listens on: its channel goes on to node 1
        dead = ("127.0.0.1", free_port())
        live = cluster.addresses[1]
        options = cluster.channel_options("client", first=1)
        options["failover"] = [live]
        async with _on_node(cluster, 0, "shuffler") as shuffler, _on_node(cluster, 2, "analyzer") as analyzer, \
                MqttChannel(*dead, **options) as client:
            assert client.address == f"{live[0]}:{live[1]}"
            # retained spec published on node 0, read on node 1
            await shuffler.publish(topics.spec_topic(session), b"spec-1", retain=True)
            assert await _retained_once_replicated(client, topics.spec_topic(session)) == b"spec-1"
            # a report from node 1 reaches the shuffler on node 0; a batch from node 0 the analyzer on node 2
            reports = await shuffler.subscribe(topics.reports_topic(session, 0))
            batches = await analyzer.subscribe(topics.batch_topic(session, 0))
            await client.publish(topics.reports_topic(session, 0), b"report")
            await shuffler.publish(topics.batch_topic(session, 0), b"chunk")
            assert await asyncio.wait_for(reports.get(), 30) == b"report"
            assert await asyncio.wait_for(batches.get(), 30) == b"chunk"
            # the ACL: a client may not read the analyzer's announcements nor the batches, nor, through the
            # $MQTT.sub.> permission every user has, the deliveries of other users' QoS 1 subscriptions
            for forbidden in (topics.announce_topic(session), topics.batch_topic(session, 0), "$MQTT/sub/+", "$MQTT/sub/#"):
                with pytest.raises(TransportError, match="not authorised"):
                    await client.subscribe(forbidden)
            # a client may not write the spec: the publish is acknowledged and dropped, so the next
            # message a reader of the spec gets is the shuffler's next one
            specs = await analyzer.subscribe(topics.spec_topic(session))
            await client.publish(topics.spec_topic(session), b"forged", retain=True)
            await shuffler.publish(topics.spec_topic(session), b"spec-2", retain=True)
            seen = [await asyncio.wait_for(specs.get(), 30)]  # spec-1 replayed as retained, if node 2 has it yet
            while seen[-1] != b"spec-2":
                seen.append(await asyncio.wait_for(specs.get(), 30))
            assert b"forged" not in seen and set(seen) <= {b"spec-1", b"spec-2"}
        # a wrong password is refused by the live node, and reported at once
        with pytest.raises(TransportError, match="not authorised"):
            async with MqttChannel(*dead, username="client", password="wrong", tls_ca_file=cluster.ca_file,
                                   failover=[live]):
                pass


async def test_node_killed_mid_round_counts_every_report_once(tmp_path, capfd):
    """The node leading the stream that stores QoS 1 publishes is SIGKILLed once the shuffler on
    it has sent its first receipts, before the batch is out (reports and receipts outstanding,
    the batch yet to be published and acknowledged): the survivors elect a new leader while the
    parties fail over. Shuffler on that node, devices and analyzer on the two others."""
    n = 200
    with _cluster(tmp_path / "nats") as cluster:
        deployment = Deployment()
        spec = topics.spec_topic(deployment.session_id)
        spec_watch = _on_node(cluster, 0, "device-2")
        await spec_watch.connect()  # the first MQTT connection creates the MQTT streams
        try:
            victim = cluster.leader("$MQTT_msgs")
            assert victim is not None
            others = [(victim + 1) % 3, (victim + 2) % 3]
            # the shuffler's channel: the victim node first, then the others
            on_victim = SimpleNamespace(host=cluster.addresses[victim][0], port=cluster.addresses[victim][1],
                                        channel_options=lambda role: cluster.channel_options(role, first=victim))
            identifier = f"shuffledp-shuffler-{os.urandom(8).hex()}"
            shuffler = ChildShuffler(deployment, on_victim, tmp_path, identifier=identifier)
            shuffler.start()
            clients = [deployment.client(np.array([0.01 * i]), PrivacyLedger(1.0)) for i in range(n)]
            specs = await spec_watch.subscribe(spec)
            async with _on_node(cluster, others[1], "analyzer") as analyzer_channel, \
                    _on_node(cluster, others[0], "client") as fleet_channel:
                coordinator = deployment.coordinator(analyzer_channel, round_timeout=60.0, grace=10.0,
                                                     batch_margin=NO_LIVENESS_MARGIN)
                fleet = Fleet(fleet_channel, deployment.session_id, clients, SeededSource(3), rate=100.0,
                              retry_interval=0.5)
                watch = await fleet_channel.subscribe(topics.receipts_topic(deployment.session_id, 0))
                fleet_task = asyncio.create_task(fleet.serve(rounds=1))
                round_task = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=n))
                await _wait_receipts(watch, 2)
                await asyncio.to_thread(cluster.kill, victim)
                # the analyzer had no batch yet: the batch and its acknowledgement cross the cluster after the kill
                assert not round_task.done()
                record = await asyncio.wait_for(round_task, 90)
                await asyncio.wait_for(fleet_task, 60)
                await _served(shuffler, 30)
                seen_spec = await asyncio.wait_for(specs.get(), 30)
            # a device joining after the kill, on a surviving node, still finds the round's spec
            host, port = cluster.addresses[others[1]]
            async with MqttChannel(host, port, **cluster.channel_options("client", first=others[1])) as late:
                assert late.address == f"{host}:{port}"
                assert await late.retained(spec) == seen_spec
        finally:
            await spec_watch.close()
            if "shuffler" in locals():
                shuffler.stop()
        assert not cluster.running(victim) and cluster.leader("$MQTT_msgs") in others
        _check_exactly_once(n, deployment, clients, fleet, record, shuffler, coordinator)
        # the shuffler's channel lost its node and went on to another one (its log line)
        survivors = {f"{h}:{p}" for h, p in (cluster.addresses[i] for i in others)}
        err = capfd.readouterr().err
        assert any(f"MQTT channel {identifier} reconnected to {address}" in err for address in survivors), err[-2000:]
