"""The :class:`~shuffledp.protocol.transport.channel.Channel` interface over MQTT (aiomqtt).

Each party opens its own connection to a broker (mosquitto; see
:mod:`shuffledp.deploy.broker` for an authenticated TLS deployment). Payloads are the
exact bytes the in-process channel carries; messages go with QoS 1 (at least once:
a duplicate report is caught by the shuffler's nonce check), retained ones with
MQTT's retain flag.

Guarantees:

* **Typed failures.** Every failure of aiomqtt, paho or the socket layer surfaces
  as :class:`~shuffledp.protocol.errors.TransportError` with a one-line reason
  (refused credentials read "not authorised"). Nothing waits forever on a dead
  channel: a publish gives up after ``publish_timeout``; when the channel dies
  (``reconnect=False`` and the broker went away, or :meth:`MqttChannel.close`),
  waiting ``get()``\\ s raise TransportError.
* **First connection.** :meth:`MqttChannel.connect` makes one attempt unless
  ``first_connect_retry`` > 0: then an attempt that fails for a reason a broker that is
  starting or restarting gives (refused, reset, timed out, closed during the handshake)
  is made again with the same backoff as reconnection, for up to that many seconds, each
  failure logged as one line. Refused credentials, a certificate that fails verification,
  an unreadable CA file and an unknown host name are reported at once: waiting does not
  mend them. The services (``shuffler serve``, ``analyzer run``, ``clients run``, and so
  ``up``) retry for 30 s by default (``--connect-retry``).
* **Reconnection** (``reconnect=True``, the default). After the *first* connection
  succeeded, a lost connection is re-established with exponential backoff (0.1 s
  doubling up to ``max_backoff``, each wait jittered to 50-100 %), forever until
  :meth:`MqttChannel.close`. An attempt that fails in any way (aiomqtt's connect raising
  something other than its own errors included) is one more failed attempt. Every topic
  with a live subscription is subscribed again, then delivery resumes on the same
  subscription objects. Publishes made
  while disconnected wait for the reconnection (within ``publish_timeout``); a
  publish whose acknowledgement was lost with the connection is sent again, so it
  may arrive twice (QoS 1 semantics). Messages published by others while this
  channel was disconnected are not delivered to it (clean sessions), except
  retained ones, which the broker sends again on re-subscription.
* **Failover** (``failover=[(host, port), ...]``: further nodes of a clustered broker,
  e.g. :class:`shuffledp.deploy.nats_cluster.NatsCluster`). The channel connects to the
  first address that answers, in order; each reconnection attempt goes to the *next*
  address after the one last tried, round the ring, so a channel whose node died is on
  another node after one backoff step (0.05-0.1 s) if that one is live. What the
  channel re-subscribes and re-publishes is as above; retained messages and the
  messages published after the new SUBSCRIBE reach it from whichever node it is on, as
  a clustered broker shares them. With a single address nothing changes.
* **Bounded memory.** Each subscription queues at most ``queue_limit`` unread
  messages; more are dropped and counted (``dropped_by_topic``, and ``dropped`` on
  the subscription).
* **Concurrency.** Any number of publishes may run at once (``asyncio.gather``
  works); at most ``max_inflight_publishes`` wait for their PUBACK at a time, the
  rest wait for a slot. :meth:`MqttChannel.publish_many` keeps a bounded window.

* **Quiet third parties.** aiomqtt and paho log through this module's loggers
  (``shuffledp.mqtt.aiomqtt``, ``shuffledp.mqtt.paho``), whose records are one line each:
  an exception's type and text, never its traceback. aiomqtt's report of an
  acknowledgement for a call the channel cancelled (a SUBACK or UNSUBACK for a message id it
  no longer tracks) and of a disconnect from a broker already gone are debug lines, and
  paho's packet-by-packet chatter is not logged (warnings and errors are).

Incoming messages are routed to subscriptions directly from aiomqtt's message
callback (through the queue class aiomqtt lets callers supply), in arrival order,
with no intermediate queue or per-message task.

aiomqtt is an optional dependency (the ``mqtt`` extra: ``pip install -e ".[mqtt]"``) and is
imported only here, so devices that use another transport never load it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import random
import socket
import ssl
from collections import Counter, defaultdict
from typing import Awaitable, Callable, Iterable, TypeVar

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
import paho.mqtt.client as paho

from shuffledp.protocol.transport.channel import QueueSubscription
from shuffledp.protocol.errors import TransportError

log = logging.getLogger("shuffledp.mqtt")


class _OneLine(logging.Filter):
    """Turns a third-party record into one line: its exception (type and text) joins the message and
    the traceback is dropped; aiomqtt's reports of benign races (see the module docstring) become
    debug records, kept only where debug logging is on."""

    BENIGN = ("Unexpected message ID", "Could not gracefully disconnect")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info:
            exc = record.exc_info[1]
            if exc is not None:
                message = f"{message}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if record.exc_info or record.stack_info or record.args:
            record.msg, record.args = " ".join(message.split()), None
            record.exc_info = record.exc_text = record.stack_info = None
        if record.levelno > logging.DEBUG and any(text in message for text in self.BENIGN):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


#: aiomqtt's log (its own messages); one line per record.
_AIOMQTT_LOG = logging.getLogger("shuffledp.mqtt.aiomqtt")
_AIOMQTT_LOG.addFilter(_OneLine())
#: paho's log: warnings and errors only (below that it logs every packet), one line per record.
_PAHO_LOG = logging.getLogger("shuffledp.mqtt.paho")
_PAHO_LOG.setLevel(logging.WARNING)
_PAHO_LOG.addFilter(_OneLine())


class _Unreachable(TransportError):
    """A connection attempt that failed as it does while a broker starts or restarts (refused, reset,
    timed out, closed during the handshake, or failing inside aiomqtt): worth another attempt."""

T = TypeVar("T")

#: The last level of every reports topic (``channel.reports_topic``).
REPORTS_SUFFIX = "/reports"

#: CONNACK codes that mean the broker refused who we are (MQTT 3.1.1: 4 bad
#: username or password, 5 not authorised; MQTT 5: 0x86, 0x87).
_REFUSED_IDENTITY = {4, 5, 0x86, 0x87}
#: paho result codes that mean "no connection" rather than a refused request.
_CONNECTION_GONE = {paho.MQTT_ERR_NO_CONN, paho.MQTT_ERR_CONN_LOST, paho.MQTT_ERR_CONN_REFUSED}


class _ConnectionLost(Exception):
    """Internal: the connection an operation ran on went away (the caller retries)."""


class _RoutingQueue(asyncio.Queue):
    """The "queue" aiomqtt puts received messages into: it hands each one straight to
    the channel's router instead of storing it, so nothing accumulates in aiomqtt."""

    def __init__(self, route: Callable[[aiomqtt.Message], None], maxsize: int = 0) -> None:
        super().__init__(maxsize=0)
        self._route = route

    def put_nowait(self, item: aiomqtt.Message) -> None:
        self._route(item)


