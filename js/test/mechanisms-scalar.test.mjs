// Unit tests of the scalar randomizers: ranges, refusals with typed errors, probabilities never
// above their exact values, determinism with SeededSource, and the Gaussian calibration.
// Run: cd js && npx tsc -p tsconfig.json && node --test test/mechanisms-scalar.test.mjs

import { test } from "node:test";
import assert from "node:assert/strict";

import { SeededSource } from "../dist/random/source.js";
import { floatToRational } from "../dist/random/exact.js";
import { InvalidParameter, ValueOutOfRange } from "../dist/wire/errors.js";
import * as hadamardRange from "../dist/mechanisms/hadamardRange.js";
import * as projectedMean from "../dist/mechanisms/projectedMean.js";
import { checkReportValues, valueRange } from "../dist/mechanisms/valueRange.js";
import { dyadicFloor, krrKeepProbability, randomizeKrr } from "../dist/mechanisms/krr.js";
import {
  hadamardResponseParams,
  hadamardResponseProbabilities,
  randomizeHadamardResponse,
} from "../dist/mechanisms/blockHadamard.js";
import {
  calibrateDiscreteGaussian,
  discreteGaussianDelta,
  erfc,
  pairwiseSum,
} from "../dist/mechanisms/gaussianCalibration.js";
import { hadamardEntry, nextPowerOfTwo, popcount } from "../dist/mechanisms/hadamard.js";

const HR = { mechanism: "hadamard-range", low: 0, high: 1, tau: 1 / 16 }; // 8 bins
const PM_LAPLACE = { mechanism: "projected-mean", lower: -1, upper: 3, noise: "laplace", gridLevels: 64 };
const PM_GAUSSIAN = { mechanism: "projected-mean", lower: -1, upper: 3, noise: "gaussian", gridLevels: 64 };

// ---------------------------------------------------------------------------------------------
// Exact arithmetic for the checks: exp(x) of a rational x in fixed point with 2^-400 resolution.
// Each Taylor term is truncated (error below 2^-400 each, fewer than 400 terms), so the value
// returned is within 2^-390 of exp(x); the callers take that margin on the unsafe side.

const FRAC = 400n;
const ONE = 1n << FRAC;
const SLACK = 1n << 10n; // 2^-390 in fixed point

/** floor(e^(num/den) 2^400) up to SLACK, for 0 <= num/den <= 40. */
function expFixed(num, den) {
  let term = ONE;
  let sum = ONE;
  for (let n = 1n; n < 400n; n++) {
    term = (term * num) / (den * n);
    if (term === 0n) break;
    sum += term;
  }
  return sum;
}

/** Exact rational of a double, as bigints. */
function rational(x) {
  const [n, d] = floatToRational(x);
  return [n, d];
}

// ---------------------------------------------------------------------------------------------
// Hadamard matrices

test("popcount, Hadamard entries and powers of two", () => {
  assert.equal(popcount(0), 0);
  assert.equal(popcount(0b1011), 3);
  assert.equal(popcount(2 ** 40 + 1), 2);
  // H_4 rows: ++++, +-+-, ++--, +--+
  const h4 = [0, 1, 2, 3].map((j) => [0, 1, 2, 3].map((v) => hadamardEntry(j, v)));
  assert.deepEqual(h4, [
    [1, 1, 1, 1],
    [1, -1, 1, -1],
    [1, 1, -1, -1],
    [1, -1, -1, 1],
  ]);
  assert.throws(() => hadamardEntry(-1, 0), InvalidParameter);
  assert.equal(nextPowerOfTwo(1), 1);
  assert.equal(nextPowerOfTwo(5), 8);
  assert.equal(nextPowerOfTwo(8), 8);
  assert.throws(() => nextPowerOfTwo(0), InvalidParameter);
});

// ---------------------------------------------------------------------------------------------
// Keep probabilities: never above the exact value, and within a few ulps of it

test("nextDown steps one double toward zero", () => {
  assert.equal(hadamardRange.nextDown(1), 1 - 2 ** -53);
  assert.equal(hadamardRange.nextDown(0.75), 0.75 - 2 ** -53);
  assert.equal(hadamardRange.nextDown(Number.MIN_VALUE), 0);
  assert.equal(hadamardRange.nextDown(2 ** -1022), 2 ** -1022 - Number.MIN_VALUE);
  assert.throws(() => hadamardRange.nextDown(0), InvalidParameter);
});

