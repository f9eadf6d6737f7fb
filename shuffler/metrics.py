"""Operator metrics for the shuffler: Prometheus text exposition over a minimal HTTP/1.0 server.

:func:`render_metrics` turns :meth:`Shuffler.stats() <shuffledp.shuffler.service.Shuffler.stats>`
(and, optionally, the MQTT channel's counters) into the Prometheus text format 0.0.4.
Every counter counts since the process started; a restarted shuffler starts again
from zero (Prometheus treats that as a counter reset), except that envelopes
reloaded from the spool count as admitted again and are also counted in
``shuffledp_shuffler_resumed_total``.

:class:`MetricsServer` serves ``GET /metrics`` (and ``HEAD``) with
``asyncio.start_server`` and a hand-written HTTP/1.0 responder: one request per
connection, then close. It is built to be robust to whatever reaches the port:

* the request head (request line and headers) must arrive within ``read_timeout``
  seconds and fit in ``max_request_bytes``, else the answer is ``408`` or ``400``
  (or the connection is just closed if even that cannot be written); after an
  error answer the rest of the input is read and dropped (at most 16 times
  ``max_request_bytes``, for at most a second) so that closing does not reset the
  connection before the client has read the answer;
* anything that is not ``METHOD TARGET HTTP/x.y`` in ASCII is ``400``; methods
  other than GET and HEAD are ``405``; paths other than ``/metrics`` are ``404``;
* at most ``max_connections`` connections are served at once; more are closed
  at once, unanswered;
* no input ever ends the server or reaches the shuffler: every failure is
  confined to its connection (and counted in :attr:`MetricsServer.bad_requests`).

It binds to 127.0.0.1 by default: metrics carry no secret, but exposing them
beyond the host is the operator's decision (``--metrics-host``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping

_log = logging.getLogger(__name__)

PREFIX = "shuffledp_shuffler_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Outcomes of a round that mean its batch left the shuffler.
_RELEASED = ("forwarded", "served")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float | int) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class _Exposition:
    """Builds the text of one scrape: HELP and TYPE once per metric, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[Mapping[str, str], float | int]] | float | int,
    ) -> None:
        full = PREFIX + name
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        if isinstance(samples, (int, float)):
            samples = [({}, samples)]
        for labels, value in samples:
            label_text = ",".join(f'{key}="{_escape(str(val))}"' for key, val in sorted(labels.items()))
            self.lines.append(f"{full}{{{label_text}}} {_number(value)}" if label_text else f"{full} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _by(label: str, counts: Mapping[str, int]) -> list[tuple[dict[str, str], int]]:
    return [({label: str(key)}, int(value)) for key, value in sorted(counts.items())]


def render_metrics(stats: Mapping[str, Any], transport: Mapping[str, Any] | None = None) -> str:
    """The Prometheus text exposition of a shuffler's ``stats()`` (and its MQTT ``transport`` counters).

    ``transport`` may hold ``connected`` (bool), ``reconnects``, ``republished`` and
    ``dropped`` (ints), as the shuffler service collects them from its MqttChannel.
    """
    rounds = list(stats.get("rounds", ()))
    outcomes = [str(r.get("outcome", "open")) for r in rounds]
    failed: dict[str, int] = {}
    for outcome in outcomes:
        if outcome != "open" and outcome not in _RELEASED:
            failed[outcome] = failed.get(outcome, 0) + 1
    out = _Exposition()
    out.metric("info", "gauge", "The session this shuffler serves (value is always 1).",
               [({"session_id": str(stats.get("session_id", ""))}, 1)])
    out.metric("uptime_seconds", "gauge", "Seconds since the shuffler process started.", float(stats.get("uptime_s", 0.0)))
    out.metric("admitted_total", "counter", "Envelopes admitted (committed to the spool), resumed ones included.",
               int(stats.get("admitted_total", 0)))
    out.metric("resumed_total", "counter", "Envelopes reloaded from the spool when a round was resumed after a restart.",
               sum(int(r.get("resumed", 0)) for r in rounds))
    out.metric("retransmitted_total", "counter", "Exact retransmissions of admitted envelopes (acknowledged again, counted once).",
               sum(int(r.get("retransmitted", 0)) for r in rounds))
    out.metric("forwarded_total", "counter", "Reports forwarded to the analyzer in released batches.",
               sum(int(r.get("forwarded", 0)) for r in rounds))
    out.metric("rejected_total", "counter", "Envelopes refused at admission, by reason.",
               _by("reason", stats.get("rejected_total", {})))
    out.metric("receipts_unsent_total", "counter", "Receipts messages that could not be published.",
               sum(int(r.get("receipts_unsent", 0)) for r in rounds))
    out.metric("rounds_total", "counter", "Rounds by outcome: released (batch forwarded), served (analyzer acknowledged), failed.",
               [({"outcome": "released"}, sum(o in _RELEASED for o in outcomes)),
                ({"outcome": "served"}, sum(o == "served" for o in outcomes)),
                ({"outcome": "failed"}, sum(failed.values()))])
    out.metric("rounds_failed_total", "counter", "Failed rounds, by reason.", _by("reason", failed))
    out.metric("rounds_open", "gauge", "Rounds open (admitting envelopes) now.", sum(o == "open" for o in outcomes))
    out.metric("acknowledged_batches_total", "counter", "Batches the analyzer acknowledged (signed BatchAck).",
               int(stats.get("acknowledged_batches", 0)))
    out.metric("republished_batches_total", "counter", "Unacknowledged batches published again (after a restart, and periodically).",
               int(stats.get("republished_batches", 0)))
    out.metric("storage_errors_total", "counter",
               "Spool writes that failed (disk full, I/O error), by operation (open-round, release, fail, acknowledge); "
               'envelopes refused because their admission could not be written are in rejected_total{reason="storage-error"}.',
               _by("operation", stats.get("storage_errors", {})))
    out.metric("rejected_acks_total", "counter", "Acknowledgements refused, by reason.", _by("reason", stats.get("rejected_acks", {})))
    out.metric("rejected_announcements_total", "counter", "Round announcements refused, by reason.",
               _by("reason", stats.get("rejected_announcements", {})))
    if transport is not None:
        out.metric("mqtt_connected", "gauge", "Whether the MQTT connection is up (1) or not (0).", bool(transport.get("connected")))
        out.metric("mqtt_reconnects_total", "counter", "Successful MQTT re-connections.", int(transport.get("reconnects", 0)))
        out.metric("mqtt_republished_total", "counter", "MQTT publishes sent again because the connection dropped before their PUBACK.",
                   int(transport.get("republished", 0)))
        out.metric("mqtt_dropped_total", "counter", "Messages dropped because a subscription queue was full.",
                   int(transport.get("dropped", 0)))
    return out.text()


class MetricsServer:
    """``GET /metrics`` over HTTP/1.0 on ``host:port`` (0 = a free port), the body from ``render()``.

    :meth:`start` returns the bound port. Counters: :attr:`served` (200 answers),
    :attr:`bad_requests` (every other outcome: 4xx, timeouts, resets, refused
    connections, render failures).
    """

    def __init__(
        self,
        render: Callable[[], str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        read_timeout: float = 5.0,
        max_request_bytes: int = 8192,
        max_connections: int = 32,
    ) -> None:
        self.render = render
        self.host = host
        self.port = port
        self.read_timeout = read_timeout
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self.served = 0
        self.bad_requests = 0
        self._active = 0
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self) -> int:
        """Listen; returns the port (the one the OS chose if ``port`` was 0)."""
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, limit=self.max_request_bytes
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening and end the connections being served. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        pending = set(self._handlers)
        while pending:  # cancel again if one was lost (asyncio.wait_for on Python 3.11 can swallow it)
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            if self._active >= self.max_connections:
                self.bad_requests += 1
                return
            self._active += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._active -= 1
        except asyncio.CancelledError:
            raise
        except Exception:  # never let a connection's failure reach the event loop's handler
            self.bad_requests += 1
            _log.debug("metrics: connection failed", exc_info=True)
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            except (Exception, asyncio.TimeoutError):
                pass
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        extra: dict[str, str]
        try:
            method, path = await asyncio.wait_for(self._read_head(reader), self.read_timeout)
        except asyncio.TimeoutError:
            status, body, extra, method = 408, "request timeout\n", {}, "GET"
        except (ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, UnicodeDecodeError):
            status, body, extra, method = 400, "bad request\n", {}, "GET"
        else:
            status, body, extra = self._answer(method, path)
        if status == 200:
            self.served += 1
        else:
            self.bad_requests += 1
        payload = body.encode("utf-8")
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  408: "Request Timeout", 500: "Internal Server Error"}[status]
        head = [f"HTTP/1.0 {status} {reason}", f"Content-Type: {CONTENT_TYPE if status == 200 else 'text/plain; charset=utf-8'}",
                f"Content-Length: {len(payload)}", "Connection: close", *(f"{k}: {v}" for k, v in extra.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (b"" if method == "HEAD" else payload))
        await asyncio.wait_for(writer.drain(), self.read_timeout)
        if status != 200:
            # Closing with unread input makes the kernel reset the connection, which can discard
            # the answer before the client reads it: drain what is left first (bounded).
            try:
                await asyncio.wait_for(self._discard(reader), min(1.0, self.read_timeout))
            except (asyncio.TimeoutError, ConnectionError):
                pass

    async def _discard(self, reader: asyncio.StreamReader) -> None:
        """Read and drop the client's remaining input, at most 16 times ``max_request_bytes``."""
        left = 16 * self.max_request_bytes
        while left > 0:
            chunk = await reader.read(min(left, 65536))
            if not chunk:
                return
            left -= len(chunk)

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """The method and path of one request, after reading (and bounding) its headers."""
        total = 0
        line = await reader.readuntil(b"\n")
        total += len(line)
        parts = line.decode("ascii").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[0].isalpha() or not parts[1].startswith("/"):
            raise ValueError("not an HTTP request line")
        while True:  # headers, until the blank line
            header = await reader.readuntil(b"\n")
            total += len(header)
            if total > self.max_request_bytes:
                raise ValueError("request head too large")
            if header in (b"\r\n", b"\n"):
                break
        return parts[0], parts[1]

    def _answer(self, method: str, path: str) -> tuple[int, str, dict[str, str]]:
        if method not in ("GET", "HEAD"):
            return 405, "method not allowed\n", {"Allow": "GET, HEAD"}
        if path.split("?", 1)[0] != "/metrics":
            return 404, "not found: try /metrics\n", {}
        try:
            return 200, self.render(), {}
        except Exception:
            _log.exception("metrics: rendering failed")
            return 500, "internal error\n", {}


__all__ = ["MetricsServer", "render_metrics"]
