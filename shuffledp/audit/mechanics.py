"""Shuffler mechanics, checked against a running shuffler (``shuffledp audit --part mechanics``).

Amplification by shuffling (Erlingsson et al., SODA 2019; Feldman, McMillan &
Talwar, FOCS 2021) holds only if the analyzer sees the reports of a batch of at
least ``n`` users as a *uniformly random* permutation and *nothing else*. The
accountant takes that for granted; this audit checks it against the code that
runs. The auditor plays every other party: it signs and announces rounds as the
analyzer, runs real clients (real credentials, real HPKE, their OS-CSPRNG
randomizers) and crafted hostile ones, watches the wire as the broker does, and
reads the shuffled batches as the analyzer does. The shuffler is the real service
(:class:`shuffledp.shuffler.service.Shuffler`), in-process or over an MQTT broker.
Because the auditor holds the test deployment's shuffler key, it can open each
envelope's outer layer and so knows which sealed report came from which client,
in which arrival position: the link a shuffler must destroy.

The checks (each names itself in the report; :data:`CHECKS`):

* ``constant-lengths``: within a round every envelope on the wire has the declared
  length (:func:`shuffledp.protocol.wire.wire_size.envelope_bytes`) and every sealed
  report in the batch the round's sealed size, over clients holding values spread
  across the whole range: a length that depends on the value is a side channel. A
  round whose envelopes differ is not sent (the check has already failed).
* ``analyzer-view``: every chunk on the batch topic is signed by the shuffler and
  reads as a batch of the round under the analyzer's strict reader; no credential,
  client id or nonce of any envelope of the round occurs anywhere in its bytes or in
  the round's outcome; and every payload is exactly a sealed report a client sent.
* ``arrival-order-kept``: no batch (of 8 or more reports) leaves in its arrival order
  or the reverse. Under a uniform permutation that has probability ``2 / B!`` per
  batch (below ``1e-4`` at ``B = 8``), so one such batch is a violation.
* ``position-vs-arrival``, ``position-vs-client``: Pearson chi-square tests of
  independence between the output position (:data:`POSITION_BINS` bins) and the
  arrival position (envelopes go out in :data:`POSITION_BINS` bursts with a pause
  between, so this is also the test of dependence on timing) and the client (a
  fixed population answers every round, in a fresh random arrival order). With both
  margins fixed in every batch (each bin holds ``B / G`` reports), the pooled
  statistic of independent batches has mean ``(G-1)^2 B / (B-1)`` and is
  asymptotically ``B / (B-1)`` times a chi-square with ``(G-1)^2`` degrees of freedom
  (the hypergeometric variance of a permutation table is ``B / (B-1)`` times the
  multinomial one), so it is scaled by ``(B-1) / B`` before the chi-square tail.
* ``rank-correlation``: Spearman's rho between arrival and output position; under a
  uniform permutation of ``B`` items it has mean 0 and variance exactly ``1/(B-1)``,
  so ``z = sum_b rho_b sqrt(B-1) / sqrt(batches)`` is asymptotically standard
  normal (two-sided). It catches a shuffler that only partly mixes.
* ``min-batch``: a round whose ``min_batch`` is one more than its honest clients
  must end with a signed ``failed`` outcome and nothing on its batch topic.
* ``quota-and-replay``: one round with hostile envelopes among the honest ones (a
  second report under a used credential, an exact retransmission, a sealed report
  re-wrapped under another credential, a stale envelope of the previous round, a
  credential from another issuer): the batch must hold exactly the honest sealed
  reports, each once.

The statistical checks (the last three of the positional ones) share a family-wise
false-alarm rate :data:`STATISTICAL_ALPHA` (Bonferroni); every other check is
deterministic (a uniform shuffler passes it with probability 1, or ``1 - 2/B!`` per
batch). Planted faults (:mod:`shuffledp.audit.faults`: ``shuffler-arrival-order``,
``small-batch-release``, ``padding-off``, ``analyzer-gets-credentials``) each fail the
check named for them; ``tests/audit/test_audit_mechanics.py`` shows it.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

if TYPE_CHECKING:  # imported where used, lazily
    from shuffledp.protocol.wire.messages import ShuffledBatch
    from shuffledp.protocol.wire.report_format import BatchChunk
    from shuffledp.shuffler.service import Shuffler

Progress = Callable[[str, int], None]

#: Bins of the output / arrival / client position in the chi-square tests (G).
POSITION_BINS = 8
#: Family-wise false-alarm rate of the statistical checks on a correct shuffler. Small, because
#: the audit's false alarms add up over its parts (``scripts/audit_false_alarms.py`` measures
#: them): at 0.01 it measured 2 in 100 quick audits. The deterministic ``arrival-order-kept``
#: check, not these, is what catches a shuffler leaving whole batches in order.
STATISTICAL_ALPHA = 0.001
STATISTICAL_CHECKS = ("position-vs-arrival", "position-vs-client", "rank-correlation")
CHECKS = (
    "constant-lengths",
    "analyzer-view",
    "arrival-order-kept",
    *STATISTICAL_CHECKS,
    "min-batch",
    "quota-and-replay",
)
#: Smallest batch for which leaving arrival order is evidence (2 / 8! < 1e-4).
ORDER_MIN_BATCH = 8
#: Leading bytes of a credential that name the client (the rest is the issuer's tag).
CLIENT_ID_BYTES = 16
#: The mechanisms of the positional rounds, alternating: values of every CBOR width.
RANGE_LOW, RANGE_HIGH = 0.0, 64.0


@dataclass
class MechanicsCheck:
    """One mechanics check: ``status`` is ``passed``, ``failed`` or ``skipped`` (nothing to check)."""

    name: str
    status: str
    detail: str
    p_value: float | None = None

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "passed": self.passed, "detail": self.detail, "p_value": self.p_value}


@dataclass
class MechanicsAudit:
    """The mechanics checks of one audit run."""

    transport: str
    batches: int
    batch_size: int
    checks: list[MechanicsCheck]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def as_dict(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "passed": self.passed,
            "failed": self.failed,
            "seconds": self.seconds,
            "checks": [c.as_dict() for c in self.checks],
        }


@dataclass
class RoundView:
    """What the auditor saw of one round: what went in, in which order, and what came out."""

    spec: Any
    #: Encoded envelopes in the order they were published.
    sent: list[bytes]
    #: For each sent envelope: the sealed report inside (None if its outer layer did not open).
    sealed: list[bytes | None]
    #: For each sent envelope: the index of the client that made it (-1: a hostile envelope).
    clients: list[int]
    #: ``(kind, bytes)`` of every sent envelope's credential, client id and nonce (never for the analyzer).
    secrets: list[tuple[str, bytes]]
    #: The shuffler's verified outcome (None: none by the deadline).
    outcome: Any = None
    #: Raw chunks on the round's batch topic, as they arrived.
    chunks: list[bytes] = field(default_factory=list)
    #: Payloads of the released batch in output order (assembled from verified chunks).
    batch: list[bytes] = field(default_factory=list)
    #: Why a chunk could not be read as the analyzer would (empty: every chunk read).
    chunk_errors: list[str] = field(default_factory=list)
    #: The encoded outcome message, as the analyzer receives it.
    outcome_bytes: bytes = b""
    #: True if the round was not sent (its envelopes already broke a check).
    withheld: bool = False

    def forwarded(self) -> list[int]:
        """For each batch payload, the index of the sent envelope whose sealed report it is (matched by
        its first ``sealed_size`` bytes, so a payload with data appended is still placed), or -1."""
        from shuffledp.protocol.wire.report_format import report_format

        size = report_format(self.spec.round_id, self.spec.mechanism).sealed_size
        index: dict[bytes, int] = {}
        for i, s in enumerate(self.sealed):
            if s is not None:
                index.setdefault(s, i)
        return [index.get(p, index.get(p[:size], -1)) for p in self.batch]

    def arrival_and_output(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(arrival rank, output position, client)`` of every batch payload that matches a sent
        sealed report (by its first ``sealed_size`` bytes, so a payload with data appended is
        still placed)."""
        arrival, output, client = [], [], []
        for position, i in enumerate(self.forwarded()):
            if i >= 0 and self.clients[i] >= 0:
                arrival.append(i)
                output.append(position)
                client.append(self.clients[i])
        ranks = np.argsort(np.argsort(arrival)) if arrival else np.array([], dtype=np.int64)
        outputs = np.argsort(np.argsort(output)) if output else np.array([], dtype=np.int64)
        return ranks, outputs, np.asarray(client, dtype=np.int64)


