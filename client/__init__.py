"""Device-side code: the randomizers, the privacy ledger and the Client.

Importing this package loads only numpy, cbor2, cryptography and
``shuffledp.protocol``'s device-safe modules: no scipy, no MQTT, no analyzer.
"""

from shuffledp.client.client import Client, RoundExpired, verified_spec
from shuffledp.client.hadamard_response import (
    HadamardResponseParams,
    choose_hadamard_response,
    randomize_hadamard_response,
)
from shuffledp.client.krr import randomize_krr
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.client.range_randomizer import randomize_range

from shuffledp.client.vector_randomizer import randomize_vector_mean, randomize_vector_range

__all__ = [
    "Client",
    "HadamardResponseParams",
    "PrivacyLedger",
    "RoundExpired",
    "choose_hadamard_response",
    "randomize_hadamard_response",
    "randomize_krr",
    "randomize_mean",
    "randomize_range",
    "randomize_vector_mean",
    "randomize_vector_range",
    "verified_spec",
]
