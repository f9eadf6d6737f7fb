// The message codec (js/src/wire/messages.ts) and padded reports (js/src/wire/reportFormat.ts)
// against the reference vectors of tests/protocol/vectors (written by make_vectors.py), plus the
// shape rules, size limits and a fixed-seed fuzz loop. Run: node --test js/test/vectors-codec.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { encodeCbor, decodeCbor } from "../dist/wire/cbor.js";
import {
  BadPadding,
  InvalidParameter,
  MalformedMessage,
  MessageTooLarge,
  ShuffleDPError,
  UnsupportedVersion,
  WrongSize,
} from "../dist/wire/errors.js";
import {
  MESSAGE_LIMITS,
  binCenter,
  decodeMessage,
  decodeRoundSpec,
  encodeMessage,
  messagesPerUserOf,
  minReports,
  numBins,
  paddedBins,
  paddedDim,
  treeGroups,
  treeLevels,
  ulp,
  valuesPerReport,
} from "../dist/wire/messages.js";
import { HPKE_OVERHEAD, decodePadded, encodePadded, paddedSize, sealedSize } from "../dist/wire/reportFormat.js";

const VECTORS = fileURLToPath(new URL("../../tests/protocol/vectors/", import.meta.url));
const hex = (h) => Uint8Array.from(h.match(/../g) ?? [], (x) => parseInt(x, 16));
const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

/**
 * JSON as Python's json module writes it, keeping integers exact: a number literal with a '.',
 * 'e' or 'E' is a float (Python writes every float so), any other is an integer (a bigint).
 */
function parseJson(text) {
  let at = 0;
  const ws = () => { while (" \t\n\r".includes(text[at])) at++; };
  const value = () => {
    ws();
    const c = text[at];
    if (c === "{") {
      at++;
      const out = {};
      ws();
      if (text[at] === "}") { at++; return out; }
      for (;;) {
        ws();
        const key = value();
        ws();
        assert.equal(text[at++], ":");
        out[key] = value();
        ws();
        if (text[at++] === "}") return out;
      }
    }
    if (c === "[") {
      at++;
      const out = [];
      ws();
      if (text[at] === "]") { at++; return out; }
      for (;;) {
        out.push(value());
        ws();
        if (text[at++] === "]") return out;
      }
    }
    if (c === '"') {
      let end = at + 1;
      while (text[end] !== '"') end += text[end] === "\\" ? 2 : 1;
      const s = JSON.parse(text.slice(at, end + 1));
      at = end + 1;
      return s;
    }
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, at)) { at += word.length; return v; }
    }
    const match = /^-?\d+(\.\d+)?([eE][-+]?\d+)?/.exec(text.slice(at, at + 64));
    at += match[0].length;
    return match[1] || match[2] ? Number(match[0]) : BigInt(match[0]);
  };
  return value();
}

const CODEC = parseJson(readFileSync(VECTORS + "codec.json", "utf8"));
const REFUSED = parseJson(readFileSync(VECTORS + "refused.json", "utf8"));
const SEALING = parseJson(readFileSync(VECTORS + "sealing.json", "utf8"));
const ONION = parseJson(readFileSync(VECTORS + "onion.json", "utf8"));

/** Integer fields the TS interfaces keep as bigint; every other integer is a number. */
const BIG = new Set(["roundId", "rotationSeed", "modulus", "values"]);
const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/** The TS message of a vector's `fields` (wire names, {hex} for bytes). */
function fromFields(fields, key = "") {
  if (typeof fields === "bigint") return BIG.has(key) ? fields : Number(fields);
  if (Array.isArray(fields)) return fields.map((item) => fromFields(item, key));
  if (fields !== null && typeof fields === "object") {
    const keys = Object.keys(fields);
    if (keys.length === 1 && keys[0] === "hex") return hex(fields.hex);
    const out = {};
    for (const [k, v] of Object.entries(fields)) out[camel(k)] = fromFields(v, camel(k));
    return out;
  }
  return fields;
}

