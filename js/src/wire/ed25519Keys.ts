/**
 * Ed25519 public keys under which anyone could sign, refused wherever a key is taken; mirrors
 * `protocol/wire/ed25519_keys.py`.
 *
 * Verification checks `[s]B = R + [k]A` with `k = SHA-512(R || A || M)`. If the key `A` is a
 * point of small order (its order divides the cofactor 8), `[k]A` is one of at most 8 points
 * whatever the message, so `s = 0` and `R = -[k]A` sign any message with no secret. A verifier
 * that checks that equation as it stands (OpenSSL, under the Python parties) accepts such
 * signatures, also under a non-canonical encoding of the key. Strict RFC 8032 verification
 * (`@noble/curves` with `zip215: false`) refuses them too; the software refuses these keys
 * itself as well, by the same rule as the Python parties:
 *
 * - a **non-canonical encoding**: `y >= p` (the 255-bit y field not reduced mod `p = 2^255 - 19`);
 * - a **small-order point**: `y` is one of the five y-coordinates of the 8 points of order
 *   dividing 8 (`1` the neutral point, `p - 1` order 2, `0` the two points of order 4, and `Y8`,
 *   `p - Y8` the four of order 8), whatever the sign bit.
 *
 * These are the 14 encodings of the known small-order blocklist (as in libsodium's
 * `crypto_sign_verify_detached`). A key of mixed order (a genuine key plus a small-order
 * component) is not refused: forging under it still takes the discrete logarithm of its
 * prime-order part.
 */

import { InvalidParameter } from "./errors.js";

/** The field prime of edwards25519. */
export const FIELD_PRIME: bigint = (1n << 255n) - 19n;
/**
 * y of the four points of order 8 (with `FIELD_PRIME - Y8`): the roots of `d y^4 + 2 y^2 - 1 = 0`,
 * where doubling gives a point of order 4 (`y = 0`).
 */
export const Y8: bigint = 0x7a03ac9277fdc74ec6cc392cfa53202a0f67100d760b3cba4fd84d3d706a17c7n;
/** The y-coordinates of the 8 points whose order divides 8. */
export const SMALL_ORDER_Y: ReadonlySet<bigint> = new Set([0n, 1n, FIELD_PRIME - 1n, Y8, FIELD_PRIME - Y8]);

const KEY_BYTES = 32;

/** The 255-bit y field of an encoded point (little-endian, sign bit cleared). */
function yField(key: Uint8Array): bigint {
  let y = 0n;
  for (let i = key.length - 1; i >= 0; i--) {
    y = (y << 8n) | BigInt(i === KEY_BYTES - 1 ? (key[i] as number) & 0x7f : (key[i] as number));
  }
  return y;
}

/**
 * Why `key` (32 bytes) must not be verified against, or undefined: a non-canonical encoding
 * (`y >= p`) or a small-order point (anyone can make signatures that verify under it).
 */
export function weakEd25519Key(key: Uint8Array): string | undefined {
  const y = yField(key);
  if (y >= FIELD_PRIME) {
    return "a non-canonical encoding (y >= p)";
  }
  if (SMALL_ORDER_Y.has(y)) {
    return "a small-order point (anyone could sign under it)";
  }
  return undefined;
}

/**
 * `key` if it is `size` bytes and a key signatures can be checked against; else
 * {@link InvalidParameter} naming `name` (see {@link weakEd25519Key}).
 */
export function checkEd25519Key(key: unknown, name: string, size: number = KEY_BYTES): Uint8Array {
  if (!(key instanceof Uint8Array) || key.length !== size) {
    throw new InvalidParameter(name, `must be ${size} bytes (an Ed25519 public key)`);
  }
  const problem = weakEd25519Key(key);
  if (problem !== undefined) {
    throw new InvalidParameter(name, `is ${problem}, not a usable Ed25519 public key`);
  }
  return key;
}
