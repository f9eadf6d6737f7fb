"""The messages the parties exchange, as frozen dataclasses validated at construction.

One round flows as::

    Analyzer --SignedRoundSpec--> Shuffler --SignedRoundSpec--> Client
    Client --Envelope(outer: Admission(credential, nonce, sealed Report))--> Shuffler
    Shuffler --AdmissionReceipts--> Clients
    Shuffler --ShuffledBatch chunks (signed)--> Analyzer --BatchAck (signed)--> Shuffler
    Shuffler --RoundOutcome (signed)--> Clients, Analyzer

* :class:`RoundSpec` names the mechanism, every public parameter of a round, and the
  keys of the analyzer (sealing) and of the shuffler (sealing and batch signatures).
  The analyzer signs its canonical encoding (:class:`SignedRoundSpec`).
* :class:`Report` is a client's randomized answer, padded to the round's fixed size
  and sealed to the analyzer with HPKE: the inner layer.
* :class:`Admission` is the outer layer's plaintext: the client's credential, a fresh
  nonce and the sealed report; it is sealed to the shuffler (``protocol/wire/onion.py``).
* :class:`Envelope` is what the broker and the network see: the session, the round,
  and the outer ciphertext, all of one length per round.
* :class:`ShuffledBatch` is one signed chunk of what the shuffler forwards: the sealed
  reports alone, permuted; :class:`BatchAck` is the analyzer's signed receipt of it.
* :class:`AdmissionReceipts` and :class:`RoundOutcome` tell clients, under the
  shuffler's signature, whether their envelopes were admitted and what became of
  the round.

**Binding to the spec.** Every message of a round after the spec names the exact
signed spec it belongs to: :attr:`RoundSpec.digest` (SHA-256 over a label and the
spec's canonical encoding, the bytes the analyzer signed) is part of both HPKE
``info`` strings (so a report or envelope sealed under one spec opens under no other,
even one with the same session and round ids) and a field of every shuffled-batch
chunk, acknowledgement, receipts message and outcome, which the receiver compares
with the spec it holds. A batch randomized at one ε0 therefore cannot be recorded
under a spec that says another.

The wire encoding of all of these lives in :mod:`shuffledp.protocol.wire.codec`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from dataclasses import dataclass, field
from typing import ClassVar, Union, get_args

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import next_power_of_two
from shuffledp.protocol.mechanisms.randomness import MAX_NOISE_SCALE
from shuffledp.protocol.wire.ed25519_keys import check_ed25519_key

WIRE_VERSION = 3
#: The SHA-256 digest that binds a round's sealed reports and signed messages to its exact spec.
SPEC_DIGEST_BYTES = 32
SPEC_DIGEST_LABEL = b"shuffledp/v3/spec"
SESSION_ID_BYTES = 16
NONCE_BYTES = 16
X25519_KEY_BYTES = 32
ED25519_KEY_BYTES = 32
SIGNATURE_BYTES = 64
#: An admission credential: client id (16 bytes) and its HMAC tag (32), see ``protocol/wire/credentials.py``.
CREDENTIAL_BYTES = 48
BATCH_ID_BYTES = 16
#: Largest sealed report a round may use, and largest outer ciphertext of an envelope.
MAX_SEALED_BYTES = 1024
MAX_OUTER_BYTES = 2048
MAX_BINS = 1 << 20
MAX_GRID_LEVELS = 1 << 24
#: Most reports one user may send in a round (vector summation: messages x padded dimension).
MAX_MESSAGES_PER_USER = 4096
#: Largest local epsilon a round may ask for. Beyond ~36 the keep-probability of
#: randomized response rounds to 1 in double precision (no randomization at all);
#: 30 leaves room for the safety margin of range_randomizer.keep_probability.
MAX_EPSILON = 30.0
#: Smallest local epsilon a round may ask for. Below it randomized response is
#: numerically degenerate (its keep probability is within a few ulps of 1/2, see
#: range_randomizer.keep_probability) and the noise of a mean report dwarfs any signal.
MIN_EPSILON = 1e-6
#: Most reports a round may batch (a round's max_batch, and the default).
MAX_BATCH = 1 << 24
#: Most shuffler instances one round may be spread over.
MAX_SHUFFLER_INSTANCES = 64


def short_repr(value: object, limit: int = 40) -> str:
    """``repr`` cut to ``limit`` characters, safe for any value (error messages quote hostile input).

    Integers are sized before formatting: Python refuses to format ints past 4,300
    digits, and a message must never fail while reporting bad input.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<integer of {value.bit_length()} bits>"
    if isinstance(value, (bytes, bytearray, str, list, tuple, dict, set)) and len(value) > limit:
        return f"<{type(value).__name__} of length {len(value)}>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _require(condition: bool, name: str, problem: str) -> None:
    if not condition:
        raise InvalidParameter(name, problem)


def _finite(value: float, name: str) -> None:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool), name, "must be a number")
    _require(math.isfinite(value), name, f"must be finite, got {short_repr(value)}")


def _bytes_of(value: bytes, length: int, name: str) -> None:
    _require(isinstance(value, bytes), name, "must be bytes")
    _require(len(value) == length, name, f"must be {length} bytes, got {len(value)}")


def _count(value: int, name: str, low: int, high: int) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool), name, "must be an integer")
    if not low <= value <= high:  # the message is formatted only for a refusal (every message checks its round id)
        raise InvalidParameter(name, f"must be in [{low}, {high}], got {short_repr(value)}")


def _round(value: int) -> None:
    _count(value, "round_id", 0, 2**63 - 1)