# ---------------------------------------------------------------------------- the checks


def _ok(name: str, detail: str, p: float | None = None) -> MechanicsCheck:
    return MechanicsCheck(name, "passed", detail, p)


def _fail(name: str, detail: str, p: float | None = None) -> MechanicsCheck:
    return MechanicsCheck(name, "failed", detail, p)


def check_constant_lengths(views: list[RoundView]) -> MechanicsCheck:
    """Every envelope of a round the declared length; every batch payload the round's sealed size."""
    from shuffledp.protocol.wire.report_format import report_format
    from shuffledp.protocol.wire.wire_size import envelope_bytes

    name = "constant-lengths"
    envelopes = payloads = 0
    for view in views:
        spec = view.spec
        declared = envelope_bytes(spec.mechanism, spec.round_id)
        lengths = sorted({len(e) for e, c in zip(view.sent, view.clients) if c >= 0})  # crafted envelopes aside
        if lengths != [declared]:
            return _fail(name, f"round {spec.round_id} ({spec.mechanism}): envelope lengths {lengths[:6]} on the wire, "
                               f"declared {declared}: the length depends on the value")
        sealed = report_format(spec.round_id, spec.mechanism).sealed_size
        out = sorted({len(p) for p in view.batch})
        if out and out != [sealed]:
            return _fail(name, f"round {spec.round_id}: sealed reports of {out[:6]} bytes in the batch, declared {sealed}")
        envelopes += sum(1 for c in view.clients if c >= 0)
        payloads += len(view.batch)
    return _ok(name, f"{envelopes:,} envelopes and {payloads:,} batch payloads in {len(views)} round(s), one length per round")


