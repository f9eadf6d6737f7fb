"""Audit another implementation of the device randomizers: a command that speaks the external
client protocol (``shuffledp audit --client CMD``).

A device client written in another language (the JavaScript package in ``js/``, or any other)
claims the same guarantees as the Python randomizers. This module runs the *same* audit as
:func:`shuffledp.audit.local.audit_local` -- the same worst-case pairs, events, threshold
selection, Clopper-Pearson bounds, parametric Gaussian bounds and family-wise correction -- on
reports produced by that implementation instead of the built-in one, through
:func:`~shuffledp.audit.local.run_audit`'s ``sampler`` hook. It audits the local rows whose
randomizer is a round mechanism a device runs: ``hadamard-range``, ``projected-mean``
(Laplace and Gaussian, with the Gaussian stress claim), ``vector-range`` (sampled and paper
mode) and ``vector-mean`` (Laplace and Gaussian). The frequency oracles (``k-rr``,
``hadamard-response``) are not round mechanisms, and the built-in audit has no rows for
``coordinate-tree``, ``shifted-norm`` or ``local-vector``: neither audit covers them.

Besides the privacy bound, every row gets a *law-equality* test: a two-sample chi-square test of
homogeneity of the external reports against as many built-in reports (seeded streams) on the same
inputs (:func:`two_sample_chi_square`). A correct port of a randomizer has the same output law;
a small p-value says the two implementations differ (which is not a privacy violation by itself:
the bound decides that).

The external client protocol
----------------------------
The auditor starts ``CMD`` (split like a shell command line, no shell involved) and, for each
batch of runs, writes one request line of UTF-8 JSON, ended by ``\\n``, on its standard input::

    {"spec": "<hex>", "input": <number or array of numbers>, "count": <n>}

* ``spec``: the round spec in lowercase hex: the deterministic CBOR encoding of a ``RoundSpec``
  message (``docs/wire-format.md``; the bytes an analyzer signs), carrying the mechanism, its
  parameters and the claimed ``epsilon0``/``delta0``. The keys, session and deadline in it are
  placeholders; only the mechanism part matters.
* ``input``: the local input, a number (scalar mechanisms) or an array of ``dim`` numbers
  (vector mechanisms), each a finite double written exactly (shortest round-trip form).
* ``count``: how many independent runs of the randomizer on that input to return,
  ``1 <= count <= 65536`` (:data:`MAX_REQUEST_OUTPUTS`), with ``count x messages x values`` at
  most ``2^24`` (:data:`MAX_ANSWER_VALUES`; a command may refuse a larger request).

The command answers each request, in order, on its standard output with one binary frame:

* an **answer**: the 4 bytes ``SDPR``, then three unsigned 32-bit little-endian integers
  ``count``, ``messages``, ``values``, then ``count x messages x values`` signed 64-bit
  little-endian integers: run by run, the run's messages in order, each message's values in
  order (the report tuple of the mechanism, as ``randomize_round`` returns it); or
* a **refusal**: the 4 bytes ``SDPE``, an unsigned 32-bit little-endian length (at most 1024)
  and that many bytes of UTF-8 text saying why (e.g. an unsupported mechanism). The audit stops
  with that text.

The auditor closes the command's standard input when it is done; the command should then exit.
Standard error is free for diagnostics (its last lines appear in the auditor's error messages).

Nothing the command sends is trusted: frames are read with exact, bounded lengths; a header
whose shape differs from the request (``count``; ``messages`` and ``values`` of the mechanism),
a value outside the round's report ranges (``client.mechanisms.report_ranges``), a short answer,
a command that cannot start, exits or stays silent for ``timeout`` seconds each end the audit
with one :class:`ExternalClientError` (reason ``external-client``), one line of text.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import select
import selectors
import shlex
import signal
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from shuffledp.audit.local import (
    DEFAULT_EPSILONS,
    GAUSSIAN_DELTA0,
    GAUSSIAN_STRESS,
    AuditCase,
    AuditResult,
    Progress,
    _check_confidence,
    _check_count,
    _check_delta,
    _check_epsilon,
    local_cases,
    run_audit,
)
from shuffledp.client.mechanisms import report_ranges
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import (
    ED25519_KEY_BYTES,
    SESSION_ID_BYTES,
    X25519_KEY_BYTES,
    RoundSpec,
    messages_per_user,
)

__all__ = [
    "ANSWER_MAGIC",
    "DEFAULT_EXTERNAL_TRIALS",
    "DEFAULT_TIMEOUT",
    "ERROR_MAGIC",
    "LAW_ALPHA",
    "MAX_ANSWER_VALUES",
    "MAX_REQUEST_OUTPUTS",
    "QUICK_EXTERNAL_TRIALS",
    "ExternalAudit",
    "ExternalClient",
    "ExternalClientError",
    "LawComparison",
    "audit_external",
    "audit_spec",
    "external_cases",
    "external_runs",
    "two_sample_chi_square",
]

#: First four bytes of an answer frame, then ``<III`` count, messages, values.
ANSWER_MAGIC = b"SDPR"
#: First four bytes of a refusal frame, then ``<I`` length and the UTF-8 text.
ERROR_MAGIC = b"SDPE"
_COUNTS = struct.Struct("<III")
_LENGTH = struct.Struct("<I")
#: Most runs one request asks for.
MAX_REQUEST_OUTPUTS = 1 << 16
#: Most values one answer holds (``count x messages x values``): an answer is at most 128 MiB.
MAX_ANSWER_VALUES = 1 << 24
#: Longest refusal text accepted.
MAX_ERROR_TEXT = 1024
#: Seconds the command may stay silent (no byte of an expected answer) before the audit gives up.
DEFAULT_TIMEOUT = 120.0
#: Runs per input of each row: default and ``--quick``.
DEFAULT_EXTERNAL_TRIALS = 2 * 10**5
QUICK_EXTERNAL_TRIALS = 10**4
#: Family-wise level of the law-equality tests (Bonferroni over the rows). They do not decide the
#: audit's verdict (a different law need not be less private), so they have their own budget.
LAW_ALPHA = 0.05
# Runs asked for per request: a progress step each.
_REQUEST_RUNS = 1 << 14
# Built-in runs per call of the comparison sample.
_BUILTIN_CHUNK = 1 << 18
# Bytes a pipe reported writable takes without blocking (POSIX PIPE_BUF is at least 512; Linux 4096).
_PIPE_BUF = getattr(select, "PIPE_BUF", 512)
# Placeholder deadline of the audit's specs (2100-01-01); no randomizer reads it.
_DEADLINE = 4102444800.0


class ExternalClientError(ShuffleDPError):
    """The external command could not be run, or broke the protocol (one line of text)."""

    reason = "external-client"


# --------------------------------------------------------------------------
# Specs and the command
# --------------------------------------------------------------------------


#: Signals only the main thread may take: Ctrl-C and a polite stop.
_MAIN_THREAD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _start_without_signals(thread: threading.Thread) -> None:
    """Start ``thread`` with Ctrl-C and SIGTERM blocked in it.

    A signal sent to the process goes to any thread that does not block it. Taken by a helper
    thread, Python's handler would run only when the main thread next executes bytecode, which
    its wait on the command's output (up to the whole timeout) delays. A new thread inherits
    the mask of the thread that starts it, so the mask is set around ``start()`` and restored;
    a signal arriving meanwhile stays pending for the main thread."""
    if not hasattr(signal, "pthread_sigmask"):  # no per-thread masks (Windows): nothing to route
        thread.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_THREAD_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


#: Longest single wait of the main thread on the command (seconds): a signal that another thread
#: took is acted on (Ctrl-C raised) when the main thread next runs Python code, so no wait is longer.
_SIGNAL_CHECK_INTERVAL = 0.25


def _select_within(selector: selectors.BaseSelector, timeout: float) -> list:
    """``selector.select(timeout)`` in slices of at most :data:`_SIGNAL_CHECK_INTERVAL`: the ready
    events, or ``[]`` once ``timeout`` seconds passed with none. Between slices Python runs any
    pending signal handler, so Ctrl-C is raised within a slice even when a thread other than the
    main one (a library's, or one started before the mask of :func:`_start_without_signals`) took it."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return []
        events = selector.select(min(left, _SIGNAL_CHECK_INTERVAL))
        if events:
            return events


def _placeholder(label: str, size: int) -> bytes:
    return hashlib.sha256(f"shuffledp/audit/external/{label}".encode()).digest()[:size]


def audit_spec(params: object, epsilon0: float, delta0: float) -> RoundSpec:
    """A valid round spec of ``params`` at the claim ``(epsilon0, delta0)``, with placeholder
    keys, session, round and deadline (the randomizer reads only the mechanism part)."""
    return RoundSpec(
        session_id=_placeholder("session", SESSION_ID_BYTES),
        round_id=1,
        params=params,  # type: ignore[arg-type]
        epsilon0=float(epsilon0),
        analyzer_key=_placeholder("analyzer-key", X25519_KEY_BYTES),
        shuffler_key=_placeholder("shuffler-key", X25519_KEY_BYTES),
        shuffler_signing_key=_placeholder("shuffler-signing-key", ED25519_KEY_BYTES),
        min_batch=1,
        deadline=_DEADLINE,
        delta0=float(delta0),
        messages_per_user=messages_per_user(params),  # type: ignore[arg-type]
    )


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ExternalClient:
    """A running external randomizer command (the protocol in the module docstring).

    ``command``: a command line (split with :func:`shlex.split`) or an argument list. The
    command starts on the first request (or on ``with``) and stops on :meth:`close`.
    ``timeout``: seconds without a byte of an expected answer before giving up. Every
    failure raises :class:`ExternalClientError`.
    """

    def __init__(self, command: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, cwd: str | None = None) -> None:
        argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        if not argv:
            raise InvalidParameter("client", "the command is empty")
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf")):
            raise InvalidParameter("timeout", f"must be a positive number of seconds, got {timeout!r}")
        self.argv = argv
        self.label = command if isinstance(command, str) else shlex.join(argv)
        self.timeout = float(timeout)
        self.cwd = cwd
        self.requests = 0
        self._process: subprocess.Popen | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=8)
        self._selector: selectors.BaseSelector | None = None
        self._broken = False  # the command broke the protocol: stop it at once on close

    # -- lifetime ---------------------------------------------------------

    def __enter__(self) -> "ExternalClient":
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen:
        if self._process is not None:
            return self._process
        try:
            process = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.cwd,
                bufsize=0,
            )
        except OSError as exc:
            raise ExternalClientError(f"cannot start {_one_line(self.label)!r}: {exc.strerror or exc}") from None
        self._process = process
        _start_without_signals(threading.Thread(target=self._drain_stderr, args=(process.stderr,), daemon=True))
        self._selector = selectors.DefaultSelector()
        assert process.stdin is not None and process.stdout is not None  # both opened as pipes
        self._selector.register(process.stdout, selectors.EVENT_READ)
        return process

    def _drain_stderr(self, stream) -> None:
        """Keep the last lines of the command's stderr (it must never block on a full pipe)."""
        try:
            for raw in iter(lambda: stream.readline(4096), b""):
                line = _one_line(raw.decode("utf-8", errors="replace"))
                if line:
                    self._stderr.append(line)
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Close the command's input and wait a little for it to exit (then kill it); a command
        that broke the protocol is killed at once."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None  # both opened as pipes
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=0 if self._broken else 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        process.stdout.close()

    # -- failures ---------------------------------------------------------

    def _stderr_note(self) -> str:
        time.sleep(0.05)  # let the drain thread catch the command's last words
        return f" (stderr: {self._stderr[-1]})" if self._stderr else ""

    def _ended(self, what: str) -> ExternalClientError:
        """The error for a command whose output ended early: its exit status if it exited."""
        process = self._process
        status = None
        if process is not None:
            try:
                status = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                status = None
        if status not in (None, 0):
            return ExternalClientError(f"{_one_line(self.label)!r} exited with status {status} {what}{self._stderr_note()}")
        return ExternalClientError(f"{_one_line(self.label)!r} closed its output {what}{self._stderr_note()}")

    # -- reading ----------------------------------------------------------

    def _write_all(self, data: bytes, what: str) -> None:
        """Write ``data`` to the command's stdin, giving up after ``timeout`` seconds without progress."""
        process = self._process
        assert process is not None and process.stdin is not None
        fd = process.stdin.fileno()
        view = memoryview(data)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while view:
                if not _select_within(selector, self.timeout):
                    raise ExternalClientError(f"{_one_line(self.label)!r} read nothing for {self.timeout:g} s of "
                                              f"{what}{self._stderr_note()}")
                try:
                    written = os.write(fd, view[:_PIPE_BUF])  # writable: at least this much fits
                except (BrokenPipeError, ConnectionResetError):
                    raise self._ended(f"before {what}") from None
                view = view[written:]

    def _read_exact(self, size: int, what: str) -> bytes:
        """Exactly ``size`` bytes of the command's stdout, or a typed error (EOF, silence)."""
        process = self._process
        assert process is not None and process.stdout is not None and self._selector is not None
        fd = process.stdout.fileno()
        chunks = bytearray()
        while len(chunks) < size:
            if not _select_within(self._selector, self.timeout):
                raise ExternalClientError(
                    f"{_one_line(self.label)!r} sent nothing for {self.timeout:g} s {what} "
                    f"({len(chunks)} of {size} bytes){self._stderr_note()}")
            data = os.read(fd, min(size - len(chunks), 1 << 20))
            if not data:
                raise self._ended(f"after {len(chunks)} of {size} bytes {what}")
            chunks += data
        return bytes(chunks)

    def randomize(self, spec: RoundSpec, local_input: float | np.floating | Sequence[float] | np.ndarray, count: int,
                  spec_hex: str | None = None) -> np.ndarray:
        """``count`` runs of the command's randomizer of ``spec`` on ``local_input``: int64
        ``(count, messages, values)``, every value checked against the round's report ranges.
        ``spec_hex``: the spec's encoding in hex, when the caller has it already."""
        try:
            return self._randomize(spec, local_input, count, spec_hex)
        except ExternalClientError:
            self._broken = True
            raise

    def _randomize(self, spec: RoundSpec, local_input, count: int, spec_hex: str | None) -> np.ndarray:
        count = _check_count("count", count, 1, MAX_REQUEST_OUTPUTS)
        messages = messages_per_user(spec.params)
        width = type(spec.params).VALUES_PER_REPORT
        if count * messages * width > MAX_ANSWER_VALUES:
            raise InvalidParameter("count", f"{count} runs of {messages} x {width} values exceed {MAX_ANSWER_VALUES} values")
        data = np.asarray(local_input, dtype=np.float64)
        if data.ndim > 1 or not np.all(np.isfinite(data)):
            raise InvalidParameter("local_input", "must be a finite number or a vector of finite numbers")
        if spec_hex is None:
            spec_hex = codec.canonical_encode(spec).hex()
        request = {"spec": spec_hex, "input": data.tolist(), "count": count}
        line = (json.dumps(request, separators=(",", ":"), allow_nan=False) + "\n").encode()
        process = self._start()
        self.requests += 1
        what = f"of answer {self.requests} ({spec.mechanism})"
        self._write_all(line, f"request {self.requests} ({spec.mechanism})")
        magic = self._read_exact(4, what)
        if magic == ERROR_MAGIC:
            (length,) = _LENGTH.unpack(self._read_exact(_LENGTH.size, what))
            if length > MAX_ERROR_TEXT:
                raise ExternalClientError(f"{_one_line(self.label)!r} sent a malformed refusal: {length} bytes of text, "
                                          f"at most {MAX_ERROR_TEXT}")
            text = self._read_exact(length, what).decode("utf-8", errors="replace")
            raise ExternalClientError(f"{_one_line(self.label)!r} refused request {self.requests} "
                                      f"({spec.mechanism}): {_one_line(text)}")
        if magic != ANSWER_MAGIC:
            raise ExternalClientError(f"{_one_line(self.label)!r} sent a malformed answer {self.requests}: "
                                      f"starts with {magic!r}, not {ANSWER_MAGIC!r} or {ERROR_MAGIC!r}")
        shape = _COUNTS.unpack(self._read_exact(_COUNTS.size, what))
        if shape != (count, messages, width):
            raise ExternalClientError(f"{_one_line(self.label)!r} sent a malformed answer {self.requests}: shape "
                                      f"{shape[0]} x {shape[1]} x {shape[2]}, expected {count} x {messages} x {width} "
                                      f"(runs x messages x values of {spec.mechanism})")
        body = self._read_exact(count * messages * width * 8, what)
        reports = np.frombuffer(body, dtype="<i8").astype(np.int64).reshape(count, messages, width)
        _check_ranges(reports, spec, self.label, self.requests)
        return reports


