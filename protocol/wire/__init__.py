"""Wire format and sealing: messages, their strict CBOR encoding, padding, HPKE sealing, onion envelopes, signatures and credentials."""