def _resolvable(low: float, high: float, step: float, name: str) -> None:
    """Refuse a grid whose step is lost in double precision at the interval's magnitude.

    Bins or grid points closer than a few ulps collapse into each other (``low + step
    == low``), and a width that overflows makes every decoded value NaN.
    """
    width = high - low
    _require(math.isfinite(width), name, f"interval [{low}, {high}] is wider than a double can hold")
    magnitude = max(abs(low), abs(high))
    _require(
        step >= 4.0 * math.ulp(magnitude),
        name,
        f"gives a step of {step:.3g}, below 4 ulps ({4.0 * math.ulp(magnitude):.3g}) at magnitude {magnitude:.3g}",
    )


@dataclass(frozen=True)
class HadamardRangeParams:
    """Public parameters of Hadamard-response range estimation (Girgis et al. 2022, Alg. 3/4).

    ``[low, high]`` is split into ``num_bins = ceil((high - low) / (2 tau))`` intervals
    of width ``2 tau``; the Hadamard matrix has ``padded_bins`` (the next power of two)
    rows and columns. The padding columns are never chosen by a client.
    """

    MECHANISM: ClassVar[str] = "hadamard-range"
    #: A report is ``(row, bit)``.
    VALUES_PER_REPORT: ClassVar[int] = 2
    low: float
    high: float
    tau: float

    def __post_init__(self) -> None:
        _finite(self.low, "low")
        _finite(self.high, "high")
        _finite(self.tau, "tau")
        _require(self.high > self.low, "high", f"must exceed low ({self.low}), got {self.high}")
        _require(self.tau > 0, "tau", f"must be > 0, got {self.tau}")
        ratio = (self.high - self.low) / (2.0 * self.tau)
        _require(
            math.isfinite(ratio) and ratio <= MAX_BINS,
            "tau",
            f"gives {ratio:.3g} bins over [{self.low}, {self.high}]; at most {MAX_BINS} allowed",
        )
        _require(
            self.num_bins <= MAX_BINS,
            "tau",
            f"gives {self.num_bins} bins over [{self.low}, {self.high}]; at most {MAX_BINS} allowed",
        )
        _resolvable(self.low, self.high, 2.0 * self.tau, "tau")
        # the announced range [centre - 3 tau, centre + 3 tau] must stay finite too
        _require(math.isfinite(abs(self.low) + abs(self.high) + 8.0 * self.tau), "tau", "announced range overflows")

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Randomized response is pure: ``delta0`` must be 0."""
        _require(delta == 0, "delta0", "must be 0: randomized response is pure epsilon-LDP")

    @property
    def num_bins(self) -> int:
        return max(1, math.ceil((self.high - self.low) / (2.0 * self.tau) - 1e-12))

    @property
    def padded_bins(self) -> int:
        return next_power_of_two(self.num_bins)

    def bin_center(self, index: int) -> float:
        return self.low + self.tau * (2 * index + 1)


NOISE_KINDS = ("laplace", "gaussian")


def check_epsilon_delta(epsilon0: float, delta0: float) -> None:
    """The range every round's guarantee must lie in: ``MIN_EPSILON <= epsilon0 <= MAX_EPSILON``, ``0 <= delta0 < 1``."""
    _finite(epsilon0, "epsilon0")
    _require(
        MIN_EPSILON <= epsilon0 <= MAX_EPSILON,
        "epsilon0",
        f"must be in [{MIN_EPSILON}, {MAX_EPSILON}], got {short_repr(epsilon0)}",
    )
    _finite(delta0, "delta0")
    _require(0.0 <= delta0 < 1.0, "delta0", f"must be in [0, 1), got {short_repr(delta0)}")


def check_local_budget(epsilon0: float, delta0: float, noise: str) -> None:
    """Validate a local budget: ``MIN_EPSILON <= epsilon0 <= MAX_EPSILON``, ``0 <= delta0 < 1``, and
    ``delta0 > 0`` exactly when the noise is Gaussian (Laplace reports are pure DP)."""
    check_epsilon_delta(epsilon0, delta0)
    _require(noise in NOISE_KINDS, "noise", f"must be one of {NOISE_KINDS}, got {noise!r}")
    _require((noise == "gaussian") == (delta0 > 0), "delta0", "must be > 0 exactly when the noise is Gaussian")


