// Unit tests of the vector and summation randomizers: shapes, report ranges, the shares'
// arithmetic (replayed exactly from the same seed) and typed refusals. The laws and the
// privacy loss against Python are in tests/js/test_js_vector_randomizers.py.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as coordinateTree from "../dist/mechanisms/coordinateTree.js";
import { encodeFixedPoint, floorMod, splitShares } from "../dist/mechanisms/fixedPoint.js";
import * as localVector from "../dist/mechanisms/localVector.js";
import * as modularSum from "../dist/mechanisms/modularSum.js";
import * as shiftedNorm from "../dist/mechanisms/shiftedNorm.js";
import {
  checkScalarSum,
  checkVectorSum,
  localVectorBound,
  messagesNeeded,
  skellamTail,
  splitDelta,
} from "../dist/mechanisms/summationParams.js";
import { inRange } from "../dist/mechanisms/valueRange.js";
import { euclideanNorm, pairwiseSum } from "../dist/mechanisms/vectorInput.js";
import * as vectorMean from "../dist/mechanisms/vectorMean.js";
import * as vectorRange from "../dist/mechanisms/vectorRange.js";
import * as vectorSum from "../dist/mechanisms/vectorSum.js";
import { polyaShares, skellamShares } from "../dist/random/distributedNoise.js";
import { SeededSource } from "../dist/random/source.js";
import { InvalidParameter } from "../dist/wire/errors.js";

const RANGE = { mechanism: "vector-range", low: -1, high: 1, tau: 0.125, dim: 3, rotationSeed: 11n, mode: "sampled" };
const PAPER = { ...RANGE, mode: "paper" };
const MEAN = { mechanism: "vector-mean", dim: 3, rotationSeed: 11n, lower: [-1, -1, -1, -1], upper: [1, 1, 1, 1], noise: "laplace", gridLevels: 16 };
const TREE = { mechanism: "coordinate-tree", low: -1, high: 1, tau: 0.125, dim: 3, rotationSeed: 11n };
const NORM = { mechanism: "shifted-norm", center: [0.5, -1, 2], low: -4, high: 4, tau: 0.5 };
const SUM = { mechanism: "modular-sum", lower: 0, upper: 1, precision: 8, modulus: 1000003n, messages: 3, users: 4, noise: "polya" };
const VSUM = { mechanism: "vector-sum", dim: 3, radius: 1, levels: 64, rotationSeed: 11n, modulus: 1000003n, messages: 3, users: 4, mu: 20, noise: "skellam" };
const SHIFTED = { ...VSUM, mechanism: "shifted-vector-sum", center: [0.1, 0.2, -0.3] };
const LOCAL = { mechanism: "local-vector", dim: 3, radius: 1, levels: 16, rotationSeed: 11n, mu: 10, center: [0.1, 0.2, -0.3] };

const CASES = [
  ["vector-range sampled", vectorRange, RANGE, 1, 0, 1],
  ["vector-range paper", vectorRange, PAPER, 2, 0, 4],
  ["vector-mean", vectorMean, MEAN, 1, 0, 1],
  ["coordinate-tree", coordinateTree, TREE, 1, 0, 1],
  ["shifted-norm", shiftedNorm, NORM, 1, 0, 1],
  ["vector-sum", vectorSum, VSUM, 1, 1e-6, 12],
  ["shifted-vector-sum", vectorSum, SHIFTED, 1, 1e-6, 12],
  ["local-vector", localVector, LOCAL, 1, 1e-6, 4],
];
const INPUTS = [
  [0.3, -0.2, 0.5],
  [0, 0, 0],
  [1e300, -1e300, 1e300],
  [-5e-324, 7, -3],
];

const refusal = (parameter) => (error) => error instanceof InvalidParameter && error.parameter === parameter;

for (const [name, module, params, eps, delta, messages] of CASES) {
  test(`${name}: ${messages} messages per user, every value in its report range`, () => {
    const source = new SeededSource(1);
    const ranges = module.reportRanges(params, eps, delta);
    for (const x of INPUTS) {
      for (let i = 0; i < 50; i++) {
        const reports = module.randomize(params, eps, delta, x, source);
        assert.equal(reports.length, messages);
        for (const report of reports) {
          assert.equal(report.length, ranges.length);
          report.forEach((value, j) => assert.ok(inRange(value, ranges[j]), `${name}: value ${j} = ${value} of ${x}`));
        }
      }
    }
  });

  test(`${name}: refuses data that are not a finite vector, typed`, () => {
    const source = new SeededSource(2);
    for (const bad of [[0.1, NaN, 0.2], [0.1, Infinity, 0.2], 0.5, ["0.1", 0.2, 0.3], [0.1, 0.2]]) {
      assert.throws(() => module.randomize(params, eps, delta, bad, source), InvalidParameter);
    }
  });
}

