/**
 * Onion envelopes, the spec digest, verified specs and verified shuffler messages, mirroring
 * `protocol/wire/onion.py` (and `protocol/wire/envelope_packing.py` for packed envelopes).
 *
 * An envelope has two layers: the inner one is the padded report sealed to the analyzer
 * (`wire/sealing.ts`); the outer one seals an admission (the device's credential, a fresh
 * nonce and the inner layer) to the shuffler with HPKE in the same suite, under
 * `info = "shuffledp/v3/envelope" || session || round || spec digest`. The broker and the
 * network see only the session, the round and a ciphertext of the round's one length.
 *
 * Every party binds a round to the digest of the exact spec bytes the analyzer signed,
 * `SHA-256("shuffledp/v3/spec" || spec_bytes)`, computed here over the bytes as received.
 */

import { sha256 } from "@noble/hashes/sha2.js";
import { concatBytes, utf8ToBytes } from "@noble/hashes/utils.js";

import { InvalidParameter, MalformedMessage, MessageTooLarge, WrongSize } from "./errors.js";
import {
  CREDENTIAL_BYTES,
  NONCE_BYTES,
  SESSION_ID_BYTES,
  SIGNATURE_BYTES,
  decodeMessage,
  decodeRoundSpec,
  encodeMessage,
  type Mechanism,
  type MessageOf,
  type RoundSpec,
} from "./messages.js";
import { HPKE_OVERHEAD, sealedSize } from "./reportFormat.js";
import { RoundSealer, roundBinding } from "./sealing.js";
import { signatureOffset, specSigningString, verifyDigest, verifyEd25519, zeroedDigest } from "./signing.js";

/** Label of the spec digest. */
export const SPEC_DIGEST_LABEL: Uint8Array = utf8ToBytes("shuffledp/v3/spec");
/** Label of the outer layer's HPKE `info`. */
export const ENVELOPE_INFO_LABEL: Uint8Array = utf8ToBytes("shuffledp/v3/envelope");
/** Most envelopes one transport message may carry. */
export const MAX_ENVELOPES_PER_MESSAGE = 64;

/** `SHA-256("shuffledp/v3/spec" || spec_bytes)`: the digest naming one exact encoded spec. */
export function specDigest(specBytes: Uint8Array): Uint8Array {
  return sha256(concatBytes(SPEC_DIGEST_LABEL, specBytes));
}

/** HPKE `info` of the outer layer: `"shuffledp/v3/envelope" || session || round (8 bytes BE) || spec digest`. */
export function envelopeInfo(sessionId: Uint8Array, roundId: bigint, digest: Uint8Array): Uint8Array {
  return concatBytes(ENVELOPE_INFO_LABEL, roundBinding(sessionId, roundId, digest));
}

/** A round spec whose analyzer signature verified, with the bytes it was verified over. */
export interface VerifiedSpec {
  spec: RoundSpec;
  /** The spec's encoding exactly as received (and signed). */
  specBytes: Uint8Array;
  /** {@link specDigest} of {@link specBytes}. */
  digest: Uint8Array;
}

/**
 * The round spec inside an encoded signed-round-spec, if the analyzer's Ed25519 signature over
 * the spec bytes as received verifies under `analyzerSigningKey`; a typed error otherwise
 * ({@link MalformedMessage}, {@link BadSignature}, ...). The signature is checked before the
 * spec is decoded, and a spec not in its one canonical encoding (an integer where a float
 * belongs) is refused, as the reference's `verified_spec` refuses it: every party must derive
 * the same digest from it.
 */
export function verifiedSpec(signedSpec: Uint8Array, analyzerSigningKey: Uint8Array): VerifiedSpec {
  const signed = decodeMessage(signedSpec, "signed-round-spec");
  const specBytes = signed.specBytes.slice();
  verifyEd25519(analyzerSigningKey, specSigningString(specBytes), signed.signature, "round spec");
  const spec = decodeRoundSpec(specBytes);
  if (!sameBytes(encodeMessage(spec), specBytes)) {
    throw new MalformedMessage("the signed spec is not in its canonical encoding (a float field written as an integer)");
  }
  return { spec, specBytes, digest: specDigest(specBytes) };
}

