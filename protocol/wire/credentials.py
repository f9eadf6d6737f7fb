"""Admission credentials: what a client shows the shuffler, and cannot mint itself.

A credential is ``client_id (16 bytes) || tag (32 bytes)`` with
``tag = HMAC-SHA256(issuer_key, "shuffledp/v2/credential" || client_id)``. The
enrollment service (run by the shuffler's operator) holds ``issuer_key`` and hands
each enrolled device one credential; the shuffler holds the same key and checks the
tag in constant time. A client without the key cannot produce a valid tag for any
id (HMAC is a PRF: forging one is as hard as breaking HMAC-SHA256), so the shuffler's
per-round quota is a quota per *enrolled device*, and a Sybil needs as many
enrollments as identities.

Who sees a credential: only the shuffler, because it travels inside the envelope's
outer layer, which is sealed to the shuffler (``protocol/wire/onion.py``). The broker and
the network see ciphertext; the analyzer never sees it. The shuffler can link one
device's envelopes across rounds by ``client_id``; it is trusted for admission and
never sees a report value. See the threat model in ``docs/threat-model.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

CLIENT_ID_BYTES = 16
TAG_BYTES = 32
CREDENTIAL_BYTES = CLIENT_ID_BYTES + TAG_BYTES
ISSUER_KEY_BYTES = 32
_LABEL = b"shuffledp/v2/credential"


class BadCredential(ShuffleDPError):
    """A credential whose tag does not verify, or of a revoked client."""

    reason = "bad-credential"


class CredentialIssuer:
    """Issues and verifies credentials under one secret key (held by enrollment and the shuffler)."""

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != ISSUER_KEY_BYTES:
            raise InvalidParameter("key", f"must be {ISSUER_KEY_BYTES} bytes")
        self._key = key
        # HMAC's keyed state with the label absorbed, computed once; each tag copies it (RFC 2104's
        # inner and outer hashes keyed once instead of per credential: the same tag, in half the time).
        self._keyed = hmac.new(key, _LABEL, "sha256")

    @classmethod
    def generate(cls) -> "CredentialIssuer":
        return cls(os.urandom(ISSUER_KEY_BYTES))

    @property
    def key(self) -> bytes:
        return self._key

    def _tag(self, client_id: bytes) -> bytes:
        """``HMAC-SHA256(key, label || client_id)``."""
        mac = self._keyed.copy()
        mac.update(client_id)
        return mac.digest()

    def issue(self, client_id: bytes | None = None) -> bytes:
        """A credential for ``client_id`` (a fresh random id if None)."""
        client_id = os.urandom(CLIENT_ID_BYTES) if client_id is None else client_id
        if not isinstance(client_id, bytes) or len(client_id) != CLIENT_ID_BYTES:
            raise InvalidParameter("client_id", f"must be {CLIENT_ID_BYTES} bytes")
        return client_id + self._tag(client_id)

    def issue_many(self, count: int) -> list[bytes]:
        """``count`` credentials for fresh random ids (as many :meth:`issue` calls; one read of the OS
        CSPRNG for all the ids)."""
        if not isinstance(count, int) or count < 0:
            raise InvalidParameter("count", f"must be a non-negative integer, got {count!r}")
        ids = os.urandom(CLIENT_ID_BYTES * count)
        tag = self._tag
        return [client_id + tag(client_id) for client_id in
                (ids[i : i + CLIENT_ID_BYTES] for i in range(0, len(ids), CLIENT_ID_BYTES))]

    def verify(self, credential: bytes, revoked: frozenset[bytes] | set[bytes] = frozenset()) -> bytes:
        """The credential's client id, or :class:`BadCredential` (constant-time tag check)."""
        if not isinstance(credential, bytes) or len(credential) != CREDENTIAL_BYTES:
            raise BadCredential(f"a credential is {CREDENTIAL_BYTES} bytes")
        client_id, tag = credential[:CLIENT_ID_BYTES], credential[CLIENT_ID_BYTES:]
        if not hmac.compare_digest(tag, self._tag(client_id)):
            raise BadCredential("credential tag does not verify")
        if client_id in revoked:
            raise BadCredential("credential revoked")
        return client_id


def assigned_instance(client_id: bytes, instances: int, spec_digest: bytes) -> int:
    """The shuffler instance (0 .. instances - 1) that admits ``client_id``'s envelopes in the
    round whose spec has ``spec_digest``.

    A fixed function of the client id within a round (SHA-256 of a label, the spec digest
    and the client id; first 8 bytes, modulo the count), so a client always goes to the
    same instance of a round and each instance enforces the per-credential quota alone:
    the quota holds for the round as a whole without the instances sharing any state.
    Spread is uniform up to 2**-64. The spec digest makes the assignment fresh in every
    round: the instance index is visible on the wire (the reports topic), and an index
    fixed per client would be a pseudonym the broker could link across rounds and
    sessions (with several instance counts, by the Chinese remainder theorem).
    """
    if not isinstance(instances, int) or instances < 1:
        raise InvalidParameter("instances", f"must be a positive integer, got {instances!r}")
    if instances == 1:
        return 0  # the one instance admits every client (any hash modulo 1)
    digest = hashlib.sha256(b"shuffledp/v3/instance" + spec_digest + client_id).digest()
    return int.from_bytes(digest[:8], "big") % instances
