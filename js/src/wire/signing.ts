/**
 * The signing rule of the wire format (`docs/wire-format.md`, "Signing"), mirroring the signing
 * half of `protocol/wire/onion.py` and `protocol/wire/sealing.py::verify`.
 *
 * Every signed message carries a 64-byte `signature` field; the signature is Ed25519 (RFC 8032)
 * over
 *
 *     "shuffledp/v3/signed/" || t || SHA-256(encoding with the signature field zeroed)
 *
 * with `t` the message's type tag. The field's head (`69 "signature" 58 40`) and its position
 * do not depend on its value, so the zeroed encoding is the received bytes with those 64 bytes
 * read as zeros where they lie: a verifier hashes what it received, once, without re-encoding.
 * A round spec is signed by the same rule over its encoding as it is (`t` = `"round-spec"`,
 * nothing zeroed: the signature travels beside it, in the signed-round-spec).
 *
 * Verification is strict RFC 8032 (`zip215: false` in @noble/curves): non-canonical encodings
 * of points and scalars are refused, as the Python parties' OpenSSL refuses them. Before that, a
 * key that is a small-order point or a non-canonical encoding is refused by the rule of
 * `protocol/wire/ed25519_keys.py` ({@link weakEd25519Key}), as `protocol/wire/sealing.py::verify`
 * refuses it: strict verification refuses signatures under such keys too, and both checks stay.
 */

import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { concatBytes, utf8ToBytes } from "@noble/hashes/utils.js";

import { weakEd25519Key } from "./ed25519Keys.js";
import { BadSignature, InvalidParameter } from "./errors.js";
import { ED25519_KEY_BYTES, SIGNATURE_BYTES } from "./messages.js";

/** Prefix of every signed string. */
export const SIGNED_LABEL: Uint8Array = utf8ToBytes("shuffledp/v3/signed/");

/** The signature field in a deterministic encoding: the key "signature", then a 64-byte string's head. */
const SIGNATURE_FIELD = concatBytes(Uint8Array.of(0x69), utf8ToBytes("signature"), Uint8Array.of(0x58, 0x40));

/** `"shuffledp/v3/signed/" || t || digest`: what a signature on a message of type `t` covers. */
export function signingString(type: string, digest: Uint8Array): Uint8Array {
  return concatBytes(SIGNED_LABEL, utf8ToBytes(type), digest);
}

/** What the analyzer's signature on an encoded round spec covers: the rule above with `t` = `"round-spec"`. */
export function specSigningString(specBytes: Uint8Array): Uint8Array {
  return signingString("round-spec", sha256(specBytes));
}

/**
 * Throws {@link BadSignature} (naming `what` was signed) unless `signature` is `publicKey`'s
 * Ed25519 signature of `data`, verified strictly (RFC 8032; no ZIP-215 leniency). A `publicKey`
 * under which anyone could sign (a small-order point or a non-canonical encoding:
 * {@link weakEd25519Key}) is refused before the signature is looked at.
 */
export function verifyEd25519(publicKey: Uint8Array, data: Uint8Array, signature: Uint8Array, what: string): void {
  const problem =
    publicKey instanceof Uint8Array && publicKey.length === ED25519_KEY_BYTES ? weakEd25519Key(publicKey) : undefined;
  if (problem !== undefined) {
    throw new BadSignature(`${what} signature refused: the signing key is ${problem}`);
  }
  let valid = false;
  try {
    valid =
      publicKey instanceof Uint8Array &&
      publicKey.length === ED25519_KEY_BYTES &&
      signature instanceof Uint8Array &&
      signature.length === SIGNATURE_BYTES &&
      ed25519.verify(signature, data, publicKey, { zip215: false });
  } catch {
    valid = false; // a key or signature that does not decode verifies nothing
  }
  if (!valid) {
    throw new BadSignature(`${what} signature does not verify`);
  }
}

function indexOf(data: Uint8Array, pattern: Uint8Array, from: number): number {
  const first = pattern[0];
  const last = data.length - pattern.length;
  outer: for (let i = data.indexOf(first as number, from); i !== -1 && i <= last; i = data.indexOf(first as number, i + 1)) {
    for (let j = 1; j < pattern.length; j++) {
      if (data[i + j] !== pattern[j]) {
        continue outer;
      }
    }
    return i;
  }
  return -1;
}

/**
 * Where the 64 signature bytes lie in `encoded`, a signed message's encoding: just after the
 * signature field's head, if that head occurs exactly once and `signature` follows it; else
 * undefined (another field holds the same bytes, and the caller must re-encode the message).
 */
export function signatureOffset(encoded: Uint8Array, signature: Uint8Array): number | undefined {
  const at = indexOf(encoded, SIGNATURE_FIELD, 0);
  if (at < 0 || indexOf(encoded, SIGNATURE_FIELD, at + 1) >= 0) {
    return undefined;
  }
  const start = at + SIGNATURE_FIELD.length;
  if (start + SIGNATURE_BYTES > encoded.length) {
    return undefined;
  }
  for (let i = 0; i < SIGNATURE_BYTES; i++) {
    if (encoded[start + i] !== signature[i]) {
      return undefined;
    }
  }
  return start;
}

/** SHA-256 of `encoded` with the 64 bytes at `at` read as zeros (hashed in place, nothing copied). */
export function zeroedDigest(encoded: Uint8Array, at: number): Uint8Array {
  if (!Number.isSafeInteger(at) || at < 0 || at + SIGNATURE_BYTES > encoded.length) {
    throw new InvalidParameter("at", "the signature must lie inside the encoding");
  }
  return sha256
    .create()
    .update(encoded.subarray(0, at))
    .update(new Uint8Array(SIGNATURE_BYTES))
    .update(encoded.subarray(at + SIGNATURE_BYTES))
    .digest();
}

/**
 * Throws {@link BadSignature} unless `signature` is `publicKey`'s signature of a message of type
 * `type` whose zeroed encoding hashes to `digest`.
 */
export function verifyDigest(publicKey: Uint8Array, type: string, digest: Uint8Array, signature: Uint8Array): void {
  verifyEd25519(publicKey, signingString(type, digest), signature, type);
}

/**
 * An encoding with its zeroed signature field (at `at`) filled with `privateSeed`'s signature:
 * how the shuffler and the analyzer sign. The device signs nothing; tests and tools playing
 * those parties do.
 */
export function signEncodedAt(privateSeed: Uint8Array, type: string, zeroed: Uint8Array, at: number): Uint8Array {
  const signature = ed25519.sign(signingString(type, zeroedDigest(zeroed, at)), privateSeed);
  const out = zeroed.slice();
  out.set(signature, at);
  return out;
}

/** The analyzer's signature on an encoded round spec (tests and tools; see {@link specSigningString}). */
export function signSpecBytes(privateSeed: Uint8Array, specBytes: Uint8Array): Uint8Array {
  return ed25519.sign(specSigningString(specBytes), privateSeed);
}