/** The fixed sizes of one round's envelopes: every field has one length per round. */
export interface EnvelopeFormat {
  /** Every sealed report of the round (padded report + 48). */
  sealedSize: number;
  /** The encoded admission (round id, 48-byte credential, 16-byte nonce, sealed report). */
  admissionSize: number;
  /** The outer layer: the admission + 48. */
  outerSize: number;
  /** The encoded envelope. */
  size: number;
}

const formats = new Map<string, EnvelopeFormat>();

/** The fixed sizes of the envelopes of round `roundId` of `mechanism` (computed once, then cached). */
export function envelopeFormat(roundId: bigint, mechanism: Mechanism): EnvelopeFormat {
  const key = `${mechanism}/${roundId}`;
  let format = formats.get(key);
  if (format === undefined) {
    const sealed = sealedSize(roundId, mechanism);
    const admissionSize = encodeMessage({
      type: "admission",
      roundId,
      credential: new Uint8Array(CREDENTIAL_BYTES),
      nonce: new Uint8Array(NONCE_BYTES),
      sealed: new Uint8Array(sealed),
    }).length;
    const outerSize = admissionSize + HPKE_OVERHEAD;
    const size = encodeMessage({
      type: "envelope",
      sessionId: new Uint8Array(SESSION_ID_BYTES),
      roundId,
      outer: new Uint8Array(outerSize),
    }).length;
    format = { sealedSize: sealed, admissionSize, outerSize, size };
    if (formats.size >= 64) {
      formats.clear();
    }
    formats.set(key, format);
  }
  return format;
}

/** An encoded envelope and the nonce inside it. */
export interface WrappedEnvelope {
  envelope: Uint8Array;
  nonce: Uint8Array;
}

function freshNonce(): Uint8Array {
  const nonce = new Uint8Array(NONCE_BYTES);
  globalThis.crypto.getRandomValues(nonce);
  return nonce;
}

/**
 * Wraps sealed reports of one round into envelopes: the shuffler's key parsed once, the outer
 * layer's `info` computed once; every {@link EnvelopeWrapper.wrap} is a fresh HPKE encapsulation
 * with a fresh nonce (16 bytes of `crypto.getRandomValues`) unless one is given.
 */
export class EnvelopeWrapper {
  readonly format: EnvelopeFormat;

  private constructor(
    readonly spec: RoundSpec,
    private readonly sealer: RoundSealer,
  ) {
    this.format = envelopeFormat(spec.roundId, spec.params.mechanism);
  }

  /** A wrapper of the round of `spec`, bound to the spec's `digest`; {@link SealingError} for an unusable shuffler key. */
  static async create(spec: RoundSpec, digest: Uint8Array): Promise<EnvelopeWrapper> {
    const info = envelopeInfo(spec.sessionId, spec.roundId, digest);
    return new EnvelopeWrapper(spec, await RoundSealer.create(spec.shufflerKey, info, "shuffler"));
  }

  /** The encoded envelope carrying `sealed` under `credential`, and its nonce. */
  async wrap(credential: Uint8Array, sealed: Uint8Array, nonce: Uint8Array = freshNonce()): Promise<WrappedEnvelope> {
    const { format, spec } = this;
    if (!(credential instanceof Uint8Array) || credential.length !== CREDENTIAL_BYTES) {
      throw new InvalidParameter("credential", `must be ${CREDENTIAL_BYTES} bytes`);
    }
    if (!(nonce instanceof Uint8Array) || nonce.length !== NONCE_BYTES) {
      throw new InvalidParameter("nonce", `must be ${NONCE_BYTES} bytes`);
    }
    if (!(sealed instanceof Uint8Array) || sealed.length !== format.sealedSize) {
      throw new WrongSize(`a sealed report of this round is ${format.sealedSize} bytes, got ${sealed?.length}`);
    }
    const admission = encodeMessage({ type: "admission", roundId: spec.roundId, credential, nonce, sealed });
    const outer = await this.sealer.seal(admission);
    const envelope = encodeMessage({ type: "envelope", sessionId: spec.sessionId, roundId: spec.roundId, outer });
    if (admission.length !== format.admissionSize || envelope.length !== format.size) {
      // The fixed-size rule: every field has one length per round, so this cannot happen.
      throw new WrongSize(`envelope of ${envelope.length} bytes; this round's are ${format.size}`);
    }
    return { envelope, nonce: nonce.slice() };
  }
}

