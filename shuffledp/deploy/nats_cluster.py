"""A clustered MQTT broker tier for shuffledp: NATS server nodes with MQTT and JetStream.

mosquitto (:mod:`shuffledp.deploy.broker`) is one process: if it dies, every party loses
the broker until it is back. :class:`NatsCluster` runs ``nodes`` NATS servers (Debian
``nats-server``, 2.9 or later) clustered on loopback routes, each with an MQTT listener the
parties connect to as they do to mosquitto. The MQTT state lives in JetStream streams
replicated to ``replicas`` nodes (default 3, or every node of a smaller cluster): retained messages
(the round spec, the round outcome), sessions and the QoS 1 messages in flight, so

* a retained message published through one node is delivered by every node, also after
  the node it was published to was killed (the stream keeps a quorum of its replicas);
* a party whose node dies reconnects to another one (``MqttChannel(..., failover=...)``)
  and, after subscribing again, gets the retained messages and everything published from
  then on, as after a mosquitto restart.

What the configuration written here guarantees (:func:`nats_conf`):

* **Accounts and ACL.** One NATS account holds every user of :class:`BrokerUsers`
  (one role each). Each user may publish and subscribe to exactly the NATS subjects that
  :data:`TOPIC_ACCESS` grants its role as MQTT topic filters, translated by
  :func:`mqtt_filter_to_subject` (``a/+/b`` -> ``a.*.b``, ``#`` -> ``>``), plus
  subscribe on ``$MQTT.sub.>``, the deliver subjects of the JetStream consumers NATS
  makes for QoS 1 subscriptions (without it the SUBACK refuses QoS 1). Users may
  connect over MQTT only (``allowed_connection_types``), so nobody reaches ``$MQTT.sub.>``
  or the JetStream API with the NATS protocol, and NATS refuses MQTT subscriptions to
  ``$MQTT/...`` topics, so that permission opens no read path to others' deliveries. NATS refuses a SUBSCRIBE the ACL forbids
  with a failure code in the SUBACK, and, like mosquitto, acknowledges and drops a
  publish it forbids.
* **TLS.** The MQTT listeners speak TLS 1.2 or later with the certificate of
  :func:`generate_tls` (so the same CA file verifies every node). Cluster routes and the
  monitoring port bind 127.0.0.1 and are plaintext: the cluster is for one host (tests,
  ``shuffledp up --broker-nodes``); nodes on several hosts need route TLS as well.
* **Payload.** ``max_payload`` (:data:`NATS_MAX_PAYLOAD`) is the largest message any role
  sends (a shuffled-batch chunk), for every user alike: NATS sets payload limits per
  server (or per account in operator mode), not per user. The smaller per-role limits of
  :func:`default_role_limits` (a client's envelope: 4096 bytes) and the other per-role
  limits of mosquitto's plugin (retain only where the protocol retains, connections per
  username, clean sessions only for clients, client-id takeover across usernames) are
  **not** enforced by this broker: the receiving party enforces what matters (the
  shuffler refuses a reports message longer than 64 envelopes whole, and any other wrong
  length, before opening it; ``MqttChannel`` drops a retained message on a reports topic);
  ``docs/threat-model.md`` lists each.
  :meth:`NatsCluster.role_limits_status` reports them as off, with this reason.
* **Storage.** Each node's JetStream holds at most :data:`NATS_MAX_FILE_STORE` on disk and
  :data:`NATS_MAX_MEMORY_STORE` in memory; NATS 2.9 speaks MQTT 3.1.1 only, so no account
  sends MQTT 5 properties.
* **Subscriptions.** The parties subscribe with QoS 0 here (:data:`SUBSCRIBE_QOS`; their
  publishes stay QoS 1).

What differs from one mosquitto, besides the limits above: a retained message is stored in
the replicated stream before the publisher's PUBACK, but the *other* nodes learn of it from
that stream asynchronously, so a subscriber on another node may, for a few milliseconds,
find no retained message yet; a device whose subscription to the spec topic falls in that
window, and so also after the live delivery, misses that round's spec (the shuffler publishes
a round's spec once) and answers from the next round on. A subscription kept open gets every
spec live. While a node is down, the survivors elect new leaders for what it led (seconds:
NATS raft elections), during which QoS 1 publishes wait; ``MqttChannel`` waits within its
``publish_timeout``.

Passwords are written in plaintext into each node's configuration (mode 0600, in a 0700
directory): NATS accepts bcrypt hashes, which the standard library cannot make.

Reference: NATS server 2.9 MQTT support (``server/mqtt.go``): topic/subject translation,
the ``$MQTT_msgs``, ``$MQTT_rmsgs`` and ``$MQTT_sess`` streams, ``mqtt.stream_replicas``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Sequence

from shuffledp.deploy.broker import (
    BrokerError,
    BrokerTier,
    BrokerUsers,
    TlsFiles,
    _accepts,
    _reap,
    _write_private,
    default_role_limits,
    free_port,
    generate_tls,
    parent_death_signal,
)
from shuffledp.protocol.transport.channel import TOPIC_ACCESS

#: Largest message payload a node accepts (NATS ``max_payload``, for every user): a
#: shuffled-batch chunk of the shuffler's default 16384 reports at the report codec limit
#: (256 bytes each, 4 MiB) with its header and signature, and an admission-receipts
#: message at its codec limit (4 MiB), fit with room to spare. NATS warns above 8 MiB.
NATS_MAX_PAYLOAD = 8 * 1024 * 1024
#: JetStream storage per node (``max_file_store``, ``max_memory_store``): what retained
#: messages, sessions and the QoS 1 messages awaiting a QoS 1 subscriber may take on a node's
#: disk and in its memory. Beyond it the node refuses to store more (QoS 1 publishes then fail):
#: a bound on what an account that retains or leaves sessions behind can make a node hold.
NATS_MAX_FILE_STORE = 4 * 1024 ** 3
NATS_MAX_MEMORY_STORE = 256 * 1024 ** 2
#: The one account every broker user belongs to (MQTT sessions and retained messages are per account).
ACCOUNT = "SHUFFLEDP"
#: Subjects every MQTT user must be able to subscribe to: the deliver subjects of the
#: JetStream consumers behind QoS 1 subscriptions.
MQTT_INTERNAL_SUBSCRIBE = "$MQTT.sub.>"
#: The QoS the parties subscribe with on this broker. NATS backs every QoS 1 subscription with a
#: JetStream consumer replicated like the streams; while a node is down, creating one needs a
#: raft election among the survivors that often outlasts NATS 2.9's fixed 4 s JetStream API
#: timeout, and the SUBACK then refuses the subscription. A QoS 0 subscription is a plain
#: cluster-wide NATS subscription. The parties use clean sessions, where QoS 1 on the
#: subscribing side keeps nothing more: what is in flight when a connection drops is dropped
#: with the session either way. Publishes stay QoS 1 (stored in the replicated stream
#: before the PUBACK).
SUBSCRIBE_QOS = 0
#: Why the per-role limits of mosquitto's plugin are off on this broker.
ROLE_LIMITS_OFF_REASON = (
    "NATS sets payload limits per server, not per user, and has no per-user retain, connection-count, "
    "session or client-id rules in config mode; receivers enforce them (docs/threat-model.md)"
)


def find_nats_server() -> str:
    """Path of ``nats-server`` (on ``PATH``, else /usr/sbin or /usr/bin); :class:`BrokerError` naming
    the Debian package when it is missing."""
    for candidate in (shutil.which("nats-server"), "/usr/sbin/nats-server", "/usr/bin/nats-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BrokerError("nats-server is not installed (Debian: apt-get install nats-server)")


def mqtt_filter_to_subject(topic_filter: str) -> str:
    """The NATS subject (wildcard) NATS matches an MQTT topic filter against.

    NATS 2.9 maps MQTT level separators ``/`` to ``.``, a ``.`` inside a level to ``//``,
    ``+`` to ``*`` and a trailing ``#`` to ``>``. (An MQTT subscription to ``a/#`` also
    matches ``a`` itself; NATS subscribes ``a`` and ``a.>`` for it. Permission-wise the
    two subjects are listed here.) Raises ``ValueError`` for a filter that has an empty level
    or a ``#`` that is not the last level, which the protocol's filters never have.
    """
    levels = topic_filter.split("/")
    out: list[str] = []
    for i, level in enumerate(levels):
        if not level:
            raise ValueError(f"topic filter {topic_filter!r}: empty level")
        if level == "#":
            if i != len(levels) - 1:
                raise ValueError(f"topic filter {topic_filter!r}: '#' must be the last level")
            out.append(">")
        elif level == "+":
            out.append("*")
        elif "+" in level or "#" in level or any(c in level for c in " *>"):
            raise ValueError(f"topic filter {topic_filter!r}: bad level {level!r}")
        else:
            out.append(level.replace(".", "//"))
    return ".".join(out)


def role_permissions(role: str) -> dict[str, dict[str, list[str]]]:
    """NATS ``permissions`` of a user of ``role``: publish and subscribe allow-lists from
    :data:`TOPIC_ACCESS` (write and read), plus :data:`MQTT_INTERNAL_SUBSCRIBE`. Everything
    else is denied (an allow-list denies what it does not name)."""
    access = TOPIC_ACCESS[role]
    publish = [mqtt_filter_to_subject(f) for f in access.get("write", ())]
    subscribe = [mqtt_filter_to_subject(f) for f in access.get("read", ())] + [MQTT_INTERNAL_SUBSCRIBE]
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def _q(value: str) -> str:
    """A NATS config string literal (JSON quoting, which the NATS config parser reads)."""
    return json.dumps(value)


def nats_conf(
    *,
    name: str,
    cluster_name: str,
    host: str,
    mqtt_port: int,
    cluster_port: int,
    peer_cluster_ports: Sequence[int],
    http_port: int,
    store_dir: Path,
    tls: TlsFiles,
    users: BrokerUsers,
    replicas: int,
    max_payload: int = NATS_MAX_PAYLOAD,
) -> str:
    """The configuration of one NATS node (see the module docstring for what it guarantees).

    The node listens for MQTT over TLS on ``host:mqtt_port``, for cluster routes on
    ``127.0.0.1:cluster_port`` (routes to ``peer_cluster_ports``), for the NATS protocol on
    a random loopback port no user may use, and for monitoring (``/healthz``) on
    ``127.0.0.1:http_port``. JetStream stores in ``store_dir``; MQTT streams and consumers
    have ``replicas`` replicas.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    user_lines = []
    for user in users:
        perms = role_permissions(user.role)
        user_lines.append(
            "      {user: %s, password: %s, allowed_connection_types: [\"MQTT\"], permissions: {publish: {allow: [%s]}, "
            "subscribe: {allow: [%s]}}}  # role %s"
            % (_q(user.username), _q(user.password), ", ".join(map(_q, perms["publish"]["allow"])),
               ", ".join(map(_q, perms["subscribe"]["allow"])), user.role)
        )
    routes = ", ".join(_q(f"nats-route://127.0.0.1:{p}") for p in peer_cluster_ports)
    return "\n".join([
        "# Generated by shuffledp.deploy.nats_cluster; regenerate rather than edit.",
        f"server_name: {_q(name)}",
        'host: "127.0.0.1"',
        "port: -1",
        f'http: "127.0.0.1:{http_port}"',
        f"max_payload: {max_payload}",
        "jetstream {",
        f"  store_dir: {_q(str(store_dir))}",
        f"  max_file_store: {NATS_MAX_FILE_STORE}",
        f"  max_memory_store: {NATS_MAX_MEMORY_STORE}",
        "}",
        "cluster {",
        f"  name: {_q(cluster_name)}",
        '  host: "127.0.0.1"',
        f"  port: {cluster_port}",
        f"  routes: [{routes}]",
        "}",
        "mqtt {",
        f"  host: {_q(host)}",
        f"  port: {mqtt_port}",
        "  tls {",
        f"    cert_file: {_q(str(tls.cert_file))}",
        f"    key_file: {_q(str(tls.key_file))}",
        "    timeout: 5",
        "  }",
        f"  stream_replicas: {replicas}",
        f"  consumer_replicas: {replicas}",
        # Consumers of clean sessions live as long as their connection: keep them in memory.
        "  consumer_memory_storage: true",
        "}",
        "accounts {",
        f"  {ACCOUNT}: {{",
        "    jetstream: enabled",
        "    users: [",
        *user_lines,
        "    ]",
        "  }",
        "}",
        "",
    ])


