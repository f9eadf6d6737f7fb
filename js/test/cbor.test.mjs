// The strict CBOR reader and deterministic writer (js/src/wire/cbor.ts): every refusal rule of
// docs/wire-format.md at the first byte that shows it, exact half precision, shortest floats,
// limits, and a fixed-seed fuzz loop. Run: node --test js/test/cbor.test.mjs (after npx tsc).
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  ALLOCATION_FACTOR,
  ALLOCATION_SLACK,
  ITEM_COST,
  MAX_DEPTH,
  StrictReader,
  decodeCbor,
  encodeCbor,
  halfBitsOf,
  halfToNumber,
  readCborItem,
} from "../dist/wire/cbor.js";
import { InvalidParameter, MalformedMessage, ShuffleDPError } from "../dist/wire/errors.js";

const hex = (h) => Uint8Array.from(h.match(/../g) ?? [], (x) => parseInt(x, 16));
const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

/** xorshift64*: a fixed-seed generator for the property and fuzz loops (never Math.random). */
function xorshift(seed) {
  let state = BigInt.asUintN(64, seed);
  const next64 = () => {
    state ^= state >> 12n;
    state ^= BigInt.asUintN(64, state << 25n);
    state ^= state >> 27n;
    return BigInt.asUintN(64, state * 0x2545f4914f6cdd1dn);
  };
  return {
    next64,
    below(n) {
      return Number(next64() % BigInt(n));
    },
    bytes(n) {
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) out[i] = Number(next64() >> 56n);
      return out;
    },
  };
}

function refuses(input, words, options) {
  assert.throws(
    () => decodeCbor(typeof input === "string" ? hex(input) : input, options),
    (error) => {
      assert.ok(error instanceof MalformedMessage, `expected MalformedMessage, got ${error}`);
      assert.equal(error.reason, "malformed");
      assert.ok(error.message.includes(words), `"${error.message}" does not name "${words}"`);
      return true;
    },
  );
}

// Each rule: a hostile input, the rule's words, and the shortest prefix that already shows it.
// Refusing the prefix (not "truncated") shows the reader stops at the first byte that shows it.
const RULES = [
  ["c2", "tags are not allowed", "tag 2 (bignum)"],
  ["d81ca1d81d0000", "tags are not allowed", "tag 28 (shared value)"],
  ["a16174c100", "tags are not allowed", "a tag inside a map"],
  ["bf", "indefinite lengths are not allowed", "indefinite map"],
  ["9f", "indefinite lengths are not allowed", "indefinite array"],
  ["5f", "indefinite lengths are not allowed", "indefinite byte string"],
  ["7f", "indefinite lengths are not allowed", "indefinite text"],
  ["1f", "indefinite lengths are not allowed", "indefinite integer head"],
  ["1c", "reserved additional information 28", "reserved head"],
  ["f4", "simple values", "false"],
  ["f5", "simple values", "true"],
  ["f6", "simple values", "null"],
  ["f7", "simple values", "undefined"],
  ["f0", "simple values", "unassigned simple value"],
  ["f8", "simple values", "one-byte simple value"],
  ["ff", "simple values", "a lone break"],
  ["f97e00", "NaN and infinities", "half NaN"],
  ["f97c00", "NaN and infinities", "half +infinity"],
  ["f9fc00", "NaN and infinities", "half -infinity"],
  ["fa7fc00000", "NaN and infinities", "single NaN"],
  ["fb7ff0000000000000", "NaN and infinities", "double +infinity"],
  ["1817", "shortest form", "23 in one extra byte"],
  ["1900ff", "shortest form", "255 in two bytes"],
  ["1a0000ffff", "shortest form", "65535 in four bytes"],
  ["1b00000000ffffffff", "shortest form", "2^32 - 1 in eight bytes"],
  ["3817", "shortest form", "negative integer not shortest"],
  ["5800", "shortest form", "byte string length not shortest"],
  ["7800", "shortest form", "text length not shortest"],
  ["9800", "shortest form", "array length not shortest"],
  ["b800", "shortest form", "map length not shortest"],
  ["fa3f800000", "shortest exact form", "1.0 as a single"],
  ["fb3ff0000000000000", "shortest exact form", "1.0 as a double"],
  ["fb3fb99999a0000000", "shortest exact form", "float32(0.1) as a double"],
  ["fa00000000", "shortest exact form", "+0 as a single"],
  ["fb8000000000000000", "shortest exact form", "-0 as a double"],
  ["a101", "map keys must be text strings", "integer key"],
  ["a140", "map keys must be text strings", "byte-string key"],
  ["a180", "map keys must be text strings", "array key"],
  ["a2617402617402", "strictly increasing", "duplicate key"],
  ["a2617602617401", "strictly increasing", "keys out of order"],
  ["a262616101616202", "strictly increasing", "a longer key before a shorter one"],
  ["8181818181", `nesting deeper than ${MAX_DEPTH}`, "five nested arrays"],
  ["a161618181818100", `nesting deeper than ${MAX_DEPTH}`, "arrays nested in a map"],
  ["9b0000000100000000", "array of 4294967296 declared", "array of 2^32"],
  ["82", "only 0 bytes remain", "array of 2 with nothing after"],
  ["43aabb", "byte string of 3 declared, only 2 bytes remain", "short byte string"],
  ["7a00010000", "text string of 65536 declared", "short text"],
  ["bb0000000100000000", "only 0 bytes remain", "map of 2^32"],
  ["62c328", "not valid UTF-8", "invalid UTF-8"],
  ["63eda080", "not valid UTF-8", "an encoded surrogate (CESU-8)"],
  ["", "truncated", "empty input"],
  ["19ff", "truncated", "truncated two-byte argument"],
  ["f93c", "truncated", "truncated half"],
];