/** The types signed by a party: their signature covers the rule of `wire/signing.ts`. */
export type SignedType = "shuffled-batch" | "batch-ack" | "admission-receipts" | "round-outcome";

/**
 * Decodes a signed message of type `type` and checks its signature under `publicKey`, or throws a
 * typed error. The digest is computed over `data` as received with its 64 signature bytes read
 * as zeros where they lie; where the field's position is not plain (its head occurs twice), over
 * the re-encoding with the signature zeroed (the same bytes for the one deterministic encoding).
 */
export function decodeVerified<T extends SignedType>(data: Uint8Array, type: T, publicKey: Uint8Array): MessageOf<T> {
  const message = decodeMessage(data, type);
  const signature = (message as { signature: Uint8Array }).signature;
  const at = signatureOffset(data, signature);
  const digest =
    at !== undefined
      ? zeroedDigest(data, at)
      : sha256(encodeMessage({ ...message, signature: new Uint8Array(SIGNATURE_BYTES) } as MessageOf<T>));
  verifyDigest(publicKey, type, digest, signature);
  return message;
}

/**
 * `envelopes`, `perMessage` to a transport message (the last may hold fewer), each message their
 * concatenation with no header: a message of `k E` bytes is `k` envelopes of one round's size `E`.
 */
export function packEnvelopes(envelopes: readonly Uint8Array[], perMessage: number): Uint8Array[] {
  if (!Number.isSafeInteger(perMessage) || perMessage < 1 || perMessage > MAX_ENVELOPES_PER_MESSAGE) {
    throw new InvalidParameter("per_message", `must be in [1, ${MAX_ENVELOPES_PER_MESSAGE}], got ${String(perMessage)}`);
  }
  const size = envelopes[0]?.length;
  const out: Uint8Array[] = [];
  for (let i = 0; i < envelopes.length; i += perMessage) {
    const group = envelopes.slice(i, i + perMessage);
    for (const envelope of group) {
      if (envelope.length !== size) {
        throw new InvalidParameter("envelopes", `one round's envelopes have one size: got ${envelope.length} B after ${size} B`);
      }
    }
    out.push(concatBytes(...group));
  }
  return out;
}

/** How many envelopes of `envelopeSize` bytes fit one message of at most `payloadLimit` bytes (at most 64). */
export function envelopesPerMessage(envelopeSize: number, payloadLimit: number): number {
  if (!(envelopeSize >= 1) || !(payloadLimit >= envelopeSize)) {
    throw new InvalidParameter("payload_limit", `${payloadLimit} B cannot carry one envelope of ${envelopeSize} B`);
  }
  return Math.min(MAX_ENVELOPES_PER_MESSAGE, Math.floor(payloadLimit / envelopeSize));
}

/**
 * A transport message split as the shuffler splits it: `k` envelopes if it is `k E` bytes with
 * `2 <= k <= 64`, {@link MessageTooLarge} for more than 64, and the message whole otherwise
 * (one envelope, judged by whoever opens it).
 */
export function unpackEnvelopes(payload: Uint8Array, envelopeSize: number): Uint8Array[] {
  const length = payload.length;
  if (length > envelopeSize && length % envelopeSize === 0) {
    const count = length / envelopeSize;
    if (count > MAX_ENVELOPES_PER_MESSAGE) {
      throw new MessageTooLarge(`${count} envelopes in one message, over ${MAX_ENVELOPES_PER_MESSAGE}`);
    }
    const out: Uint8Array[] = [];
    for (let at = 0; at < length; at += envelopeSize) {
      out.push(payload.slice(at, at + envelopeSize));
    }
    return out;
  }
  return [payload];
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) {
    return false;
  }
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      return false;
    }
  }
  return true;
}
