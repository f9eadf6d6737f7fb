/**
 * HPKE sealing of both onion layers, mirroring `protocol/wire/sealing.py`.
 *
 * HPKE (RFC 9180) in base mode with the suite DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
 * ChaCha20-Poly1305, no AAD. The sealed form is `enc (32 bytes) || ciphertext || tag (16 bytes)`,
 * so every sealed payload is its plaintext plus {@link HPKE_OVERHEAD} bytes. Each seal is a fresh
 * encapsulation (a fresh ephemeral X25519 key): two seals of one plaintext share nothing.
 *
 * The HPKE `info` binds a label, the session id (16 bytes), the round id (8 bytes, big-endian)
 * and the round spec's digest (32 bytes), so a payload sealed for one round or session, or
 * under another spec of the same round, does not open.
 */

import { CipherSuite, DhkemX25519HkdfSha256 as NativeX25519Kem, HkdfSha256 } from "@hpke/core";
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { DhkemX25519HkdfSha256 as PortableX25519Kem } from "@hpke/dhkem-x25519";
import { concatBytes, utf8ToBytes } from "@noble/hashes/utils.js";

import { InvalidParameter, SealingError } from "./errors.js";
import { SESSION_ID_BYTES, SPEC_DIGEST_BYTES, X25519_KEY_BYTES } from "./messages.js";
import { HPKE_OVERHEAD } from "./reportFormat.js";

/** Label of the inner layer's HPKE `info` (a report sealed to the analyzer). */
export const REPORT_INFO_LABEL: Uint8Array = utf8ToBytes("shuffledp/v3/report");
/** Length of HPKE's encapsulated key (X25519's ephemeral public key) at the start of a sealed payload. */
export const ENCAPSULATED_KEY_BYTES = 32;
const ROUND_ID_LIMIT = 1n << 63n;

let suiteInstance: Promise<CipherSuite> | undefined;

/**
 * Whether this runtime's WebCrypto does X25519 itself (Node >= 20, Chromium >= 133, Firefox,
 * Safari >= 17): tried once, by generating a key pair.
 */
async function webCryptoHasX25519(): Promise<boolean> {
  try {
    await globalThis.crypto.subtle.generateKey({ name: "X25519" }, false, ["deriveBits"]);
    return true;
  } catch {
    return false;
  }
}

/**
 * The one HPKE suite of the wire format (made on first use). The X25519 KEM is the runtime's
 * own WebCrypto X25519 where there is one (about three times faster per seal in Node), else a
 * portable JavaScript X25519 (`@hpke/dhkem-x25519`); both compute the same RFC 7748 function,
 * so a payload either seals, the other opens (`js/test/onion.test.mjs`).
 */
export function hpkeSuite(): Promise<CipherSuite> {
  suiteInstance ??= webCryptoHasX25519().then((native) => portableOrNativeSuite(native));
  return suiteInstance;
}

/** The wire format's HPKE suite over the native (WebCrypto) or the portable X25519 KEM. */
export function portableOrNativeSuite(native: boolean): CipherSuite {
  return new CipherSuite({
    kem: native ? new NativeX25519Kem() : new PortableX25519Kem(),
    kdf: new HkdfSha256(),
    aead: new Chacha20Poly1305(),
  });
}

/** A round id as 8 bytes, big-endian; an id outside `[0, 2^63)` is an {@link InvalidParameter}. */
export function roundIdBytes(roundId: bigint): Uint8Array {
  if (typeof roundId !== "bigint" || roundId < 0n || roundId >= ROUND_ID_LIMIT) {
    throw new InvalidParameter("round_id", "must be an integer in [0, 2^63)");
  }
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, roundId, false);
  return out;
}

/**
 * `session_id (16 bytes) || round_id (8 bytes, big-endian) || spec_digest (32 bytes)`: what every
 * HPKE `info` of a round binds after its label.
 */