test("every refusal rule is refused, with its rule named", () => {
  for (const [input, words] of RULES) refuses(input, words);
});

test("each rule is refused at the first byte that shows it", () => {
  // The reader must not read ahead: the prefix up to the revealing byte gives the same refusal.
  const cases = [
    ["c2", 1], // a tag: its initial byte
    ["bf", 1],
    ["f5", 1],
    ["1817", 2], // non-shortest: the argument byte
    ["a101", 2], // a non-text key: its initial byte
    ["8181818181", 5],
    ["9b0000000100000000", 9],
    ["a2617402617402", 6],
  ];
  for (const [input, length] of cases) {
    const rule = RULES.find(([h]) => h === input)[1];
    refuses(input.slice(0, 2 * length), rule);
    // and anything after it is irrelevant
    refuses(input.slice(0, 2 * length) + "00".repeat(4), rule);
  }
  // the reported offset is just past the head that shows the problem
  assert.throws(() => decodeCbor(hex("a16174c2")), /CBOR at byte 4: tags/);
  assert.throws(() => decodeCbor(hex("a2617402617402")), /CBOR at byte 6:/);
});

test("depth 4 is accepted and depth 5 refused, for reader and writer", () => {
  assert.deepEqual(decodeCbor(hex("8181818100")), [[[[0n]]]]);
  const nested = new Map([["a", [[[1n]]]]]);
  assert.equal(toHex(encodeCbor(nested)), "a1616181818101");
  assert.deepEqual(decodeCbor(encodeCbor(nested)), nested);
  assert.throws(() => encodeCbor([[[[[0n]]]]]), InvalidParameter);
});

test("the caller's item limit bounds arrays before anything is read", () => {
  assert.deepEqual(decodeCbor(hex("83000102"), { maxItems: 3 }), [0n, 1n, 2n]);
  refuses("83000102", "over the limit of 2", { maxItems: 2 });
  refuses("83ffffff", "over the limit of 2", { maxItems: 2 }); // refused at the header, before its items
  // maps are bounded by the bytes that remain only (as the reference reader)
  assert.equal(decodeCbor(hex("a3616100616201616302"), { maxItems: 2 }).size, 3);
});

test("integers: the full 64-bit range both ways, and nothing wider", () => {
  const cases = [
    [0n, "00"], [23n, "17"], [24n, "1818"], [255n, "18ff"], [256n, "190100"], [65535n, "19ffff"],
    [65536n, "1a00010000"], [4294967295n, "1affffffff"], [4294967296n, "1b0000000100000000"],
    [(1n << 64n) - 1n, "1bffffffffffffffff"], [-1n, "20"], [-24n, "37"], [-25n, "3818"],
    [-(1n << 62n), "3b3fffffffffffffff"], [-(1n << 64n), "3bffffffffffffffff"],
  ];
  for (const [value, encoding] of cases) {
    assert.equal(toHex(encodeCbor(value)), encoding, `${value}`);
    assert.equal(decodeCbor(hex(encoding)), value);
  }
  assert.throws(() => encodeCbor(1n << 64n), InvalidParameter);
  assert.throws(() => encodeCbor(-(1n << 64n) - 1n), InvalidParameter);
});