class NatsCluster(BrokerTier):
    """A local cluster of ``nodes`` NATS servers with MQTT, run as subprocesses.

    The surface the parties use is :class:`~shuffledp.deploy.broker.Broker`'s: ``host``,
    ``port`` (node 0's MQTT port), :attr:`addresses` (every node's), ``channel_options(role)``
    (account, CA file and the other nodes as ``failover``), ``credentials(role)``,
    ``ca_file``, ``users``, :meth:`start`, :meth:`stop`, :meth:`close`, and sync and async
    context management. :meth:`kill` SIGKILLs one node (as a crash would) and
    :meth:`start_node` starts it again on its ports with its store.

    :meth:`start` returns once every node answers ``/healthz`` with 200 (NATS: the node is
    up and JetStream is current with the cluster) and its MQTT listener completes a TLS
    handshake verified against the cluster's CA. A node never outlives the object (killed
    when it is collected or the interpreter exits) and, with ``die_with_parent`` (Linux),
    the thread that started it.
    """

    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        nodes: int = 3,
        replicas: int | None = None,
        users: BrokerUsers | None = None,
        host: str = "127.0.0.1",
        server_names: Sequence[str] = (),
        max_payload: int = NATS_MAX_PAYLOAD,
        startup_timeout: float = 30.0,
        nats_server: str | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        # 3 replicas keep a quorum of 2 when one node dies; NATS allows at most 5.
        self.replicas = min(nodes, 3) if replicas is None else replicas
        if not 1 <= self.replicas <= min(nodes, 5):
            raise ValueError(f"replicas must be in [1, min(nodes, 5) = {min(nodes, 5)}], got {self.replicas}")
        self._owns_directory = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="shuffledp-nats-") if directory is None else directory)
        self.users = users if users is not None else BrokerUsers.default()
        if not self.users:
            raise ValueError("users: the broker needs at least one user")
        self.host = host
        self.nodes = nodes
        self.server_names = tuple(server_names)
        self.max_payload = max_payload
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self._binary = nats_server
        self.mqtt_ports: list[int] = []
        self.cluster_ports: list[int] = []
        self.http_ports: list[int] = []
        self._choose_ports()
        #: Completed :meth:`start` calls.
        self.starts = 0
        self._processes: list[subprocess.Popen | None] = [None] * nodes
        self._reapers: list[weakref.finalize | None] = [None] * nodes
        self._tls: TlsFiles | None = None
        #: The limits mosquitto's plugin enforces per role, none of which this broker does.
        self.role_limits = default_role_limits(max_payload)
        self.role_limits_off_reason = ROLE_LIMITS_OFF_REASON

    # -- addresses and accounts

    @property
    def port(self) -> int:
        """Node 0's MQTT port (``host:port`` is one address of the tier, as for ``Broker``)."""
        return self.mqtt_ports[0]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every node's MQTT ``(host, port)``, node 0 first."""
        return [(self._connect_host(), p) for p in self.mqtt_ports]

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def credentials_file(self) -> Path:
        return self.directory / "credentials.json"

    def conf_file(self, index: int) -> Path:
        return self.directory / f"node{index}.conf"

    def log_file(self, index: int) -> Path:
        return self.directory / f"node{index}.log"

    def store_dir(self, index: int) -> Path:
        return self.directory / f"node{index}-jetstream"

    @property
    def role_limits_on(self) -> bool:
        """Always False: see the module docstring."""
        return False

    def role_limits_status(self) -> dict[str, object]:
        return {"on": False, "reason": self.role_limits_off_reason, "limits": {}}

    def channel_options(self, role_or_username: str, *, first: int = 0) -> dict[str, object]:
        """Keyword arguments for ``MqttChannel(cluster.host, cluster.port, **...)``: the account
        (by username, else the first of a role), the CA file, and every other node as
        ``failover`` (in ring order from node ``first`` + 1)."""
        username, password = self._account(role_or_username)
        ring = self.addresses[first:] + self.addresses[:first]
        return {"username": username, "password": password, "tls_ca_file": str(self.ca_file), "failover": ring[1:],
                "subscribe_qos": SUBSCRIBE_QOS}

    def broker_argument(self) -> str:
        """Every node as the services' ``--broker`` value: ``HOST:PORT,HOST:PORT,...``."""
        return ",".join(f"{h}:{p}" for h, p in self.addresses)

    # -- files

    def write_files(self) -> None:
        """Write TLS material (once), each node's config and ``credentials.json`` (0600)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._tls is None:
            self._tls = generate_tls(self.directory, server_names=self.server_names)
        for i in range(self.nodes):
            self.store_dir(i).mkdir(mode=0o700, exist_ok=True)
            peers = [p for j, p in enumerate(self.cluster_ports) if j != i]
            _write_private(self.conf_file(i), nats_conf(
                name=f"shuffledp-{i}", cluster_name="shuffledp", host=self.host, mqtt_port=self.mqtt_ports[i],
                cluster_port=self.cluster_ports[i], peer_cluster_ports=peers, http_port=self.http_ports[i],
                store_dir=self.store_dir(i), tls=self._tls, users=self.users, replicas=self.replicas,
                max_payload=self.max_payload,
            ))
        self.users.write_credentials(
            self.credentials_file, host=self._connect_host(), port=self.port, ca_file=str(self.ca_file),
            addresses=[f"{h}:{p}" for h, p in self.addresses], role_limits=self.role_limits_status(),
        )

    # -- processes

    def running(self, index: int) -> bool:
        process = self._processes[index]
        return process is not None and process.poll() is None

    def pid(self, index: int) -> int | None:
        process = self._processes[index]
        return process.pid if process is not None else None

    def log_tail(self, index: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file(index).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def _launch(self, index: int) -> None:
        binary = self._binary or find_nats_server()
        with open(self.log_file(index), "ab") as log:
            process = subprocess.Popen(
                [binary, "-c", str(self.conf_file(index))], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=parent_death_signal() if self.die_with_parent else None,
            )
        self._processes[index] = process
        self._reapers[index] = weakref.finalize(self, _reap, process)

    def _healthy(self, index: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_ports[index]}/healthz", timeout=1.0) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _wait_ready(self, indices: Sequence[int]) -> None:
        """Wait until each node in ``indices`` is healthy and its MQTT TLS listener verifies
        against our CA; :class:`BrokerError` with its log tail if it exits or times out."""
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + self.startup_timeout
        pending = list(indices)
        while pending:
            index = pending[0]
            process = self._processes[index]
            assert process is not None
            if self._healthy(index) and _accepts(self._connect_host(), self.mqtt_ports[index], tls):
                pending.pop(0)
                continue
            if process.poll() is not None:
                code = process.returncode
                self.stop()
                raise BrokerError(f"nats-server node {index} exited with status {code}; "
                                  f"log {self.log_file(index)}:\n{self.log_tail(index)}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"nats-server node {index} was not ready within {self.startup_timeout} s; "
                                  f"log {self.log_file(index)}:\n{self.log_tail(index)}")
            time.sleep(0.05)

    def leader(self, stream: str | None = None) -> int | None:
        """The node leading JetStream's metadata (``stream`` None) or the stream named ``stream`` of
        the broker's account (e.g. ``"$MQTT_msgs"``, where QoS 1 publishes are stored), as a running
        node reports it (``/jsz``); None if no running node names a leader. The MQTT streams exist
        once a first MQTT client connected."""
        for index in range(self.nodes):
            if not self.running(index):
                continue
            url = f"http://127.0.0.1:{self.http_ports[index]}/jsz?acc={ACCOUNT}&streams=true"
            try:
                with urllib.request.urlopen(url, timeout=2.0) as answer:
                    report = json.load(answer)
            except (urllib.error.URLError, OSError, ValueError):
                continue
            if stream is None:
                name = (report.get("meta_cluster") or {}).get("leader")
            else:
                details = [d for account in report.get("account_details") or () for d in account.get("stream_detail") or ()]
                name = next(((d.get("cluster") or {}).get("leader") for d in details if d.get("name") == stream), None)
            if name and name.startswith("shuffledp-") and name[len("shuffledp-"):].isdigit():
                return int(name[len("shuffledp-"):])
        return None

    def wait_healthy(self) -> None:
        """Wait until every running node is ready again (as :meth:`start` waits), e.g. after
        :meth:`kill`: until the survivors have elected the JetStream leaders the dead node held,
        a new QoS 1 subscription is refused and QoS 1 publishes wait (NATS raft elections take
        seconds)."""
        self._wait_ready([i for i in range(self.nodes) if self.running(i)])

    def start(self) -> "NatsCluster":
        """Start every node that is not running and wait until all of them are ready.

        On the first start, if a port chosen by the OS was taken in the meantime (a node's log
        says "address already in use"), every port is chosen again and the cluster started
        again, up to three times."""
        attempts = 1 if self.starts else 3
        for attempt in range(attempts):
            self.write_files()
            started = [i for i in range(self.nodes) if not self.running(i)]
            for i in started:
                self._launch(i)
            try:
                self._wait_ready(started)
            except BrokerError as exc:
                if attempt + 1 == attempts or "address already in use" not in str(exc):
                    raise
                self._choose_ports()
                continue
            self.starts += 1
            return self
        raise AssertionError("unreachable")

    def _choose_ports(self) -> None:
        connect = self._connect_host()
        self.mqtt_ports = [free_port(connect) for _ in range(self.nodes)]
        self.cluster_ports = [free_port() for _ in range(self.nodes)]
        self.http_ports = [free_port() for _ in range(self.nodes)]

    def start_node(self, index: int) -> None:
        """Start node ``index`` again (same ports, same store) and wait until it is ready."""
        if not self.running(index):
            self._launch(index)
            self._wait_ready([index])

    def kill(self, index: int = 0) -> None:
        """SIGKILL node ``index``, as a crash would; its MQTT clients lose their connections.
        Idempotent."""
        process, self._processes[index] = self._processes[index], None
        self._detach(index)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def _detach(self, index: int) -> None:
        reaper, self._reapers[index] = self._reapers[index], None
        if reaper is not None:
            reaper.detach()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout`` s). Idempotent."""
        processes = []
        for i in range(self.nodes):
            process, self._processes[i] = self._processes[i], None
            self._detach(i)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                processes.append(process)
        for process in processes:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __repr__(self) -> str:
        up = sum(self.running(i) for i in range(self.nodes))
        return f"NatsCluster({self.nodes} nodes, {up} running, replicas={self.replicas}, directory={str(self.directory)!r})"
