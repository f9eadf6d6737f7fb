"""The clustered broker tier (:class:`shuffledp.deploy.nats_cluster.NatsCluster`): three real
``nats-server`` nodes with MQTT and JetStream on loopback.

* the roles' accounts work across nodes (a message published through one node is delivered by
  another), the ACL translated from ``TOPIC_ACCESS`` refuses what it refuses, a retained spec is
  served by every node, and ``MqttChannel`` skips a dead address on its first connection;
* two shuffler instances of one round on two nodes, devices on both, the analyzer on the third:
  every report counted once in its instance's batch, every device charged once;
* a node SIGKILLed in each of two rounds (:mod:`tests.mqtt.cluster_kill_round`, which
  ``scripts/cluster_kills.py`` runs over many rounds): the node leading the stream of QoS 1
  publishes, with the shuffler on it, with receipts outstanding; then, that node back, the
  analyzer's node with the batch opened and its acknowledgement held until after the kill. The parties fail over (``MqttChannel(failover=...)``) while the
  survivors elect new leaders; the round completes with every report counted once, every client
  charged once, the batch served, and a device joining after the kill still gets the round's spec.

A missing ``nats-server`` is a failure, as a missing mosquitto is (``scripts/test.sh`` installs
both); SHUFFLEDP_SKIP_MQTT=1 skips.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
from pathlib import Path

import pytest

from shuffledp.deploy.broker import BrokerError, free_port
from shuffledp.deploy.nats_cluster import NatsCluster, find_nats_server, mqtt_filter_to_subject
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport import channel as topics
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from tests.mqtt.cluster_kill_round import MOMENTS, NODES, Kill, KillRoundResult, kill_cluster, run_kill_round

pytestmark = pytest.mark.mqtt


def _cluster(directory: Path | None = None) -> NatsCluster:
    try:
        find_nats_server()
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    return kill_cluster(directory)


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


async def _published_until_read(publisher, topic: str, payload: bytes, subscription, *, every: float = 0.5) -> bool:
    """Publish ``payload`` until ``subscription`` reads it. A QoS 0 subscription made on another
    node gets only what is published after that node has learnt of it, and NATS passes that
    interest between nodes asynchronously (milliseconds, longer on a loaded machine). The
    parties resend for the same reason: devices their reports, the shuffler its batches,
    the analyzer its announcements and acknowledgements."""
    async with asyncio.timeout(30):
        while True:
            await publisher.publish(topic, payload)
            try:
                async with asyncio.timeout(every):
                    return await subscription.get() == payload
            except TimeoutError:
                continue


def _cluster_kills_script():
    spec = importlib.util.spec_from_file_location("cluster_kills", Path(__file__).resolve().parents[2] / "scripts" / "cluster_kills.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cluster_kills_script_covers_every_moment_and_node_and_fails_a_round_not_served_once():
    script = _cluster_kills_script()
    assert {(k.moment, k.node) for k in script.schedule(6)} == {(m, n) for m in MOMENTS for n in NODES}
    with pytest.raises(SystemExit) as refused:  # before any cluster starts
        script.main(["--kills", "0"])
    assert refused.value.code == 2
    served = KillRoundResult(
        kill=Kill("unacknowledged", "shuffler"), nodes={"fleet": 0, "shuffler": 1, "analyzer": 2}, killed=1,
        killed_leader=False, shuffler_at_kill=1, receipted_at_kill=5, sent=5, counted=5, duplicates=0, charged_once=True,
        late_saw_spec=True, batch="served", outcome="released", retransmitted=0, shuffler_failed_over=True,
        analyzer_reconnects=0, fleet_reconnects=0, reacknowledged=1, spool_state="served", spool_holds_ciphertext=False,
        seconds=1.0)
    assert served.exactly_once and script.row(1, served)[2:10] == (
        "1 (shuffler)", "5", "5", "0", "yes", "yes", "1", "served (acknowledged)")
    # each way a round can go wrong fails it (the script's exit status 1)
    for wrong in (dict(counted=4), dict(duplicates=1), dict(charged_once=False), dict(late_saw_spec=False),
                  dict(batch="expired", spool_state="failed"), dict(spool_holds_ciphertext=True)):
        assert not dataclasses.replace(served, **wrong).exactly_once, wrong


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
            assert await _published_until_read(client, topics.reports_topic(session, 0), b"report", reports)
            assert await _published_until_read(shuffler, topics.batch_topic(session, 0), b"chunk", batches)
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


async def test_node_killed_mid_round_counts_every_report_once(tmp_path):
    """Two rounds over one cluster (:mod:`tests.mqtt.cluster_kill_round`), a node SIGKILLed in each:

    * the node leading the stream that stores QoS 1 publishes, with the shuffler on it, once the
      first receipts are out (reports outstanding: the fleet holds receipts for fewer than all): the
      shuffler fails over while the survivors elect new leaders, and the fleet sends again what the
      outage lost;
    * that node back and the cluster healthy, the analyzer's node once the analyzer has opened the
      batch, its acknowledgement held until the node is dead: the acknowledgement goes out from the
      analyzer's new node and serves the batch at the shuffler on another one.

    Each round completes with every report counted once, every device charged once, the batch
    served, and a device joining after the kill (the dead node first in its list) finds the round's
    spec on a survivor."""
    results = []
    with _cluster(tmp_path / "nats") as cluster:
        results.append(await run_kill_round(cluster, tmp_path / "receipts", Kill("receipts", "leader")))
        assert not cluster.running(results[0].killed)
        await asyncio.to_thread(cluster.start_node, results[0].killed)
        await asyncio.to_thread(cluster.wait_healthy)
        results.append(await run_kill_round(cluster, tmp_path / "unacknowledged", Kill("unacknowledged", "analyzer"),
                                            seed=4))
    leader_kill, ack_kill = results
    assert leader_kill.killed_leader and leader_kill.killed == leader_kill.nodes["shuffler"]
    assert leader_kill.receipted_at_kill < leader_kill.sent  # reports were outstanding at the kill
    assert leader_kill.shuffler_failed_over and leader_kill.retransmitted > 0, leader_kill
    assert ack_kill.killed == ack_kill.nodes["analyzer"] and ack_kill.analyzer_reconnects >= 1, ack_kill
    for result in results:
        # every report counted once, none twice; every device charged once; the round released
        assert result.counted == result.sent == 200 and result.duplicates == 0, result
        assert result.charged_once and result.outcome == "released", result
        # the acknowledgement served the batch at the shuffler, whose spool holds no ciphertext any more
        assert result.batch == "served" and result.spool_state == "served" and not result.spool_holds_ciphertext, result
        assert result.late_saw_spec, result
        assert result.exactly_once


async def test_shuffler_instances_on_two_nodes_devices_on_both_and_the_analyzer_on_the_third():
    """Two shuffler instances of one round, on nodes 0 and 1; the devices split over nodes 0 and 1
    (each node's devices answer both instances, so reports cross nodes both ways); the analyzer on
    node 2. Every report is counted once, in its instance's batch, and every device charged once."""
    import time

    import numpy as np

    from shuffledp.client.ledger import PrivacyLedger
    from shuffledp.deploy.deployment import Deployment
    from shuffledp.deploy.fleet import Fleet
    from shuffledp.protocol.mechanisms.randomness import SeededSource
    from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec, messages_per_user

    each = 40  # devices per instance: the round releases each batch the moment it holds them all
    deployment = Deployment()
    params = HadamardRangeParams(-4.0, 4.0, 0.5)
    spec = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=params, epsilon0=0.5, delta0=0.0,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, messages_per_user=messages_per_user(params),
        min_batch=each, max_batch=each, deadline=time.time() + 60.0, shuffler_instances=2)
    clients: dict[int, list] = {0: [], 1: []}
    while min(map(len, clients.values())) < each:  # the round assigns devices to instances by credential
        client = deployment.client(np.array([0.01 * sum(map(len, clients.values()))]), PrivacyLedger(1.0))
        if len(clients[client.instance_for(spec)]) < each:
            clients[client.instance_for(spec)].append(client)
    on_node = {0: clients[0][::2] + clients[1][::2], 1: clients[0][1::2] + clients[1][1::2]}
    with _cluster() as cluster:
        async with _on_node(cluster, 0, "shuffler") as s0, _on_node(cluster, 1, "shuffler") as s1, \
                _on_node(cluster, 2, "analyzer") as analyzer_channel, \
                _on_node(cluster, 0, "client") as devices0, _on_node(cluster, 1, "client") as devices1:
            shufflers = [deployment.shuffler(channel, instance=i) for i, channel in enumerate((s0, s1))]
            serving = [asyncio.create_task(s.serve()) for s in shufflers]
            fleets = [Fleet(channel, deployment.session_id, on_node[i], SeededSource(i), retry_interval=0.5)
                      for i, channel in enumerate((devices0, devices1))]
            answering = [asyncio.create_task(f.serve(rounds=1)) for f in fleets]
            try:
                async with deployment.coordinator(analyzer_channel, round_timeout=60.0, grace=10.0) as coordinator:
                    record = await asyncio.wait_for(coordinator.receive_round(spec, announce=True), 90)
                await asyncio.wait_for(asyncio.gather(*answering), 30)
            finally:
                for task in (*serving, *answering):
                    task.cancel()
                await asyncio.gather(*serving, *answering, return_exceptions=True)
    assert record.batch_sizes == (each, each) and record.opened.size == 2 * each and record.failed_instances == 0
    assert sum(record.opened.rejected.values()) == 0
    assert [s.rounds[0].admitted for s in shufflers] == [each, each]
    assert all(c.ledger.spent_epsilon == 0.5 and len(c.ledger.answered) == 1 for c in clients[0] + clients[1])
