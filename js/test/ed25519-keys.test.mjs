// Ed25519 public keys under which anyone could sign (small-order points, non-canonical
// encodings): refused by the key rule, by verification, by the round-spec decoder, by the Client
// and by the enrollment reader, as the Python parties refuse them
// (tests/protocol/test_ed25519_keys.py).
//
// The small-order points are derived here with @noble/curves' point arithmetic, not copied from a
// list: the group of edwards25519 has order 8 * L with a cyclic 8-torsion, so [L]Q of any point Q
// lies in it, and one of order 8 generates all 8 points (k * T8 for k = 0..7). Their canonical
// encodings and every non-canonical variant are the 14 keys refused.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { ed25519 } from "@noble/curves/ed25519.js";
import { sha512 } from "@noble/hashes/sha2.js";
import { concatBytes, utf8ToBytes } from "@noble/hashes/utils.js";

import { Client } from "../dist/client/client.js";
import { EnrollmentError, parsePublicInfo } from "../dist/enrollment.js";
import { MemoryLedger } from "../dist/ledger/ledger.js";
import { decodeCbor, encodeCbor } from "../dist/wire/cbor.js";
import { FIELD_PRIME, SMALL_ORDER_Y, checkEd25519Key, weakEd25519Key } from "../dist/wire/ed25519Keys.js";
import { BadSignature, InvalidParameter, MalformedMessage } from "../dist/wire/errors.js";
import { decodeMessage, decodeRoundSpec, encodeMessage } from "../dist/wire/messages.js";
import { decodeVerified } from "../dist/wire/onion.js";
import { verifyEd25519 } from "../dist/wire/signing.js";
import { ANALYZER, SESSION, SHUFFLER, credentialOf, hex, roundSpec, signedMessage } from "./support/rounds.mjs";

const Point = ed25519.Point;
const P = Point.CURVE().p;
const L = Point.CURVE().n;
const Y_MASK = (1n << 255n) - 1n;

// ------------------------------------------------------------------ the group, derived

function bytesToLittle(bytes) {
  let n = 0n;
  for (let i = bytes.length - 1; i >= 0; i--) n = (n << 8n) | BigInt(bytes[i]);
  return n;
}

function littleToBytes(n) {
  const out = new Uint8Array(32);
  for (let i = 0; i < 32; i++, n >>= 8n) out[i] = Number(n & 0xffn);
  return out;
}

/** [k]Q for a small k >= 0 by repeated addition (multiply() refuses 0 and scalars >= L). */
function times(k, point) {
  let result = Point.ZERO;
  for (let i = 0n; i < k; i++) result = result.add(point);
  return result;
}

/** [L]Q: the torsion component of Q (L itself is not a scalar noble multiplies by). */
function timesL(point) {
  return point.multiplyUnsafe(L - 1n).add(point);
}

/** The 8 points of order dividing 8: the multiples of one point of order 8, found as [L]Q. */
function torsionPoints() {
  for (let y = 2n; ; y++) {
    let q;
    try {
      q = Point.fromBytes(littleToBytes(y));
    } catch {
      continue; // no x for this y
    }
    const t8 = timesL(q);
    if (!times(4n, t8).is0()) {
      const points = Array.from({ length: 8 }, (_, k) => times(BigInt(k), t8));
      assert.equal(new Set(points.map((p) => hex(p.toBytes()))).size, 8);
      for (const p of points) assert.ok(times(8n, p).is0() && p.isSmallOrder());
      return points;
    }
  }
}

/** The encoding of `point`: its y (plus p if asked) and a sign bit (x's parity unless given). */
function encode(point, { yPlusP = false, sign } = {}) {
  const { x, y } = point.toAffine();
  const bit = sign ?? Number(x & 1n);
  return littleToBytes((yPlusP ? y + P : y) | (BigInt(bit) << 255n));
}

const TORSION = torsionPoints();
const CANONICAL = TORSION.map((p) => encode(p));
// The other encodings of the same points: y + p where it fits in 255 bits (y = 0, 1), and the sign
// bit set on x = 0 (y = 1, p - 1).
// (The two points of order 4 share y = 0, hence the same y + p encodings.)
const distinct = (keys) => [...new Map(keys.map((k) => [hex(k), k])).values()];
const NON_CANONICAL = distinct([
  ...TORSION.filter((p) => p.toAffine().y + P < 1n << 255n).flatMap((p) => [0, 1].map((sign) => encode(p, { yPlusP: true, sign }))),
  ...TORSION.filter((p) => p.toAffine().x === 0n).map((p) => encode(p, { sign: 1 })),
]);
const ALL_WEAK = distinct([...CANONICAL, ...NON_CANONICAL]);
const NEUTRAL = encode(Point.ZERO);

const label = (key) => `${hex(key).slice(0, 8)}-${hex(key).slice(-2)}`;

/** The verifier's SHA-512(R || A || M) mod L, A as encoded (not re-encoded). */
function challenge(r, key, message) {
  return bytesToLittle(sha512(concatBytes(r, key, message))) % L;
}