def check_analyzer_view(views: list[RoundView]) -> MechanicsCheck:
    """Nothing from the outer layer reaches the analyzer; the batch holds only sealed reports clients sent."""
    name = "analyzer-view"
    chunks = 0
    for view in views:
        rid = view.spec.round_id
        seen = b"".join(view.chunks) + view.outcome_bytes
        leaked = Counter(kind for kind, secret in view.secrets if secret in seen)
        if leaked:
            what = ", ".join(f"{count} {kind}(s)" for kind, count in sorted(leaked.items()))
            return _fail(name, f"round {rid}: outer-layer fields reach the analyzer: {what} in the batch or outcome")
        if view.chunk_errors:
            return _fail(name, f"round {rid}: a chunk the analyzer cannot read as a batch: {view.chunk_errors[0]}")
        sent = {s for s in view.sealed if s is not None}
        foreign = sum(1 for p in view.batch if p not in sent)
        if foreign:
            return _fail(name, f"round {rid}: {foreign} batch payload(s) are not sealed reports any client sent")
        chunks += len(view.chunks)
    return _ok(name, f"{chunks} signed chunk(s): strict reads, no credential / client id / nonce, only sent sealed reports")


def check_arrival_order(views: list[RoundView]) -> MechanicsCheck:
    """No batch of at least :data:`ORDER_MIN_BATCH` leaves in arrival order or its reverse."""
    name = "arrival-order-kept"
    kept = checked = 0
    for view in views:
        ranks, outputs, _ = view.arrival_and_output()
        if len(ranks) < ORDER_MIN_BATCH:
            continue
        checked += 1
        if np.array_equal(ranks, outputs) or np.array_equal(ranks, outputs[::-1]):
            kept += 1
    if checked == 0:
        return MechanicsCheck(name, "skipped", "no released batch to check")
    bound = min(1.0, checked * 2.0 / math.factorial(ORDER_MIN_BATCH))
    if kept:
        return _fail(name, f"{kept} of {checked} batches left in arrival order (or reversed); a uniform shuffle does "
                           f"that with probability < {bound:.1e}", bound)
    return _ok(name, f"none of {checked} batches in arrival order", None)


