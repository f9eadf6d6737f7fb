"""The contract all parties share, in four subpackages:

* ``wire``: the messages, their strict deterministic CBOR encoding, padding, HPKE
  sealing, onion envelopes, signatures and admission credentials;
* ``transport``: the channel interface, the in-process channel and the MQTT channel;
* ``mechanisms``: randomness, Hadamard transforms, rotations, exact noise samplers and
  the parameter choices of every mechanism;
* ``accounting``: privacy accounting, local and shuffled, per round and per session.

``errors`` (the typed errors every party raises) and ``held_files`` sit beside them.
Submodules are imported explicitly (``from shuffledp.protocol.wire import codec``); no
package imports anything eagerly, so a device loads only what it uses.
"""