test("keepProbability <= e^eps / (e^eps + 1) exactly, and within 8 ulps of it", () => {
  for (const eps of [1e-6, 1e-3, 0.1, 0.5, 1, Math.LN2, 2, 4.5, 10, 20, 30]) {
    const p = hadamardRange.keepProbability(eps);
    const [en, ed] = rational(eps);
    const eUp = expFixed(en, ed) + SLACK; // >= e^eps
    const eLow = expFixed(en, ed) - SLACK; // <= e^eps
    const [pn, pd] = rational(p);
    // p <= e/(e+1)  <=>  p (e + 1) <= e  <=>  p <= e (1 - p); checked with e at its lower bound.
    assert.ok(pn * (eLow + ONE) <= eLow * pd, `eps ${eps}: p above the exact value`);
    // and not far below: p + 8 ulp(p) >= e/(e+1) (with e at its upper bound)
    const ulp = 2 ** (Math.floor(Math.log2(p)) - 52);
    const [qn, qd] = rational(p + 8 * ulp);
    assert.ok(qn * (eUp + ONE) >= eUp * qd, `eps ${eps}: p more than 8 ulps below the exact value`);
  }
  assert.throws(() => hadamardRange.keepProbability(0), InvalidParameter);
  assert.throws(() => hadamardRange.keepProbability(31), InvalidParameter);
  assert.throws(() => hadamardRange.keepProbability(Number.NaN), InvalidParameter);
});

test("k-RR keep probability <= e^eps / (e^eps + k - 1) exactly, a multiple of 2^-53", () => {
  for (const [k, eps] of [[2, 0.5], [8, 1], [8, 2], [100, 3.3], [1000, 0.01], [5, 29]]) {
    const p = krrKeepProbability(k, eps);
    assert.equal(Math.floor(p * 2 ** 53), p * 2 ** 53);
    const [en, ed] = rational(eps);
    const eLow = expFixed(en, ed) - SLACK;
    const [pn, pd] = rational(p);
    assert.ok(pn * (eLow + BigInt(k - 1) * ONE) <= eLow * pd, `k ${k}, eps ${eps}`);
    assert.ok(p * k > 1);
  }
  assert.throws(() => krrKeepProbability(1, 1), InvalidParameter);
  assert.throws(() => krrKeepProbability(8, 1e-17), InvalidParameter);
  assert.throws(() => krrKeepProbability(8, -1), InvalidParameter);
  assert.equal(dyadicFloor(0.5), 0.5 - 2 ** -49); // 0.5 (1 - 2^-48) is 16 ulps of 2^-53 below 0.5
});

test("block Hadamard response: t <= (e^eps - 1) / (e^eps - 1 + 2B) exactly; p_in / p_out <= e^eps", () => {
  for (const [k, eps, blocks] of [[8, 3, undefined], [8, 3, 2], [100, 1, undefined], [64, 0.5, 1], [10, 8, undefined]]) {
    const params = hadamardResponseParams(k, eps, blocks);
    const t = params.informativeProbability;
    const [en, ed] = rational(eps);
    const aLow = expFixed(en, ed) - SLACK - ONE; // <= e^eps - 1
    const [tn, td] = rational(t);
    // t (a + 2B) <= a
    assert.ok(tn * (aLow + 2n * BigInt(params.blocks) * ONE) <= aLow * td, `k ${k} eps ${eps}`);
    assert.ok(params.blockSize > Math.ceil(k / params.blocks));
    assert.equal(params.outputSize, params.blocks * params.blockSize);
    const [pIn, pOut] = hadamardResponseProbabilities(params);
    assert.ok(Math.abs(params.setSize * pIn + (params.outputSize - params.setSize) * pOut - 1) < 1e-12);
  }
  assert.throws(() => hadamardResponseParams(8, 1, 9), InvalidParameter);
  assert.throws(() => hadamardResponseParams(8, 1, 0), InvalidParameter);
  assert.throws(() => hadamardResponseParams(1, 1), InvalidParameter);
});

// ---------------------------------------------------------------------------------------------
// Ranges