def _pooled_table(views: list[RoundView], which: str, bins: int) -> tuple[np.ndarray, int, int]:
    """Pooled ``bins x bins`` table of (arrival or client bin, output bin), batches used, their size."""
    table = np.zeros((bins, bins), dtype=np.int64)
    used, size = 0, 0
    for view in views:
        ranks, outputs, clients = view.arrival_and_output()
        b = len(ranks)
        if b < bins or b % bins or (size and b != size):
            continue
        size = b
        rows = (ranks if which == "arrival" else np.argsort(np.argsort(clients))) * bins // b
        np.add.at(table, (rows, outputs * bins // b), 1)
        used += 1
    return table, used, size


def chi_square_positions(table: np.ndarray, batch_size: int) -> tuple[float, float]:
    """Scaled Pearson statistic and its p-value for a pooled fixed-margin permutation table
    (module docstring: scaled by ``(B-1)/B``, then chi-square with ``(G-1)^2`` d.o.f.)."""
    from scipy.stats import chi2

    expected = np.outer(table.sum(1), table.sum(0)) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum()) * (batch_size - 1) / batch_size
    dof = (table.shape[0] - 1) * (table.shape[1] - 1)
    return statistic, float(chi2.sf(statistic, dof))


def check_position_independence(views: list[RoundView], which: str, alpha: float) -> MechanicsCheck:
    """Chi-square test of output position against arrival position (``which="arrival"``) or client."""
    name = f"position-vs-{which}"
    table, used, size = _pooled_table(views, which, POSITION_BINS)
    if used == 0:
        return MechanicsCheck(name, "skipped", "no released batch whose size is a multiple of the bins")
    statistic, p = chi_square_positions(table, size)
    detail = f"{used} batches of {size}: chi2 = {statistic:.1f} on {(POSITION_BINS - 1) ** 2} d.o.f., p = {p:.3g} (alpha {alpha:.2g})"
    return (_fail if p < alpha else _ok)(name, detail, p)


def rank_correlation_z(views: list[RoundView]) -> tuple[float, int]:
    """``z = sum_b rho_b sqrt(B_b - 1) / sqrt(batches)`` over batches of at least 3 matched reports."""
    total, used = 0.0, 0
    for view in views:
        ranks, outputs, _ = view.arrival_and_output()
        b = len(ranks)
        if b < 3:
            continue
        rho = float(np.corrcoef(ranks, outputs)[0, 1])  # ranks are 0..b-1 on both sides: Pearson = Spearman
        total += rho * math.sqrt(b - 1)
        used += 1
    return (total / math.sqrt(used) if used else 0.0), used


def check_rank_correlation(views: list[RoundView], alpha: float) -> MechanicsCheck:
    from scipy.stats import norm

    name = "rank-correlation"
    z, used = rank_correlation_z(views)
    if used == 0:
        return MechanicsCheck(name, "skipped", "no released batch to check")
    p = float(2.0 * norm.sf(abs(z)))
    return (_fail if p < alpha else _ok)(name, f"{used} batches: z = {z:+.2f}, p = {p:.3g} (alpha {alpha:.2g})", p)


def check_min_batch(view: RoundView | None) -> MechanicsCheck:
    """The short round failed with a signed outcome and released nothing."""
    name = "min-batch"
    if view is None:
        return MechanicsCheck(name, "skipped", "not run: the audit stopped at a failed check")
    honest = sum(1 for c in view.clients if c >= 0)
    if view.chunks or (view.outcome is not None and view.outcome.outcome == "released"):
        return _fail(name, f"a round of min_batch {view.spec.min_batch} holding {honest} report(s) was released "
                           f"({len(view.batch)} reports forwarded)")
    if view.outcome is None or view.outcome.outcome != "failed":
        return _fail(name, "the short round ended without the shuffler's signed 'failed' outcome")
    return _ok(name, f"{honest} of min_batch {view.spec.min_batch}: signed 'failed' ({view.outcome.reason}), nothing released")


def check_quota_and_replay(view: RoundView | None, attacks: dict[str, bytes] | None = None) -> MechanicsCheck:
    """The batch holds exactly the honest clients' sealed reports, each once (``attacks``: label -> the
    sealed report each attack tried to add, for the detail)."""
    name = "quota-and-replay"
    if view is None:
        return MechanicsCheck(name, "skipped", "not run: the audit stopped at a failed check")
    if not view.batch:
        return _fail(name, f"the round was not released ({view.outcome.reason if view.outcome else 'no outcome'})")
    honest = [s for s, c in zip(view.sealed, view.clients) if c >= 0 and s is not None]
    batch = [s for i in view.forwarded() if i >= 0 and (s := view.sealed[i]) is not None]  # forwarded: sent
    admitted = [label for label, sealed in (attacks or {}).items() if batch.count(sealed) > (1 if sealed in honest else 0)]
    duplicates = len(batch) - len(set(batch))
    if admitted or duplicates or sorted(batch) != sorted(honest):
        what = ", ".join(admitted) if admitted else f"{duplicates} duplicate(s), {len(set(honest) - set(batch))} honest report(s) missing"
        return _fail(name, f"the batch is not exactly the honest reports: {what}")
    return _ok(name, f"{len(honest)} honest reports forwarded once each; refused: {', '.join(attacks or {}) or '-'}")


# ---------------------------------------------------------------------------- the auditor


class _Auditor:
    """Drives rounds against a running shuffler and records what each party would see."""

    def __init__(self, channels: tuple, round_timeout: float, seed: int, deployment=None) -> None:
        from shuffledp.deploy.deployment import Deployment

        self.analyzer_channel, self.shuffler_channel, self.client_channel = channels
        #: A deployment's keys (``--keys``): audit the shuffler service already serving its
        #: session; None: a fresh deployment and a shuffler of our own on ``shuffler_channel``.
        self.external = deployment is not None
        self.deployment = deployment if deployment is not None else Deployment()
        self.analyzer = self.deployment.analyzer()
        self.round_timeout = round_timeout
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x3EC4]))
        # A running service never re-opens a round it served: an audit of one starts at a fresh,
        # random round id (2^40 up), clear of the session's own rounds and of earlier audits.
        self.next_round = (1 << 40) + int.from_bytes(os.urandom(4), "big") * 1024 if self.external else 0
        self.shuffler: Shuffler | None = None
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "_Auditor":
        if not self.external:
            self.shuffler = self.deployment.shuffler(self.shuffler_channel)
            self.task = asyncio.create_task(self.shuffler.serve())
        return self

    async def __aexit__(self, *exc) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.analyzer.close()

    def clients(self, count: int) -> list:
        """``count`` enrolled clients (OS-CSPRNG randomizers) holding values spread over the whole range."""
        from shuffledp.client.ledger import PrivacyLedger

        values = np.linspace(RANGE_LOW, RANGE_HIGH, count)
        return [self.deployment.client(np.array([v]), PrivacyLedger(1e6, 0.5)) for v in values]

    def spec(self, params, *, min_batch: int, max_batch: int, deadline: float, epsilon0: float = 1.0):
        from shuffledp.protocol.wire.messages import RoundSpec

        d = self.deployment
        spec = RoundSpec(
            session_id=d.session_id, round_id=self.next_round, params=params, epsilon0=epsilon0, delta0=0.0,
            analyzer_key=d.analyzer_keys.hpke_public, shuffler_key=d.shuffler_keys.hpke_public,
            shuffler_signing_key=d.shuffler_keys.signing_public, min_batch=min_batch, max_batch=max_batch,
            deadline=time.time() + deadline,
        )
        self.next_round += 1
        return spec

    def opened(self, spec, envelope: bytes):
        """The envelope's :class:`Admission` (the auditor holds the shuffler key), or None."""
        from shuffledp.protocol.wire.onion import EnvelopeOpener

        try:
            return EnvelopeOpener(self.deployment.shuffler_keys.hpke_private, spec).open(envelope)
        except ShuffleDPError:
            return None

    def view(self, spec, envelopes: list[bytes], clients: list[int]) -> RoundView:
        sealed, secrets = [], []
        for envelope in envelopes:
            admission = self.opened(spec, envelope)
            sealed.append(admission.sealed if admission else None)
            if admission:
                secrets += [("credential", admission.credential), ("client id", admission.credential[:CLIENT_ID_BYTES]),
                            ("nonce", admission.nonce)]
        return RoundView(spec, list(envelopes), sealed, list(clients), secrets)

    async def run(self, view: RoundView, bursts: int = 1) -> RoundView:
        """Announce ``view.spec``, publish its envelopes in ``bursts`` with a pause between, collect
        the outcome and every chunk on the batch topic, acknowledge a released batch."""
        from shuffledp.protocol.transport.channel import acks_topic, announce_topic, batch_topic, outcome_topic, reports_topic, spec_topic
        from shuffledp.protocol.wire.messages import RoundOutcome, ShuffledBatch
        from shuffledp.protocol.wire.onion import decode_verified
        from shuffledp.analyzer.service import read_signed_chunk

        spec = view.spec
        sid, rid = spec.session_id, spec.round_id
        signed_spec = self.analyzer.sign_spec(spec)
        batches = await self.analyzer_channel.subscribe(batch_topic(sid, rid))
        outcomes = await self.analyzer_channel.subscribe(outcome_topic(sid, rid))
        opened = await self.client_channel.subscribe(spec_topic(sid))
        try:
            await self.analyzer_channel.publish(announce_topic(sid), signed_spec, retain=True)
            async with asyncio.timeout(self.round_timeout):
                while await opened.get() != signed_spec:  # the shuffler passes the spec on once the round is open
                    pass
            topic = reports_topic(sid, rid)
            cuts = np.linspace(0, len(view.sent), bursts + 1).astype(int)
            for start, stop in zip(cuts[:-1], cuts[1:]):
                for envelope in view.sent[start:stop]:
                    await self.client_channel.publish(topic, envelope)
                await asyncio.sleep(0.002)
            async with asyncio.timeout(max(0.0, spec.deadline - time.time()) + self.round_timeout):
                while view.outcome is None:
                    data = await outcomes.get()
                    try:
                        outcome = decode_verified(data, RoundOutcome, spec.shuffler_signing_key)
                    except ShuffleDPError:
                        continue
                    if (outcome.session_id, outcome.round_id) == (sid, rid):
                        view.outcome = outcome
                        view.outcome_bytes = data
            pieces: dict[int, list[bytes]] = {}
            expected = None
            wait_until = time.monotonic() + (self.round_timeout if view.outcome.outcome == "released" else 0.2)
            while time.monotonic() < wait_until and (expected is None or len(pieces) < expected):
                try:
                    async with asyncio.timeout(max(0.0, wait_until - time.monotonic())):
                        data = await batches.get()
                except TimeoutError:
                    break
                view.chunks.append(data)
                chunk: BatchChunk | ShuffledBatch
                try:  # as the analyzer reads it: the fixed layout, then the shuffler's signature
                    chunk = read_signed_chunk(data, spec)
                except ShuffleDPError as exc:
                    view.chunk_errors.append(f"{exc.reason}: {exc}")
                    try:  # still place what a faulty shuffler signed, for the other checks
                        chunk = decode_verified(data, ShuffledBatch, spec.shuffler_signing_key)
                    except ShuffleDPError:
                        continue
                pieces[chunk.chunk] = list(chunk.payloads)
                expected = chunk.chunks
            view.batch = [p for i in sorted(pieces) for p in pieces[i]]
            if view.outcome.outcome == "released":
                await self.analyzer_channel.publish(acks_topic(sid), self.analyzer.acknowledge(spec, view.outcome.batch_id))
        finally:
            for subscription in (batches, outcomes, opened):
                await subscription.close()
        return view