test("strings, byte strings, arrays and maps round trip in the deterministic form", () => {
  const value = new Map([
    ["values", [1n, -1n]],
    ["t", "report"],
    ["v", 3n],
    ["bb", new Uint8Array([1, 2, 3])],
    ["é", "ü"],
    ["\ufeffbom", ""],
  ]);
  const encoded = encodeCbor(value);
  const decoded = decodeCbor(encoded);
  assert.deepEqual([...decoded.keys()], ["t", "v", "bb", "é", "values", "\ufeffbom"]); // shorter first, then bytewise
  assert.deepEqual(decoded, value);
  assert.equal(toHex(encodeCbor(new Map([["b", 1n], ["a", 2n]]))), "a2616102616201");
  // a leading byte order mark is kept, not stripped
  assert.equal(decodeCbor(hex("63efbbbf")), "\ufeff");
  assert.throws(() => encodeCbor("\ud800"), InvalidParameter); // a lone surrogate has no UTF-8 encoding
  assert.throws(() => encodeCbor(NaN), InvalidParameter);
  assert.throws(() => encodeCbor(Infinity), InvalidParameter);
  assert.throws(() => encodeCbor(null), InvalidParameter);
  assert.throws(() => encodeCbor(true), InvalidParameter);
  assert.throws(() => encodeCbor(new Map([[1, 2n]])), InvalidParameter);
  refuses("0000", "1 trailing bytes");
  assert.deepEqual(readCborItem(hex("0100ff")), { value: 1n, end: 1 });
});

/** The value of a binary16 pattern from its definition (an independent formula for the check). */
function halfByDefinition(bits) {
  const s = bits >> 15;
  const e = (bits >> 10) & 31;
  const m = bits & 1023;
  const magnitude = e === 0 ? (m / 1024) * Math.pow(2, -14) : (1 + m / 1024) * Math.pow(2, e - 15);
  return s ? -magnitude : magnitude;
}

test("half precision is exact over all 63,488 finite patterns, subnormals included", () => {
  let previous = -Infinity;
  for (let bits = 0; bits < 0x7c00; bits++) {
    const value = halfToNumber(bits);
    assert.ok(Object.is(value, halfByDefinition(bits)), `pattern ${bits.toString(16)}`);
    assert.ok(Object.is(halfToNumber(bits | 0x8000), -value));
    assert.equal(halfBitsOf(value), bits);
    assert.equal(halfBitsOf(-value), bits | 0x8000);
    assert.ok(value > previous, "increasing");
    if (bits > 0) {
      // the midpoint between neighbours is not a half: exactness, not rounding
      const mid = (previous + value) / 2;
      assert.equal(halfBitsOf(mid), undefined, `midpoint below ${bits.toString(16)}`);
    }
    previous = value;
    const encoded = encodeCbor(value);
    assert.equal(encoded.length, 3);
    assert.ok(Object.is(decodeCbor(encoded), value));
  }
  for (let bits = 0x7c00; bits < 0x8000; bits++) assert.ok(!Number.isFinite(halfToNumber(bits)));
  const known = [[1, "f93c00"], [65504, "f97bff"], [2 ** -24, "f90001"], [2 ** -14, "f90400"], [1023 * 2 ** -24, "f903ff"], [-2, "f9c000"], [0, "f90000"], [-0, "f98000"], [0.5, "f93800"]];
  for (const [value, encoding] of known) {
    assert.equal(toHex(encodeCbor(value)), encoding);
    assert.ok(Object.is(decodeCbor(hex(encoding)), value));
  }
  for (const value of [65505, 65520, 2 ** -25, 3 * 2 ** -25, 1 + 2 ** -11, 2049, 4097]) {
    assert.equal(halfBitsOf(value), undefined, `${value}`);
  }
});