const messageOf = (vector) => ({ type: vector.type, ...fromFields(vector.fields) });

function refusedWith(fn, ErrorClass, words) {
  assert.throws(fn, (error) => {
    assert.ok(error instanceof ErrorClass, `expected ${ErrorClass.name}, got ${error?.constructor?.name}: ${error?.message}`);
    if (words !== undefined) assert.ok(error.message.includes(words), `"${error.message}" does not name "${words}"`);
    return true;
  });
}

test("the vectors cover every message type", () => {
  assert.deepEqual(new Set(CODEC.map((v) => v.type)), new Set(Object.keys(MESSAGE_LIMITS)));
});

for (const vector of CODEC) {
  test(`codec vector ${vector.name}: built from its fields, encodes to its bytes; decodes to its fields`, () => {
    const built = messageOf(vector);
    assert.equal(toHex(encodeMessage(built)), vector.cbor_hex);
    const decoded = decodeMessage(hex(vector.cbor_hex));
    assert.deepEqual(decoded, built);
    assert.equal(toHex(encodeMessage(decoded)), vector.cbor_hex);
    assert.deepEqual(decodeMessage(hex(vector.cbor_hex), vector.type), built);
  });
}

test("refused vectors: every entry is refused, naming its rule", () => {
  for (const vector of REFUSED) {
    refusedWith(() => decodeMessage(hex(vector.hex)), MalformedMessage, vector.names);
  }
});

test("a signed spec's bytes decode with decodeRoundSpec, every check included", () => {
  const signed = decodeMessage(hex(CODEC.find((v) => v.type === "signed-round-spec").cbor_hex), "signed-round-spec");
  const spec = decodeRoundSpec(signed.specBytes);
  assert.equal(spec.type, "round-spec");
  assert.equal(spec.params.mechanism, "hadamard-range");
  assert.deepEqual(encodeMessage(spec), signed.specBytes); // its canonical encoding
});

// ---------------------------------------------------------------------------------------------
// Shape rules

/** The CBOR map of a codec vector, to edit. */
const bodyOf = (name) => decodeCbor(hex(CODEC.find((v) => v.name === name).cbor_hex));

test("unknown, missing and ill-typed keys are refused, naming the field", () => {
  const envelope = bodyOf("envelope");
  envelope.set("extra", 1n);
  refusedWith(() => decodeMessage(encodeCbor(envelope)), MalformedMessage, "unknown key(s), e.g. 'extra'");

  const outcome = bodyOf("round-outcome/released");
  outcome.delete("signature");
  refusedWith(() => decodeMessage(encodeCbor(outcome)), MalformedMessage, "missing key 'signature'");

  const ack = bodyOf("batch-ack");
  ack.set("round_id", 0.0); // a float is not an integer
  refusedWith(() => decodeMessage(encodeCbor(ack)), MalformedMessage, "batch-ack.round_id: expected int, got float");

  const report = bodyOf("report/hadamard-range");
  report.set("values", [17n, -1.0]);
  refusedWith(() => decodeMessage(encodeCbor(report)), MalformedMessage, "report.values: expected int, got float");
  report.set("values", 17n);
  refusedWith(() => decodeMessage(encodeCbor(report)), MalformedMessage, "expected an array");

  const spec = bodyOf("round-spec/hadamard-range");
  spec.get("params").set("spare", 1n);
  refusedWith(() => decodeMessage(encodeCbor(spec)), MalformedMessage, "round-spec.params: 1 unknown key(s)");
  spec.get("params").delete("spare");
  spec.get("params").set("mechanism", "no-such-mechanism");
  refusedWith(() => decodeMessage(encodeCbor(spec)), MalformedMessage, "unknown mechanism");
  spec.set("params", [1n]);
  refusedWith(() => decodeMessage(encodeCbor(spec)), MalformedMessage, "expected a parameter map");

  refusedWith(() => decodeMessage(encodeCbor([1n])), MalformedMessage, "top level must be a CBOR map");
  refusedWith(() => decodeMessage("not bytes"), MalformedMessage, "expected bytes");
});