@dataclass(frozen=True)
class ProjectedMeanParams:
    """Public parameters of the projected mean report (Girgis et al. 2022, Alg. 2).

    A user projects its local mean onto ``[lower, upper]``, rounds it at random to
    one of ``grid_levels + 1`` points of a fixed grid, and adds discrete ``noise``
    ("laplace": pure epsilon; "gaussian": (epsilon, delta)).
    """

    MECHANISM: ClassVar[str] = "projected-mean"
    #: A report is ``(grid_value,)``.
    VALUES_PER_REPORT: ClassVar[int] = 1
    lower: float
    upper: float
    noise: str = "laplace"
    grid_levels: int = 4096

    def __post_init__(self) -> None:
        _finite(self.lower, "lower")
        _finite(self.upper, "upper")
        _require(self.upper > self.lower, "upper", f"must exceed lower ({self.lower}), got {self.upper}")
        _require(self.noise in NOISE_KINDS, "noise", f"must be one of {NOISE_KINDS}, got {self.noise!r}")
        _count(self.grid_levels, "grid_levels", 1, MAX_GRID_LEVELS)
        _resolvable(self.lower, self.upper, (self.upper - self.lower) / self.grid_levels, "grid_levels")

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Refuse a budget whose noise scale in grid units exceeds :data:`MAX_NOISE_SCALE`.

        Laplace: the scale is ``G / eps`` exactly. Gaussian: the calibrated sigma is at
        most the sigma that the zCDP route gives, since the discrete Gaussian with
        ``sigma^2`` is ``rho = G^2 / (2 sigma^2)``-zCDP (Canonne, Kamath & Steinke 2020,
        Thm. 4) and rho-zCDP implies ``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP
        (Bun & Steinke 2016, Prop. 1.3); solving for rho gives
        ``sqrt(rho) = sqrt(log(1/delta) + eps) - sqrt(log(1/delta))``.
        """
        check_local_budget(epsilon, delta, self.noise)
        if self.noise == "laplace":
            scale = self.grid_levels / epsilon
        else:
            log_inv_delta = -math.log(delta)
            sqrt_rho = epsilon / (math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta))
            scale = self.grid_levels / (math.sqrt(2.0) * sqrt_rho)
        _require(
            scale <= MAX_NOISE_SCALE,
            "epsilon0",
            f"gives a noise scale of {scale:.3g} grid units with {self.grid_levels} levels; "
            f"at most {MAX_NOISE_SCALE:.3g} (raise epsilon0 or lower grid_levels)",
        )
        # A decoded report lies within (G + 2B) steps of [lower, upper], with B below 64 noise
        # scales (mean_randomizer.noise_tail_bound); MAX_BATCH of them must still sum to a finite float.
        extent = max(abs(self.lower), abs(self.upper)) + (self.grid_levels + 64.0 * scale) * self.step
        _require(
            extent * MAX_BATCH < sys.float_info.max,
            "upper",
            f"reports may decode to magnitude {extent:.3g}; a sum of {MAX_BATCH} of them overflows a double",
        )

    @property
    def step(self) -> float:
        return (self.upper - self.lower) / self.grid_levels


VECTOR_MODES = ("sampled", "paper")
#: Largest dimension a vector round may name (a vector-mean spec carries two floats per coordinate).
MAX_VECTOR_DIM = 1 << 10


class _RotatedRange:
    """What the rotated range rounds share: the scalar bin layout of ``[low, high]`` in bins of
    width ``2 tau``, and the rotation's padded dimension."""

    low: float
    high: float
    tau: float
    dim: int

    @property
    def scalar(self) -> HadamardRangeParams:
        return HadamardRangeParams(self.low, self.high, self.tau)

    @property
    def padded_dim(self) -> int:
        return next_power_of_two(self.dim)


@dataclass(frozen=True)
class VectorRangeParams(_RotatedRange):
    """Public parameters of the vector protocol's range round (Girgis et al. 2022, Alg. 5 lines 4-10).

    A user rotates its local mean with the randomized Hadamard transform of
    ``rotation_seed`` (``U = H D / sqrt(D)``, dimension padded to ``D``) and answers the
    Hadamard range round over ``[low, high]`` with bins of width ``2 tau``: for one
    coordinate it draws uniformly (``sampled``: one report), or for every coordinate
    at ``epsilon0 / D`` each (``paper``: ``D`` reports). A report is ``(coord, row, bit)``.
    The round is ``epsilon0``-LDP either way (the coordinate is drawn independently of
    the data; basic composition over ``D``).
    """

    MECHANISM: ClassVar[str] = "vector-range"
    VALUES_PER_REPORT: ClassVar[int] = 3
    low: float
    high: float
    tau: float
    dim: int
    rotation_seed: int
    mode: str = "sampled"

    def __post_init__(self) -> None:
        HadamardRangeParams(self.low, self.high, self.tau)  # the same interval and bin checks
        _count(self.dim, "dim", 1, MAX_VECTOR_DIM)
        _count(self.rotation_seed, "rotation_seed", 0, 2**64 - 1)
        _require(self.mode in VECTOR_MODES, "mode", f"must be one of {VECTOR_MODES}, got {short_repr(self.mode)}")

    @property
    def messages_per_user(self) -> int:
        return 1 if self.mode == "sampled" else self.padded_dim

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Pure: ``delta0`` must be 0; in paper mode each of the ``D`` reports gets ``epsilon0 / D``,
        which must stay in the common range."""
        self.scalar.check_budget(epsilon, delta)
        _require(
            epsilon / self.messages_per_user >= MIN_EPSILON,
            "epsilon0",
            f"{epsilon} over {self.messages_per_user} reports is below {MIN_EPSILON} per report",
        )


@dataclass(frozen=True)
class CoordinateTreeParams(_RotatedRange):
    """Public parameters of a per-coordinate dyadic range tree after a random rotation
    (Huang, Liang & Yi, NeurIPS 2021, Sec. 5 step 2: the private per-coordinate median,
    local and shuffle versions; hierarchical local range counting after Cormode,
    Kulkarni & Srivastava, VLDB 2019).

    ``[low, high]`` is cut into ``K = padded_bins`` leaves of width ``2 tau`` (the
    padding leaves lie past ``high`` and hold no user); the tree over them has
    ``levels = log2 K`` levels below the root. A user rotates its vector with the
    randomized Hadamard transform of ``rotation_seed``, draws one rotated coordinate
    ``l`` and one level ``h`` in ``1..levels`` uniformly, and answers Hadamard response
    (the ``K``-row matrix, as :class:`HadamardRangeParams`) for its node at level ``h``,
    the leaf index shifted right by ``levels - h``. A report is ``(group, row, bit)``
    with ``group = l * levels + h - 1``.

    Guarantee: pure ``epsilon0``-LDP. The group is drawn independently of the data and
    Hadamard response is ``epsilon0``-LDP for any input index (every output has
    probability ``p/K`` or ``(1-p)/K``).
    """

    MECHANISM: ClassVar[str] = "coordinate-tree"
    VALUES_PER_REPORT: ClassVar[int] = 3
    low: float
    high: float
    tau: float
    dim: int
    rotation_seed: int

    def __post_init__(self) -> None:
        scalar = HadamardRangeParams(self.low, self.high, self.tau)  # the same interval and bin checks
        _require(scalar.num_bins >= 2, "tau", "a tree needs at least two leaves: tau must be below (high - low) / 2")
        _count(self.dim, "dim", 1, MAX_VECTOR_DIM)
        _count(self.rotation_seed, "rotation_seed", 0, 2**64 - 1)

    @property
    def levels(self) -> int:
        return self.scalar.padded_bins.bit_length() - 1

    @property
    def groups(self) -> int:
        """``padded_dim * levels``: one (coordinate, level) pair per group."""
        return self.padded_dim * self.levels

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Pure: ``delta0`` must be 0."""
        self.scalar.check_budget(epsilon, delta)