test("rotated coordinates past the largest double: refused by range and mean reports, clamped by the tree", () => {
  const x = [1.7e308, 1.7e308, 1.7e308];
  const source = new SeededSource(8);
  assert.throws(() => vectorRange.randomize(PAPER, 2, 0, x, source), refusal("local_means"));
  for (let i = 0; i < 20; i++) {
    const [[group, row, bit]] = coordinateTree.randomize(TREE, 1, 0, x, source);
    assert.ok(group >= 0n && group < 12n && row >= 0n && row < 8n && (bit === 1n || bit === -1n));
  }
  for (const module of [vectorSum, localVector]) {
    const params = module === vectorSum ? VSUM : LOCAL;
    assert.equal(module.randomize(params, 1, 1e-6, x, source).length, params === VSUM ? 12 : 4); // clipped first: no overflow
  }
});

test("vector-range paper: one report per rotated coordinate, in order", () => {
  const reports = vectorRange.randomize(PAPER, 2, 0, [0.3, -0.2, 0.5], new SeededSource(3));
  assert.deepEqual(reports.map((r) => r[0]), [0n, 1n, 2n, 3n]);
});

test("vector-sum: every coordinate's shares sum mod q to its encoding plus its Skellam share", () => {
  for (const params of [VSUM, SHIFTED]) {
    const x = [0.3, -0.2, 0.5];
    const reports = vectorSum.randomize(params, 1, 1e-6, x, new SeededSource(4));
    // replay the same draws: encoding, then the Skellam shares, then the split
    const replay = new SeededSource(4);
    const shifted = params.center ? vectorSum.shiftedVector(x, params.center, 3, 1) : x;
    const encoded = vectorSum.encodeVector(shifted, params, replay);
    const noise = skellamShares(params.mu, params.users, encoded.length, replay);
    for (let l = 0; l < encoded.length; l++) {
      const shares = reports.slice(l * 3, l * 3 + 3);
      assert.ok(shares.every((r) => r[0] === BigInt(l)));
      const total = shares.reduce((acc, r) => acc + r[1], 0n) % params.modulus;
      assert.equal(total, floorMod(encoded[l] + noise[l], params.modulus));
    }
  }
});

test("modular-sum: the shares sum mod q to the encoding plus the Pólya share", () => {
  for (const x of [0, 0.37, 1, -3, 12.5]) {
    const reports = modularSum.randomize(SUM, 1, 1e-6, x, new SeededSource(5));
    assert.equal(reports.length, 3);
    const replay = new SeededSource(5);
    const encoded = encodeFixedPoint(x, 0, 1, 8, replay);
    const [noise] = polyaShares(Math.exp(-1 / 8), 4, 1, replay);
    assert.ok(encoded >= 0n && encoded <= 8n);
    const total = reports.reduce((acc, r) => acc + r[0], 0n) % SUM.modulus;
    assert.equal(total, floorMod(encoded + noise, SUM.modulus));
  }
});

test("splitShares: M shares in [0, q) summing to the value mod q, for negative values and q near 2^62", () => {
  const source = new SeededSource(6);
  const q = (1n << 62n) - 57n;
  for (const v of [0n, -1n, 5n, -(1n << 61n), (1n << 63n) - 1n]) {
    const shares = splitShares(v, q, 5, source);
    assert.equal(shares.length, 5);
    assert.ok(shares.every((s) => s >= 0n && s < q));
    assert.equal(shares.reduce((a, b) => a + b, 0n) % q, floorMod(v, q));
  }
  assert.throws(() => splitShares(1n, 1n, 3, source), refusal("modulus"));
  assert.throws(() => splitShares(1n, (1n << 62n) + 1n, 3, source), refusal("modulus"));
});

test("encodeFixedPoint: clipped values encode deterministically, integers exactly", () => {
  const source = new SeededSource(7);
  assert.equal(encodeFixedPoint(-5, 0, 1, 8, source), 0n);
  assert.equal(encodeFixedPoint(7, 0, 1, 8, source), 8n);
  assert.equal(encodeFixedPoint(0.5, 0, 1, 8, source), 4n);
  assert.throws(() => encodeFixedPoint(NaN, 0, 1, 8, source), InvalidParameter);
});