test("versions other than 3 are unsupported; a version that is not an integer is malformed", () => {
  const body = bodyOf("envelope");
  body.set("v", 2n);
  refusedWith(() => decodeMessage(encodeCbor(body)), UnsupportedVersion);
  assert.equal(new UnsupportedVersion("x").reason, "unsupported-version");
  body.set("v", 3.0);
  refusedWith(() => decodeMessage(encodeCbor(body)), MalformedMessage, "wire version");
  body.delete("v");
  refusedWith(() => decodeMessage(encodeCbor(body)), MalformedMessage, "wire version");
  const unknownType = bodyOf("envelope");
  unknownType.set("t", "telemetry");
  refusedWith(() => decodeMessage(encodeCbor(unknownType)), MalformedMessage, "unknown message type");
});

test("size limits: before parsing against the expected type, after `t` against the message's own", () => {
  const big = new Uint8Array(MESSAGE_LIMITS.report + 1); // not even CBOR: refused by size first
  refusedWith(() => decodeMessage(big, "report"), MessageTooLarge);
  assert.equal(new MessageTooLarge("x").reason, "too-large");
  // a valid-looking outcome padded past 512 bytes by a long reason (itself refused later anyway)
  const outcome = bodyOf("round-outcome/failed");
  outcome.set("reason", "x".repeat(400));
  const data = encodeCbor(outcome);
  assert.ok(data.length > MESSAGE_LIMITS["round-outcome"]);
  refusedWith(() => decodeMessage(data), MessageTooLarge, "round-outcome of");
  refusedWith(() => decodeMessage(hex(CODEC.find((v) => v.type === "envelope").cbor_hex), "report"), MessageTooLarge);
  refusedWith(() => decodeMessage(hex(CODEC.find((v) => v.type === "batch-ack").cbor_hex), "envelope"), MalformedMessage, "expected envelope, got batch-ack");
  // a batch reader's item limit
  const batch = hex(CODEC.find((v) => v.name === "shuffled-batch/whole").cbor_hex);
  assert.equal(decodeMessage(batch, "shuffled-batch", { maxItems: 2 }).payloads.length, 2);
  refusedWith(() => decodeMessage(batch, "shuffled-batch", { maxItems: 1 }), MalformedMessage, "over the limit of 1");
  // the encoder refuses too
  const failed = messageOf(CODEC.find((v) => v.name === "round-outcome/failed"));
  refusedWith(() => encodeMessage({ ...failed, reason: "y".repeat(33) }), InvalidParameter, "reason");
});

test("a float / uint spec field may carry an integer: decoded as a float, re-encoded as one", () => {
  const spec = bodyOf("round-spec/hadamard-range");
  spec.get("params").set("low", -20n);
  spec.set("deadline", BigInt(spec.get("deadline")));
  const data = encodeCbor(spec);
  const decoded = decodeRoundSpec(data);
  assert.equal(decoded.params.low, -20);
  assert.equal(typeof decoded.deadline, "number");
  // its canonical encoding writes floats: not the received bytes (so a signature over the received
  // bytes is what a device checks), and equal to the vector's encoding
  assert.notDeepEqual(encodeMessage(decoded), data);
  assert.equal(toHex(encodeMessage(decoded)), CODEC.find((v) => v.name === "round-spec/hadamard-range").cbor_hex);
  // integer fields stay strict
  const strict = bodyOf("round-spec/hadamard-range");
  strict.set("min_batch", 10.0);
  refusedWith(() => decodeRoundSpec(encodeCbor(strict)), MalformedMessage, "min_batch: expected int, got float");
});