/** The point a verifier decodes `key` to, read leniently (y mod p, x = 0 whatever the sign bit). */
function decodedKey(key) {
  const field = bytesToLittle(key);
  const y = (field & Y_MASK) % P;
  const point = TORSION.find((p) => p.toAffine().y === y);
  const { x } = point.toAffine();
  return x !== 0n && (x & 1n) !== field >> 255n ? point.negate() : point;
}

/**
 * `R || s` with s = 0 and R a small-order point with R = -[k]A: a signature on `message` under the
 * small-order key `key` made with no secret, or undefined if no R fits (each fits with
 * probability about 1/8; a forger tries another message).
 */
function forgery(key, message) {
  const a = decodedKey(key);
  for (const r of TORSION) {
    const rBytes = r.toBytes();
    const k = challenge(rBytes, key, message);
    if (times(k % 8n, a).negate().equals(r)) return concatBytes(rBytes, new Uint8Array(32));
  }
  return undefined;
}

/** The cofactorless equation [s]B = R + [k]A checked as it stands (what OpenSSL checks). */
function cofactorlessAccepts(key, message, signature) {
  const r = signature.subarray(0, 32);
  const s = bytesToLittle(signature.subarray(32));
  const left = s === 0n ? Point.ZERO : Point.BASE.multiply(s);
  const k = challenge(r, key, message);
  return left.equals(Point.fromBytes(r).add(times(k % 8n, decodedKey(key))));
}

function forgeryFor(key) {
  for (let i = 0; i < 1000; i++) {
    const message = utf8ToBytes(`outcome ${i}`);
    const signature = forgery(key, message);
    if (signature !== undefined) return { message, signature };
  }
  throw new Error(`no forgery found under ${hex(key)}`);
}

// ------------------------------------------------------------------ tests

describe("the weak-key rule", () => {
  it("refuses the 14 encodings of the 8 small-order points, derived from the group", () => {
    assert.equal(new Set(CANONICAL.map(hex)).size, 8);
    assert.equal(NON_CANONICAL.length, 6);
    assert.equal(ALL_WEAK.length, 14);
    assert.equal(FIELD_PRIME, P);
    // what the software refuses is what the group holds
    assert.deepEqual(new Set(TORSION.map((p) => p.toAffine().y)), new Set(SMALL_ORDER_Y));
    assert.ok(CANONICAL.some((k) => hex(k) === hex(NEUTRAL)) && NEUTRAL[0] === 1);
    assert.ok(CANONICAL.some((k) => hex(k) === "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"));
    assert.ok(CANONICAL.some((k) => hex(k) === "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"));
    for (const key of CANONICAL) assert.match(weakEd25519Key(key), /small-order/, label(key));
    for (const key of NON_CANONICAL) assert.ok(weakEd25519Key(key) !== undefined, label(key));
  });

  it("refuses every y field >= p as non-canonical, whatever the sign bit", () => {
    for (const y of [P, P + 1n, P + 2n, (1n << 255n) - 1n]) {
      for (const sign of [0n, 1n]) {
        assert.match(weakEd25519Key(littleToBytes(y | (sign << 255n))), /non-canonical/);
      }
    }
  });

  it("takes genuine keys, and keys of mixed order", () => {
    for (let seed = 0; seed < 20; seed++) {
      const key = ed25519.getPublicKey(new Uint8Array(32).fill(seed));
      assert.equal(weakEd25519Key(key), undefined);
      assert.equal(checkEd25519Key(key, "key"), key);
      // a genuine key plus a small-order component: forging still needs its discrete logarithm
      const mixed = Point.fromBytes(key).add(TORSION[1]).toBytes();
      assert.equal(weakEd25519Key(mixed), undefined);
    }
  });

  it("checkEd25519Key names the parameter: size first, then weakness", () => {
    assert.throws(() => checkEd25519Key(new Uint8Array(31), "k"), (e) => e instanceof InvalidParameter && /k: must be 32 bytes/.test(e.message));
    assert.throws(() => checkEd25519Key("x".repeat(32), "k"), InvalidParameter);
    for (const key of ALL_WEAK) {
      assert.throws(() => checkEd25519Key(key, "k"), (e) => e instanceof InvalidParameter && e.parameter === "k", label(key));
    }
  });
});

