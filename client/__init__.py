"""Device-side code: the randomizers, the privacy ledger and the Client.

Importing this package loads only numpy, cbor2, cryptography and
``shuffledp.protocol``'s device-safe modules: no scipy, no MQTT, no analyzer.
"""

from shuffledp.client.client import Client, RoundExpired, verified_spec
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.client.range_randomizer import randomize_range

__all__ = ["Client", "PrivacyLedger", "RoundExpired", "randomize_mean", "randomize_range", "verified_spec"]