test("round spec ranges and cross-field rules", () => {
  const edit = (name, change) => {
    const spec = bodyOf(name);
    change(spec);
    return () => decodeRoundSpec(encodeCbor(spec));
  };
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("epsilon0", 31.0)), MalformedMessage, "epsilon0: must be in");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("delta0", 1.0)), MalformedMessage, "delta0");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("messages_per_user", 2n)), MalformedMessage, "messages_per_user: must be 1");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("shuffler_instances", 65n)), MalformedMessage, "shuffler_instances");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("max_batch", (1n << 24n) + 1n)), MalformedMessage, "max_batch");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("round_id", 1n << 63n)), MalformedMessage, "round_id");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.set("analyzer_key", new Uint8Array(31))), MalformedMessage, "analyzer_key");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.get("params").set("tau", 1e-5)), MalformedMessage, "round-spec.params: tau");
  refusedWith(edit("round-spec/hadamard-range", (s) => s.get("params").set("high", -30.0)), MalformedMessage, "high: must exceed low");
  refusedWith(edit("round-spec/modular-sum", (s) => s.set("min_batch", 79999n)), MalformedMessage, "min_batch: must be at least 80000");
  refusedWith(edit("round-spec/vector-mean", (s) => s.get("params").set("lower", [0.0, 0.0, 0.0])), MalformedMessage, "lower: must give one bound per rotated coordinate (4)");
  refusedWith(edit("round-spec/vector-range-paper", (s) => s.get("params").set("mode", "all")), MalformedMessage, "mode");
  refusedWith(edit("round-spec/local-vector", (s) => s.get("params").set("center", [0.0])), MalformedMessage, "center");
  refusedWith(edit("round-spec/shifted-norm", (s) => s.get("params").set("low", -1001.0)), MalformedMessage, "high: the log2-norm grid");
  refusedWith(edit("round-spec/coordinate-tree", (s) => s.get("params").set("tau", 50.0)), MalformedMessage, "two leaves");
  refusedWith(edit("round-spec/vector-sum", (s) => s.get("params").set("rotation_seed", -1n)), MalformedMessage, "rotation_seed");
});

test("report, admission and outcome ranges", () => {
  const report = bodyOf("report/hadamard-range");
  report.set("values", [1n << 62n, 1n]);
  refusedWith(() => decodeMessage(encodeCbor(report)), MalformedMessage, "values: out of range");
  report.set("values", [-(1n << 62n), 1n]);
  assert.deepEqual(decodeMessage(encodeCbor(report)).values, [-(1n << 62n), 1n]);
  report.set("values", [1n]);
  refusedWith(() => decodeMessage(encodeCbor(report)), MalformedMessage, "must be 2 integer(s)");
  const receipts = bodyOf("admission-receipts");
  receipts.set("reasons", receipts.get("reasons").map(() => "\u{1F600}".repeat(32))); // 32 characters, 128 bytes
  assert.ok(decodeMessage(encodeCbor(receipts)));
  receipts.set("reasons", receipts.get("reasons").map(() => "\u{1F600}".repeat(33)));
  refusedWith(() => decodeMessage(encodeCbor(receipts)), MalformedMessage, "1..32 characters");
  receipts.set("reasons", receipts.get("reasons").map(() => ""));
  refusedWith(() => decodeMessage(encodeCbor(receipts)), MalformedMessage, "1..32 characters");
});

test("the encoder checks what the reference constructors check", () => {
  const envelope = messageOf(CODEC.find((v) => v.type === "envelope"));
  refusedWith(() => encodeMessage({ ...envelope, outer: new Uint8Array(0) }), InvalidParameter, "outer");
  refusedWith(() => encodeMessage({ ...envelope, roundId: -1n }), InvalidParameter, "round_id");
  refusedWith(() => encodeMessage({ ...envelope, roundId: 0.5 }), InvalidParameter, "round_id");
  refusedWith(() => encodeMessage({ ...envelope, sessionId: "x" }), InvalidParameter, "session_id");
  refusedWith(() => encodeMessage({ ...envelope, type: "mystery" }), InvalidParameter, "not a wire message type");
  const spec = messageOf(CODEC.find((v) => v.name === "round-spec/hadamard-range"));
  refusedWith(() => encodeMessage({ ...spec, epsilon0: NaN }), InvalidParameter, "epsilon0");
  refusedWith(() => encodeMessage({ ...spec, params: { ...spec.params, tau: -1 } }), InvalidParameter, "tau");
});

