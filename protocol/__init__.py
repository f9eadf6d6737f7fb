"""The contract all parties share: messages and wire codec, sealing and signing,
Hadamard math, exact noise samplers, channels, and (in ``accounting``) privacy
accounting.

Submodules are imported explicitly (``from shuffledp.protocol import codec``); this
package imports nothing eagerly, so a device loads only what it uses.
"""