@dataclass(frozen=True)
class ShiftedNormParams:
    """Public parameters of the norm round of the instance-optimal mean (Huang, Liang & Yi,
    NeurIPS 2021, Sec. 5 step 3: the clipping threshold is a quantile of the shifted norms).

    A user computes ``log2 ||x - center||`` (``center`` in the original coordinates; a
    zero distance counts as ``low``), maps it to one of the bins of width ``2 tau`` over
    ``[low, high]`` (values outside are clamped) and answers Hadamard response for that
    bin, exactly as :class:`HadamardRangeParams`. A report is ``(row, bit)``.

    Guarantee: pure ``epsilon0``-LDP (Hadamard response of a function of the data).
    """

    MECHANISM: ClassVar[str] = "shifted-norm"
    VALUES_PER_REPORT: ClassVar[int] = 2
    center: tuple[float, ...]
    low: float
    high: float
    tau: float

    def __post_init__(self) -> None:
        HadamardRangeParams(self.low, self.high, self.tau)
        _require(isinstance(self.center, tuple) and 1 <= len(self.center) <= MAX_VECTOR_DIM, "center", f"must hold 1 to {MAX_VECTOR_DIM} coordinates")
        for value in self.center:
            _finite(value, "center")
        _require(
            self.high <= 1000.0 and self.low >= -1000.0, "high", "the log2-norm grid must lie in [-1000, 1000] (norms of doubles)"
        )

    @property
    def dim(self) -> int:
        return len(self.center)

    @property
    def scalar(self) -> HadamardRangeParams:
        return HadamardRangeParams(self.low, self.high, self.tau)

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Pure: ``delta0`` must be 0."""
        self.scalar.check_budget(epsilon, delta)


@dataclass(frozen=True)
class VectorMeanParams:
    """Public parameters of the vector protocol's mean round (Girgis et al. 2022, Alg. 5 lines 11-14).

    A user rotates its local mean (``rotation_seed``), draws one coordinate uniformly,
    projects that rotated coordinate onto the announced ``[lower[l], upper[l]]`` and
    sends the projected mean report of that interval (Algorithm 2: randomized rounding
    to ``grid_levels`` levels and discrete ``noise``). A report is ``(coord, grid value)``.
    The round's guarantee is the projected report's, since each user's sensitivity is
    ``grid_levels`` grid units on whichever coordinate it draws.
    """

    MECHANISM: ClassVar[str] = "vector-mean"
    VALUES_PER_REPORT: ClassVar[int] = 2
    dim: int
    rotation_seed: int
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    noise: str = "laplace"
    grid_levels: int = 4096

    def __post_init__(self) -> None:
        _count(self.dim, "dim", 1, MAX_VECTOR_DIM)
        _count(self.rotation_seed, "rotation_seed", 0, 2**64 - 1)
        for name in ("lower", "upper"):
            value = getattr(self, name)
            _require(isinstance(value, tuple) and len(value) == self.padded_dim, name, f"must give one bound per rotated coordinate ({self.padded_dim})")
        for lo, hi in zip(self.lower, self.upper):
            ProjectedMeanParams(lo, hi, self.noise, self.grid_levels)  # each interval checked as a scalar round's

    @property
    def padded_dim(self) -> int:
        return next_power_of_two(self.dim)

    @property
    def ranges(self):
        """``(D, 2)`` array of the announced intervals."""
        import numpy as np

        return np.stack([np.asarray(self.lower), np.asarray(self.upper)], axis=1)

    def check_budget(self, epsilon: float, delta: float) -> None:
        """As a projected mean round on every coordinate's interval."""
        for lo, hi in zip(self.lower, self.upper):
            ProjectedMeanParams(lo, hi, self.noise, self.grid_levels).check_budget(epsilon, delta)


SUM_NOISE_KINDS = ("polya",)
VECTOR_SUM_NOISE_KINDS = ("skellam",)


