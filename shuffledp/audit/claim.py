"""The claim part of ``shuffledp audit``: a deployment's privacy guarantee, recomputed from what it signed.

Input: a *session file* (the JSON ``shuffledp analyzer run --output FILE`` writes), whose
``rounds`` each carry the round's signed spec (``signed_spec``: the encoded
:class:`~shuffledp.protocol.wire.messages.SignedRoundSpec` the analyzer announced, hex) and the
sizes of the batches the shuffler delivered (``batch_sizes``: valid reports per batch), and
an analyzer signing key the auditor trusts (``public.json`` of the keys directory, or an
explicit hex key; never the key the file names, which is there for information only).

What is claimed, per round (:func:`claim_report`):

* the **local** guarantee ``(eps0, delta0)`` of the signed spec: one user's answer to
  the round (all its ``messages_per_user`` reports together) is ``(eps0, delta0)``-LDP;
* the **central** ``(eps, delta)`` of the shuffled round at the auditor's ``delta``,
  accounted at the number of *users* in the round's smallest batch (its valid reports
  divided by the spec's ``messages_per_user``, rounded down): a report hides only
  among its own batch (``RoundRecord.smallest_batch``), and a user's reports are
  counted as one eps0-LDP randomizer's output (shuffling the reports one by one is a
  post-processing of shuffling each user's tuple of reports). The bound is
  :func:`shuffledp.protocol.accounting.shuffled_round`: the smallest valid one of
  Feldman, McMillan & Talwar 2021 ("Hiding Among the Clones", Thm. 3.2, numerical and
  closed form), the stronger clone (FMT, SODA 2023, Thm. 3.2 after the errata), the
  corrected variation-ratio bound (Wang et al. 2024, arXiv 2304.05007) and Girgis et
  al.'s RDP bound (CCS 2021, Thm. 1), each where its theorem applies to the mechanism
  (:func:`round_guarantee` says which local guarantee each mechanism declares);
* where one exists, an empirical **lower bound** on that central epsilon
  (:func:`shuffledp.audit.shuffled.audit_shuffled`: a distinguishing test between two
  neighbouring datasets, Clopper-Pearson at 95 %) and its ratio to the claim.

For the session: the rounds amplified by shuffling are composed by
:class:`~shuffledp.protocol.accounting.SessionAccountant` (dp-accounting's privacy loss
distributions of the rounds' curves, and their RDP; Doroshenko et al. 2022's
connect-the-dots discretization) at ``delta``, and the smaller of that and the basic
composition of the per-round bounds at ``delta / k`` each (Dwork & Roth 2014, Thm. 3.16)
is taken, as :func:`shuffledp.simulation.central_guarantee_at` does. Rounds with no
amplification claim (Gaussian reports: ``(eps0, delta0)``-LDP, hence ``(eps0, delta0)``-DP
after shuffling by post-processing; summation rounds: their central ``(eps0, delta0)``
from ``protocol/mechanisms/summation_params.py``) are added by basic composition: the session's
delta is ``delta`` plus their ``delta0``'s.

A round **fails** when a batch was smaller than the signed ``min_batch`` (the claim was
made for at least that many reports), larger than its ``max_batch``, or came from more
instances than the spec names; when it has no valid claim; or when its lower bound
exceeds its claimed epsilon. A session file whose recorded fields disagree with the
signed spec, or whose signed spec does not verify, is refused outright
(:class:`~shuffledp.protocol.errors.SessionFileError`): the signed spec is what clients
answered, and a file that says otherwise has been altered.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from shuffledp.protocol.errors import InvalidParameter, SessionFileError, ShuffleDPError
from shuffledp.protocol.wire.messages import (
    ED25519_KEY_BYTES,
    CoordinateTreeParams,
    HadamardRangeParams,
    LocalVectorParams,
    ModularSumParams,
    ProjectedMeanParams,
    ShiftedNormParams,
    RoundSpec,
    VectorMeanParams,
    VectorRangeParams,
    VectorSumParams,
)

Progress = Callable[[str, int], None]
#: Largest session file read (a session of many rounds is a few hundred KiB).
MAX_SESSION_BYTES = 64 << 20
#: Fields every round of a session file must carry, with their JSON types.
ROUND_FIELDS: dict[str, tuple[type, ...]] = {
    "round_id": (int,),
    "mechanism": (str,),
    "epsilon0": (int, float),
    "delta0": (int, float),
    "min_batch": (int,),
    "batch_sizes": (list,),
    "signed_spec": (str,),
}
#: Fields compared with the signed spec when the file has them (the signed value wins; a mismatch is refused).
SIGNED_FIELDS = ("round_id", "mechanism", "epsilon0", "delta0", "min_batch", "max_batch", "shuffler_instances")
#: Default shuffled rounds sampled per side for a lower bound (about a second per round).
DEFAULT_LOWER_ROUNDS = 10**6


# --------------------------------------------------------------------------- the session file


@dataclass(frozen=True)
class RecordedRound:
    """One round as the session file records it: the analyzer's (unsigned) fields and its signed spec.

    ``recorded`` holds the fields of :data:`SIGNED_FIELDS` the file gives, to be checked
    against the signed spec; ``spec`` is that spec once verified (None before)."""

    index: int
    signed_spec: bytes
    batch_sizes: tuple[int, ...]
    recorded: dict[str, Any]
    spec: RoundSpec | None = None

    @property
    def smallest_batch(self) -> int:
        """The batch the round's central guarantee is accounted at."""
        return min(self.batch_sizes)

    @property
    def label(self) -> str:
        return f"round #{self.index} (round_id {self.recorded.get('round_id')})"