export function roundBinding(sessionId: Uint8Array, roundId: bigint, specDigest: Uint8Array): Uint8Array {
  if (!(sessionId instanceof Uint8Array) || sessionId.length !== SESSION_ID_BYTES) {
    throw new InvalidParameter("session_id", `must be ${SESSION_ID_BYTES} bytes`);
  }
  if (!(specDigest instanceof Uint8Array) || specDigest.length !== SPEC_DIGEST_BYTES) {
    throw new InvalidParameter("spec_digest", `must be ${SPEC_DIGEST_BYTES} bytes`);
  }
  return concatBytes(sessionId, roundIdBytes(roundId), specDigest);
}

/** HPKE `info` of a report (the inner layer): `"shuffledp/v3/report" || round binding`. */
export function reportInfo(sessionId: Uint8Array, roundId: bigint, specDigest: Uint8Array): Uint8Array {
  return concatBytes(REPORT_INFO_LABEL, roundBinding(sessionId, roundId, specDigest));
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

/**
 * Seals payloads to one X25519 public key under one HPKE `info`: the key is parsed once, and
 * every {@link RoundSealer.seal} is a fresh encapsulation. Make one with {@link RoundSealer.create}.
 */
export class RoundSealer {
  private constructor(
    private readonly key: CryptoKey,
    private readonly info: Uint8Array,
    /** What the key belongs to, named in errors ("analyzer", "shuffler"). */
    readonly recipient: string,
  ) {}

  /**
   * A sealer to `publicKey` (32 raw bytes) under `info`. A key of another length is an
   * {@link InvalidParameter}; one the suite cannot use is a {@link SealingError}.
   */
  static async create(publicKey: Uint8Array, info: Uint8Array, recipient = "recipient"): Promise<RoundSealer> {
    if (!(publicKey instanceof Uint8Array) || publicKey.length !== X25519_KEY_BYTES) {
      throw new InvalidParameter(`${recipient} key`, `must be ${X25519_KEY_BYTES} bytes`);
    }
    let key: CryptoKey;
    try {
      key = await (await hpkeSuite()).kem.deserializePublicKey(publicKey.slice().buffer);
    } catch (error) {
      throw new SealingError(`cannot seal to the round's ${recipient} key (${describe(error)})`);
    }
    return new RoundSealer(key, info.slice(), recipient);
  }

  /**
   * `enc || ciphertext || tag` of `payload`; a key the suite refuses at encapsulation (a
   * low-order point, say) is a {@link SealingError}.
   */
  async seal(payload: Uint8Array): Promise<Uint8Array> {
    let sealed: { enc: ArrayBuffer; ct: ArrayBuffer };
    try {
      sealed = await (await hpkeSuite()).seal({ recipientPublicKey: this.key, info: this.info }, payload);
    } catch (error) {
      throw new SealingError(`cannot seal to the round's ${this.recipient} key (${describe(error)})`);
    }
    return concatBytes(new Uint8Array(sealed.enc), new Uint8Array(sealed.ct));
  }
}

/** A sealer of one round's reports to the analyzer's key (the inner layer). */
export function reportSealer(
  analyzerKey: Uint8Array,
  sessionId: Uint8Array,
  roundId: bigint,
  specDigest: Uint8Array,
): Promise<RoundSealer> {
  return RoundSealer.create(analyzerKey, reportInfo(sessionId, roundId, specDigest), "analyzer");
}

/**
 * Opens one sealed payload with an X25519 private key (32 raw bytes) under `info`: the
 * plaintext, or a {@link SealingError}. The device never opens anything; tests and tools that
 * play the analyzer or the shuffler do.
 */
export async function openSealed(privateKey: Uint8Array, info: Uint8Array, sealed: Uint8Array): Promise<Uint8Array> {
  if (!(sealed instanceof Uint8Array) || sealed.length < HPKE_OVERHEAD) {
    throw new SealingError(`a sealed payload holds at least ${HPKE_OVERHEAD} bytes`);
  }
  try {
    const suite = await hpkeSuite();
    const key = await suite.kem.importKey("raw", privateKey.slice().buffer, false);
    const plaintext = await suite.open(
      { recipientKey: key, enc: sealed.slice(0, ENCAPSULATED_KEY_BYTES).buffer, info },
      sealed.slice(ENCAPSULATED_KEY_BYTES),
    );
    return new Uint8Array(plaintext);
  } catch (error) {
    throw new SealingError(`payload does not open under this key and info (${describe(error)})`);
  }
}