test("clipToBall: inside unchanged, outside scaled to the radius, overflow-safe", () => {
  assert.deepEqual(vectorSum.clipToBall([0.3, -0.4], 1), [0.3, -0.4]);
  const out = vectorSum.clipToBall([3, 4], 1);
  assert.ok(Math.abs(out[0] - 0.6) < 1e-15 && Math.abs(out[1] - 0.8) < 1e-15);
  const huge = vectorSum.clipToBall([1e308, 1e308], 2);
  assert.ok(Math.abs(euclideanNorm(huge) - 2) < 1e-12);
  const shifted = vectorSum.shiftedVector([1e308, 0], [-1e308, 0], 2, 3);
  assert.ok(Math.abs(shifted[0] - 3) < 1e-12 && shifted[1] === 0);
});

test("shiftedLogNorm: zero distance is -Infinity, overflow +Infinity, else log2 of the norm", () => {
  assert.equal(shiftedNorm.shiftedLogNorm([1, 2], [1, 2]), -Infinity);
  assert.equal(shiftedNorm.shiftedLogNorm([1e308, 0], [-1e308, 0]), Infinity);
  assert.ok(Math.abs(shiftedNorm.shiftedLogNorm([3, 4], [0, 0]) - Math.log2(5)) < 1e-15);
  assert.throws(() => shiftedNorm.shiftedLogNorm([1, 2, 3], [0, 0]), refusal("vectors"));
});

test("pairwiseSum: numpy's blocked order (exact on integers) for short and long rows", () => {
  for (const n of [0, 1, 7, 8, 9, 128, 129, 1000]) {
    const a = Array.from({ length: n }, (_, i) => i + 1);
    assert.equal(pairwiseSum(a), (n * (n + 1)) / 2);
  }
});

test("split and mix: BBGN's example, 32-bit inputs of 10^4 parties at sigma 40, needs 12 messages", () => {
  assert.equal(messagesNeeded(10_000, 10_000n * 2n ** 32n, 40), 12);
  assert.equal(splitDelta(2, 12, 1000n, 1), Infinity);
});

test("checkScalarSum: refusals name their parameter", () => {
  const ok = { precision: 112, modulus: 228647n, messages: 9, users: 1000 };
  checkScalarSum(ok, 1, 1e-6);
  assert.throws(() => checkScalarSum(ok, 1, 0), refusal("delta0"));
  assert.throws(() => checkScalarSum({ ...ok, messages: 8 }, 1, 1e-6), refusal("messages"));
  assert.throws(() => checkScalarSum({ ...ok, modulus: 224000n }, 1, 1e-6), refusal("modulus"));
  assert.throws(() => checkScalarSum({ ...ok, users: 2, messages: 3 }, 1, 1e-6), refusal("users"));
  assert.throws(() => checkScalarSum({ ...ok, precision: 2 ** 40, modulus: 1n << 62n, messages: 20 }, 1e-6, 1e-6), refusal("precision"));
  assert.throws(() => modularSum.checkBudget({ ...SUM, ...ok }, 1, 0), refusal("delta0"));
});

test("checkVectorSum and the local Skellam check: refusals name their parameter", () => {
  assert.throws(() => checkVectorSum({ ...VSUM, messages: 2 }, 1, 1e-6), refusal("messages"));
  assert.throws(() => checkVectorSum(VSUM, 1, 0), refusal("delta0"));
  assert.throws(() => vectorSum.checkBudget({ ...VSUM, users: 1000, messages: 30 }, 1, 1e-6), refusal("mu"));
  assert.throws(() => localVector.checkBudget(LOCAL, 1, 1e-6), refusal("mu"));
  assert.throws(() => localVector.checkBudget({ ...LOCAL, mu: 1e9 }, 1, 0), refusal("delta0"));
  localVector.checkBudget({ ...LOCAL, mu: 1e6 }, 1, 1e-6);
});

test("pure mechanisms refuse delta0 > 0; paper mode refuses an epsilon0 / D below 1e-6", () => {
  for (const [module, params] of [[vectorRange, RANGE], [coordinateTree, TREE], [shiftedNorm, NORM]]) {
    module.checkBudget(params, 1, 0);
    assert.throws(() => module.checkBudget(params, 1, 1e-9), refusal("delta0"));
  }
  assert.throws(() => vectorRange.checkBudget(PAPER, 2e-6, 0), refusal("epsilon0"));
  assert.throws(() => vectorMean.checkBudget({ ...MEAN, noise: "gaussian" }, 1, 0), refusal("delta0"));
});

test("local-vector: values clamped to levels + 1 + the 2^-64 Skellam tail", () => {
  assert.equal(localVectorBound(16, 10), 17n + BigInt(skellamTail(10, 2 ** -64)));
  const [, values] = localVector.reportRanges(LOCAL, 1, 1e-6);
  assert.equal(values.high, -values.low);
});