@dataclass(frozen=True)
class Session:
    """A deployment's session file, parsed; its rounds verified if ``verified``."""

    path: str
    rounds: tuple[RecordedRound, ...]
    session_id: str | None = None
    #: The key the file names (information only: verification uses a trusted key).
    named_signing_key: str | None = None
    #: The analyzer's own central claim (``analyzer run``'s ``central``), if the file has one.
    analyzer_central: dict[str, Any] | None = None
    verified_with: bytes | None = field(default=None, repr=False)

    @property
    def verified(self) -> bool:
        return self.verified_with is not None

    @property
    def specs(self) -> list[RoundSpec]:
        """The verified specs (refused before :func:`verify_session`)."""
        if not self.verified:
            raise InvalidParameter("session", "not verified: call verify_session (or load_session with a key) first")
        return [r.spec for r in self.rounds]  # type: ignore[misc]


def _is_number(value: object, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _read_document(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SESSION_BYTES + 1)
    except FileNotFoundError:
        raise SessionFileError(f"{path}: missing (write one with `shuffledp analyzer run --output FILE`)") from None
    except OSError as exc:
        raise SessionFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_SESSION_BYTES:
        raise SessionFileError(f"{path}: larger than {MAX_SESSION_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SessionFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SessionFileError(f"{path}: not a session file (a JSON object with a `rounds` list)")
    return doc


def _parse_round(path: Path, index: int, entry: object) -> RecordedRound:
    where = f"{path}: round #{index}"
    if not isinstance(entry, dict):
        raise SessionFileError(f"{where}: not a JSON object")
    for name, kinds in ROUND_FIELDS.items():
        if name not in entry:
            raise SessionFileError(f"{where}: missing field {name!r}")
        if not _is_number(entry[name], kinds):
            raise SessionFileError(f"{where}: field {name!r} must be {' or '.join(k.__name__ for k in kinds)}")
    sizes = entry["batch_sizes"]
    if not sizes or not all(_is_number(s, (int,)) and s >= 0 for s in sizes):
        raise SessionFileError(f"{where}: batch_sizes must be a non-empty list of integers >= 0")
    if "smallest_batch" in entry and entry["smallest_batch"] != min(sizes):
        raise SessionFileError(f"{where}: smallest_batch {entry['smallest_batch']!r} is not min(batch_sizes) = {min(sizes)}")
    try:
        signed = bytes.fromhex(entry["signed_spec"])
    except ValueError:
        raise SessionFileError(f"{where}: signed_spec is not hex") from None
    if not signed:
        raise SessionFileError(f"{where}: signed_spec is empty (a round served without announcing its spec)")
    recorded = {name: entry[name] for name in SIGNED_FIELDS if name in entry}
    return RecordedRound(index, signed, tuple(int(s) for s in sizes), recorded)


def load_session(path: str | Path, analyzer_signing_key: bytes | None = None) -> Session:
    """Read a session file (``analyzer run --output``); with ``analyzer_signing_key``, also verify it
    (:func:`verify_session`).

    Raises :class:`SessionFileError` on a missing or unreadable file, one that is not JSON,
    a missing or ill-typed field, a session with no rounds, and (when verifying) a signed
    spec that does not verify or that disagrees with the round's recorded fields. Batches
    below the signed ``min_batch`` are not an error here: :func:`claim_report` reports them.
    """
    path = Path(path)
    doc = _read_document(path)
    rounds = doc.get("rounds")
    if not isinstance(rounds, list):
        raise SessionFileError(f"{path}: missing field 'rounds' (a list)")
    if not rounds:
        raise SessionFileError(f"{path}: no rounds: nothing was released, nothing to account")
    parsed = tuple(_parse_round(path, i, entry) for i, entry in enumerate(rounds))
    session_id = doc.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise SessionFileError(f"{path}: session_id must be a hex string")
    named = doc.get("analyzer_signing_key")
    central = doc.get("central")
    session = Session(
        str(path), parsed, session_id,
        named if isinstance(named, str) else None,
        central if isinstance(central, dict) else None,
    )
    return session if analyzer_signing_key is None else verify_session(session, analyzer_signing_key)


def _check_key(analyzer_signing_key: bytes) -> bytes:
    if not isinstance(analyzer_signing_key, (bytes, bytearray)) or len(analyzer_signing_key) != ED25519_KEY_BYTES:
        raise InvalidParameter("analyzer_signing_key", f"must be {ED25519_KEY_BYTES} bytes (an Ed25519 public key)")
    return bytes(analyzer_signing_key)


def verify_session(session: Session, analyzer_signing_key: bytes, *, session_id: bytes | None = None) -> Session:
    """``session`` with every round's signed spec verified under ``analyzer_signing_key``.

    Refuses (:class:`SessionFileError`) a spec that does not decode or verify, a round
    whose recorded ``round_id``, ``mechanism``, ``epsilon0``, ``delta0``, ``min_batch``
    (and ``max_batch``, ``shuffler_instances`` where recorded) differ from its signed
    spec's, specs of several sessions or of another session than the file's
    ``session_id`` (or ``session_id``, e.g. the keys directory's), and a round id twice.
    """
    from shuffledp.protocol.wire.onion import verified_spec

    key = _check_key(analyzer_signing_key)
    rounds = []
    specs: list[RoundSpec] = []
    for r in session.rounds:
        try:
            spec = verified_spec(r.signed_spec, key)
        except ShuffleDPError as exc:
            raise SessionFileError(
                f"{session.path}: {r.label}: the signed spec does not verify under analyzer key "
                f"{key.hex()} ({exc.reason}: {exc})"
            ) from exc
        for name, value in r.recorded.items():
            signed_value = getattr(spec, name)
            if value != signed_value or isinstance(value, bool):
                raise SessionFileError(
                    f"{session.path}: {r.label}: recorded {name} {value!r} disagrees with the signed spec's "
                    f"{signed_value!r} (the file was altered; the signed spec is what clients answered)"
                )
        rounds.append(RecordedRound(r.index, r.signed_spec, r.batch_sizes, r.recorded, spec))
        specs.append(spec)
    sessions = {spec.session_id for spec in specs}
    if len(sessions) > 1:
        raise SessionFileError(f"{session.path}: rounds of {len(sessions)} different sessions")
    signed_session = next(iter(sessions))
    for expected, what in ((session.session_id, "the file's session_id"), (session_id.hex() if session_id else None, "the expected session")):
        if expected is not None and expected.lower() != signed_session.hex():
            raise SessionFileError(f"{session.path}: the signed specs are of session {signed_session.hex()}, not {what} {expected}")
    ids = [spec.round_id for spec in specs]
    if len(set(ids)) != len(ids):
        raise SessionFileError(f"{session.path}: a round id appears twice ({sorted(ids)})")
    return Session(session.path, tuple(rounds), session.session_id, session.named_signing_key,
                   session.analyzer_central, key)


def trusted_analyzer_key(source: str | Path) -> bytes:
    """The analyzer signing key an auditor trusts: ``public.json`` of a keys directory
    (``shuffledp keys init DIR``), or 64 hex digits."""
    from shuffledp.deploy.keys import load_public

    if Path(source).is_dir():
        return load_public(source).analyzer_signing_public
    text = str(source).strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != ED25519_KEY_BYTES:
        raise InvalidParameter("analyzer key", f"{text!r} is neither a keys directory nor {2 * ED25519_KEY_BYTES} hex digits")
    return key


# --------------------------------------------------------------------------- the guarantees


def round_guarantee(spec: RoundSpec):
    """The local guarantee the accountant amplifies for ``spec``'s round, or None when no amplification is claimed.

    * ``hadamard-range``: one-bit Hadamard response over the padded ``K x K`` Sylvester
      matrix (``hadamard-response``, ``K = padded_bins``, at least 2): the clients draw a row
      uniformly and keep ``H[row, bin]`` with probability ``e^eps0/(e^eps0+1)``; padding
      columns are never an input, so the guarantee over all ``K`` columns covers the used
      ones. With one bin the report does not depend on the input at all, and the K = 2
      guarantee (any valid bound) is used, as :func:`shuffledp.simulation.central_guarantee_at` does.
    * ``projected-mean`` with Laplace noise: the projected discrete-Laplace report, pure
      eps0-LDP, on its ``grid_levels`` (``laplace-mean``: the eps0-only FMT21 / RDP bounds and
      the report's own privacy-blanket bound, :mod:`shuffledp.protocol.accounting.blanket`).
    * ``vector-mean`` (Laplace): one coordinate drawn uniformly and independently of the
      data, then the same projected Laplace report on that coordinate's grid of the same
      ``grid_levels``; the blanket law of this mixture is covered by the scalar report's
      (the argument is in :mod:`~shuffledp.protocol.accounting.blanket`), so the same
      ``laplace-mean`` guarantee.
    * ``vector-range``: pure eps0-LDP per user (a coordinate drawn independently of the
      data, then a pure eps0-LDP report of it; in ``paper`` mode ``D`` reports at
      ``eps0 / D`` each, basic composition), so the generic guarantee (valid for every
      pure eps0-LDP randomizer); no mechanism-specific bound is claimed for it.
    * Gaussian noise (``projected-mean``, ``vector-mean``): ``(eps0, delta0)``-LDP only;
      every amplification bound here needs pure LDP (see
      :class:`~shuffledp.protocol.accounting.AmplificationNotClaimed`): None.
    * ``modular-sum``, ``vector-sum`` (``LOCAL_GUARANTEE = False``): one user's shares
      reveal its value; the round's ``(eps0, delta0)`` is its central guarantee, from the
      split-and-mix analysis and the noise (``protocol/mechanisms/summation_params.py``: Balle, Bell,
      Gascón & Nissim 2019 Thm. 1; Agarwal, Kairouz & Liu 2021 for Skellam): None. The same
      for ``shifted-vector-sum`` (a public shift first).
    * ``coordinate-tree``: a coordinate and a tree level drawn independently of the data,
      then Hadamard response of a node: pure eps0-LDP, the generic guarantee (no
      mechanism-specific bound is claimed for the mixture).
    * ``shifted-norm``: Hadamard response over the padded bins of ``log2 ||x - centre||``,
      as ``hadamard-range``.
    * ``local-vector``: local Skellam noise, ``(eps0, delta0)``-LDP only: None.
    """
    return plan_guarantee(spec.params, spec.epsilon0)


def plan_params(params) -> tuple[str, dict[str, Any]]:
    """``(mechanism, parameters)`` of a round's mechanism ``params`` as a session plan states them
    (:func:`shuffledp.protocol.accounting.composition.plan_round`): what the one rule table reads."""
    if isinstance(params, HadamardRangeParams):
        return params.MECHANISM, {"padded_bins": int(params.padded_bins)}
    if isinstance(params, (ProjectedMeanParams, VectorMeanParams)):
        return params.MECHANISM, {"grid_levels": int(params.grid_levels), "noise": params.noise}
    if isinstance(params, VectorRangeParams):
        # One user's whole answer (all its messages_per_user reports, eps0 together) is one pure
        # eps0-LDP randomizer's output, in either mode: the table's sampled-mode (generic) rule.
        return params.MECHANISM, {"mode": "sampled"}
    if isinstance(params, ShiftedNormParams):
        return params.MECHANISM, {"padded_bins": int(params.scalar.padded_bins)}
    if isinstance(params, (ModularSumParams, VectorSumParams, LocalVectorParams, CoordinateTreeParams)):
        return params.MECHANISM, {}
    raise InvalidParameter("mechanism", f"no accounting rule for {getattr(params, 'MECHANISM', type(params).__name__)!r}")


def plan_guarantee(params, epsilon0: float):
    """:func:`round_guarantee` of a round given by its mechanism ``params`` and local ``epsilon0``
    (a signed spec, or a round an engine ran): the rule of the one table every session is accounted
    by (:func:`shuffledp.protocol.accounting.composition.mechanism_rule`; None where it claims no amplification)."""
    from shuffledp.protocol.accounting.composition import mechanism_rule, round_guarantee as accounted

    mechanism, plan = plan_params(params)
    rule = mechanism_rule(mechanism, epsilon0, plan)
    if isinstance(rule, str):
        return None
    kind, report_epsilon0, size, _, blocks = rule
    return accounted(kind, report_epsilon0, size, blocks)


def _unamplified_claim(spec: RoundSpec, smallest: int) -> tuple[float | None, float | None, str]:
    """``(eps, delta, method)`` of a round :func:`round_guarantee` does not amplify."""
    params = spec.params
    if getattr(params, "LOCAL_GUARANTEE", True) is False:
        assert isinstance(params, (ModularSumParams, VectorSumParams))  # the summations: no local guarantee
        floor = params.min_reports
        if smallest < floor:
            return None, None, (
                f"none: a batch of {smallest} reports holds fewer than the {params.users} users' shares "
                f"({floor} reports) the summation's noise and split are calibrated to"
            )
        return spec.epsilon0, spec.delta0, "summation: the signed central (eps0, delta0), checked by protocol/mechanisms/summation_params.py"
    return spec.epsilon0, spec.delta0, (
        "local: (eps0, delta0)-LDP Gaussian reports, (eps0, delta0)-DP after shuffling by post-processing; "
        "no amplification is claimed"
    )


def _violations(spec: RoundSpec, sizes: tuple[int, ...]) -> list[str]:
    found = []
    for size in sizes:
        if size < spec.min_batch:
            found.append(f"a batch of {size} reports, below the signed min_batch {spec.min_batch} the claim was made for")
        if size > spec.max_batch:
            found.append(f"a batch of {size} reports, above the signed max_batch {spec.max_batch}")
    if len(sizes) > spec.shuffler_instances:
        found.append(f"{len(sizes)} batches from a round of {spec.shuffler_instances} shuffler instance(s)")
    return found


def _lower_bound(spec: RoundSpec, users: int, claim: float | None, method: str, delta: float,
                 lower_rounds: int | None, seed: int) -> tuple[dict[str, Any] | None, str | None]:
    """``(audit row, None)`` or ``(None, why there is no lower bound)``."""
    from shuffledp.audit.shuffled import audit_shuffled

    if not isinstance(spec.params, HadamardRangeParams):
        return None, f"no lower-bound audit for {spec.mechanism} (audited: hadamard-range, binary-rr)"
    if lower_rounds is None:
        return None, "lower bounds not run"
    if claim is None:
        return None, "no claim to audit"
    if spec.params.num_bins < 2:
        return None, "one bin: the report does not depend on the input"
    if users < 2:
        return None, f"{users} user(s) in the smallest batch: nothing to shuffle among"
    round_seed = int(np.random.SeedSequence([seed, spec.round_id]).generate_state(1)[0])
    audit = audit_shuffled("hadamard-range", users, spec.epsilon0, delta, rounds=lower_rounds,
                           num_bins=spec.params.padded_bins, seed=round_seed, claim=(claim, method, None))
    return audit.as_dict(), None


def claim_report(
    session: Session,
    analyzer_signing_key: bytes,
    delta: float = 1e-6,
    lower_rounds: int | None = DEFAULT_LOWER_ROUNDS,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    session_id: bytes | None = None,
) -> dict[str, Any]:
    """Every round's local and central guarantee, the session's, and the lower bounds (module docstring).

    ``session`` is verified here under ``analyzer_signing_key`` (and ``session_id`` if
    given) whatever :func:`load_session` did. ``delta`` is the central delta of each
    round's bound and of the session's shuffled rounds; ``lower_rounds`` the shuffled
    rounds sampled per side for each lower bound (None: no lower bounds). Returns
    ``{"rounds": [...], "session": {...}, "passed": bool, ...}``; each round row has
    ``round_id, mechanism, epsilon0, delta0, messages_per_user, min_batch, batch_sizes,
    smallest_batch, users, local_guarantee, central_epsilon, central_delta, method,
    lower_bound, lower_over_claim, lower_bound_note, lower_bound_audit (the audit_shuffled row), violations,
    passed``; ``session`` has ``epsilon, delta, method`` and the composition routes' epsilons.
    """
    from shuffledp.protocol.accounting import shuffled_round

    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    if lower_rounds is not None and (isinstance(lower_rounds, bool) or not isinstance(lower_rounds, int) or lower_rounds < 100):
        raise InvalidParameter("lower_rounds", f"must be an integer >= 100 or None, got {lower_rounds!r}")
    started = time.perf_counter()
    session = verify_session(session, analyzer_signing_key, session_id=session_id)
    rows: list[dict[str, Any]] = []
    amplified: list[tuple[Any, int]] = []
    for r in session.rounds:
        spec = r.spec
        assert spec is not None
        users = r.smallest_batch // spec.messages_per_user
        local = round_guarantee(spec)
        violations = _violations(spec, r.batch_sizes)
        if local is None:
            epsilon, round_delta, method = _unamplified_claim(spec, r.smallest_batch)
        elif users < 1:
            epsilon, round_delta, method = None, None, "none: no user's reports in the smallest batch"
        else:
            bound = shuffled_round(local, users, delta)
            epsilon, round_delta, method = bound.epsilon, bound.delta, bound.method
            amplified.append(_rule_group(spec, users))
        if epsilon is None and not violations:
            violations.append(method)
        audit, note = _lower_bound(spec, users, epsilon, method, delta, lower_rounds, seed)
        lower = audit["lower_bound"] if audit else None
        ratio = lower / epsilon if lower is not None and epsilon else None
        if lower is not None and epsilon is not None and lower > epsilon:
            violations.append(f"empirical lower bound {lower:.4g} exceeds the claimed central epsilon {epsilon:.4g}")
        rows.append({
            "round_id": spec.round_id,
            "mechanism": spec.mechanism,
            "epsilon0": spec.epsilon0,
            "delta0": spec.delta0,
            "messages_per_user": spec.messages_per_user,
            "min_batch": spec.min_batch,
            "batch_sizes": list(r.batch_sizes),
            "smallest_batch": r.smallest_batch,
            "users": users,
            "local_guarantee": local.mechanism if local is not None else None,
            "central_epsilon": epsilon,
            "central_delta": round_delta,
            "method": method,
            "lower_bound": lower,
            "lower_over_claim": ratio,
            "lower_bound_note": note if audit is None else audit["event"],
            "lower_bound_audit": audit,
            "violations": violations,
            "passed": not violations,
        })
        if progress:
            progress(f"claim round {spec.round_id}", 1)
    if progress:
        progress("session composition", 0)
    composed = _compose(rows, amplified, delta)
    analyzer_claim = _analyzer_claim(session.analyzer_central, composed, delta)
    violations = [f"round {row['round_id']}: {v}" for row in rows for v in row["violations"]]
    if analyzer_claim is not None and analyzer_claim["covers"] is False:
        violations.append(
            f"the analyzer published central epsilon {analyzer_claim['epsilon']:.6g}, below the accountant's "
            f"{analyzer_claim['recomputed_epsilon']:.6g} for the batches delivered"
        )
    return {
        "session_file": session.path,
        "session_id": session.rounds[0].spec.session_id.hex(),  # type: ignore[union-attr]
        "analyzer_signing_key": session.verified_with.hex(),  # type: ignore[union-attr]
        "delta": delta,
        "lower_rounds": lower_rounds,
        "seed": seed,
        "rounds": rows,
        "session": composed,
        "analyzer_claim": analyzer_claim,
        "violations": violations,
        "passed": not violations,
        "seconds": time.perf_counter() - started,
    }


def _compose(rows: list[dict[str, Any]], amplified: list[tuple[Any, int]], delta: float) -> dict[str, Any]:
    """The session's ``(epsilon, delta)``: shuffled rounds composed by the accountant, the rest by basic composition."""
    void = [row["round_id"] for row in rows if row["central_epsilon"] is None]
    if void:
        return {"epsilon": None, "delta": None, "method": f"none: round(s) {void} have no valid claim", "rounds": len(rows)}
    plain = [row for row in rows if row["local_guarantee"] is None]
    plain_eps = math.fsum(row["central_epsilon"] for row in plain)
    plain_delta = math.fsum(row["central_delta"] for row in plain)
    out: dict[str, Any] = {"rounds": len(rows), "amplified_rounds": len(amplified),
                           "unamplified_epsilon": plain_eps, "unamplified_delta": plain_delta}
    if not amplified:
        out.update(epsilon=plain_eps, delta=plain_delta, method="basic composition of the rounds' (eps0, delta0)")
        return out
    session_eps, basic = _amplified_composition(tuple(amplified), delta)
    out.update(
        epsilon=min(session_eps, basic) + plain_eps,
        delta=delta + plain_delta,
        method=("min(session composition, basic composition of per-round bounds at delta/k each)"
                + (" + basic composition of the unamplified rounds" if plain else "")),
        session_composition_epsilon=session_eps,
        basic_composition_epsilon=basic,
    )
    return out


def _rule_group(spec: RoundSpec, users: int) -> tuple:
    """The round as the one rule table accounts it: ``(accounted_as, epsilon0, size, 1, users, blocks, None)``."""
    from shuffledp.protocol.accounting.composition import mechanism_rule

    mechanism, plan = plan_params(spec.params)
    rule = mechanism_rule(mechanism, spec.epsilon0, plan)
    assert not isinstance(rule, str)  # called for amplified rounds only: a rule, not a reason
    kind, epsilon0, size, _, blocks = rule
    return (kind, epsilon0, size, 1, users, blocks, None)


def _amplified_composition(amplified: tuple[tuple, ...], delta: float) -> tuple[float, float]:
    """``(SessionAccountant epsilon, basic composition at delta/k each)`` of the shuffled rounds, by the one
    composition every session is accounted by (:func:`shuffledp.protocol.accounting.composition.shuffled_session`,
    kept in the accountant's cache)."""
    from shuffledp.protocol.accounting.composition import shuffled_session

    out = shuffled_session(list(amplified), 0, delta)
    if out.get("session_composition_epsilon") is None:
        raise InvalidParameter("session", out["method"])
    return out["session_composition_epsilon"], out["basic_composition_epsilon"]


def _analyzer_claim(central: dict[str, Any] | None, composed: dict[str, Any], delta: float) -> dict[str, Any] | None:
    """The analyzer's published claim (unsigned) against the recomputed one, where they are at the same delta."""
    if central is None or not _is_number(central.get("epsilon"), (int, float)) or composed["epsilon"] is None:
        return None
    comparable = central.get("delta") == delta and composed.get("unamplified_epsilon") == 0.0
    covers = central["epsilon"] >= composed["epsilon"] * (1 - 1e-9) - 1e-12 if comparable else None
    return {"epsilon": central["epsilon"], "delta": central.get("delta"), "accounted_at_n": central.get("accounted_at_n"),
            "recomputed_epsilon": composed["epsilon"], "comparable": comparable, "covers": covers}


# --------------------------------------------------------------------------- for humans


def _g(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def format_claim(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`claim_report`'s result."""
    from shuffledp.audit.power import power_note

    lines = [
        f"shuffledp audit (claim): {'PASSED' if report['passed'] else 'FAILED'}  session {report['session_id']}, "
        f"{report['session_file']}",
        f"  specs verified under analyzer key {report['analyzer_signing_key']}; central delta {report['delta']:.3g}",
        "",
        f"  {'round':>5} {'mechanism':<15} {'eps0':>7} {'delta0':>8} {'smallest':>9} {'users':>8} "
        f"{'central eps':>11} {'lower':>8} {'lower/claim':>11}  method / verdict",
    ]
    for row in report["rounds"]:
        method, _, why = row["method"].partition(": ")
        lines.append(
            f"  {row['round_id']:>5} {row['mechanism']:<15} {row['epsilon0']:>7.4g} {row['delta0']:>8.2g} "
            f"{row['smallest_batch']:>9,} {row['users']:>8,} {_g(row['central_epsilon']):>11} "
            f"{_g(row['lower_bound']):>8} {_g(row['lower_over_claim'], '.3f'):>11}  "
            f"{method}, {'ok' if row['passed'] else 'VIOLATED'}"
        )
        if why:
            lines.append(f"  {'':>5} {method}: {why}")
        if row["lower_bound"] is None:
            lines.append(f"  {'':>5} lower bound: {row['lower_bound_note']}")
        elif row.get("lower_bound_audit") and row["central_epsilon"] is not None:
            note = power_note(row["lower_bound_audit"], "rounds", row["central_epsilon"])
            if note is not None:  # a lower bound of 0 neither confirms nor refutes the claim
                lines.append(f"  {'':>5} lower bound: {note}")
        for v in row["violations"]:
            lines.append(f"  {'':>5} ! {v}")
    s = report["session"]
    lines.append("")
    if s["epsilon"] is None:
        lines.append(f"  session: {s['method']}")
    else:
        lines.append(f"  session: eps = {s['epsilon']:.4g}, delta = {s['delta']:.3g} over {s['rounds']} round(s)  ({s['method']})")
        if s.get("session_composition_epsilon") is not None:
            lines.append(f"           accountant composition {s['session_composition_epsilon']:.4g}, "
                         f"basic composition {s['basic_composition_epsilon']:.4g}")
    claim = report.get("analyzer_claim")
    if claim is not None:
        verdict = {True: "covers the recomputed one", False: "BELOW the recomputed one", None: "not comparable (another delta)"}[claim["covers"]]
        lines.append(f"  the analyzer published eps = {claim['epsilon']:.4g} at delta {_g(claim['delta'], '.3g')}: {verdict}")
    if report["violations"]:
        lines += ["", f"  {len(report['violations'])} violation(s):"] + [f"    {v}" for v in report["violations"]]
    lines.append(f"  {report['seconds']:.1f} s")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_LOWER_ROUNDS",
    "RecordedRound",
    "Session",
    "claim_report",
    "format_claim",
    "load_session",
    "plan_guarantee",
    "plan_params",
    "round_guarantee",
    "trusted_analyzer_key",
    "verify_session",
]