def _position_params(round_id: int):
    """Alternate a Hadamard range round (64 bins: rows of 1- and 2-byte CBOR) and a projected
    Laplace mean round (grid values of every width), over the clients' range."""
    from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams

    if round_id % 2 == 0:
        return HadamardRangeParams(RANGE_LOW, RANGE_HIGH, (RANGE_HIGH - RANGE_LOW) / 128)
    return ProjectedMeanParams(RANGE_LOW, RANGE_HIGH, "laplace", 4096)


async def audit_mechanics_on(
    channels: tuple,
    *,
    batches: int = 100,
    batch_size: int = 64,
    round_timeout: float = 30.0,
    short_deadline: float = 1.0,
    seed: int = 0,
    progress: Progress | None = None,
    transport: str = "in-process",
    deployment=None,
) -> MechanicsAudit:
    """Run the mechanics checks against a shuffler served on ``channels`` = (analyzer, shuffler, clients):
    one of our own, or with ``deployment`` (:func:`deployment_from_keys`) the service already serving
    that deployment's session."""
    from shuffledp.client.client import Client
    from shuffledp.client.ledger import PrivacyLedger
    from shuffledp.deploy.deployment import Deployment
    from shuffledp.protocol.wire.onion import wrap

    if not (isinstance(batches, int) and batches >= 2):
        raise InvalidParameter("batches", f"must be an integer >= 2, got {batches!r}")
    if not (isinstance(batch_size, int) and batch_size >= 2 * POSITION_BINS and batch_size % POSITION_BINS == 0):
        raise InvalidParameter("batch_size", f"must be a multiple of {POSITION_BINS} of at least {2 * POSITION_BINS}, got {batch_size!r}")
    started = time.perf_counter()
    alpha = STATISTICAL_ALPHA / len(STATISTICAL_CHECKS)
    async with _Auditor(channels, round_timeout, seed, deployment) as auditor:
        population = auditor.clients(batch_size)
        views: list[RoundView] = []
        for _ in range(batches):
            spec = auditor.spec(_position_params(auditor.next_round), min_batch=batch_size, max_batch=batch_size,
                                deadline=round_timeout)
            signed_spec = auditor.analyzer.sign_spec(spec)
            order = auditor.rng.permutation(batch_size)
            envelopes = [population[c].answer(signed_spec)[0] for c in order]
            view = auditor.view(spec, envelopes, [int(c) for c in order])
            if len({len(e) for e in envelopes}) > 1:
                view.withheld = True  # a value-dependent length: the check fails on it, the round is not sent
                views.append(view)
                break
            views.append(await auditor.run(view, bursts=POSITION_BINS))
            if progress:
                progress("mechanics: shuffled batches", 1)
        released = [v for v in views if v.batch]

        short_view = hostile_view = None
        attacks: dict[str, bytes] = {}
        if not any(v.withheld for v in views):  # else the audit has already failed: stop there
            # a round one honest report short of its minimum
            short = auditor.spec(_position_params(0), min_batch=ORDER_MIN_BATCH, max_batch=ORDER_MIN_BATCH, deadline=short_deadline)
            signed_short = auditor.analyzer.sign_spec(short)
            short_view = auditor.view(short, [population[c].answer(signed_short)[0] for c in range(ORDER_MIN_BATCH - 1)],
                                      list(range(ORDER_MIN_BATCH - 1)))
            short_view = await auditor.run(short_view)
            if progress:
                progress("mechanics: short round", 1)

            # hostile envelopes among the honest ones
            hostile_spec = auditor.spec(_position_params(0), min_batch=batch_size, max_batch=batch_size, deadline=round_timeout)
            signed_hostile = auditor.analyzer.sign_spec(hostile_spec)
            honest = [population[c].answer(signed_hostile)[0] for c in range(batch_size)]
            twin = Client(np.array([RANGE_HIGH]), auditor.deployment.analyzer_signing_key, PrivacyLedger(1e6, 0.5),
                          credential=population[0].credential)
            second = twin.answer(signed_hostile)[0]
            rewrapped = wrap(hostile_spec, population[3].credential, auditor.opened(hostile_spec, honest[2]).sealed)[0]
            stale = released[-1].sent[0] if released else honest[1]
            foreign = Deployment(session_id=auditor.deployment.session_id)
            forged_client = foreign.client(np.array([1.0]), PrivacyLedger(1e6, 0.5))
            forged = wrap(hostile_spec, forged_client.credential, auditor.opened(hostile_spec, second).sealed)[0]
            # attacks first (after one honest report from each attacked client), then the remaining honest ones
            sequence = [honest[0], honest[1], honest[2], second, honest[1], rewrapped, stale, forged, *honest[3:]]
            clients = [0, 1, 2, -1, -1, -1, -1, -1, *range(3, batch_size)]
            hostile_view = auditor.view(hostile_spec, sequence, clients)
            attacks = {
                "second report under a used credential": auditor.opened(hostile_spec, second).sealed,
                "sealed report re-wrapped under another credential": auditor.opened(hostile_spec, rewrapped).sealed,
                "credential from another issuer": auditor.opened(hostile_spec, forged).sealed,
            }
            stale_admission = auditor.opened(released[-1].spec, stale) if released else None
            if stale_admission is not None:
                attacks["stale envelope of the previous round"] = stale_admission.sealed
            hostile_view = await auditor.run(hostile_view)
            if progress:
                progress("mechanics: hostile round", 1)

    checks = [
        check_constant_lengths(views + [v for v in (hostile_view,) if v is not None]),
        check_analyzer_view(views + [v for v in (short_view, hostile_view) if v is not None]),
        check_arrival_order(released),
        check_position_independence(released, "arrival", alpha),
        check_position_independence(released, "client", alpha),
        check_rank_correlation(released, alpha),
        check_min_batch(short_view),
        check_quota_and_replay(hostile_view, attacks),
    ]
    return MechanicsAudit(transport, len(released), batch_size, checks, time.perf_counter() - started)