@dataclass(frozen=True)
class ModularSumParams:
    """Public parameters of scalar multi-message summation (Balle, Bell, Gascón & Nissim, CCS 2020;
    Ghazi, Manurangsi, Pagh & Velingker, Eurocrypt 2020).

    A user clips its value to ``[lower, upper]``, encodes it in ``{0, ..., precision}``
    by randomized rounding, adds its Pólya noise share (``users`` shares sum to a
    discrete Laplace with ``alpha = exp(-epsilon0 / precision)``), and sends
    ``messages`` additive shares mod ``modulus``, each its own sealed report ``(share,)``.

    For this mechanism the round's ``epsilon0``/``delta0`` is the *central* guarantee
    of the shuffled round, the only one it has (one user's shares alone are not
    locally private): :meth:`check_budget` refuses parameters whose analysis does not
    give it (``protocol/mechanisms/summation_params.py``), so a client checks the claim it is
    charged for before answering.
    """

    MECHANISM: ClassVar[str] = "modular-sum"
    #: A user's shares, linked, reveal its value: the round's guarantee is central only.
    LOCAL_GUARANTEE: ClassVar[bool] = False
    #: A report is ``(share,)``, ``0 <= share < modulus``.
    VALUES_PER_REPORT: ClassVar[int] = 1
    lower: float
    upper: float
    precision: int
    modulus: int
    messages: int
    users: int
    noise: str = "polya"

    def __post_init__(self) -> None:
        _finite(self.lower, "lower")
        _finite(self.upper, "upper")
        _require(self.upper > self.lower, "upper", f"must exceed lower ({self.lower}), got {self.upper}")
        _count(self.precision, "precision", 1, 1 << 40)
        _count(self.users, "users", 2, MAX_BATCH)
        _count(self.messages, "messages", 2, MAX_MESSAGES_PER_USER)
        _count(self.modulus, "modulus", 3, 1 << 62)
        _require(self.noise in SUM_NOISE_KINDS, "noise", f"must be one of {SUM_NOISE_KINDS}, got {short_repr(self.noise)}")
        _resolvable(self.lower, self.upper, (self.upper - self.lower) / self.precision, "precision")

    @property
    def messages_per_user(self) -> int:
        return self.messages

    @property
    def min_reports(self) -> int:
        """A batch must hold every share of ``users`` users: fewer users, less noise than claimed."""
        return self.users * self.messages

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Refuse parameters under which the round does not give central ``(epsilon, delta)``."""
        from shuffledp.protocol.mechanisms.summation_params import check_scalar_sum

        check_scalar_sum(self, epsilon, delta)


@dataclass(frozen=True)
class VectorSumParams:
    """Public parameters of vector multi-message summation (Huang, Liang & Yi, NeurIPS 2021,
    Sec. 5, Lemma 5: per-coordinate summation after Balle et al. 2020, here with Skellam noise).

    A user clips its vector to the l2 ball of ``radius``, rotates it with the randomized
    Hadamard transform of ``rotation_seed`` (dimension padded to ``D``, a power of two),
    scales by ``levels / radius`` and rounds each coordinate at random to an integer,
    adds its Skellam noise shares (``users`` shares sum to ``Skellam(mu)`` on every
    coordinate), and sends, for every coordinate, ``messages`` additive shares mod
    ``modulus``: ``D * messages`` reports ``(coordinate, share)``. Each coordinate is
    its own split-and-mix instance; the tag only says which.

    As for :class:`ModularSumParams`, the round's ``epsilon0``/``delta0`` is its central
    guarantee, checked by :meth:`check_budget`.
    """

    MECHANISM: ClassVar[str] = "vector-sum"
    #: A user's shares, linked, reveal its vector: the round's guarantee is central only.
    LOCAL_GUARANTEE: ClassVar[bool] = False
    #: A report is ``(coordinate, share)``, ``0 <= coordinate < D``, ``0 <= share < modulus``.
    VALUES_PER_REPORT: ClassVar[int] = 2
    dim: int
    radius: float
    levels: int
    rotation_seed: int
    modulus: int
    messages: int
    users: int
    mu: float
    noise: str = "skellam"

    def __post_init__(self) -> None:
        _count(self.dim, "dim", 1, MAX_VECTOR_DIM)
        _finite(self.radius, "radius")
        _require(self.radius > 0, "radius", f"must be > 0, got {short_repr(self.radius)}")
        _count(self.levels, "levels", 1, 1 << 32)
        _grid_scale(self.levels, self.radius)
        _count(self.rotation_seed, "rotation_seed", 0, 2**64 - 1)
        _count(self.modulus, "modulus", 3, 1 << 62)
        _count(self.users, "users", 2, MAX_BATCH)
        _count(self.messages, "messages", 2, MAX_MESSAGES_PER_USER)
        _require(
            self.messages_per_user <= MAX_MESSAGES_PER_USER,
            "messages",
            f"{self.messages} per coordinate x {self.padded_dim} coordinates exceeds {MAX_MESSAGES_PER_USER} messages per user",
        )
        _finite(self.mu, "mu")
        _require(1.0 <= self.mu <= MAX_NOISE_SCALE**2, "mu", f"must be in [1, {MAX_NOISE_SCALE**2:.3g}], got {short_repr(self.mu)}")
        _require(self.noise in VECTOR_SUM_NOISE_KINDS, "noise", f"must be one of {VECTOR_SUM_NOISE_KINDS}, got {short_repr(self.noise)}")

    @property
    def padded_dim(self) -> int:
        return next_power_of_two(self.dim)

    @property
    def messages_per_user(self) -> int:
        return self.messages * self.padded_dim

    @property
    def min_reports(self) -> int:
        """A batch must hold every share of ``users`` users: fewer users, less noise than claimed."""
        return self.users * self.messages_per_user

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Refuse parameters under which the round does not give central ``(epsilon, delta)``."""
        from shuffledp.protocol.mechanisms.summation_params import check_vector_sum

        check_vector_sum(self, epsilon, delta)


def _grid_scale(levels: int, radius: float) -> None:
    """The encoding scales by ``levels / radius``: it must be a finite double (a radius of 1e-300
    with 2^32 levels made every encoded coordinate inf or NaN)."""
    _require(math.isfinite(levels / radius), "radius", f"{short_repr(radius)} is too small for {levels} levels: levels / radius overflows")


def _check_center(center: tuple[float, ...], dim: int) -> None:
    _require(isinstance(center, tuple) and len(center) == dim, "center", f"must give one coordinate per input dimension ({dim})")
    for value in center:
        _finite(value, "center")


@dataclass(frozen=True)
class ShiftedVectorSumParams(VectorSumParams):
    """Vector multi-message summation of ``x - center`` (Huang, Liang & Yi, NeurIPS 2021,
    Sec. 5 step 4, shuffle version: the clipped mean of the shifted vectors).

    Every field and every check of :class:`VectorSumParams`; a user first subtracts the
    public ``center`` (original coordinates), so the clipping ball of ``radius`` is
    centred there. The analyzer adds ``users * center`` back. Subtracting a public
    vector changes no sensitivity: the round's central guarantee is
    :class:`VectorSumParams`'.
    """

    MECHANISM: ClassVar[str] = "shifted-vector-sum"
    center: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_center(self.center, self.dim)


