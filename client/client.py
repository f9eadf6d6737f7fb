"""The device-side Client: verify a round, check the budget, randomize, seal, wrap.

A :class:`Client` holds one user's samples and its admission credential. Given a
signed round spec it

1. verifies the analyzer's Ed25519 signature against the key it pinned,
2. refuses expired rounds and rounds its :class:`PrivacyLedger` cannot afford,
3. runs the round's randomizer on its local mean (the same vectorized function the
   simulation uses, with a batch of one, or for the scalar mechanisms its exact scalar
   twin, :func:`~shuffledp.client.mechanisms.randomize_one`: the same draws, without arrays),
4. pads each report to the round's fixed size (so its length says nothing about its
   value) and seals it to the analyzer with HPKE, bound to the session and round:
   the inner layer,
5. wraps it with its credential and a fresh nonce in an :class:`Admission` sealed to
   the round's shuffler (``protocol/wire/onion.py``): the outer layer, so the broker and
   the network see only a fixed-size ciphertext, and no credential,
6. and only then charges its ledger (an atomic check-and-spend): a round that fails
   anywhere above costs nothing, and nothing is returned for a round not charged.

Afterwards the shuffler's signed receipts and round outcome
(:meth:`Client.settle_receipts`, :meth:`Client.settle_outcome`) tell the client
whether its envelopes were admitted and whether the round was released or lost;
the ledger records it (see ``client/ledger.py`` for why a lost round stays charged).

Randomness comes from the OS CSPRNG (:class:`SystemSource`) unless a source is
given (simulations pass a seeded one, labelled as such).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from shuffledp.client.ledger import PrivacyLedger, outcome_moves_forward
from shuffledp.client.local_data import as_real_array
from shuffledp.client.mechanisms import check_report_values, randomize_one, randomize_reports, report_ranges
from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.protocol.wire.credentials import CLIENT_ID_BYTES, CREDENTIAL_BYTES, assigned_instance
from shuffledp.protocol.wire.ed25519_keys import check_ed25519_key
from shuffledp.protocol.errors import UnknownRound
from shuffledp.protocol.wire.messages import AdmissionReceipts, RoundOutcome, RoundSpec, SignedRoundSpec, messages_per_user
from shuffledp.protocol.wire.onion import EnvelopeWrapper, decode_verified, verified_spec
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.mechanisms.randomness import RandomSource, SystemSource
from shuffledp.protocol.wire.sealing import Sealer


class RoundExpired(ShuffleDPError):
    reason = "expired"


class UntrustedRound(ShuffleDPError):
    """A spec naming a shuffler other than the one the device pinned, or promising too small a crowd."""

    reason = "untrusted-round"


@dataclass
class SentRound:
    """What a client sent in one round, and what the shuffler has said of it."""

    spec: RoundSpec
    nonces: list[bytes]
    #: nonce -> "admitted" or the refusal's reason, from signed receipts.
    receipts: dict[bytes, str] = field(default_factory=dict)
    #: "released" or "failed:<reason>", from the signed round outcome.
    outcome: str | None = None

    @property
    def admitted(self) -> int:
        return sum(1 for status in self.receipts.values() if status == "admitted")


def _as_messages(values) -> list[tuple[int, ...]]:
    """One user's report values (``(messages, width)``) as one tuple of Python ints per message;
    messages given as such tuples already (a batch caller converts a round at once) are kept."""
    if type(values) is list and all(type(message) is tuple and all(type(v) is int for v in message) for message in values):
        return values
    rows = np.asarray(values).reshape(len(values), -1)
    if rows.dtype.kind in "iu":  # Python ints, as int() gives, without a call per value
        return [tuple(row) for row in rows.tolist()]
    return [tuple(int(v) for v in row) for row in rows]


class PreparedRound:
    """What every report of one verified round needs, computed once per round: the value
    ranges an honest randomizer can report, the padded report layout, the analyzer's
    sealer and the shuffler's wrapper (parsed keys, HPKE ``info``), the messages per user.

    :meth:`seal` is the pure part of answering: pad, seal and wrap one client's messages,
    each on its own (a fresh HPKE encapsulation for each layer and a fresh nonce). It
    touches no ledger, so a caller may run it anywhere (the simulation seals blocks of
    users on worker processes) and charge the client afterwards."""

    def __init__(self, spec: RoundSpec, sealer: Sealer) -> None:
        self.spec = spec
        self.ranges = report_ranges(spec)
        self.layout = report_format(spec.round_id, spec.mechanism)
        self.messages = messages_per_user(spec.params)
        self.sealer = sealer.for_round(spec.session_id, spec.round_id, spec.digest)
        self.wrapper = EnvelopeWrapper(spec)

    #: The round prepared last by :meth:`of` (its spec and sealer objects, and itself).
    _last: "tuple[RoundSpec, Sealer, PreparedRound] | None" = None

    @classmethod
    def of(cls, spec: RoundSpec, sealer: Sealer) -> "PreparedRound":
        """The prepared round of this very ``spec`` and ``sealer`` (the same objects): the one made
        last if it is theirs, else a new one. Many clients answering one round in one process
        (each with the same spec and sealer objects) so share one."""
        last = cls._last
        if last is not None and last[0] is spec and last[1] is sealer:
            return last[2]
        prepared = cls(spec, sealer)
        PreparedRound._last = (spec, sealer, prepared)
        return prepared

    def seal(self, credential: bytes, messages: list[tuple[int, ...]]) -> tuple[list[bytes], list[bytes]]:
        """One client's envelopes and their nonces, in the messages' order; a typed error
        (:class:`ValueOutOfRange`, :class:`SealingError`, ...) if any message cannot be sent."""
        envelopes, nonces = [], []
        for message in messages:
            check_report_values(message, self.ranges)  # never send what an honest randomizer cannot
            sealed = self.sealer.seal(self.layout.encode_padded(message))
            envelope, nonce = self.wrapper.wrap(credential, sealed)
            envelopes.append(envelope)
            nonces.append(nonce)
        return envelopes, nonces


def device_settings(
    analyzer_signing_key: bytes,
    shuffler_signing_key: bytes | None = None,
    shuffler_key: bytes | None = None,
    min_batch_floor: int = 1,
    accept_central_only: bool = False,
    source: RandomSource | None = None,
    clock=time.time,
) -> dict[str, Any]:
    """A device's settings from its enrollment, checked (a typed error otherwise), as the attributes
    :class:`Client` holds them. ``source`` None: each device draws from its own :class:`SystemSource`.

    * ``analyzer_signing_key``: the analyzer whose signed specs the device answers.
    * ``shuffler_signing_key``, ``shuffler_key``: the shuffler this device trusts (pinned at
      enrollment), its signing key and its sealing (X25519) key, or None for both to take the
      shuffler the analyzer's signed spec names. Pinning keeps a malicious analyzer from naming
      itself (or a colluder) as the shuffler, which would void the amplification, not the local
      guarantee. Both keys are pinned together: a spec that kept the pinned signing key but named
      another sealing key would have the device seal its outer layer (credential, nonce, and for
      summation every share of one user) to whoever holds that key, the analyzer included.
    * ``min_batch_floor``: refuse rounds whose batch holds fewer users than this (``min_batch``
      over the reports each user sends): the crowd the amplification relies on.
    * ``accept_central_only``: answer rounds whose mechanism has no local guarantee (multi-message
      summation: a user's shares, linked, reveal its value), and only with a pinned shuffler. Off
      by default: such a round trusts the shuffler with the value, not just with the crowd.
    """
    if (shuffler_signing_key is None) != (shuffler_key is None):
        raise InvalidParameter(
            "shuffler_key", "a device pins both of its shuffler's keys (signing and sealing) or neither")
    check_ed25519_key(analyzer_signing_key, "analyzer_signing_key")  # a key anyone can sign under pins nothing
    if shuffler_signing_key is not None:
        check_ed25519_key(shuffler_signing_key, "shuffler_signing_key")
    if accept_central_only and shuffler_signing_key is None:
        raise InvalidParameter("shuffler_signing_key", "a device that accepts central-only rounds must pin its shuffler")
    return {
        "analyzer_signing_key": analyzer_signing_key,
        "shuffler_signing_key": shuffler_signing_key,
        "shuffler_key": shuffler_key,
        "min_batch_floor": min_batch_floor,
        "accept_central_only": accept_central_only,
        "source": source,
        "clock": clock,
    }


class Client:
    """One user's device: its samples, its pinned analyzer key, its budget and its credential."""

    # The checked settings of :func:`device_settings` (set together by ``_take``).
    analyzer_signing_key: bytes
    shuffler_signing_key: bytes | None
    shuffler_key: bytes | None
    min_batch_floor: int
    accept_central_only: bool
    source: RandomSource
    clock: Callable[[], float]

    def __init__(
        self,
        samples: np.ndarray,
        analyzer_signing_key: bytes,
        ledger: PrivacyLedger,
        *,
        credential: bytes,
        shuffler_signing_key: bytes | None = None,
        shuffler_key: bytes | None = None,
        min_batch_floor: int = 1,
        accept_central_only: bool = False,
        source: RandomSource | None = None,
        clock=time.time,
    ) -> None:
        try:
            rank = 2 if np.ndim(samples) == 2 else 1
        except (TypeError, ValueError):  # ragged input: as_real_array says why
            rank = 1
        samples = as_real_array(samples, "samples", ndim=rank)
        if samples.shape[0] == 0 or samples.size == 0:
            raise InvalidParameter("samples", "must not be empty")
        with np.errstate(over="ignore"):
            mean = samples.mean(axis=0)
        if not np.all(np.isfinite(mean)):
            raise InvalidParameter("samples", "their mean overflows a double")
        #: The local mean the randomizers see: a float for scalar samples ``(m,)``, a
        #: vector for vector samples ``(m, d)``.
        self.local_mean: float | np.ndarray = float(mean) if samples.ndim == 1 else mean
        self._take(ledger, credential, device_settings(
            analyzer_signing_key, shuffler_signing_key, shuffler_key, min_batch_floor, accept_central_only, source, clock))

    @classmethod
    def many(
        cls,
        values: np.ndarray,
        analyzer_signing_key: bytes,
        ledgers: Sequence[PrivacyLedger],
        credentials: Sequence[bytes],
        **options,
    ) -> list["Client"]:
        """One client per row of ``values`` (``(n,)`` or ``(n, d)``), each holding its row as
        its one sample: the clients ``Client(values[i][None], analyzer_signing_key, ledgers[i],
        credential=credentials[i], **options)`` would be, with the samples checked once for
        all of them (a simulation sets up thousands of users)."""
        values = as_real_array(values, "samples", ndim=2 if np.ndim(values) == 2 else 1)
        rank = values.ndim
        if values.shape[0] == 0 or values.size == 0:
            raise InvalidParameter("samples", "must not be empty")
        if not (len(ledgers) == len(credentials) == values.shape[0]):
            raise InvalidParameter("ledgers", "need one ledger and one credential per row of values")
        means = values.tolist() if rank == 1 else list(values.copy())  # a row's mean is the row itself
        settings = device_settings(analyzer_signing_key, **options)  # shared by every client: checked once
        out = []
        for mean, ledger, credential in zip(means, ledgers, credentials):
            client = cls.__new__(cls)
            client.local_mean = mean
            client._take(ledger, credential, settings)
            out.append(client)
        return out

    def _take(self, ledger: PrivacyLedger, credential: bytes, settings: dict[str, Any]) -> None:
        """Everything of the constructor but the samples: this device's ledger and credential, checked,
        and the checked :func:`device_settings` it shares with the devices of its enrollment."""
        if not isinstance(ledger, PrivacyLedger):
            raise InvalidParameter("ledger", f"must be a PrivacyLedger, got {type(ledger).__name__}")
        if not isinstance(credential, bytes) or len(credential) != CREDENTIAL_BYTES:
            raise InvalidParameter("credential", f"must be the {CREDENTIAL_BYTES}-byte credential issued at enrollment")
        self.__dict__.update(settings)
        self.ledger = ledger
        #: Shown only to the shuffler, inside the outer layer.
        self.credential = credential
        if self.source is None:
            self.source = SystemSource()
        #: (session id, round id) -> what was sent and what the shuffler said of it.
        self.sent: dict[tuple[bytes, int], SentRound] = {}

    def answer(self, signed: SignedRoundSpec | bytes) -> list[bytes]:
        """Encoded envelopes answering the round, or a typed error (bad signature, expired, budget)."""
        spec = verified_spec(signed, self.analyzer_signing_key)
        return self.answer_verified(spec, Sealer(spec.analyzer_key))

    def answer_verified(
        self, spec: RoundSpec, sealer: Sealer, values: np.ndarray | None = None, *, prepared: "PreparedRound | None" = None
    ) -> list[bytes]:
        """Answer an already verified spec: one envelope per message of the round (in the
        order drawn; the shuffler permutes). ``values`` (``(messages, width)``) lets a batch
        caller pass pre-drawn report values; ``prepared`` (:class:`PreparedRound` of this
        spec and ``sealer``) lets one caller answering for many clients compute the
        round's constants once.

        Every message is padded to the round's one size and sealed on its own (a fresh
        HPKE encapsulation and a fresh outer layer and nonce each), so nothing but the
        shuffler's admission links the messages of one user, and the shuffler strips that.

        The ledger is charged last, after every step that can fail, so a refused or
        failed round costs nothing; the charge is an atomic check-and-spend, so two
        threads (or two clients sharing a ledger) cannot both spend the last of it.
        """
        messages = self.begin_round(spec, values, prepared)
        if prepared is None:  # after the checks, so a refused round fails as it always did
            prepared = PreparedRound.of(spec, sealer)
        envelopes, nonces = prepared.seal(self.credential, messages)
        self.finish_round(spec, nonces)
        return envelopes

    def begin_round(
        self, spec: RoundSpec, values: np.ndarray | None = None, prepared: "PreparedRound | None" = None
    ) -> list[tuple[int, ...]]:
        """The first part of :meth:`answer_verified`: every check that can refuse the round
        (deadline, pinned shuffler, crowd floor, local guarantee, the ledger's budget), then
        the round's report values (drawn here unless given), one tuple per message. Nothing
        is charged; :meth:`finish_round` charges once the messages are sealed
        (:meth:`PreparedRound.seal`, possibly elsewhere)."""
        if prepared is not None and prepared.spec is not spec:
            raise InvalidParameter("prepared", "was prepared for another spec")
        if self.clock() > spec.deadline:
            raise RoundExpired(f"round {spec.round_id} closed at {spec.deadline}")
        if self.shuffler_signing_key is not None and spec.shuffler_signing_key != self.shuffler_signing_key:
            raise UntrustedRound("the spec names a shuffler other than the one this device pinned")
        if self.shuffler_key is not None and spec.shuffler_key != self.shuffler_key:
            raise UntrustedRound("the spec names a sealing key other than the one this device pinned for its shuffler")
        expected = prepared.messages if prepared is not None else messages_per_user(spec.params)
        users = -(-spec.min_batch // expected)  # the fewest users that fill min_batch
        if users < self.min_batch_floor:
            raise UntrustedRound(f"the round's batch holds {users} users' reports, below this device's floor {self.min_batch_floor}")
        if not getattr(spec.params, "LOCAL_GUARANTEE", True) and not self.accept_central_only:
            raise UntrustedRound(f"{spec.mechanism} has no local guarantee; this device answers only rounds that do")
        self.ledger.check(spec.session_id, spec.round_id, spec.epsilon0, spec.delta0)
        if values is not None:
            messages = _as_messages(values)
        else:
            # The scalar twin of the batch-of-one randomizer where there is one (the same draws
            # and messages), else the batch randomizer itself.
            one = randomize_one(spec.params, spec.epsilon0, spec.delta0, self.local_mean, self.source)
            messages = one if one is not None else _as_messages(
                randomize_reports(spec, np.array([self.local_mean]), self.source)[0])
        if len(messages) != expected:
            raise InvalidParameter("values", f"the round takes {expected} message(s) per user, got {len(messages)}")
        return messages

    def finish_round(self, spec: RoundSpec, nonces: list[bytes]) -> None:
        """The last part of :meth:`answer_verified`: charge the ledger (an atomic check-and-spend)
        and record what was sent (the envelopes' ``nonces``)."""
        self.ledger.spend(spec.session_id, spec.round_id, spec.epsilon0, spec.delta0)
        self.sent[(spec.session_id, spec.round_id)] = SentRound(spec, nonces)

    def instance_for(self, spec: RoundSpec) -> int:
        """The shuffler instance of the round this client's envelopes go to (its reports topic)."""
        return assigned_instance(self.credential[:CLIENT_ID_BYTES], spec.shuffler_instances, spec.digest)

    def settle_receipts(self, data: bytes) -> SentRound:
        """Record the shuffler's signed receipts for one of this client's rounds; typed error if not genuine."""
        receipts = codec.decode(data, AdmissionReceipts)
        sent = self._sent(receipts.session_id, receipts.round_id, receipts.spec_digest)
        decode_verified(data, AdmissionReceipts, sent.spec.shuffler_signing_key)
        mine = set(sent.nonces)
        for nonce in receipts.admitted:
            if nonce in mine:
                sent.receipts[nonce] = "admitted"
        for nonce, reason in zip(receipts.refused, receipts.reasons):
            if nonce in mine and sent.receipts.get(nonce) != "admitted":
                sent.receipts[nonce] = reason
        return sent

    def settle_outcome(self, data: bytes) -> SentRound:
        """Record the shuffler's signed outcome of one of this client's rounds in the ledger.

        A round that failed after this client's report was admitted is recorded as
        lost (``PrivacyLedger.outcomes``): the client is told, and stays charged.

        Only forward (:func:`~shuffledp.client.ledger.outcome_moves_forward`): ``released``
        may turn ``failed:<reason>`` (the shuffler gave up a batch the analyzer never
        acknowledged), a failed outcome is final, and the same word again changes nothing.
        Outcomes carry no timestamp, so a genuine older ``released`` relayed again after a
        ``failed`` is verified, then ignored: it cannot hide a lost round.
        """
        outcome = codec.decode(data, RoundOutcome)
        sent = self._sent(outcome.session_id, outcome.round_id, outcome.spec_digest)
        decode_verified(data, RoundOutcome, sent.spec.shuffler_signing_key)
        if outcome.instance != self.instance_for(sent.spec):
            return sent  # another instance's batch: says nothing of this client's report
        word = outcome.outcome if outcome.outcome == "released" else f"failed:{outcome.reason}"
        if not outcome_moves_forward(sent.outcome, word):
            return sent  # a failed round stays failed; the same word again is no news
        self.ledger.record_outcome(outcome.session_id, outcome.round_id, word)  # forward only there too
        # what the ledger holds now (a ledger shared with another client may know the round failed)
        sent.outcome = self.ledger.outcomes.get((outcome.session_id, outcome.round_id), word)
        return sent

    def _sent(self, session_id: bytes, round_id: int, spec_digest: bytes) -> SentRound:
        sent = self.sent.get((session_id, round_id))
        if sent is None:
            raise UnknownRound(f"this client sent nothing in round {round_id} of session {session_id.hex()}")
        if spec_digest != sent.spec.digest:
            raise UnknownRound(f"round {round_id}: the shuffler's word is about another spec than the one this client answered")
        return sent