// ---------------------------------------------------------------------------------------------
// Derived quantities (worked out by hand from the vectors' parameters)

test("derived quantities of parameters", () => {
  const params = (name) => messageOf(CODEC.find((v) => v.name === name)).params;
  const range = params("round-spec/hadamard-range"); // [-20, 20], tau 0.8: 40 / 1.6 = 25 bins
  assert.equal(numBins(range), 25);
  assert.equal(paddedBins(range), 32);
  assert.equal(binCenter(range, 0), -20 + 0.8);
  const tree = params("round-spec/coordinate-tree"); // 100 / 1.5625 = 64 leaves, 6 levels, dim 3 -> 4
  assert.equal(numBins(tree), 64);
  assert.equal(treeLevels(tree), 6);
  assert.equal(paddedDim(tree), 4);
  assert.equal(treeGroups(tree), 24);
  assert.equal(messagesPerUserOf(params("round-spec/vector-range-paper")), 4); // paper mode: D reports
  assert.equal(messagesPerUserOf(params("round-spec/vector-sum")), 40); // 10 shares x 4 coordinates
  assert.equal(messagesPerUserOf(params("round-spec/local-vector")), 4);
  assert.equal(messagesPerUserOf(params("round-spec/modular-sum")), 8);
  assert.equal(messagesPerUserOf(range), 1);
  assert.equal(minReports(params("round-spec/modular-sum")), 80000); // 10^4 users x 8 shares
  assert.equal(minReports(params("round-spec/vector-sum")), 400000);
  assert.equal(minReports(range), 1);
  for (const v of CODEC.filter((v) => v.type === "round-spec")) {
    assert.equal(BigInt(messagesPerUserOf(messageOf(v).params)), v.fields.messages_per_user);
  }
  assert.equal(valuesPerReport("vector-range"), 3);
  assert.equal(ulp(1), 2 ** -52);
  assert.equal(ulp(0), 2 ** -1074);
  assert.equal(ulp(Number.MAX_VALUE), 2 ** 971);
  assert.equal(ulp(-3), 2 ** -51);
});

// ---------------------------------------------------------------------------------------------
// Padded reports and fixed sizes

test("padded reports: the sealing vector's plaintext, sizes, and refusals", () => {
  const roundId = SEALING.round_id;
  assert.equal(paddedSize(0n, "hadamard-range"), 74); // docs/wire-format.md: round 0 of hadamard-range pads to 74
  assert.equal(sealedSize(0n, "hadamard-range"), 74 + HPKE_OVERHEAD);
  assert.equal(paddedSize(roundId, "hadamard-range"), Number(SEALING.padded_size));
  const plaintext = hex(SEALING.plaintext_hex);
  const report = decodeMessage(hex(SEALING.report_hex), "report");
  assert.deepEqual(decodePadded(roundId, "hadamard-range", plaintext), report.values);
  assert.equal(toHex(encodePadded(roundId, "hadamard-range", report.values)), SEALING.plaintext_hex);
  refusedWith(() => decodePadded(roundId, "hadamard-range", plaintext.subarray(1)), WrongSize);
  const dirty = plaintext.slice();
  dirty[dirty.length - 1] = 1;
  refusedWith(() => decodePadded(roundId, "hadamard-range", dirty), BadPadding);
  assert.equal(new BadPadding("x").reason, "bad-padding");
  assert.equal(new WrongSize("x").reason, "wrong-size");
  // the same report bytes under another round or mechanism are not this round's layout
  const other = encodePadded(roundId + 1n, "hadamard-range", report.values);
  assert.equal(other.length, plaintext.length);
  refusedWith(() => decodePadded(roundId, "hadamard-range", other), MalformedMessage, "layout");
  refusedWith(() => encodePadded(roundId, "hadamard-range", [1n]), InvalidParameter, "values");
  // every value, narrowest to widest, pads to one size
  for (const values of [[0n, 1n], [-(1n << 62n), -(1n << 62n)], [(1n << 62n) - 1n, -1n], [4096n, -1n]]) {
    const padded = encodePadded(7n, "hadamard-range", values);
    assert.equal(padded.length, paddedSize(7n, "hadamard-range"));
    assert.deepEqual(decodePadded(7n, "hadamard-range", padded), values);
  }
});