def deployment_from_keys(directory: str):
    """The :class:`~shuffledp.deploy.deployment.Deployment` in a keys directory (``shuffledp keys init``):
    the analyzer's keys (to sign the audit's rounds), the issuer's (to enrol its clients) and the
    shuffler's (to open outer layers and so know which report each client sent). An audit
    deployment: the auditor holds every party's key, so use one made for auditing."""
    from shuffledp.deploy.deployment import Deployment
    from shuffledp.deploy.keys import load_analyzer, load_shuffler

    analyzer, shuffler = load_analyzer(directory), load_shuffler(directory)
    return Deployment(analyzer.analyzer_keys, shuffler.shuffler_keys, shuffler.issuer, shuffler.session_id)


def audit_mechanics(
    *, broker: str | None = None, batches: int = 100, batch_size: int = 64, seed: int = 0,
    progress: Progress | None = None, round_timeout: float = 30.0, short_deadline: float = 1.0,
    keys: str | None = None,
) -> MechanicsAudit:
    """:func:`audit_mechanics_on` a fresh in-process channel, or over the MQTT ``broker``
    (``HOST[:PORT]`` or a broker directory, as ``shuffledp simulate --broker``). With ``keys`` (a
    keys directory; needs ``broker``), audit the shuffler service already running for that
    deployment (``shuffledp shuffler serve``) instead of starting one."""
    from shuffledp.simulation import party_channels

    if keys is not None and broker is None:
        raise InvalidParameter("keys", "auditing a running shuffler service needs the broker it serves on (--broker)")
    deployment = deployment_from_keys(keys) if keys is not None else None
    where = f"mqtt {broker}" if broker else "in-process"

    async def main() -> MechanicsAudit:
        async with party_channels(broker) as channels:
            return await audit_mechanics_on(
                channels, batches=batches, batch_size=batch_size, seed=seed, progress=progress,
                round_timeout=round_timeout, short_deadline=short_deadline, deployment=deployment,
                transport=f"{where}, the running shuffler service of {keys}" if keys else where,
            )

    return asyncio.run(main())


def format_mechanics(audit: MechanicsAudit) -> str:
    lines = [f"shuffler mechanics ({audit.transport}; {audit.batches} released batches of {audit.batch_size})"]
    for c in audit.checks:
        lines.append(f"  {c.name:<20} {c.status.upper() if c.status == 'failed' else c.status:<8} {c.detail}")
    return "\n".join(lines)


__all__ = [
    "CHECKS",
    "MechanicsAudit",
    "MechanicsCheck",
    "RoundView",
    "audit_mechanics",
    "audit_mechanics_on",
    "chi_square_positions",
    "deployment_from_keys",
    "format_mechanics",
]
