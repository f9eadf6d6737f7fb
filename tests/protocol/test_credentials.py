"""Admission credentials: the tag is HMAC-SHA256 of the label and the client id, and the instance
assignment is the documented hash, with one instance admitting everyone."""

import hashlib
import hmac

import pytest
from hypothesis import given, settings, strategies as st

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.credentials import (
    CLIENT_ID_BYTES,
    BadCredential,
    CredentialIssuer,
    assigned_instance,
)

KEY = bytes(range(32))
ids = st.binary(min_size=CLIENT_ID_BYTES, max_size=CLIENT_ID_BYTES)


@settings(max_examples=200, derandomize=True)
@given(ids)
def test_the_tag_is_hmac_sha256_of_the_label_and_the_id(client_id):
    credential = CredentialIssuer(KEY).issue(client_id)
    assert credential == client_id + hmac.digest(KEY, b"shuffledp/v2/credential" + client_id, "sha256")


@settings(max_examples=100, derandomize=True)
@given(ids, st.integers(0, 47), st.integers(1, 255))
def test_every_changed_byte_of_a_credential_is_refused(client_id, position, flip):
    issuer = CredentialIssuer(KEY)
    credential = bytearray(issuer.issue(client_id))
    assert issuer.verify(bytes(credential)) == client_id
    credential[position] ^= flip
    with pytest.raises(BadCredential):
        issuer.verify(bytes(credential))


def test_tags_issued_one_after_another_do_not_share_state():
    issuer = CredentialIssuer(KEY)
    first = issuer.issue(bytes(16))
    issuer.issue(b"\xff" * 16)
    assert issuer.issue(bytes(16)) == first


@settings(max_examples=200, derandomize=True)
@given(ids, st.integers(2, 9), st.binary(min_size=32, max_size=32))
def test_the_instance_is_the_documented_hash_modulo_the_count(client_id, instances, digest):
    expected = int.from_bytes(hashlib.sha256(b"shuffledp/v3/instance" + digest + client_id).digest()[:8], "big") % instances
    assert assigned_instance(client_id, instances, digest) == expected


@settings(max_examples=50, derandomize=True)
@given(ids, st.binary(min_size=32, max_size=32))
def test_one_instance_admits_every_client(client_id, digest):
    assert assigned_instance(client_id, 1, digest) == 0


@pytest.mark.parametrize("instances", [0, -1, 1.0, "2"])
def test_an_instance_count_that_is_not_a_positive_integer_is_refused(instances):
    with pytest.raises(InvalidParameter):
        assigned_instance(bytes(16), instances, bytes(32))