describe("verification under a weak key", () => {
  for (const key of ALL_WEAK) {
    it(`refuses a forgery made with no secret under ${label(key)}`, () => {
      const { message, signature } = forgeryFor(key);
      // the forgery satisfies the equation a cofactorless verifier (OpenSSL) checks
      assert.ok(cofactorlessAccepts(key, message, signature));
      // noble's strict verification refuses it on its own, and the key rule refuses it first
      assert.equal(ed25519.verify(signature, message, key, { zip215: false }), false);
      assert.throws(
        () => verifyEd25519(key, message, signature, "round-outcome"),
        (e) => e instanceof BadSignature && /round-outcome signature refused: the signing key is/.test(e.message),
      );
    });
  }

  it("refuses a signed outcome forged under the neutral point (R = neutral, s = 0)", () => {
    const outcome = {
      type: "round-outcome", sessionId: SESSION, roundId: 0n, specDigest: new Uint8Array(32), outcome: "failed",
      reason: "forged", admitted: 0, batchId: new Uint8Array(16), instance: 0, signature: concatBytes(NEUTRAL, new Uint8Array(32)),
    };
    assert.throws(() => decodeVerified(encodeMessage(outcome), "round-outcome", NEUTRAL), BadSignature);
  });

  it("still verifies genuine signatures", () => {
    const outcome = signedMessage({
      type: "round-outcome", sessionId: SESSION, roundId: 3n, specDigest: new Uint8Array(32), outcome: "released",
      reason: "", admitted: 5, batchId: new Uint8Array(16), instance: 0,
    });
    assert.equal(decodeVerified(outcome, "round-outcome", SHUFFLER.signingPublic).roundId, 3n);
  });
});

/** The encoded round spec with `changes` applied to its CBOR map (no constructor involved). */
function specBytesWith(changes) {
  const body = decodeCbor(encodeMessage(roundSpec()));
  for (const [name, value] of Object.entries(changes)) body.set(name, value);
  return encodeCbor(body);
}

function refusedNaming(field) {
  return (e) => e instanceof MalformedMessage && e.reason === "malformed" && e.message.includes(field);
}

describe("a round spec naming a weak shuffler signing key", () => {
  for (const key of ALL_WEAK) {
    it(`is refused (malformed) at decode, and not encoded: ${label(key)}`, () => {
      const bytes = specBytesWith({ shuffler_signing_key: key });
      assert.throws(() => decodeRoundSpec(bytes), refusedNaming("shuffler_signing_key"));
      assert.throws(() => decodeMessage(bytes), refusedNaming("shuffler_signing_key"));
      assert.throws(
        () => encodeMessage(roundSpec({ shufflerSigningKey: key })),
        (e) => e instanceof InvalidParameter && e.parameter === "shuffler_signing_key",
      );
    });
  }

  it("is refused for the key where Python's RoundSpec checks it: after the other keys, before the batch sizes", () => {
    // Python: session_id, round_id, params, epsilon0/delta0, the budget rules, analyzer_key,
    // shuffler_key, shuffler_signing_key (size, then weakness), max_batch, min_batch, deadline, ...
    const weak = { shuffler_signing_key: NEUTRAL };
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, analyzer_key: new Uint8Array(31) })), refusedNaming("analyzer_key"));
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, shuffler_key: new Uint8Array(33) })), refusedNaming("shuffler_key"));
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, epsilon0: 31.0 })), refusedNaming("epsilon0"));
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, max_batch: 0n })), refusedNaming("shuffler_signing_key"));
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, min_batch: 1n })), refusedNaming("shuffler_signing_key"));
    assert.throws(() => decodeRoundSpec(specBytesWith({ ...weak, messages_per_user: 2n })), refusedNaming("shuffler_signing_key"));
    // the same spec with a usable key decodes
    assert.equal(decodeRoundSpec(specBytesWith({})).minBatch, 1000);
  });
});

describe("a device pinning a weak key", () => {
  const options = (overrides) => ({
    localData: 1.5,
    analyzerSigningKey: ANALYZER.signingPublic,
    credential: credentialOf(0xe1),
    ledger: new MemoryLedger({ epsilonBudget: 10 }),
    shufflerSigningKey: SHUFFLER.signingPublic,
    shufflerKey: SHUFFLER.hpkePublic,
    ...overrides,
  });

  it("is refused at construction (InvalidParameter naming the key), as Python's device_settings refuses it", () => {
    assert.ok(new Client(options({})));
    for (const pin of ["analyzerSigningKey", "shufflerSigningKey"]) {
      for (const key of ALL_WEAK) {
        assert.throws(() => new Client(options({ [pin]: key })), (e) => e instanceof InvalidParameter && e.parameter === pin, `${pin} ${label(key)}`);
      }
    }
  });

  it("is refused when public.json names one (as keys.py's load_public refuses it)", () => {
    const doc = (analyzer, shuffler) => ({
      format: "shuffledp-keys/1",
      session_id: hex(SESSION),
      analyzer: { signing_public: hex(analyzer), hpke_public: hex(ANALYZER.hpkePublic) },
      shuffler: { hpke_public: hex(SHUFFLER.hpkePublic), signing_public: hex(shuffler) },
    });
    assert.deepEqual(parsePublicInfo(doc(ANALYZER.signingPublic, SHUFFLER.signingPublic)).shufflerSigningKey, SHUFFLER.signingPublic);
    for (const key of [NEUTRAL, ...ALL_WEAK]) {
      assert.throws(() => parsePublicInfo(doc(key, SHUFFLER.signingPublic)), (e) => e instanceof EnrollmentError && /^analyzer\.signing_public: is a/.test(e.message));
      assert.throws(() => parsePublicInfo(doc(ANALYZER.signingPublic, key)), (e) => e instanceof EnrollmentError && /^shuffler\.signing_public: is a/.test(e.message));
    }
  });
});
