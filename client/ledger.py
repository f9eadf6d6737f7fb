"""The client's own ledger of local privacy spent.

A device answers a round only if its budget allows. Local guarantees of one
user's answers compose by basic composition (Dwork & Roth 2014, Thm. 3.16):
answering rounds with ``(eps_i, delta_i)`` is ``(sum eps_i, sum delta_i)``-LDP.
That is an upper bound valid for any adaptively chosen sequence of rounds, and it
is what the client can check with no knowledge of other users. Each
(session, round) is answered at most once, so re-delivered specs never spend twice.

Concurrency: :meth:`PrivacyLedger.spend` checks and records under one lock, so a
device that answers rounds from several threads, or several :class:`Client`
objects sharing one ledger, can never spend past the budget or answer a round
twice. Clients call :meth:`~PrivacyLedger.check` first (cheap, no charge) and
:meth:`~PrivacyLedger.spend` last, once the report is ready to leave.

Lost rounds stay charged. When the shuffler's signed outcome says a round failed
after a report was sent (:meth:`PrivacyLedger.record_outcome`), the ledger records
it in :attr:`PrivacyLedger.outcomes` so the device knows, but does not refund: the
report left the device, and the local guarantee must hold even against a shuffler
that lies about having discarded it. Refunding would make the client's budget
depend on trusting the shuffler, which the local model does not assume.

Outcomes are recorded only forward. A round's outcome may go from nothing to
``released`` or ``failed:<reason>``, and from ``released`` to ``failed:<reason>`` (the
shuffler gave up a released batch the analyzer never acknowledged); a failed outcome is
final, and the same word again changes nothing. Signed outcomes carry no timestamp, so
this is what keeps a replayed older ``released`` from hiding a lost round.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from shuffledp.protocol.errors import BudgetExceeded, InvalidParameter

# Slack for floating-point sums of epsilons (e.g. 0.5 + 0.5 against a budget of 1.0).
_SUM_TOLERANCE = 1e-12


def _real(value: object, name: str) -> float:
    if type(value) is float and math.isfinite(value):  # the common case, decided at once
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameter(name, f"must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidParameter(name, f"must be finite, got {value}")
    return value


def is_outcome(word: object) -> bool:
    """Whether ``word`` is a round outcome as devices record it: ``released`` or ``failed:<reason>``."""
    return word == "released" or (isinstance(word, str) and word.startswith("failed:"))


def outcome_moves_forward(previous: str | None, outcome: str) -> bool:
    """Whether a round's recorded outcome ``previous`` (None: none yet) may become ``outcome``:
    only forward, ``released -> failed:<reason>``; a failed outcome is final and the same word
    again is no change."""
    if previous is None:
        return True
    return previous == "released" and outcome != "released"


@dataclass
class PrivacyLedger:
    """Local (user-level) budget ``(epsilon, delta)`` and what has been spent from it."""

    epsilon_budget: float
    delta_budget: float = 0.0
    spent_epsilon: float = 0.0
    spent_delta: float = 0.0
    answered: set[tuple[bytes, int]] = field(default_factory=set)
    #: (session, round) -> "released" or "failed:<reason>", as the shuffler signed it.
    outcomes: dict[tuple[bytes, int], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.epsilon_budget = _real(self.epsilon_budget, "epsilon_budget")
        self.delta_budget = _real(self.delta_budget, "delta_budget")
        if not self.epsilon_budget > 0:
            raise InvalidParameter("epsilon_budget", f"must be finite and > 0, got {self.epsilon_budget}")
        if not 0 <= self.delta_budget < 1:
            raise InvalidParameter("delta_budget", f"must be in [0, 1), got {self.delta_budget}")

    @classmethod
    def many(cls, epsilon_budget: float, delta_budget: float, count: int) -> "list[PrivacyLedger]":
        """``count`` fresh ledgers of one budget: ``[PrivacyLedger(epsilon_budget, delta_budget) for
        each]``, the budget checked once (a simulation sets up thousands of users)."""
        if not isinstance(count, int) or count < 0:
            raise InvalidParameter("count", f"must be a non-negative integer, got {count!r}")
        first = cls(epsilon_budget, delta_budget)
        epsilon, delta = first.epsilon_budget, first.delta_budget
        out = [first]
        for _ in range(count - 1):
            ledger = cls.__new__(cls)
            ledger.epsilon_budget, ledger.delta_budget, ledger.spent_epsilon, ledger.spent_delta = epsilon, delta, 0.0, 0.0
            ledger.answered, ledger.outcomes, ledger._lock = set(), {}, threading.Lock()
            out.append(ledger)
        return out[:count]

    @property
    def remaining_epsilon(self) -> float:
        return self.epsilon_budget - self.spent_epsilon

    def check(self, session_id: bytes, round_id: int, epsilon: float, delta: float) -> None:
        """Raise :class:`BudgetExceeded` unless this round may be answered (charges nothing)."""
        epsilon = _real(epsilon, "epsilon")
        delta = _real(delta, "delta")
        if epsilon < 0 or delta < 0:
            raise InvalidParameter("epsilon, delta", "a round cannot spend a negative amount")
        if (session_id, round_id) in self.answered:
            raise BudgetExceeded(f"round {round_id} of session {session_id.hex()} was already answered")
        if self.spent_epsilon + epsilon > self.epsilon_budget * (1 + _SUM_TOLERANCE):
            raise BudgetExceeded(
                f"round asks epsilon {epsilon:g}; {self.remaining_epsilon:g} of {self.epsilon_budget:g} remains"
            )
        if self.spent_delta + delta > self.delta_budget * (1 + _SUM_TOLERANCE):
            raise BudgetExceeded(
                f"round asks delta {delta:g}; {self.delta_budget - self.spent_delta:g} of {self.delta_budget:g} remains"
            )

    def spend(self, session_id: bytes, round_id: int, epsilon: float, delta: float) -> None:
        """Check and record the round atomically, or raise without recording anything."""
        with self._lock:
            self.check(session_id, round_id, epsilon, delta)
            self.spent_epsilon += float(epsilon)
            self.spent_delta += float(delta)
            self.answered.add((session_id, round_id))

    def record_outcome(self, session_id: bytes, round_id: int, outcome: str) -> bool:
        """Record what became of an answered round (the charge stands either way), only forward:
        ``released`` may turn ``failed:<reason>``, a failed outcome is final, and the same word
        again is a no-op. Returns whether the recorded outcome changed; raises
        :class:`InvalidParameter` for a round this ledger did not answer, or a word that is
        neither ``released`` nor ``failed:<reason>``."""
        if not is_outcome(outcome):
            raise InvalidParameter("outcome", f'must be "released" or "failed:<reason>", got {outcome!r}')
        key = (session_id, round_id)
        with self._lock:
            if key not in self.answered:
                raise InvalidParameter("round_id", f"round {round_id} was not answered by this ledger")
            if not outcome_moves_forward(self.outcomes.get(key), outcome):
                return False
            self.outcomes[key] = outcome
            return True

    def lost_rounds(self) -> list[tuple[bytes, int]]:
        """Answered rounds the shuffler says failed: charged, and never reached the analyzer (if it is honest)."""
        return [key for key, outcome in self.outcomes.items() if outcome.startswith("failed")]