def _check_ranges(reports: np.ndarray, spec: RoundSpec, label: str, request: int) -> None:
    """Refuse any value no honest randomizer of ``spec`` can send (the analyzer's check)."""
    for index, allowed in enumerate(report_ranges(spec)):
        column = reports[:, :, index]
        bad = (column < allowed.low) | (column > allowed.high) | ((column - allowed.low) % allowed.stride != 0)
        if np.any(bad):
            value = int(column[bad][0])
            raise ExternalClientError(
                f"{_one_line(label)!r} sent value {value} at position {index} of a {spec.mechanism} report in answer "
                f"{request}, outside the report range [{allowed.low}, {allowed.high}] (stride {allowed.stride})")


# --------------------------------------------------------------------------
# Law equality
# --------------------------------------------------------------------------


#: Most cells of one comparison table, and the runs a cell is made to expect (when cutting wide values).
_MAX_LEVELS = 64
_CELL_RUNS = 20.0
_MIN_CELL_TOTAL = 10


def _categories(pooled: np.ndarray) -> np.ndarray:
    """One category per run of ``pooled`` (runs x report values): the joint value where every
    column has few distinct values; a column with more than :data:`_MAX_LEVELS` is first cut at
    quantiles of the pooled runs into as many bins as keep about :data:`_CELL_RUNS` runs per
    joint cell (at least 2, at most 50)."""
    columns: list[np.ndarray | None] = []
    small_levels = 1
    wide = []
    for j in range(pooled.shape[1]):
        levels = np.unique(pooled[:, j])
        if levels.size <= _MAX_LEVELS:
            columns.append(np.searchsorted(levels, pooled[:, j]))
            small_levels *= levels.size
        else:
            columns.append(None)
            wide.append(j)
    if wide:
        per_column = (pooled.shape[0] / (_CELL_RUNS * small_levels)) ** (1.0 / len(wide))
        bins = int(min(50, max(2, per_column)))
        for j in wide:
            edges = np.unique(np.quantile(pooled[:, j], np.arange(1, bins) / bins, method="inverted_cdf"))
            columns[j] = np.searchsorted(edges, pooled[:, j], side="right")
    cut = [column for column in columns if column is not None]  # every wide column was cut just above
    _, inverse = np.unique(np.stack(cut, axis=1), axis=0, return_inverse=True)
    return inverse.ravel()