test("hadamard-range: bins, ranges and reports inside them", () => {
  assert.equal(hadamardRange.numBins(HR), 8);
  assert.equal(hadamardRange.numBins({ low: 0, high: 1, tau: 0.1 }), 5);
  assert.equal(hadamardRange.paddedBins({ low: 0, high: 1, tau: 0.1 }), 8);
  assert.equal(hadamardRange.binIndexOne(-5, HR), 0);
  assert.equal(hadamardRange.binIndexOne(5, HR), 7);
  assert.equal(hadamardRange.binIndexOne(1, HR), 7);
  assert.equal(hadamardRange.binIndexOne(0.13, HR), 1);
  const ranges = hadamardRange.reportRanges(HR, 1, 0);
  assert.deepEqual(ranges, [valueRange(0n, 7n), valueRange(-1n, 1n, 2n)]);
  const source = new SeededSource(1);
  for (let i = 0; i < 2000; i++) {
    const [message] = hadamardRange.randomize(HR, 1, 0, (i % 13) / 10 - 0.1, source);
    checkReportValues(message, ranges);
  }
});

test("projected-mean: report ranges are [-B, G + B] with B the 2^-40 tail bound", () => {
  const tail = 41 * Math.log(2);
  // Laplace: B = ceil((G / eps) 41 ln 2)
  assert.deepEqual(projectedMean.gridReportRange(64, "laplace", 1, 0), [-BigInt(Math.ceil(64 * tail)), 64n + BigInt(Math.ceil(64 * tail))]);
  assert.deepEqual(projectedMean.gridReportRange(4096, "laplace", 0.5, 0)[0], -BigInt(Math.ceil(8192 * tail)));
  // Gaussian: B = ceil(sqrt(2 sigma2 41 ln 2)) with the calibrated sigma2
  const sigma2 = projectedMean.gaussianSigma2(1, 1e-6, 64);
  assert.deepEqual(projectedMean.gridReportRange(64, "gaussian", 1, 1e-6), [
    -BigInt(Math.ceil(Math.sqrt(sigma2 * 2 * tail))),
    64n + BigInt(Math.ceil(Math.sqrt(sigma2 * 2 * tail))),
  ]);
  for (const params of [PM_LAPLACE, PM_GAUSSIAN]) {
    const delta = params.noise === "gaussian" ? 1e-6 : 0;
    const ranges = projectedMean.reportRanges(params, 1, delta);
    const source = new SeededSource(2);
    for (let i = 0; i < 300; i++) {
      const [message] = projectedMean.randomize(params, 1, delta, i / 50 - 2, source);
      checkReportValues(message, ranges);
    }
  }
});

test("projected-mean: the grid projection", () => {
  // [-1, 3] in 64 steps of 1/16
  assert.deepEqual(projectedMean.toGridOne(-7, -1, 3, 64), [0, 0]);
  assert.deepEqual(projectedMean.toGridOne(9, -1, 3, 64), [64, 0]);
  assert.deepEqual(projectedMean.toGridOne(0, -1, 3, 64), [16, 0]);
  assert.deepEqual(projectedMean.toGridOne(0.03125, -1, 3, 64), [16, 0.5]);
  // Laplace scale G / eps as an exact reduced rational
  assert.deepEqual(projectedMean.laplaceScale(64, 0.5), [128n, 1n]);
  assert.deepEqual(projectedMean.laplaceScale(3, 0.75), [4n, 1n]);
  const [n, d] = projectedMean.laplaceScale(10, 0.1); // 10 / Fraction(0.1)
  const [en, ed] = rational(0.1);
  assert.equal(n * en, 10n * ed * d);
});

test("checkReportValues refuses values out of range with ValueOutOfRange", () => {
  const ranges = [valueRange(0n, 7n), valueRange(-1n, 1n, 2n)];
  checkReportValues([3n, -1n], ranges);
  assert.throws(() => checkReportValues([8n, 1n], ranges), ValueOutOfRange);
  assert.throws(() => checkReportValues([3n, 0n], ranges), ValueOutOfRange);
  assert.throws(() => checkReportValues([3n], ranges), ValueOutOfRange);
  assert.throws(() => checkReportValues([3n, 1], ranges), ValueOutOfRange);
});

// ---------------------------------------------------------------------------------------------
// Refusals