@dataclass(frozen=True)
class LocalVectorParams:
    """A clipped, shifted vector with local Skellam noise (Huang, Liang & Yi, NeurIPS 2021,
    Sec. 5 step 4, local version, with the discrete Skellam noise of Agarwal, Kairouz &
    Liu, NeurIPS 2021, in place of the continuous Gaussian).

    A user subtracts ``center``, clips to the l2 ball of ``radius``, rotates with the
    randomized Hadamard transform of ``rotation_seed``, scales by ``levels / radius``
    and rounds every coordinate at random to an integer (the encoding of
    :class:`VectorSumParams`), then adds ``Skellam(mu)`` to every coordinate and clamps
    to ``[-bound, bound]`` (post-processing, see :attr:`bound`). It sends ``D`` reports
    ``(coordinate, value)``.

    Guarantee: ``(epsilon0, delta0)``-LDP with ``epsilon0`` from the Skellam RDP bound at
    the encoding's l1 and l2 sensitivities (``protocol/mechanisms/summation_params.py``), checked
    by :meth:`check_budget`. Not pure: no amplification by shuffling is claimed.

    Device cost: local noise for a whole vector is large (``mu`` grows as ``levels^2 / eps^2``),
    and the exact Poisson sampler's time is linear in its mean; above
    ``distributed_noise.DEVICE_MAX_MEAN`` per draw, or ``DEVICE_MAX_TOTAL_MEAN`` over the
    ``D`` coordinates (``D mu``: without it, 1,024 coordinates at the per-draw limit took many
    minutes), a device's ``skellam_shares`` refuses with a typed error, so such a device
    declines the round (nothing is sent or charged). The simulation path (numpy Poisson) has
    no such limit.
    """

    MECHANISM: ClassVar[str] = "local-vector"
    VALUES_PER_REPORT: ClassVar[int] = 2
    dim: int
    radius: float
    levels: int
    rotation_seed: int
    mu: float
    center: tuple[float, ...]

    def __post_init__(self) -> None:
        _count(self.dim, "dim", 1, MAX_VECTOR_DIM)
        _finite(self.radius, "radius")
        _require(self.radius > 0, "radius", f"must be > 0, got {short_repr(self.radius)}")
        _count(self.levels, "levels", 1, 1 << 32)
        _grid_scale(self.levels, self.radius)
        _count(self.rotation_seed, "rotation_seed", 0, 2**64 - 1)
        _finite(self.mu, "mu")
        _require(1.0 <= self.mu <= MAX_NOISE_SCALE**2, "mu", f"must be in [1, {MAX_NOISE_SCALE**2:.3g}], got {short_repr(self.mu)}")
        _check_center(self.center, self.dim)

    @property
    def padded_dim(self) -> int:
        return next_power_of_two(self.dim)

    @property
    def messages_per_user(self) -> int:
        return self.padded_dim

    @property
    def bound(self) -> int:
        """Largest magnitude a report value takes: the encoding's ``levels + 1`` plus a Skellam
        tail exceeded with probability below ``2^-64`` per value (the clamp is post-processing)."""
        from shuffledp.protocol.mechanisms.summation_params import skellam_tail

        return self.levels + 1 + skellam_tail(self.mu, 2.0**-64)

    def check_budget(self, epsilon: float, delta: float) -> None:
        """Refuse ``mu`` whose Skellam noise does not give ``(epsilon, delta)`` for one user's report."""
        from shuffledp.protocol.mechanisms.summation_params import skellam_epsilon

        check_epsilon_delta(epsilon, delta)
        _require(delta > 0, "delta0", "must be > 0: Skellam noise is not pure DP")
        achieved = skellam_epsilon(self.mu, self.levels, self.padded_dim, delta)
        _require(achieved <= epsilon, "mu", f"Skellam noise mu = {self.mu:.6g} gives eps {achieved:.4g} > {epsilon:.4g} at delta {delta:.3g}")


MechanismParams = Union[
    HadamardRangeParams,
    ProjectedMeanParams,
    VectorRangeParams,
    VectorMeanParams,
    ModularSumParams,
    VectorSumParams,
    CoordinateTreeParams,
    ShiftedNormParams,
    ShiftedVectorSumParams,
    LocalVectorParams,
]
#: Every mechanism's parameter class by its wire name (the members of :data:`MechanismParams`).
MECHANISMS: dict[str, type[MechanismParams]] = {cls.MECHANISM: cls for cls in get_args(MechanismParams)}


def messages_per_user(params: MechanismParams) -> int:
    """Reports each user sends in a round with these parameters."""
    return getattr(params, "messages_per_user", 1)