def two_sample_chi_square(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of the homogeneity test of two samples of reports.

    ``a`` and ``b``: reports (runs x messages x values, or runs x values). The runs of both are
    mapped to categories (:func:`_categories`: joint report values, wide values cut at pooled
    quantiles -- a function of the pooled sample, which is exchangeable under the null, so the
    test keeps its level); categories with fewer than :data:`_MIN_CELL_TOTAL` runs in all are
    merged into one (and that one into the next smallest while it is still that small). The
    statistic ``sum (O - E)^2 / E`` over the 2 x C table has ``C - 1`` degrees of freedom; a
    single category gives ``(0.0, 0)``.
    """
    x = np.asarray(a).reshape(len(a), -1)
    y = np.asarray(b).reshape(len(b), -1)
    if x.shape[1] != y.shape[1] or len(x) == 0 or len(y) == 0:
        raise InvalidParameter("reports", "need two non-empty samples of reports of one shape")
    category = _categories(np.concatenate([x, y]))
    table = np.stack([np.bincount(category[: len(x)], minlength=category.max() + 1),
                      np.bincount(category[len(x):], minlength=category.max() + 1)]).astype(np.float64)
    totals = table.sum(axis=0)
    sparse = totals < _MIN_CELL_TOTAL
    if np.any(sparse):
        table = np.concatenate([table[:, ~sparse], table[:, sparse].sum(axis=1, keepdims=True)], axis=1)
        if table.shape[1] > 1 and table[:, -1].sum() < _MIN_CELL_TOTAL:
            smallest = int(np.argmin(table[:, :-1].sum(axis=0)))
            table[:, smallest] += table[:, -1]
            table = table[:, :-1]
    if table.shape[1] < 2:
        return 0.0, 0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    return float(np.sum((table - expected) ** 2 / expected)), int(table.shape[1] - 1)


@dataclass(frozen=True)
class LawComparison:
    """The law-equality test of one row: the external reports vs as many built-in ones, on both
    inputs of the pair (the two sides' statistics and degrees of freedom summed: independent
    samples). ``differs``: ``pvalue`` below ``level`` (the family-wise level over the rows)."""

    mechanism: str
    epsilon0: float
    delta0: float
    runs: int
    statistic: float
    dof: int
    pvalue: float
    level: float
    differs: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _compare_laws(case: AuditCase, external: list[np.ndarray], seed: int, level: float) -> LawComparison:
    from scipy.stats import chi2

    statistic, dof = 0.0, 0
    key = zlib.crc32(f"{case.mechanism}|{case.epsilon0!r}|{case.delta0!r}".encode())
    for side, reports in enumerate(external):
        source = SeededSource(np.random.SeedSequence([seed, key, 2, side]))
        builtin = np.concatenate([case.run(side, min(_BUILTIN_CHUNK, len(reports) - done), source)
                                  for done in range(0, len(reports), _BUILTIN_CHUNK)])
        s, d = two_sample_chi_square(reports, builtin)
        statistic += s
        dof += d
    pvalue = float(chi2.sf(statistic, dof)) if dof > 0 else 1.0
    return LawComparison(case.mechanism, case.epsilon0, case.delta0, min(len(r) for r in external), statistic, dof,
                         pvalue, level, pvalue < level)


# --------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------


class _Sampler:
    """The :data:`~shuffledp.audit.local.Sampler` of an :class:`ExternalClient`: each call in
    requests of at most :data:`_REQUEST_RUNS` runs; the evaluation reports are kept per side."""

    def __init__(self, client: ExternalClient) -> None:
        self.client = client
        self.kept: list[list[np.ndarray]] = [[], []]
        self._specs: dict[int, tuple[RoundSpec, str]] = {}

    def __call__(self, case: AuditCase, side: int, n: int, purpose: int) -> np.ndarray:
        if id(case) not in self._specs:
            spec = audit_spec(case.params, case.epsilon0, case.delta0)
            self._specs = {id(case): (spec, codec.canonical_encode(spec).hex())}
        spec, spec_hex = self._specs[id(case)]
        size = messages_per_user(spec.params) * type(spec.params).VALUES_PER_REPORT
        per_request = max(1, min(_REQUEST_RUNS, MAX_ANSWER_VALUES // size))
        if case.pair is None:
            raise InvalidParameter("case", f"{case.mechanism}: an external client is audited on cases with a data pair")
        parts = []
        for done in range(0, n, per_request):
            parts.append(self.client.randomize(spec, case.pair[side], min(per_request, n - done), spec_hex))
        reports = np.concatenate(parts)
        if purpose == 1:
            self.kept[side].append(reports)
        return reports

    def take(self) -> list[np.ndarray]:
        kept, self.kept = self.kept, [[], []]
        return [np.concatenate(side) for side in kept]


def external_cases(
    epsilons: Iterable[float] = DEFAULT_EPSILONS,
    *,
    gaussian_delta0: float = GAUSSIAN_DELTA0,
    gaussian_stress: Iterable[tuple[float, float]] = GAUSSIAN_STRESS,
    mechanisms: Iterable[str] | None = None,
) -> list[AuditCase]:
    """The built-in audit's cases (:func:`~shuffledp.audit.local.local_cases`) that run a round
    mechanism, optionally only the rows named in ``mechanisms`` (row names such as
    ``hadamard-range`` or ``projected-mean-gaussian``)."""
    cases = [case for case in local_cases(list(epsilons), gaussian_delta0=gaussian_delta0,
                                          gaussian_stress=list(gaussian_stress))
             if case.params is not None]
    if mechanisms is not None:
        wanted = set(mechanisms)
        unknown = wanted - {case.mechanism for case in cases}
        if unknown:
            raise InvalidParameter("mechanisms", f"no audit rows named {', '.join(sorted(unknown))}; the rows are "
                                   f"{', '.join(sorted({case.mechanism for case in cases}))}")
        cases = [case for case in cases if case.mechanism in wanted]
    return cases


def external_runs(cases: Iterable[AuditCase], trials: int) -> int:
    """Runs of the external command :func:`audit_external` asks for (what it passes to ``progress``)."""
    return sum(2 * trials * (2 if case.threshold else 1) for case in cases)


@dataclass(frozen=True)
class ExternalAudit:
    """The rows of an external audit (the built-in audit's :class:`AuditResult`, source
    ``"external"``), the law-equality test of each, and the command audited."""

    implementation: str
    results: list[AuditResult]
    laws: list[LawComparison]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def rows(self) -> list[dict]:
        """Every row as :meth:`AuditResult.as_dict`, with its law test under ``"law"``."""
        out = []
        for result, law in zip(self.results, self.laws):
            row = result.as_dict()
            row["law"] = law.as_dict()
            out.append(row)
        return out


def audit_external(
    command: str | Sequence[str] | ExternalClient,
    trials: int = DEFAULT_EXTERNAL_TRIALS,
    epsilons: Iterable[float] = DEFAULT_EPSILONS,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    confidence: float = 0.95,
    familywise: bool = True,
    gaussian_delta0: float = GAUSSIAN_DELTA0,
    gaussian_stress: Iterable[tuple[float, float]] = GAUSSIAN_STRESS,
    mechanisms: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    law_alpha: float = LAW_ALPHA,
) -> ExternalAudit:
    """Audit the randomizers of ``command`` (the protocol of the module docstring) as
    :func:`~shuffledp.audit.local.audit_local` audits the built-in ones.

    Every row of :func:`external_cases` gets ``trials`` evaluation runs per input from the
    command and, for threshold rows, ``trials`` selection runs per input from it too (so the
    event is chosen on the command's own law, before the evaluation runs exist). The
    family-wise split is the built-in audit's: ``m`` bounds (one per row plus the parametric
    bound of each Gaussian row) at ``1 - (1 - confidence)/m`` each. The law tests are at
    ``law_alpha`` over the rows (Bonferroni), against seeded built-in runs (``seed``).
    ``progress(stage, runs)`` as runs arrive. Raises :class:`ExternalClientError` if the
    command fails or breaks the protocol.
    """
    trials = _check_count("trials", trials, 2)
    seed = _check_count("seed", seed, 0)
    confidence = _check_confidence(confidence)
    law_alpha = _check_confidence(law_alpha)
    eps_list = [_check_epsilon(e) for e in epsilons]
    if not eps_list:
        raise InvalidParameter("epsilons", "must name at least one epsilon")
    stress = [(_check_epsilon(e), _check_delta(d)) for e, d in gaussian_stress]
    cases = external_cases(eps_list, gaussian_delta0=_check_delta(gaussian_delta0), gaussian_stress=stress,
                           mechanisms=mechanisms)
    if not cases:
        raise InvalidParameter("mechanisms", "nothing to audit")
    bounds = len(cases) + sum(case.gaussian for case in cases)
    row_confidence = 1.0 - (1.0 - confidence) / bounds if familywise else confidence
    law_level = law_alpha / len(cases)
    client = command if isinstance(command, ExternalClient) else ExternalClient(command, timeout=timeout)
    results, laws = [], []
    sampler = _Sampler(client)
    try:
        for case in cases:
            results.append(run_audit(case, source="external", trials=trials, seed=seed, confidence=row_confidence,
                                     selection_trials=trials, progress=progress, parametric_confidence=row_confidence,
                                     sampler=sampler, chunk=_REQUEST_RUNS))
            laws.append(_compare_laws(case, sampler.take(), seed, law_level))
    finally:
        if client is not command:
            client.close()
    return ExternalAudit(client.label, results, laws)