test("randomizers refuse bad input and bad parameters with InvalidParameter", () => {
  const source = new SeededSource(3);
  for (const bad of [Number.NaN, Infinity, -Infinity, "1", [1]]) {
    assert.throws(() => hadamardRange.randomize(HR, 1, 0, bad, source), InvalidParameter);
    assert.throws(() => projectedMean.randomize(PM_LAPLACE, 1, 0, bad, source), InvalidParameter);
  }
  assert.throws(() => hadamardRange.randomize(HR, 0, 0, 0.5, source), InvalidParameter);
  assert.throws(() => projectedMean.randomize(PM_GAUSSIAN, 1, 0, 0.5, source), InvalidParameter);
  assert.throws(() => projectedMean.randomize({ ...PM_LAPLACE, noise: "cauchy" }, 1, 0, 0.5, source), InvalidParameter);
  assert.throws(() => projectedMean.randomize({ ...PM_LAPLACE, gridLevels: 0 }, 1, 0, 0.5, source), InvalidParameter);
  assert.throws(() => randomizeKrr(8, 8, 1, source), InvalidParameter);
  assert.throws(() => randomizeKrr(1.5, 8, 1, source), InvalidParameter);
  assert.throws(() => randomizeHadamardResponse(-1, hadamardResponseParams(8, 1), source), InvalidParameter);
});

test("budget rules refuse what Python's check_budget refuses", () => {
  // hadamard-range: pure
  hadamardRange.checkBudget(HR, 1, 0);
  assert.throws(() => hadamardRange.checkBudget(HR, 1, 1e-6), InvalidParameter);
  // projected-mean: delta0 > 0 exactly when Gaussian
  projectedMean.checkBudget(PM_LAPLACE, 1, 0);
  projectedMean.checkBudget(PM_GAUSSIAN, 1, 1e-6);
  assert.throws(() => projectedMean.checkBudget(PM_LAPLACE, 1, 1e-6), InvalidParameter);
  assert.throws(() => projectedMean.checkBudget(PM_GAUSSIAN, 1, 0), InvalidParameter);
  // the common range of epsilon0 and delta0
  assert.throws(() => projectedMean.checkBudget(PM_LAPLACE, 1e-7, 0), InvalidParameter);
  assert.throws(() => projectedMean.checkBudget(PM_LAPLACE, 31, 0), InvalidParameter);
  assert.throws(() => projectedMean.checkBudget(PM_GAUSSIAN, 1, 1), InvalidParameter);
  assert.throws(() => projectedMean.checkBudget(PM_LAPLACE, Number.NaN, 0), InvalidParameter);
  // noise scale above 2^44 grid units: Laplace G / eps = 2^24 / 1e-6 ~ 1.7e13 < 2^44 passes,
  // Gaussian at the same (G, eps) needs a larger scale and is refused
  const wide = { ...PM_LAPLACE, gridLevels: 2 ** 24 };
  projectedMean.checkBudget(wide, 1e-6, 0);
  assert.throws(() => projectedMean.checkBudget({ ...wide, noise: "gaussian" }, 1e-6, 1e-6), InvalidParameter);
  // decoded reports whose sum over 2^24 reports overflows a double
  assert.throws(() => projectedMean.checkBudget({ ...PM_LAPLACE, lower: -1e300, upper: 1e300 }, 1, 0), InvalidParameter);
});

// ---------------------------------------------------------------------------------------------
// Determinism

test("SeededSource: the same seed gives the same reports, another seed other reports", () => {
  const run = (seed) => {
    const source = new SeededSource(seed);
    const out = [];
    for (let i = 0; i < 50; i++) {
      out.push(...hadamardRange.randomize(HR, 1, 0, i / 50, source).flat());
      out.push(...projectedMean.randomize(PM_LAPLACE, 1, 0, i / 20, source).flat());
      out.push(...projectedMean.randomize(PM_GAUSSIAN, 2, 1e-6, i / 20, source).flat());
      out.push(BigInt(randomizeKrr(i % 8, 8, 1, source)));
      out.push(BigInt(randomizeHadamardResponse(i % 8, hadamardResponseParams(8, 3), source)));
    }
    return out;
  };
  assert.deepEqual(run(7), run(7));
  assert.notDeepEqual(run(7), run(8));
});

// ---------------------------------------------------------------------------------------------
// Gaussian calibration