class _Connection:
    """One live aiomqtt connection and what has been done on it."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        #: Set by the supervisor when the connection is gone.
        self.lost = asyncio.Event()
        #: topic -> future resolved when the broker acknowledged our SUBSCRIBE.
        self.topics: dict[str, asyncio.Future[None]] = {}
        #: Operations awaiting the broker on this connection (cancelled on loss).
        self.pending: set[asyncio.Task] = set()


def _packet_read_but_unhandled(client: paho.Client) -> bool:
    """Whether ``client`` holds a whole incoming packet it has not handled yet."""
    packet = getattr(client, "_in_packet", None)
    if not isinstance(packet, dict):
        return False
    return bool(packet.get("command")) and bool(packet.get("have_remaining")) and packet.get("to_process") == 0


def handle_completed_packets(client: paho.Client) -> None:
    """Make ``client.loop_read`` handle a packet whose last bytes it has just read.

    paho-mqtt (2.2.0 and earlier) reads a packet's body in at most 100 ``recv``
    calls per ``loop_read``; when the 100th call happens to complete the packet, it
    returns "try again" *before* handling it. aiomqtt calls ``loop_read`` only when
    the socket is readable, and every byte has been read, so the packet (a large
    message: an 8 MiB batch chunk arrives in ~512 TLS records) waits until the
    broker next sends anything -- the keepalive PINGRESP, 60 s later. Measured here:
    5 of 200 8-MiB deliveries under CPU load took 60 s
    (``scripts/mqtt_large_message_soak.py``). This wrapper calls ``loop_read`` again
    while a whole packet sits unhandled, which runs paho's own handler on it.
    """
    read = client.loop_read

    @functools.wraps(read)
    def loop_read(max_packets: int = 1) -> paho.MQTTErrorCode:
        rc = read(max_packets)
        while rc == paho.MQTT_ERR_SUCCESS and _packet_read_but_unhandled(client):
            rc = read(max_packets)
        return rc

    client.loop_read = loop_read  # type: ignore[method-assign]


def _reason_code(exc: BaseException) -> int | None:
    rc = getattr(exc, "rc", None)
    if rc is None:
        return None
    return int(getattr(rc, "value", rc))


#: Words of a connection failure that waiting cannot mend (see :func:`_transient`).
_PERMANENT = ("certificate verify failed", "name or service not known", "nodename nor servname",
              "no address associated", "wrong version number")


def _transient(exc: BaseException) -> bool:
    """Whether a failed connection attempt may succeed if made again (the broker starting or
    restarting): not for refused credentials, a certificate that fails verification, an unknown
    host name or a TLS listener spoken to in plaintext (and the reverse)."""
    if isinstance(exc, MqttConnectError):
        return _reason_code(exc) not in _REFUSED_IDENTITY  # e.g. "server unavailable": retried
    if isinstance(exc, (ssl.SSLCertVerificationError, socket.gaierror)):
        return False
    text = str(exc).lower()
    return not any(word in text for word in _PERMANENT)


def describe(exc: BaseException) -> str:
    """A one-line reason for an aiomqtt/paho/socket failure."""
    if isinstance(exc, MqttConnectError) and _reason_code(exc) in _REFUSED_IDENTITY:
        return f"not authorised (the broker refused the credentials: {exc})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message or exc}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the broker running on that port?)"
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}"
    if "certificate verify failed" in text.lower():
        text = f"TLS certificate verification failed: {text}"
    return " ".join(text.split())


class MqttChannel:
    """Publish/subscribe through an MQTT broker; use as ``async with MqttChannel(host, port) as ch``.

    Parameters (all but host and port keyword-only):

    * ``username``/``password``: the broker account (anonymous if None);
    * ``tls_ca_file``: connect with TLS (1.2 or later), verifying the broker's
      certificate and host name against this CA; plaintext if None;
    * ``reconnect``: re-establish a lost connection (see the module docstring); if
      False a lost connection kills the channel: later and waiting operations raise
      :class:`TransportError`;
    * ``max_backoff``: longest wait between reconnection attempts, seconds;
    * ``first_connect_retry``: seconds over which :meth:`connect` tries again a first
      connection that failed for a transient reason (0: one attempt; see the module docstring);
    * ``publish_timeout``: longest a :meth:`publish` or :meth:`subscribe` call takes,
      waiting for a reconnection and the broker's acknowledgement included;
    * ``queue_limit``: most unread messages per subscription (0 = unbounded);
    * ``connect_timeout``: longest wait for the broker's CONNACK per attempt;
    * ``max_inflight_publishes``: most publishes awaiting a PUBACK at once (more wait
      for a slot; 256 keeps a loopback broker busy, raise it for high-latency links);
    * ``keepalive``: MQTT keepalive, seconds (a silent broker is detected after 1.5x);
    * ``failover``: further ``(host, port)`` addresses of the same (clustered) broker, tried
      after ``(hostname, port)`` in order (see the module docstring);
    * ``subscribe_qos``: the QoS of subscriptions (publishes are always QoS 1). 1 by default;
      0 for a broker that backs each QoS 1 subscription with a replicated store (NATS: a
      JetStream consumer, whose creation fails while a cluster node is down). On a clean
      session the two lose the same: a message on its way when the connection drops is
      dropped with the session either way, and re-subscription resumes from then on.

    Counters: ``bytes_by_topic`` and ``messages_by_topic`` (acknowledged publishes),
    ``reconnects`` (successful re-connections), ``republished`` (publishes sent
    again because the connection dropped before their PUBACK), ``dropped_by_topic``
    (messages dropped because a subscription's queue was full).
    """

    def __init__(
        self,
        hostname: str = "127.0.0.1",
        port: int = 1883,
        *,
        first_connect_retry: float = 0.0,
        identifier: str | None = None,
        username: str | None = None,
        password: str | None = None,
        tls_ca_file: str | os.PathLike[str] | None = None,
        reconnect: bool = True,
        max_backoff: float = 5.0,
        publish_timeout: float = 30.0,
        queue_limit: int = 1_000_000,
        connect_timeout: float = 10.0,
        max_inflight_publishes: int = 256,
        keepalive: int = 60,
        failover: Iterable[tuple[str, int]] = (),
        subscribe_qos: int = 1,
    ) -> None:
        if subscribe_qos not in (0, 1):
            raise ValueError(f"subscribe_qos must be 0 or 1, got {subscribe_qos}")
        if max_backoff < 0.1:
            raise ValueError(f"max_backoff must be >= 0.1 s, got {max_backoff}")
        if publish_timeout <= 0 or connect_timeout <= 0:
            raise ValueError("publish_timeout and connect_timeout must be > 0")
        if not 0 <= first_connect_retry < math.inf:
            raise ValueError(f"first_connect_retry must be a finite number of seconds >= 0, got {first_connect_retry}")
        if queue_limit < 0:
            raise ValueError(f"queue_limit must be >= 0 (0 = unbounded), got {queue_limit}")
        if not 1 <= max_inflight_publishes <= 60_000:
            # paho numbers in-flight messages with 16-bit ids.
            raise ValueError(f"max_inflight_publishes must be in [1, 60000], got {max_inflight_publishes}")
        self.hostname = hostname
        self.port = port
        #: Every address of the broker, ``(hostname, port)`` first; :attr:`address` is the one in use.
        self.addresses: list[tuple[str, int]] = [(hostname, port)] + [(str(h), int(p)) for h, p in failover]
        self._address_index = 0
        self.identifier = identifier or f"shuffledp-{os.urandom(16).hex()}"
        self.username = username
        self._password = password
        self.subscribe_qos = subscribe_qos
        self.tls_ca_file = os.fspath(tls_ca_file) if tls_ca_file is not None else None
        self.reconnect = reconnect
        self.first_connect_retry = first_connect_retry
        self.max_backoff = max_backoff
        self.publish_timeout = publish_timeout
        self.queue_limit = queue_limit
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._max_inflight_publishes = max_inflight_publishes
        self._publish_slots: asyncio.Semaphore | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._conn: _Connection | None = None
        self._online: asyncio.Event | None = None
        self._supervisor: asyncio.Task | None = None
        self._dead: TransportError | None = None
        self._background: set[asyncio.Task] = set()
        self._subscribers: dict[str, list[QueueSubscription]] = defaultdict(list)
        self.bytes_by_topic: Counter = Counter()
        self.messages_by_topic: Counter = Counter()
        self.dropped_by_topic: Counter = Counter()
        #: Retained messages on reports topics, dropped unread: reports are never published
        #: retained, and a retained one would replay to every later subscription.
        self.dropped_retained: Counter = Counter()
        self.reconnects = 0
        self.republished = 0
        self.last_error: str | None = None

    def companion(self, suffix: str) -> "MqttChannel":
        """A new, unconnected channel to the same broker with the same account, TLS and options, and
        the client id ``<this channel's>-<suffix>``: a second MQTT connection, so a second broker
        session with a queue of its own. A party reads on it the topics that must not share a
        queue with a flood (the shuffler: the analyzer's announcements and acknowledgements,
        beside reports topics every client account may publish to; see ``Shuffler``)."""
        if not suffix or not all(c.isalnum() or c in "-_" for c in suffix):
            raise ValueError(f"suffix must be letters, digits, '-' or '_', got {suffix!r}")
        return MqttChannel(
            self.hostname, self.port, first_connect_retry=self.first_connect_retry,
            identifier=f"{self.identifier}-{suffix}", username=self.username, password=self._password,
            tls_ca_file=self.tls_ca_file, reconnect=self.reconnect, max_backoff=self.max_backoff,
            publish_timeout=self.publish_timeout, queue_limit=self.queue_limit, connect_timeout=self.connect_timeout,
            max_inflight_publishes=self._max_inflight_publishes, keepalive=self.keepalive, failover=self.addresses[1:],
            subscribe_qos=self.subscribe_qos,
        )

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "MqttChannel":
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def address(self) -> str:
        """``host:port`` of the address connected to, or tried last."""
        host, port = self.addresses[self._address_index]
        return f"{host}:{port}"

    def _next_address(self) -> None:
        """Make the next address (round the ring) the one the next attempt goes to."""
        self._address_index = (self._address_index + 1) % len(self.addresses)

    @property
    def connected(self) -> bool:
        """Whether a connection to the broker is up right now."""
        return self._dead is None and self._conn is not None and self._online is not None and self._online.is_set()

    async def connect(self) -> None:
        """Open the first connection; raises :class:`TransportError` (one line) if it fails.

        With ``first_connect_retry`` > 0 an attempt that failed for a transient reason (the
        broker not listening yet, restarting: see the module docstring) is made again after a
        jittered, doubling wait (0.1 s up to ``max_backoff``), each failure logged as one
        warning, until ``first_connect_retry`` seconds have passed; then the last failure is
        raised, saying how long it was tried. Refused credentials, a certificate that fails
        verification, an unreadable CA file or an unknown host are raised at once."""
        if self._supervisor is not None:
            raise RuntimeError("MqttChannel is already connected")
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.first_connect_retry
        delay = 0.1
        self._address_index = 0
        while True:
            try:
                client = await self._open()
                break
            except _Unreachable as exc:
                self.last_error = str(exc)
                self._next_address()
                if self._address_index != 0:
                    continue  # another node first: waiting is for when none answers
                remaining = give_up - loop.time()
                if self.first_connect_retry <= 0:
                    raise
                if remaining <= 0:
                    raise TransportError(f"{exc} (a first connection, tried for {self.first_connect_retry:g} s)") from None
                wait = min(delay * random.uniform(0.5, 1.0), remaining)
                delay = min(delay * 2, self.max_backoff)
                log.warning("MQTT channel %s: %s; trying again in %.1f s (a first connection is tried for up to %g s)",
                            self.identifier, exc, wait, self.first_connect_retry)
                await asyncio.sleep(wait)
        self._online = asyncio.Event()
        self._publish_slots = asyncio.Semaphore(self._max_inflight_publishes)
        self._dead = None
        self._conn = _Connection(client)
        self._online.set()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"mqtt-supervisor-{self.identifier}")

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_ca_file is None:
            return None
        if self._tls_context is None:
            try:
                context = ssl.create_default_context(cafile=self.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise TransportError(f"cannot read the broker CA file {self.tls_ca_file}: {describe(exc)}") from None
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._tls_context = context
        return self._tls_context

    async def _open(self) -> aiomqtt.Client:
        """One connection attempt; :class:`TransportError` with the reason if it fails, as
        :class:`_Unreachable` when another attempt may succeed (:func:`_transient`)."""
        where = f"cannot connect to the MQTT broker at {self.address}"
        hostname, port = self.addresses[self._address_index]
        try:
            client = aiomqtt.Client(
                hostname,
                port,
                username=self.username,
                password=self._password,
                identifier=self.identifier,
                queue_type=functools.partial(_RoutingQueue, self._route),  # type: ignore[arg-type]
                # No window of paho's own (0): the channel's publish slots already bound the publishes
                # awaiting a PUBACK, and paho's window scans every message it holds at each PUBACK.
                max_inflight_messages=0,
                tls_context=self._ssl_context(),
                timeout=self.connect_timeout,
                keepalive=self.keepalive,
                socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
                logger=_AIOMQTT_LOG,
            )
            client._client.enable_logger(_PAHO_LOG)  # paho's chatter stays below the level this logger shows
            client.pending_calls_threshold = 1 << 30  # many concurrent publishes are normal here
            handle_completed_packets(client._client)
            await client.__aenter__()
        except TransportError:
            raise
        except aiomqtt.MqttError as exc:
            reason = describe(exc)
            if reason == "Operation timed out":
                hint = "" if self.tls_ca_file else " (if it is a TLS listener, pass tls_ca_file)"
                reason = f"no answer to CONNECT within {self.connect_timeout:g} s{hint}"
            raise (_Unreachable if _transient(exc) else TransportError)(f"{where}: {reason}") from None
        except ValueError as exc:
            raise TransportError(f"{where}: {describe(exc)}") from None
        except OSError as exc:
            raise (_Unreachable if _transient(exc) else TransportError)(f"{where}: {describe(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - e.g. aiomqtt's socket callbacks racing the loop's selector
            raise _Unreachable(f"{where}: the connection failed while it was set up ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())})") from None
        return client

    async def close(self) -> None:
        """Disconnect. Afterwards (and for subscriptions still waiting) every operation
        raises :class:`TransportError`; queued messages stay readable. Idempotent."""
        if self._dead is None:
            self._die(TransportError("the MQTT channel is closed"), notify=False)
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            for task in list(conn.pending):
                task.cancel()
            await self._discard(conn.client)
        self._subscribers.clear()

    def _die(self, error: TransportError, *, notify: bool = True) -> None:
        """Kill the channel: fail every subscription and wake every waiter with ``error``."""
        self._dead = error
        if notify:
            log.warning("MQTT channel %s is dead: %s", self.identifier, error)
        for subs in self._subscribers.values():
            for sub in subs:
                sub.fail(TransportError(str(error)))
        if self._conn is not None:
            self._conn.lost.set()
            for task in list(self._conn.pending):
                task.cancel()
        if self._online is not None:
            self._online.set()  # waiters wake and see _dead

    async def _discard(self, client: aiomqtt.Client) -> None:
        """Disconnect ``client`` quietly (it may already be gone), and read the reason aiomqtt kept for
        the disconnection: unread, asyncio would print it ("Future exception was never retrieved")."""
        try:
            await asyncio.wait_for(client.__aexit__(None, None, None), timeout=2.0)
        except (asyncio.TimeoutError, aiomqtt.MqttError, OSError, RuntimeError):
            pass
        disconnected = getattr(client, "_disconnected", None)
        if isinstance(disconnected, asyncio.Future) and disconnected.done() and not disconnected.cancelled():
            disconnected.exception()

    # ------------------------------------------------------------------ supervisor

    async def _supervise(self) -> None:
        """Watch the connection; on loss, reconnect (or kill the channel)."""
        try:
            while True:
                conn = self._conn
                assert conn is not None and self._online is not None
                reason = await self._wait_for_loss(conn)
                self.last_error = reason
                self._online.clear()
                self._conn = None
                conn.lost.set()
                for task in list(conn.pending):
                    task.cancel()
                await self._discard(conn.client)
                if not self.reconnect:
                    self._die(TransportError(f"lost the connection to the MQTT broker at {self.address}: {reason}"))
                    return
                log.warning("MQTT channel %s lost the broker at %s (%s); reconnecting", self.identifier, self.address, reason)
                self._conn = await self._reconnect()
                self.reconnects += 1
                self._online.set()
                log.warning("MQTT channel %s reconnected to %s", self.identifier, self.address)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave every waiter hanging
            log.exception("MQTT channel supervisor failed")
            self._die(TransportError(f"the MQTT channel's supervisor failed: {exc!r}"))

    async def _wait_for_loss(self, conn: _Connection) -> str:
        """Return (with the reason) when ``conn`` disconnects. The routing queue never
        yields a message, so aiomqtt's iterator only ends by raising on disconnect."""
        try:
            async for _ in conn.client.messages:
                pass
        except aiomqtt.MqttError as exc:
            cause = exc.__cause__
            return describe(cause) if cause is not None else describe(exc)
        return "the message stream ended"

    async def _reconnect(self) -> _Connection:
        """Connect again with jittered exponential backoff and re-subscribe every topic
        that has live subscriptions. Tries until it succeeds (or is cancelled)."""
        delay = 0.1
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.max_backoff)
            self._next_address()  # the node just lost (or just tried) is the least likely to answer
            try:
                client = await self._open()
            except TransportError as exc:
                self.last_error = str(exc)
                continue
            conn = _Connection(client)
            try:
                deadline = asyncio.get_running_loop().time() + self.connect_timeout
                for topic in [t for t, subs in self._subscribers.items() if subs]:
                    await self._subscribe_on(conn, topic, deadline)
            except (_ConnectionLost, TransportError) as exc:
                self.last_error = f"re-subscribing failed: {exc or 'connection lost'}"
                await self._discard(client)
                continue
            except asyncio.CancelledError:  # closed meanwhile: do not leak the connection
                await asyncio.shield(self._discard(client))
                raise
            return conn

    # ------------------------------------------------------------------ routing

    def _route(self, message: aiomqtt.Message) -> None:
        """Deliver one received message to its topic's subscriptions (called by aiomqtt
        from the socket callback; must never raise)."""
        try:
            topic = message.topic.value
            subs = self._subscribers.get(topic)
            if not subs:
                return
            if message.retain and topic.endswith(REPORTS_SUFFIX):
                # A client account may publish retained on a reports topic (mosquitto 2.0 cannot
                # forbid it per role); the broker replays such a message to every later
                # subscriber, so a report that arrives retained is never delivered.
                self.dropped_retained[topic] += 1
                return
            payload = message.payload
            data = bytes(payload) if isinstance(payload, (bytes, bytearray)) else b""
            for sub in subs:
                if not sub.deliver(data) and sub.failed is None:
                    self.dropped_by_topic[topic] += 1
        except Exception:  # never break aiomqtt's read loop
            log.exception("MQTT channel %s could not route a message", self.identifier)

    # ------------------------------------------------------------------ operations

    def _check_started(self) -> None:
        if self._online is None:
            raise RuntimeError("MqttChannel is not connected")

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.publish_timeout

    async def _wait_online(self, deadline: float, what: str) -> _Connection:
        """The live connection, waiting for a reconnection until ``deadline``."""
        assert self._online is not None
        loop = asyncio.get_running_loop()
        while True:
            if self._dead is not None:
                raise TransportError(f"{what}: {self._dead}")
            if self._online.is_set() and self._conn is not None:
                return self._conn
            remaining = deadline - loop.time()
            if remaining > 0:
                try:
                    await asyncio.wait_for(self._online.wait(), remaining)
                    continue
                except asyncio.TimeoutError:
                    pass
            last = f" (last error: {self.last_error})" if self.last_error else ""
            raise TransportError(
                f"{what}: not connected to the MQTT broker at {self.address} within {self.publish_timeout:g} s{last}"
            )

    async def _run_on(self, conn: _Connection, operation: Awaitable[T], deadline: float, what: str) -> T:
        """Await ``operation`` (an aiomqtt call on ``conn``) until ``deadline``.

        Raises :class:`_ConnectionLost` if the connection went away meanwhile,
        :class:`TransportError` on timeout or on any other failure."""
        task: asyncio.Task[T] = asyncio.ensure_future(operation)
        conn.pending.add(task)
        task.add_done_callback(conn.pending.discard)
        try:
            done, _ = await asyncio.wait((task,), timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        finally:
            if not task.done():
                task.cancel()
        if not done:
            raise TransportError(f"{what}: no acknowledgement from the broker at {self.address} within {self.publish_timeout:g} s")
        if task.cancelled():
            raise _ConnectionLost()
        exc = task.exception()
        if exc is None:
            return task.result()
        if conn.lost.is_set() or _reason_code(exc) in _CONNECTION_GONE:
            raise _ConnectionLost()
        raise TransportError(f"{what}: {describe(exc)}")

    async def _wait_lost(self, conn: _Connection, deadline: float) -> None:
        """After an operation saw ``conn`` fail, give the supervisor time to notice."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining > 0 and not conn.lost.is_set():
            try:
                await asyncio.wait_for(conn.lost.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish ``payload`` to ``topic`` with QoS 1; returns once the broker acknowledged it.

        During a disconnect it waits for the reconnection; if the connection drops
        before the acknowledgement it publishes again on the next connection (so
        the message may arrive twice). Raises :class:`TransportError` if that has not
        succeeded within ``publish_timeout`` or the channel is dead. Note that a
        broker acknowledges, then silently drops, a publish its ACL forbids.
        """
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        self._check_started()
        assert self._publish_slots is not None
        what = f"publish to {topic}"
        async with self._publish_slots:
            deadline = self._deadline()
            while True:
                conn = await self._wait_online(deadline, what)
                coro = conn.client.publish(topic, payload, qos=1, retain=retain, timeout=math.inf)
                try:
                    await self._run_on(conn, coro, deadline, what)
                    break
                except _ConnectionLost:
                    self.republished += 1
                    await self._wait_lost(conn, deadline)
        self.bytes_by_topic[topic] += len(payload)
        self.messages_by_topic[topic] += 1

    async def publish_many(
        self, topic: str, payloads: Iterable[bytes], *, retain: bool = False, window: int = 256
    ) -> int:
        """Publish every payload to ``topic``, at most ``window`` awaiting their PUBACK
        at a time; returns how many were published.

        On a stable connection messages leave in the order given. On the first
        failure the publishes not yet done are cancelled and its
        :class:`TransportError` is raised (some earlier payloads have been delivered).
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        pending: set[asyncio.Task[None]] = set()
        count = 0

        def settle(done: Iterable[asyncio.Task[None]]) -> None:
            errors = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
            if errors:
                raise errors[0]  # type: ignore[misc]

        try:
            for payload in payloads:
                if len(pending) >= window:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    settle(done)
                pending.add(asyncio.ensure_future(self.publish(topic, payload, retain=retain)))
                count += 1
            if pending:
                done, pending = await asyncio.wait(pending)
                settle(done)
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return count

    async def subscribe(self, topic: str) -> QueueSubscription:
        """Subscribe to ``topic`` (QoS 1); returns once the broker acknowledged it.

        The subscription's queue is bounded by ``queue_limit``. Raises
        :class:`TransportError` if the broker refuses the subscription, or it could not
        be made within ``publish_timeout``. A broker that lets the subscription
        through but has no read access for this user simply never delivers anything.
        """
        self._check_started()
        if self._dead is not None:
            raise TransportError(f"subscribe to {topic}: {self._dead}")
        sub = QueueSubscription(on_close=lambda s: self._unsubscribe(topic, s), maxsize=self.queue_limit)
        self._subscribers[topic].append(sub)
        deadline = self._deadline()
        what = f"subscribe to {topic}"
        try:
            while True:
                conn = await self._wait_online(deadline, what)
                try:
                    await self._subscribe_on(conn, topic, deadline)
                    return sub
                except _ConnectionLost:
                    await self._wait_lost(conn, deadline)  # the reconnection re-subscribes it
        except BaseException:
            subs = self._subscribers.get(topic)
            if subs is not None and sub in subs:
                subs.remove(sub)
                if not subs:
                    del self._subscribers[topic]
            raise

    async def _subscribe_on(self, conn: _Connection, topic: str, deadline: float) -> None:
        """Make sure ``conn`` is subscribed to ``topic`` (one SUBSCRIBE per topic and
        connection; concurrent callers share it)."""
        pending = conn.topics.get(topic)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            conn.topics[topic] = pending
            what = f"subscribe to {topic}"
            try:
                granted = await self._run_on(conn, conn.client.subscribe(topic, qos=self.subscribe_qos, timeout=math.inf),
                                             deadline, what)
                codes = [code if isinstance(code, int) else int(code.value) for code in granted]
                if any(code >= 0x80 for code in codes):
                    raise TransportError(f"{what}: not authorised (the broker refused the subscription)")
            except BaseException as exc:
                conn.topics.pop(topic, None)
                if not pending.done():
                    pending.set_exception(exc if isinstance(exc, (TransportError, _ConnectionLost)) else _ConnectionLost())
                    pending.exception()  # retrieved: sharers re-raise it themselves
                raise
            pending.set_result(None)
            return
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait_for(asyncio.shield(pending), remaining)
        except asyncio.TimeoutError:
            raise TransportError(f"subscribe to {topic}: no acknowledgement within {self.publish_timeout:g} s") from None

    async def retained(self, topic: str) -> bytes | None:
        """The message the broker retains on ``topic``, or None if it retains none, known without
        waiting out a timeout.

        It subscribes, then unsubscribes and waits for the broker's UNSUBACK. A broker sends a
        topic's retained message as it takes the SUBSCRIBE (mosquitto writes it right behind the
        SUBACK, before it reads the next packet) and answers one connection's packets in order,
        and this channel routes each message as paho reads it, so once the UNSUBACK is in, the
        retained message, if there is one, is in the subscription. A connection lost meanwhile is
        re-established with the topic subscribed again (which delivers the message again) before
        the UNSUBSCRIBE is retried. The channel must not hold another subscription to ``topic``
        (ValueError: its unsubscription would end that one too). Raises :class:`TransportError`
        as :meth:`subscribe` does.
        """
        if self._subscribers.get(topic):
            raise ValueError(f"{topic}: this channel already holds a subscription to it")
        sub = await self.subscribe(topic)
        try:
            await self._unsubscribe_now(topic)
        finally:
            await sub.close()  # the broker no longer sends anything for it: nothing left to unsubscribe
        found = sub.get_nowait_all(1)
        return found[0] if found else None

    async def _unsubscribe_now(self, topic: str) -> None:
        """UNSUBSCRIBE ``topic`` and wait for the broker's UNSUBACK (on a reconnection, once it
        subscribed the topic again), then forget it on the connection."""
        deadline = self._deadline()
        what = f"unsubscribe from {topic}"
        while True:
            conn = await self._wait_online(deadline, what)
            try:
                await self._run_on(conn, conn.client.unsubscribe(topic, timeout=math.inf), deadline, what)
            except _ConnectionLost:
                await self._wait_lost(conn, deadline)
                continue
            conn.topics.pop(topic, None)
            return

    def _unsubscribe(self, topic: str, sub: QueueSubscription) -> None:
        subs = self._subscribers.get(topic, [])
        if sub in subs:
            subs.remove(sub)
        if subs:
            return
        self._subscribers.pop(topic, None)
        conn = self._conn
        if conn is not None and self._dead is None and conn.topics.pop(topic, None) is not None:
            task = asyncio.ensure_future(self._quiet_unsubscribe(conn, topic))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _quiet_unsubscribe(self, conn: _Connection, topic: str) -> None:
        try:
            await conn.client.unsubscribe(topic)
        except (aiomqtt.MqttError, OSError):
            pass  # the connection is gone; nothing is left to unsubscribe from