test("floats take the shortest of half, single and double that holds them exactly (fixed-seed property)", () => {
  const rng = xorshift(0x5eed_f10a7n);
  const view = new DataView(new ArrayBuffer(8));
  const sample = () => {
    switch (rng.below(4)) {
      case 0: // any double bit pattern
        view.setBigUint64(0, rng.next64());
        return view.getFloat64(0);
      case 1: // any single
        view.setUint32(0, Number(rng.next64() >> 32n));
        return view.getFloat32(0);
      case 2: // any half
        return halfToNumber(rng.below(0x10000));
      default: // a small decimal, as a round spec carries
        return (rng.below(2_000_001) - 1_000_000) / 10 ** rng.below(7);
    }
  };
  let widths = { 3: 0, 5: 0, 9: 0 };
  for (let i = 0; i < 20000; i++) {
    const value = sample();
    if (!Number.isFinite(value)) continue;
    const encoded = encodeCbor(value);
    const expected = halfBitsOf(value) !== undefined ? 3 : Math.fround(value) === value ? 5 : 9;
    assert.equal(encoded.length, expected);
    widths[encoded.length] += 1;
    const decoded = decodeCbor(encoded);
    assert.ok(Object.is(decoded, value), `${value} -> ${decoded}`);
    // a wider form of the same value is refused
    if (encoded.length < 9) {
      const wide = new Uint8Array(9);
      wide[0] = 0xfb;
      new DataView(wide.buffer).setFloat64(1, value);
      refuses(wide, "shortest exact form");
    }
    if (encoded.length === 3) {
      const single = new Uint8Array(5);
      single[0] = 0xfa;
      new DataView(single.buffer).setFloat32(1, value);
      refuses(single, "shortest exact form");
    }
  }
  for (const width of [3, 5, 9]) assert.ok(widths[width] > 1000, `few floats of width ${width}`);
});

test("memory is bounded: the reference's allocation allowance is enforced", () => {
  // n one-byte strings cost 2 input bytes but ITEM_COST + 1 bytes of charge each
  const n = 60000;
  const data = new Uint8Array(3 + 2 * n);
  data.set([0x99, (n >> 8) & 0xff, n & 0xff]);
  for (let i = 0; i < n; i++) data[3 + 2 * i] = 0x41;
  const allowance = ALLOCATION_FACTOR * data.length + ALLOCATION_SLACK;
  assert.ok((n + 1) * ITEM_COST + n > allowance); // derived: the charge passes the allowance
  refuses(data, "expands past");
  // a few items fit
  const small = new Uint8Array([0x83, 0x41, 0, 0x41, 1, 0x41, 2]);
  assert.equal(decodeCbor(small).length, 3);
});

test("byte strings read from a Node Buffer are plain copies, never views of the input", () => {
  const input = Buffer.from("8243010203f93c00", "hex");
  const [bytes, one] = decodeCbor(input);
  assert.equal(Object.getPrototypeOf(bytes), Uint8Array.prototype);
  assert.deepEqual(bytes, new Uint8Array([1, 2, 3]));
  assert.equal(one, 1);
  bytes[0] = 9;
  assert.equal(input[2], 1);
  assert.throws(() => decodeCbor("8100"), MalformedMessage);
  assert.throws(() => decodeCbor([0x00]), MalformedMessage);
});

test("the reader takes at most one item per input byte", () => {
  const reader = new StrictReader(hex("a2617483010203617640"));
  reader.read();
  assert.equal(reader.pos, 10);
  assert.ok(reader.items <= 10);
  assert.equal(reader.items, 8);
});

test("fuzz: random and mutated inputs give a value or a typed error, nothing else", () => {
  const rng = xorshift(20261207n);
  const seeds = [
    "a2617402617603", "8181818100", "a3616100616201616302", "f93c00", "fb3fb999999999999a", "83000102",
    "a16176a2616180616240", "1bffffffffffffffff", "63efbbbf", "9a00000002410041ff",
  ].map(hex);
  let values = 0;
  let refusals = 0;
  for (let i = 0; i < 20000; i++) {
    let input;
    if (i % 2 === 0) {
      input = rng.bytes(rng.below(24));
    } else {
      const seed = seeds[rng.below(seeds.length)];
      input = seed.slice();
      const edits = 1 + rng.below(3);
      for (let k = 0; k < edits && input.length > 0; k++) {
        const at = rng.below(input.length);
        switch (rng.below(3)) {
          case 0: input[at] = rng.below(256); break;
          case 1: input[at] ^= 1 << rng.below(8); break;
          default: input = input.slice(0, at); break;
        }
      }
    }
    try {
      const value = decodeCbor(input, { maxItems: 8 });
      values += 1;
      // whatever decodes is deterministic: it re-encodes to the same bytes
      assert.equal(toHex(encodeCbor(value)), toHex(input));
    } catch (error) {
      if (!(error instanceof ShuffleDPError)) throw error;
      assert.ok(error instanceof MalformedMessage);
      refusals += 1;
    }
  }
  assert.ok(values > 500 && refusals > 5000, `${values} values, ${refusals} refusals`);
});
