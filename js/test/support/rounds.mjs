// Test support (no tests here): parties' keys, signed round specs, messages signed as the
// shuffler signs them, and envelopes opened as the shuffler and the analyzer open them.
import { ed25519, x25519 } from "@noble/curves/ed25519.js";

import { decodeMessage, encodeMessage } from "../../dist/wire/messages.js";
import { envelopeInfo, specDigest } from "../../dist/wire/onion.js";
import { decodePadded } from "../../dist/wire/reportFormat.js";
import { openSealed, reportInfo } from "../../dist/wire/sealing.js";
import { signatureOffset, signEncodedAt, signSpecBytes } from "../../dist/wire/signing.js";
import { issueCredential } from "../../dist/wire/credentials.js";

export const hex = (bytes) => Buffer.from(bytes).toString("hex");
export const fromHex = (text) => Uint8Array.from(Buffer.from(text, "hex"));

/** A party's keys from a one-byte label: X25519 (sealing) and Ed25519 (signing), fixed for tests. */
export function partyKeys(label) {
  const hpkePrivate = new Uint8Array(32).fill(label);
  const signingSeed = new Uint8Array(32).fill(label ^ 0x5a);
  return {
    hpkePrivate,
    hpkePublic: x25519.getPublicKey(hpkePrivate),
    signingSeed,
    signingPublic: ed25519.getPublicKey(signingSeed),
  };
}

export const ANALYZER = partyKeys(0x11);
export const SHUFFLER = partyKeys(0x22);
export const OTHER = partyKeys(0x33);
export const SESSION = Uint8Array.from({ length: 16 }, (_, i) => i);
export const ISSUER_KEY = Uint8Array.from({ length: 32 }, (_, i) => 0xa0 + i);
export const credentialOf = (byte) => issueCredential(ISSUER_KEY, new Uint8Array(16).fill(byte));

/** A round spec of `params` (a hadamard-range round by default) with the test parties' keys. */
export function roundSpec(overrides = {}) {
  return {
    type: "round-spec",
    sessionId: SESSION,
    roundId: 0n,
    params: { mechanism: "hadamard-range", low: -20.0, high: 20.0, tau: 0.8 },
    epsilon0: 0.5,
    delta0: 0,
    analyzerKey: ANALYZER.hpkePublic,
    shufflerKey: SHUFFLER.hpkePublic,
    shufflerSigningKey: SHUFFLER.signingPublic,
    minBatch: 1000,
    deadline: 1_900_000_000.0,
    messagesPerUser: 1,
    maxBatch: 1 << 24,
    shufflerInstances: 1,
    ...overrides,
  };
}

/** The encoded signed-round-spec of `spec`, signed with `seed` (the analyzer's by default). */
export function signedSpec(spec, seed = ANALYZER.signingSeed) {
  const specBytes = encodeMessage(spec);
  return encodeMessage({ type: "signed-round-spec", specBytes, signature: signSpecBytes(seed, specBytes) });
}

/** The encoding of a signed message (its `signature` field ignored), signed with `seed`. */
export function signedMessage(message, seed = SHUFFLER.signingSeed) {
  const zeroed = encodeMessage({ ...message, signature: new Uint8Array(64) });
  const at = signatureOffset(zeroed, new Uint8Array(64));
  if (at === undefined) throw new Error("the signature field's head occurs twice in this test message");
  return signEncodedAt(seed, message.type, zeroed, at);
}

/** Opens an envelope as the shuffler (outer layer) and then the analyzer (inner layer). */
export async function openEnvelope(envelope, spec, { shuffler = SHUFFLER, analyzer = ANALYZER } = {}) {
  const digest = specDigest(encodeMessage(spec));
  const decoded = decodeMessage(envelope, "envelope");
  const admissionBytes = await openSealed(shuffler.hpkePrivate, envelopeInfo(spec.sessionId, spec.roundId, digest), decoded.outer);
  const admission = decodeMessage(admissionBytes, "admission");
  const plaintext = await openSealed(analyzer.hpkePrivate, reportInfo(spec.sessionId, spec.roundId, digest), admission.sealed);
  return { envelope: decoded, admission, values: decodePadded(spec.roundId, spec.params.mechanism, plaintext) };
}
