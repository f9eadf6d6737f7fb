"""Test support: one session's parties and helpers to build their messages.

The keys are generated once per test process (real X25519/Ed25519 keys, real HPKE);
tests that need a second, foreign party create their own :class:`Deployment`.
"""

from __future__ import annotations

import dataclasses

from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.wire.onion import wrap

SESSION = bytes(range(16))
OTHER_SESSION = bytes(16)
DEPLOYMENT = Deployment(session_id=SESSION)
ANALYZER_KEYS = DEPLOYMENT.analyzer_keys
SHUFFLER_KEYS = DEPLOYMENT.shuffler_keys
ISSUER = DEPLOYMENT.issuer
PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)


def make_spec(
    params=PARAMS,
    *,
    round_id: int = 3,
    min_batch: int = 3,
    max_batch: int | None = None,
    messages_per_user: int = 1,
    epsilon0: float = 0.5,
    delta0: float = 0.0,
    deadline: float = 1e12,
    deployment: Deployment = DEPLOYMENT,
) -> RoundSpec:
    """A spec of ``deployment``'s session naming its analyzer and shuffler keys.

    A quota (``messages_per_user``) above 1 with the default parameters takes a
    mechanism that sends that many reports per user (:func:`quota_params`): a spec's
    quota is exactly what its parameters make a user send."""
    if params is PARAMS and messages_per_user > 1:
        params = quota_params(messages_per_user)
    extra = {} if max_batch is None else {"max_batch": max_batch}
    return RoundSpec(
        session_id=deployment.session_id,
        round_id=round_id,
        params=params,
        epsilon0=epsilon0,
        delta0=delta0,
        analyzer_key=deployment.analyzer_keys.hpke_public,
        shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public,
        min_batch=min_batch,
        deadline=deadline,
        messages_per_user=messages_per_user,
        **extra,
    )


def quota_params(quota: int):
    """Parameters whose users send ``quota`` reports each (a power of two): the vector range round in
    paper mode over ``quota`` coordinates."""
    from shuffledp.protocol.wire.messages import VectorRangeParams

    if quota & (quota - 1):
        raise ValueError(f"quota {quota} is not a power of two")
    return VectorRangeParams(-4.0, 4.0, 0.5, quota, 1, "paper")


def credential(i: int, issuer=ISSUER) -> bytes:
    """The credential of enrolled client number ``i`` (deterministic id, real HMAC tag)."""
    return issuer.issue(i.to_bytes(16, "big"))


def nonce(i: int) -> bytes:
    return i.to_bytes(16, "big")


def envelope(spec: RoundSpec, cred: bytes, sealed: bytes, nonce_: bytes | None = None, **header) -> bytes:
    """An encoded envelope of ``spec``'s round; ``header`` overrides ``session_id`` / ``round_id``
    (the outer layer is then bound to those, as a client of that round would seal it)."""
    target = dataclasses.replace(spec, **header) if header else spec
    return wrap(target, cred, sealed, nonce_)[0]


class Recording:
    """Wraps a protocol (``analyzer/protocols.py``) and keeps every round's reports, sorted (a
    multiset: what two engines must agree on whatever the shuffler's permutation)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.data_rank = inner.data_rank
        self.seen: list = []

    @property
    def budget(self):
        return self.inner.budget

    def rounds(self):
        import numpy as np

        rounds = self.inner.rounds()
        plan = next(rounds)
        while True:
            values = yield plan
            self.seen.append(values[np.lexsort(values.T[::-1])])
            try:
                plan = rounds.send(values)
            except StopIteration as done:
                return done.value