test("onion sizes: every admission and envelope of a round has one length", () => {
  const sizes = ONION.sizes;
  assert.equal(BigInt(sealedSize(ONION.round_id, ONION.mechanism)), sizes.sealed);
  const admission = encodeMessage({
    type: "admission", roundId: ONION.round_id, credential: new Uint8Array(48), nonce: new Uint8Array(16),
    sealed: new Uint8Array(Number(sizes.sealed)),
  });
  assert.equal(BigInt(admission.length), sizes.admission);
  const envelope = encodeMessage({
    type: "envelope", sessionId: hex(ONION.session_id_hex), roundId: ONION.round_id, outer: new Uint8Array(Number(sizes.outer)),
  });
  assert.equal(BigInt(envelope.length), sizes.envelope);
  assert.equal(toHex(decodeMessage(hex(ONION.admission_hex), "admission").nonce), ONION.nonce_hex);
});

// ---------------------------------------------------------------------------------------------
// Fuzz

/** xorshift64*: fixed-seed generator (never Math.random). */
function xorshift(seed) {
  let state = BigInt.asUintN(64, seed);
  const next64 = () => {
    state ^= state >> 12n;
    state ^= BigInt.asUintN(64, state << 25n);
    state ^= state >> 27n;
    return BigInt.asUintN(64, state * 0x2545f4914f6cdd1dn);
  };
  return { below: (n) => Number(next64() % BigInt(n)), byte: () => Number(next64() >> 56n) };
}

test("fuzz: random bytes and mutated vectors give a message or a typed error, nothing else", () => {
  const rng = xorshift(0xc0dec5eedn);
  const seeds = [...CODEC.map((v) => hex(v.cbor_hex)), ...REFUSED.map((v) => hex(v.hex))];
  let decoded = 0;
  let refused = 0;
  for (let i = 0; i < 20000; i++) {
    let input;
    if (i % 4 === 0) {
      input = Uint8Array.from({ length: rng.below(64) }, () => rng.byte());
    } else {
      input = seeds[rng.below(seeds.length)].slice();
      const edits = 1 + rng.below(4);
      for (let k = 0; k < edits && input.length > 0; k++) {
        const at = rng.below(input.length);
        switch (rng.below(4)) {
          case 0: input[at] = rng.byte(); break;
          case 1: input[at] ^= 1 << rng.below(8); break;
          case 2: input = input.slice(0, at); break;
          default: { // a small integer changed to a neighbour (keeps the shape, moves a range)
            if (input[at] < 0x17) input[at] += 1;
            else if (input[at] > 0x00 && input[at] <= 0x17) input[at] -= 1;
          }
        }
      }
    }
    try {
      const message = decodeMessage(input);
      decoded += 1;
      // whatever decodes re-encodes to the same bytes, up to integers in float fields of a spec
      if (message.type !== "round-spec") assert.equal(toHex(encodeMessage(message)), toHex(input));
    } catch (error) {
      if (!(error instanceof ShuffleDPError)) {
        throw new Error(`untyped ${error?.constructor?.name} on ${toHex(input)}: ${error?.message}`);
      }
      refused += 1;
    }
  }
  assert.ok(decoded > 100 && refused > 10000, `${decoded} decoded, ${refused} refused`);
});