@dataclass(frozen=True)
class RoundSpec:
    """Everything public about one round; clients check it before answering.

    ``epsilon0``/``delta0`` is the local (user-level) guarantee one answer gives;
    a client refuses a spec that would push its ledger past its budget.
    ``analyzer_key`` is the X25519 key reports are sealed to (inner layer);
    ``shuffler_key`` the X25519 key envelopes are sealed to (outer layer), and
    ``shuffler_signing_key`` the Ed25519 key the shuffler signs batches, receipts and
    outcomes with: the analyzer names the one shuffler it will accept batches from (a
    small-order point or a non-canonical encoding, under which anyone could sign, is refused).
    ``min_batch`` is the batch size the shuffler waits for before forwarding,
    ``max_batch`` the most reports a batch of this round may hold (the analyzer
    refuses a longer batch before decoding it), and ``deadline`` (Unix seconds)
    when the round closes regardless.
    """

    session_id: bytes
    round_id: int
    params: MechanismParams
    epsilon0: float
    analyzer_key: bytes
    shuffler_key: bytes
    shuffler_signing_key: bytes
    min_batch: int
    deadline: float
    delta0: float = 0.0
    messages_per_user: int = 1
    max_batch: int = MAX_BATCH
    shuffler_instances: int = 1

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _require(isinstance(self.params, tuple(MECHANISMS.values())), "params", "unknown mechanism parameters")
        check_epsilon_delta(self.epsilon0, self.delta0)
        try:  # the mechanism's own rules (e.g. delta0 > 0 iff Gaussian; a summation's analysis)
            self.params.check_budget(self.epsilon0, self.delta0)
        except InvalidParameter:
            raise
        except (ArithmeticError, ValueError) as exc:  # a budget so extreme the analysis cannot be evaluated
            raise InvalidParameter("epsilon0", f"the mechanism's analysis fails at this budget ({type(exc).__name__})") from None
        _bytes_of(self.analyzer_key, X25519_KEY_BYTES, "analyzer_key")
        _bytes_of(self.shuffler_key, X25519_KEY_BYTES, "shuffler_key")
        _bytes_of(self.shuffler_signing_key, ED25519_KEY_BYTES, "shuffler_signing_key")
        # a small-order or non-canonical key would let anyone sign as this round's shuffler
        check_ed25519_key(self.shuffler_signing_key, "shuffler_signing_key", ED25519_KEY_BYTES)
        _count(self.max_batch, "max_batch", 1, MAX_BATCH)
        _count(self.min_batch, "min_batch", 1, self.max_batch)
        floor = getattr(self.params, "min_reports", 1)
        _require(
            self.min_batch >= floor,
            "min_batch",
            f"must be at least {floor}: the noise of these parameters is calibrated to that many reports",
        )
        _finite(self.deadline, "deadline")
        _count(self.messages_per_user, "messages_per_user", 1, MAX_MESSAGES_PER_USER)
        _count(self.shuffler_instances, "shuffler_instances", 1, MAX_SHUFFLER_INSTANCES)
        # Exactly: a larger quota would let one (Sybil) credential fill a batch that the
        # amplification, or a summation's noise, counts as many users' reports.
        _require(
            self.messages_per_user == messages_per_user(self.params),
            "messages_per_user",
            f"must be {messages_per_user(self.params)}, the reports one user sends with these parameters",
        )

    @property
    def mechanism(self) -> str:
        return self.params.MECHANISM

    @functools.cached_property
    def digest(self) -> bytes:
        """The round's binding to this exact spec: :func:`spec_digest_of` its canonical encoding
        (``codec.canonical_encode``: float fields written as floats, whatever type built them).

        The analyzer signs exactly those bytes (``Analyzer.sign_spec``), and ``verified_spec``
        accepts only specs whose signed bytes are that encoding, so every party that holds
        a verified spec computes this same digest from it. Computed once per spec object
        (``dataclasses.replace`` builds a new one; a frozen spec is never changed in place)."""
        from shuffledp.protocol.wire import codec  # codec imports this module

        return spec_digest_of(codec.canonical_encode(self))


def spec_digest_of(spec_bytes: bytes) -> bytes:
    """``SHA-256("shuffledp/v3/spec" || spec_bytes)``: the digest of an encoded RoundSpec (the
    ``spec_bytes`` of a :class:`SignedRoundSpec`), as an auditor computes it from stored bytes."""
    return hashlib.sha256(SPEC_DIGEST_LABEL + spec_bytes).digest()


@dataclass(frozen=True)
class SignedRoundSpec:
    """A RoundSpec's canonical encoding with the analyzer's Ed25519 signature over it."""

    spec_bytes: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _require(isinstance(self.spec_bytes, bytes) and len(self.spec_bytes) > 0, "spec_bytes", "must be non-empty bytes")
        _bytes_of(self.signature, SIGNATURE_BYTES, "signature")


@dataclass(frozen=True)
class Report:
    """One randomized answer, before sealing.

    ``values`` holds the mechanism's output: ``(row, bit)`` for Hadamard range
    (bit is +1/-1), ``(grid_value,)`` for a projected mean.
    """

    round_id: int
    mechanism: str
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        _round(self.round_id)
        _require(self.mechanism in MECHANISMS, "mechanism", f"unknown mechanism {short_repr(self.mechanism)}")
        width = MECHANISMS[self.mechanism].VALUES_PER_REPORT
        _require(isinstance(self.values, tuple) and len(self.values) == width, "values", f"must be {width} integer(s)")
        for v in self.values:
            _require(isinstance(v, int) and not isinstance(v, bool), "values", "must be integers")
            _require(-(2**62) <= v < 2**62, "values", "out of range")


def _byte_strings(values: tuple, name: str, low: int, high: int) -> None:
    _require(isinstance(values, tuple), name, "must be a tuple of bytes")
    for v in values:
        if not (isinstance(v, bytes) and low <= len(v) <= high):  # one check per item, no call (batches hold thousands)
            _require(False, name, f"each must be {low}..{high} bytes")


@dataclass(frozen=True)
class Admission:
    """The plaintext of an envelope's outer layer, which only the shuffler can open.

    ``credential`` proves the sender is an enrolled client (the shuffler's quota is per
    credential); ``nonce`` is fresh per envelope (replays are refused, and receipts
    name it); ``sealed`` is the padded report sealed to the analyzer. Every field has
    one length per round, so the outer ciphertext does too.
    """

    round_id: int
    credential: bytes
    nonce: bytes
    sealed: bytes

    def __post_init__(self) -> None:
        _round(self.round_id)
        _bytes_of(self.credential, CREDENTIAL_BYTES, "credential")
        _bytes_of(self.nonce, NONCE_BYTES, "nonce")
        _require(isinstance(self.sealed, bytes) and 0 < len(self.sealed) <= MAX_SEALED_BYTES, "sealed", f"must be 1..{MAX_SEALED_BYTES} bytes")