test("erfc matches reference values to 1e-15 relative", () => {
  // Standard values of the complementary error function (e.g. Abramowitz & Stegun, Table 7.1).
  const reference = [
    [0, 1],
    [0.25, 0.7236736098317631],
    [0.5, 0.4795001221869535],
    [1, 0.15729920705028513],
    [-1, 1.8427007929497148],
    [2, 0.004677734981047266],
    [3, 2.209049699858544e-5],
    [5, 1.5374597944280349e-12],
    [10, 2.088487583762545e-45],
  ];
  for (const [x, value] of reference) {
    assert.ok(Math.abs(erfc(x) - value) <= 1e-15 * value, `erfc(${x}) = ${erfc(x)}, expected ${value}`);
  }
});

test("pairwiseSum adds exactly where every partial sum is exact", () => {
  for (const n of [0, 1, 7, 8, 9, 128, 129, 1000, 4097]) {
    const a = Float64Array.from({ length: n }, (_, i) => (i % 17) - 5);
    let plain = 0;
    for (const v of a) plain += v;
    assert.equal(pairwiseSum(a), plain);
  }
});

test("calibrated sigma2 meets delta and is minimal to 1e-10 relative", () => {
  for (const [eps, delta, sens] of [[1, 1e-6, 1], [1, 1e-6, 64], [0.5, 1e-9, 16], [4, 1e-3, 4096], [2, 1e-6, 2 ** 20]]) {
    const sigma2 = calibrateDiscreteGaussian(eps, delta, sens);
    assert.ok(discreteGaussianDelta(sigma2, eps, sens) <= delta);
    // the bracket's lower end, within 1e-10 of the result, failed; below it delta only grows
    assert.ok(discreteGaussianDelta(sigma2 * (1 - 2e-10), eps, sens) > delta);
    // the right order of magnitude: above the sensitivity scale, below 100x the classical Dwork-Roth variance
    assert.ok(sigma2 > 0.1 * sens * sens && sigma2 < 100 * sens * sens * Math.log(1.25 / delta) / (eps * eps));
  }
  assert.throws(() => calibrateDiscreteGaussian(1, 0, 1), InvalidParameter);
  assert.throws(() => calibrateDiscreteGaussian(1, 1e-6, 0), InvalidParameter);
  assert.throws(() => discreteGaussianDelta(-1, 1, 1), InvalidParameter);
});

// ---------------------------------------------------------------------------------------------
// Dispatch

test("index dispatches on the mechanism; budget.ts applies the common range and the mechanism's rules", async () => {
  const { randomizeRound, reportRanges, randomizeChecked } = await import("../dist/mechanisms/index.js");
  const { checkMechanismBudget } = await import("../dist/mechanisms/budget.js");
  const spec = { params: HR, epsilon0: 1, delta0: 0 };
  assert.deepEqual(randomizeRound(spec, 0.3, new SeededSource(5)), hadamardRange.randomize(HR, 1, 0, 0.3, new SeededSource(5)));
  assert.deepEqual(reportRanges(spec), hadamardRange.reportRanges(HR, 1, 0));
  const pm = { params: PM_GAUSSIAN, epsilon0: 1, delta0: 1e-6 };
  assert.deepEqual(randomizeChecked(pm, 0.3, new SeededSource(6)), projectedMean.randomize(PM_GAUSSIAN, 1, 1e-6, 0.3, new SeededSource(6)));
  assert.deepEqual(reportRanges(pm), projectedMean.reportRanges(PM_GAUSSIAN, 1, 1e-6));
  assert.throws(() => randomizeRound({ params: { mechanism: "nope" }, epsilon0: 1, delta0: 0 }, 0, new SeededSource(1)), InvalidParameter);
  checkMechanismBudget(HR, 1, 0);
  checkMechanismBudget(PM_GAUSSIAN, 1, 1e-6);
  assert.throws(() => checkMechanismBudget(HR, 1, 1e-6), InvalidParameter);
  assert.throws(() => checkMechanismBudget(HR, 0, 0), InvalidParameter);
  assert.throws(() => checkMechanismBudget(PM_LAPLACE, 1, -0.5), InvalidParameter);
  assert.throws(() => checkMechanismBudget({ mechanism: "nope" }, 1, 0), InvalidParameter);
});
