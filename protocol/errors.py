"""The typed exception hierarchy shared by every party.

Services never crash on bad input: they catch :class:`ShuffleDPError`, count the
rejection under its :attr:`ShuffleDPError.reason` and go on. Library calls with
invalid parameters raise :class:`InvalidParameter` at construction, naming the
parameter and why it is wrong.
"""

from __future__ import annotations


#: Reason a service counts when it meets an exception that is not a typed ShuffleDPError:
#: a bug to fix (logged), never an input class; the fuzz suite checks it never happens.
INTERNAL_ERROR = "internal-error"


class ShuffleDPError(Exception):
    """Base of every error shuffledp raises on purpose."""

    reason: str = "error"


class InvalidParameter(ShuffleDPError, ValueError):
    """A parameter is out of its domain. The message names the parameter and the rule."""

    reason = "invalid-parameter"

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.parameter = name


class MalformedMessage(ShuffleDPError):
    """Bytes that do not decode to a valid message (bad CBOR, schema, size or version)."""

    reason = "malformed"


class UnsupportedVersion(MalformedMessage):
    """A message of a wire-format version this build does not speak."""

    reason = "unsupported-version"


class MessageTooLarge(MalformedMessage):
    """A message over the codec's hard size limit."""

    reason = "too-large"


class ValueOutOfRange(MalformedMessage):
    """A report value that no honest randomizer of the round can produce."""

    reason = "out-of-range"


class DuplicateReport(ShuffleDPError):
    """The same sealed report seen twice in one round (a re-wrapped or replayed copy)."""

    reason = "duplicate"


class SealingError(ShuffleDPError):
    """A sealed payload failed to open: tampered, or sealed for another session or round."""

    reason = "unsealable"


class BadSignature(ShuffleDPError):
    """A RoundSpec whose analyzer signature does not verify."""

    reason = "bad-signature"


class UnknownRound(ShuffleDPError):
    """A report for a round that is not open at the shuffler."""

    reason = "unknown-round"


class ReplayedReport(ShuffleDPError):
    """A report whose nonce was already admitted."""

    reason = "replay"


class QuotaExceeded(ShuffleDPError):
    """A client sent more reports for a round than the round allows."""

    reason = "quota"


class BudgetExceeded(ShuffleDPError):
    """A client refuses a round that would overspend its local privacy budget."""

    reason = "budget"


class BatchTooSmall(ShuffleDPError):
    """A round closed at its deadline with fewer reports than its minimum batch size."""

    reason = "batch-too-small"


class TransportError(ShuffleDPError):
    """A channel could not connect or lost its connection (e.g. the MQTT broker is unreachable)."""

    reason = "transport"


class RoundFull(QuotaExceeded):
    """The round already holds its maximum batch."""

    reason = "round-full"


class RateLimited(ShuffleDPError):
    """A credential that keeps sending refused envelopes in one round: later ones are dropped unread."""

    reason = "rate-limited"


class WrongInstance(ShuffleDPError):
    """An envelope from a credential assigned to another shuffler instance of the round."""

    reason = "wrong-instance"


class SessionFileError(ShuffleDPError):
    """A deployment's session file (``analyzer run --output``) an auditor cannot take as it is:
    missing, not JSON, a field missing or ill-typed, a signed round spec that does not verify
    under the trusted analyzer key, or a round whose recorded fields disagree with its signed spec."""

    reason = "session-file"