@dataclass(frozen=True)
class Envelope:
    """What a client publishes: the round it is for, and the outer ciphertext (an :class:`Admission` sealed to the shuffler)."""

    session_id: bytes
    round_id: int
    outer: bytes

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _require(isinstance(self.outer, bytes) and 0 < len(self.outer) <= MAX_OUTER_BYTES, "outer", f"must be 1..{MAX_OUTER_BYTES} bytes")


@dataclass(frozen=True)
class ShuffledBatch:
    """One chunk of a round's shuffled batch: sealed reports only, in a uniformly random order.

    A batch of ``total`` reports travels as ``chunks`` messages (``chunk`` = 0 ..
    chunks - 1) that share one random ``batch_id``; chunk ``i`` holds positions
    ``[i * c, i * c + len(payloads))`` of the permuted batch. Each chunk carries the
    shuffler's Ed25519 signature over its own encoding (``protocol/wire/onion.py``), so the
    analyzer checks every chunk as it arrives and accepts only a complete batch whose
    chunks all verify under the shuffler key named in the round spec.
    """

    session_id: bytes
    round_id: int
    spec_digest: bytes
    batch_id: bytes
    chunk: int
    chunks: int
    total: int
    payloads: tuple[bytes, ...] = field(repr=False)
    signature: bytes = bytes(SIGNATURE_BYTES)

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _bytes_of(self.spec_digest, SPEC_DIGEST_BYTES, "spec_digest")
        _bytes_of(self.batch_id, BATCH_ID_BYTES, "batch_id")
        _count(self.total, "total", 1, MAX_BATCH)
        _count(self.chunks, "chunks", 1, self.total)
        _count(self.chunk, "chunk", 0, self.chunks - 1)
        _byte_strings(self.payloads, "payloads", 1, MAX_SEALED_BYTES)
        _require(0 < len(self.payloads) <= self.total, "payloads", f"a chunk holds 1..total ({self.total}) payloads")
        _bytes_of(self.signature, SIGNATURE_BYTES, "signature")

    @property
    def size(self) -> int:
        return len(self.payloads)


@dataclass(frozen=True)
class BatchAck:
    """The analyzer's signed acknowledgement that it has received and opened a batch.

    On it the shuffler marks the round served and stops re-publishing the batch.
    """

    session_id: bytes
    round_id: int
    spec_digest: bytes
    batch_id: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _bytes_of(self.spec_digest, SPEC_DIGEST_BYTES, "spec_digest")
        _bytes_of(self.batch_id, BATCH_ID_BYTES, "batch_id")
        _bytes_of(self.signature, SIGNATURE_BYTES, "signature")


#: Most nonces one receipts message may list.
MAX_RECEIPTS = 1 << 16


@dataclass(frozen=True)
class AdmissionReceipts:
    """The shuffler's signed word on envelopes it has processed: which nonces it admitted
    (durably spooled) and which it refused, with the refusal's reason.

    Only envelopes whose outer layer opened have a nonce to name; the rest are counted
    in the shuffler's stats only. Published on the round's receipts topic.
    """

    session_id: bytes
    round_id: int
    spec_digest: bytes
    admitted: tuple[bytes, ...]
    refused: tuple[bytes, ...]
    reasons: tuple[str, ...]
    signature: bytes = bytes(SIGNATURE_BYTES)

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _bytes_of(self.spec_digest, SPEC_DIGEST_BYTES, "spec_digest")
        _byte_strings(self.admitted, "admitted", NONCE_BYTES, NONCE_BYTES)
        _byte_strings(self.refused, "refused", NONCE_BYTES, NONCE_BYTES)
        _require(len(self.admitted) + len(self.refused) <= MAX_RECEIPTS, "admitted", f"at most {MAX_RECEIPTS} receipts")
        _require(isinstance(self.reasons, tuple) and len(self.reasons) == len(self.refused), "reasons", "one per refused nonce")
        for r in self.reasons:
            _require(isinstance(r, str) and 0 < len(r) <= 32, "reasons", "each must be 1..32 characters")
        _bytes_of(self.signature, SIGNATURE_BYTES, "signature")


ROUND_OUTCOMES = ("released", "failed")


@dataclass(frozen=True)
class RoundOutcome:
    """The shuffler's signed word on how a round ended.

    ``released``: a batch of ``admitted`` reports left for the analyzer under
    ``batch_id``. ``failed``: nothing was forwarded (``reason``, e.g. too few reports
    by the deadline) and the admitted reports were deleted from the spool. A client
    whose report was admitted learns from it whether its round was lost. ``instance``
    names the shuffler instance speaking (a round may have several).
    """

    session_id: bytes
    round_id: int
    spec_digest: bytes
    outcome: str
    reason: str
    admitted: int
    batch_id: bytes
    instance: int = 0
    signature: bytes = bytes(SIGNATURE_BYTES)

    def __post_init__(self) -> None:
        _bytes_of(self.session_id, SESSION_ID_BYTES, "session_id")
        _round(self.round_id)
        _bytes_of(self.spec_digest, SPEC_DIGEST_BYTES, "spec_digest")
        _count(self.instance, "instance", 0, MAX_SHUFFLER_INSTANCES - 1)
        _require(self.outcome in ROUND_OUTCOMES, "outcome", f"must be one of {ROUND_OUTCOMES}")
        _require(isinstance(self.reason, str) and len(self.reason) <= 32, "reason", "at most 32 characters")
        _count(self.admitted, "admitted", 0, MAX_BATCH)
        _bytes_of(self.batch_id, BATCH_ID_BYTES, "batch_id")
        _bytes_of(self.signature, SIGNATURE_BYTES, "signature")

