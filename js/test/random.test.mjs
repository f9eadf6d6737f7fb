// Tests of the randomness layer: sources, exact rationals, CKS20 samplers, distributed noise
// and the numpy-compatible rotation signs. Statistical checks use SeededSource with fixed
// seeds (so a run is reproducible) and a 5-standard-error criterion: for a correct sampler
// and a fresh seed such a check fails with probability below 6e-7 (normal approximation).
// The laws themselves are tested against their exact pmf by tests/js/test_js_samplers.py.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { SeededSource, SystemSource, WordSource } from "../dist/random/source.js";
import {
  bernoulliExpNeg,
  ceilDiv,
  compareRational,
  discreteGaussianExact,
  discreteLaplaceExact,
  floatToRational,
  floorDiv,
  gcd,
  isqrt,
  MAX_NOISE_SCALE,
  reduce,
} from "../dist/random/exact.js";
import {
  DEVICE_MAX_MEAN,
  discreteLaplaceVariance,
  gammaVariate,
  geometricHalf,
  negativeBinomial,
  poissonExact,
  polyaShares,
  skellamShares,
} from "../dist/random/distributedNoise.js";
import { fwht, nextPowerOfTwo, RandomRotation, rotationSigns } from "../dist/random/numpyRotationSigns.js";
import { InvalidParameter } from "../dist/wire/errors.js";

const isInvalid = (err) => err instanceof InvalidParameter && err.reason === "invalid-parameter";

/** A source that replays given 32-bit words (then fails), to pin down exactly which bits are used. */
class ScriptedSource extends WordSource {
  secure = false;
  constructor(words) {
    super();
    this.words = [...words];
  }
  fillWords(out) {
    // WordSource refills 256 words at a time; supply the script, then a marker that fails loudly.
    for (let i = 0; i < out.length; i++) {
      if (this.words.length === 0) throw new Error("script exhausted");
      out[i] = this.words.shift();
    }
  }
}
const scripted = (words) => new ScriptedSource([...words, ...new Array(256 * 4).fill(0xdeadbeef)]);

function meanAndVariance(values) {
  let s = 0;
  let s2 = 0;
  for (const v of values) {
    s += v;
    s2 += v * v;
  }
  const m = s / values.length;
  return [m, s2 / values.length - m * m];
}

/** |observed mean - expected| <= 5 standard errors, with the variance known from theory. */
function assertMeanWithin5SE(values, expectedMean, variance, what) {
  const [m] = meanAndVariance(values);
  const se = Math.sqrt(variance / values.length);
  assert.ok(Math.abs(m - expectedMean) <= 5 * se, `${what}: mean ${m}, expected ${expectedMean} +- ${5 * se}`);
}

// ------------------------------------------------------------------------------------------
// No Math.random anywhere in the sources
// ------------------------------------------------------------------------------------------

test("no source file calls Math.random", () => {
  const root = fileURLToPath(new URL("../src/", import.meta.url));
  const offenders = [];
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else if (/\.(ts|js|mjs)$/.test(name) && /Math\s*\.\s*random/.test(readFileSync(path, "utf8"))) offenders.push(path);
    }
  };
  walk(root);
  assert.deepEqual(offenders, []);
});

// ------------------------------------------------------------------------------------------
// Exact rationals
// ------------------------------------------------------------------------------------------

test("floatToRational is the exact binary value (Python's Fraction(x))", () => {
  assert.deepEqual(floatToRational(0.5), [1n, 2n]);
  assert.deepEqual(floatToRational(-3), [-3n, 1n]);
  assert.deepEqual(floatToRational(0), [0n, 1n]);
  assert.deepEqual(floatToRational(-0), [0n, 1n]);
  // 0.1 = 0x3FB999999999999A: significand 0x1999999999999A = 7205759403792794 times 2^-56,
  // reduced by 2.
  assert.deepEqual(floatToRational(0.1), [3602879701896397n, 1n << 55n]);
  assert.deepEqual(floatToRational(Number.MIN_VALUE), [1n, 1n << 1074n]);
  assert.deepEqual(floatToRational(2 ** 60), [1n << 60n, 1n]);
  const [mn, md] = floatToRational(Number.MAX_VALUE);
  assert.equal(md, 1n);
  assert.equal(mn, ((1n << 53n) - 1n) << 971n);
  // Round trip and lowest terms on many doubles of every magnitude.
  const src = new SeededSource(11n);
  const view = new DataView(new ArrayBuffer(8));
  for (let i = 0; i < 2000; i++) {
    view.setUint32(0, src.integer(2 ** 32));
    view.setUint32(4, src.integer(2 ** 32));
    const x = view.getFloat64(0);
    if (!Number.isFinite(x)) continue;
    const [num, den] = floatToRational(x);
    assert.equal(den & (den - 1n), 0n, "denominator is a power of two");
    assert.equal(gcd(num, den), num === 0n ? den : 1n);
    // num / den is exact: check num = x * den by rescaling with the exact power of two.
    const e = den.toString(2).length - 1;
    assert.equal(Number(num) * 2 ** -Math.min(e, 1000) * 2 ** -Math.max(0, e - 1000), x);
  }
  for (const bad of [NaN, Infinity, -Infinity]) assert.throws(() => floatToRational(bad), isInvalid);
});

test("rational arithmetic on bigint pairs", () => {
  assert.deepEqual(reduce(6n, -4n), [-3n, 2n]);
  assert.equal(floorDiv(-7n, 2n), -4n);
  assert.equal(floorDiv(7n, 2n), 3n);
  assert.equal(ceilDiv(7n, 2n), 4n);
  assert.equal(ceilDiv(-7n, 2n), -3n);
  assert.equal(compareRational([1n, 3n], [2n, 6n]), 0);
  assert.equal(compareRational([1n, 3n], [1n, 2n]), -1);
  for (const n of [0n, 1n, 2n, 3n, 4n, 15n, 16n, 17n, (1n << 100n) - 1n, 1n << 100n, 10n ** 40n + 7n]) {
    const r = isqrt(n);
    assert.ok(r * r <= n && (r + 1n) * (r + 1n) > n, `isqrt(${n})`);
  }
  assert.throws(() => reduce(1n, 0n), isInvalid);
});

// ------------------------------------------------------------------------------------------
// Sources: primitives
// ------------------------------------------------------------------------------------------

test("SeededSource is deterministic and seeds differ", () => {
  const draws = (seed) => {
    const s = new SeededSource(seed);
    return [s.integer(1000), s.integer(10n ** 30n), s.discreteLaplace(5n, 2n), s.discreteGaussian(7n, 3n), s.bernoulli(0.5), [...s.randomBytes(9)]];
  };
  assert.deepEqual(draws(42n), draws(42));
  assert.deepEqual(draws(2n ** 64n - 1n), draws(2n ** 64n - 1n));
  assert.notDeepEqual(draws(1n), draws(2n));
  assert.equal(new SeededSource(0).secure, false);
  assert.equal(new SystemSource().secure, true);
  for (const bad of [-1, 1.5, -1n, 2n ** 64n, "1"]) assert.throws(() => new SeededSource(bad), isInvalid);
});

test("integer: ranges, types and refusals", () => {
  for (const src of [new SystemSource(), new SeededSource(3)]) {
    for (const high of [1, 2, 3, 7, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 53]) {
      for (let i = 0; i < 200; i++) {
        const v = src.integer(high);
        assert.equal(typeof v, "number");
        assert.ok(Number.isInteger(v) && v >= 0 && v < high, `${v} in [0, ${high})`);
      }
    }
    for (const high of [1n, 2n, 5n, 2n ** 53n, 2n ** 53n + 1n, 2n ** 200n + 3n]) {
      for (let i = 0; i < 200; i++) {
        const v = src.integer(high);
        assert.equal(typeof v, "bigint");
        assert.ok(v >= 0n && v < high);
      }
    }
    for (const bad of [0, -1, 1.5, NaN, Infinity, 2 ** 53 + 2, 0n, -5n, "3"]) {
      assert.throws(() => src.integer(bad), isInvalid, String(bad));
    }
  }
  // Large bigint ranges are uniform: the top bit of a draw on [0, 2^200 + 3) is set with
  // probability ~ 1/2 (3/2^200 off), standard error 1/(2 sqrt(n)).
  const src = new SeededSource(9);
  const top = [];
  for (let i = 0; i < 4000; i++) top.push(src.integer(2n ** 200n + 3n) >= 2n ** 199n ? 1 : 0);
  assertMeanWithin5SE(top, 0.5, 0.25, "top bit");
  // Number ranges: mean of uniform {0..6} is 3, variance 4.
  const small = [];
  for (let i = 0; i < 20000; i++) small.push(src.integer(7));
  assertMeanWithin5SE(small, 3, 4, "integer(7)");
});

test("integer uses the top bits of a word and rejects exactly the values >= high", () => {
  // high = 3: bit length of 2 is 2, so a word gives its top two bits; 3 (binary 11) is rejected.
  const src = scripted([0xffffffff, 0x80000000]);
  assert.equal(src.integer(3), 2);
  // high = 2^53: 21 top bits of the first word, then a full word.
  const big = scripted([0xffffffff, 0xffffffff]);
  assert.equal(big.integer(2 ** 53), 2 ** 53 - 1);
});

test("bernoulli realises floor(p 2^53) / 2^53 with 53 bits", () => {
  // U = 0 (both words zero) is below the threshold 1 of p = 2^-53, and of nothing smaller.
  assert.equal(scripted([0, 0]).bernoulli(2 ** -53), true);
  assert.equal(scripted([0, 0]).bernoulli(2 ** -54), false); // floor(2^-54 2^53) = 0
  assert.equal(scripted([0, 0]).bernoulli(0), false);
  // U = 2^53 - 1 (all ones) is below floor(p 2^53) only for p = 1.
  assert.equal(scripted([0xffffffff, 0xffffffff]).bernoulli(1 - 2 ** -53), false);
  assert.equal(scripted([0xffffffff, 0xffffffff]).bernoulli(1), true);
  // U = 2^52 exactly: the 21 top bits of the first word are 1 followed by zeros.
  assert.equal(scripted([0x80000000, 0]).bernoulli(0.5), false);
  assert.equal(scripted([0x7fffffff, 0xffffffff]).bernoulli(0.5), true);
  const src = new SeededSource(5);
  for (let i = 0; i < 1000; i++) {
    assert.equal(src.bernoulli(0), false);
    assert.equal(src.bernoulli(1), true);
  }
  const flips = [];
  for (let i = 0; i < 20000; i++) flips.push(src.bernoulli(0.3) ? 1 : 0);
  assertMeanWithin5SE(flips, 0.3, 0.21, "bernoulli(0.3)");
  for (const bad of [-0.1, 1.1, NaN, Infinity, "0.5", 0n]) assert.throws(() => src.bernoulli(bad), isInvalid);
});

test("bernoulliRational is exact and refuses non-probabilities", () => {
  const src = new SeededSource(6);
  for (let i = 0; i < 500; i++) {
    assert.equal(src.bernoulliRational(0n, 7n), false);
    assert.equal(src.bernoulliRational(7n, 7n), true);
  }
  const flips = [];
  for (let i = 0; i < 20000; i++) flips.push(src.bernoulliRational(2n, 7n) ? 1 : 0);
  assertMeanWithin5SE(flips, 2 / 7, (2 / 7) * (5 / 7), "bernoulliRational(2/7)");
  for (const [n, d] of [[-1n, 2n], [3n, 2n], [1n, 0n], [1n, -2n], [1, 2]]) {
    assert.throws(() => src.bernoulliRational(n, d), isInvalid);
  }
});

test("randomBytes", () => {
  for (const src of [new SystemSource(), new SeededSource(8)]) {
    for (const n of [0, 1, 3, 4, 5, 70000]) assert.equal(src.randomBytes(n).length, n);
    for (const bad of [-1, 1.5, NaN]) assert.throws(() => src.randomBytes(bad), isInvalid);
  }
  // 100k bytes: each bit is set with probability 1/2; mean of bit 0 within 5 SE.
  const bytes = new SystemSource().randomBytes(100000);
  assertMeanWithin5SE(Array.from(bytes, (b) => b & 1), 0.5, 0.25, "low bits");
});

// ------------------------------------------------------------------------------------------
// CKS20 samplers
// ------------------------------------------------------------------------------------------

test("CKS20 Algorithm 1: Bernoulli(exp(-gamma)) in both branches", () => {
  const src = new SeededSource(21);
  for (const [num, den] of [[0n, 1n], [1n, 2n], [1n, 1n], [5n, 2n]]) {
    const p = Math.exp(-Number(num) / Number(den));
    const flips = [];
    for (let i = 0; i < 20000; i++) flips.push(bernoulliExpNeg(num, den, src) ? 1 : 0);
    if (num === 0n) assert.ok(flips.every((f) => f === 1));
    else assertMeanWithin5SE(flips, p, p * (1 - p), `exp(-${num}/${den})`);
  }
});

test("discrete Laplace: symmetric, variance 2q/(1-q)^2, integer scale division", () => {
  const src = new SeededSource(22);
  // scale 7/3: q = exp(-3/7). Var = 2q/(1-q)^2; the mean's standard error uses it.
  const q = Math.exp(-3 / 7);
  const variance = (2 * q) / (1 - q) ** 2;
  const draws = [];
  for (let i = 0; i < 20000; i++) draws.push(Number(src.discreteLaplace(14n, 6n)));
  assertMeanWithin5SE(draws, 0, variance, "DLap mean");
  // The squared draws: E[K^2] = variance; Var[K^2] = E[K^4] - variance^2, from the pmf.
  let m4 = 0;
  for (let k = -400; k <= 400; k++) m4 += ((1 - q) / (1 + q)) * q ** Math.abs(k) * k ** 4;
  assertMeanWithin5SE(draws.map((k) => k * k), variance, m4 - variance ** 2, "DLap variance");
  assert.ok(draws.every((k) => Number.isInteger(k)));
});

test("discrete Gaussian: mean 0 and variance within 5 SE of the exact law's", () => {
  const src = new SeededSource(23);
  for (const [num, den] of [[1n, 10n], [9n, 2n], [1000n, 1n]]) {
    const s2 = Number(num) / Number(den);
    let z = 0, m2 = 0, m4 = 0;
    const r = Math.ceil(40 * Math.sqrt(s2)) + 10;
    for (let k = -r; k <= r; k++) {
      const w = Math.exp(-(k * k) / (2 * s2));
      z += w;
      m2 += w * k * k;
      m4 += w * k ** 4;
    }
    m2 /= z;
    m4 /= z;
    const draws = [];
    for (let i = 0; i < 10000; i++) draws.push(Number(src.discreteGaussian(num, den)));
    assertMeanWithin5SE(draws, 0, m2, `DG(${s2}) mean`);
    assertMeanWithin5SE(draws.map((k) => k * k), m2, m4 - m2 * m2, `DG(${s2}) second moment`);
  }
});

test("noise samplers refuse bad parameters and scales above MAX_NOISE_SCALE", () => {
  const src = new SeededSource(24);
  assert.equal(MAX_NOISE_SCALE, 2 ** 44);
  const limit = 1n << 44n;
  for (const [n, d] of [[0n, 1n], [-1n, 1n], [1n, 0n], [limit + 1n, 1n], [1, 1n], [1n, 1]]) {
    assert.throws(() => src.discreteLaplace(n, d), isInvalid, `${n}/${d}`);
  }
  for (const [n, d] of [[0n, 1n], [-3n, 2n], [1n, 0n], [limit * limit + 1n, 1n]]) {
    assert.throws(() => src.discreteGaussian(n, d), isInvalid, `${n}/${d}`);
  }
  // A negative denominator is a sign, not an error, when the value is positive.
  assert.equal(typeof src.discreteLaplace(-3n, -2n), "bigint");
  // The largest scales are accepted and draw quickly.
  assert.equal(typeof src.discreteLaplace(limit, 1n), "bigint");
  assert.equal(typeof src.discreteGaussian(limit * limit, 1n), "bigint");
  assert.equal(typeof discreteLaplaceExact(3n, 1n, src), "bigint");
  assert.equal(typeof discreteGaussianExact(3n, 1n, src), "bigint");
});

// ------------------------------------------------------------------------------------------
// Distributed noise
// ------------------------------------------------------------------------------------------

test("geometricHalf counts trailing zero bits across words", () => {
  assert.equal(geometricHalf(scripted([1])), 0);
  assert.equal(geometricHalf(scripted([0b1000])), 3);
  assert.equal(geometricHalf(scripted([0, 0b100])), 34);
});

test("exact Poisson: mean lam for integer and fractional lam", () => {
  const src = new SeededSource(31);
  for (const lam of [[0n, 1n], [3n, 4n], [2n, 1n], [7n, 3n]]) {
    const mean = Number(lam[0]) / Number(lam[1]);
    const draws = [];
    for (let i = 0; i < 10000; i++) draws.push(Number(poissonExact(lam, src)));
    if (mean === 0) assert.ok(draws.every((d) => d === 0));
    else assertMeanWithin5SE(draws, mean, mean, `Poisson(${mean})`);
  }
});

test("gamma variates: mean shape * scale in all three branches", () => {
  const src = new SeededSource(32);
  for (const shape of [0.25, 1, 3.5]) {
    const draws = [];
    for (let i = 0; i < 10000; i++) draws.push(gammaVariate(shape, 2, src));
    assert.ok(draws.every((x) => x >= 0));
    assertMeanWithin5SE(draws, shape * 2, shape * 4, `Gamma(${shape}, 2)`);
  }
});

test("negative binomial uses the success-probability convention", () => {
  // NB(r = 2, p = 0.25): failures before 2 successes; mean r(1-p)/p = 6, variance r(1-p)/p^2 = 24.
  const src = new SeededSource(33);
  const draws = negativeBinomial(2, 0.25, 10000, src).map(Number);
  assertMeanWithin5SE(draws, 6, 24, "NB(2, 0.25)");
  assert.deepEqual(negativeBinomial(1, 1, 3, src), [0n, 0n, 0n]);
});

test("Pólya shares of one user are DLap(alpha); variance check", () => {
  const src = new SeededSource(34);
  const alpha = 0.8;
  const draws = polyaShares(alpha, 1, 10000, src).map(Number);
  const v = discreteLaplaceVariance(alpha);
  assertMeanWithin5SE(draws, 0, v, "Polya mean");
  let m4 = 0;
  for (let k = -2000; k <= 2000; k++) m4 += ((1 - alpha) / (1 + alpha)) * alpha ** Math.abs(k) * k ** 4;
  assertMeanWithin5SE(draws.map((k) => k * k), v, m4 - v * v, "Polya variance");
});

test("Skellam shares: variance 2 mu / users", () => {
  const src = new SeededSource(35);
  const draws = skellamShares(3, 4, 10000, src).map(Number);
  // Skellam(lam): variance 2 lam; fourth moment of a difference of Poissons:
  // E[K^4] = 2 lam + 12 lam^2 (cumulants 2lam (even orders), 0 (odd): m4 = k4 + 3 k2^2).
  const lam = 0.75;
  assertMeanWithin5SE(draws, 0, 2 * lam, "Skellam mean");
  assertMeanWithin5SE(draws.map((k) => k * k), 2 * lam, 2 * lam + 12 * lam * lam - 4 * lam * lam, "Skellam variance");
});

test("distributed noise refuses bad parameters", () => {
  const src = new SeededSource(36);
  for (const alpha of [0, 1, -0.5, NaN, Infinity, 1 - 1e-6, 1 - 1e-15]) {
    assert.throws(() => polyaShares(alpha, 3, 1, src), isInvalid, String(alpha));
  }
  for (const users of [0, 1.5, 2 ** 40 + 1, NaN]) assert.throws(() => polyaShares(0.5, users, 1, src), isInvalid);
  for (const size of [-1, 1.5, 2 ** 31 + 1]) assert.throws(() => skellamShares(1, 1, size, src), isInvalid);
  for (const mu of [0, -1, NaN, Infinity, 2 ** 44 * 2]) assert.throws(() => skellamShares(mu, 1, 1, src), isInvalid);
  // Per-user mean above DEVICE_MAX_MEAN, and a total mean above DEVICE_MAX_TOTAL_MEAN = 2^18.
  assert.throws(() => skellamShares(DEVICE_MAX_MEAN * 2, 1, 1, src), isInvalid);
  assert.throws(() => skellamShares(1000, 1, 300, src), isInvalid);
  assert.equal(skellamShares(1000, 1, 0, src).length, 0);
  assert.throws(() => negativeBinomial(0, 0.5, 1, src), isInvalid);
  assert.throws(() => negativeBinomial(1, 0, 1, src), isInvalid);
  assert.throws(() => negativeBinomial(1, 1.5, 1, src), isInvalid);
});

// ------------------------------------------------------------------------------------------
// Rotation
// ------------------------------------------------------------------------------------------

test("fwht: Hadamard transform, involution up to K", () => {
  assert.deepEqual(Array.from(fwht(Float64Array.from([1, 0, 0, 0]))), [1, 1, 1, 1]);
  assert.deepEqual(Array.from(fwht(Float64Array.from([0, 1, 0, 0]))), [1, -1, 1, -1]);
  assert.deepEqual(Array.from(fwht(Float64Array.from([0, 0, 0, 1]))), [1, -1, -1, 1]);
  const x = Float64Array.from([3, -1, 4, 1, -5, 9, 2, -6]);
  assert.deepEqual(Array.from(fwht(fwht(Float64Array.from(x)))), Array.from(x, (v) => v * 8));
  assert.throws(() => fwht(new Float64Array(3)), isInvalid);
  assert.throws(() => fwht(new Float64Array(0)), isInvalid);
});

test("rotation signs and RandomRotation: shape, orthogonality, inverse", () => {
  assert.equal(nextPowerOfTwo(1), 1);
  assert.equal(nextPowerOfTwo(5), 8);
  assert.equal(nextPowerOfTwo(1024), 1024);
  const signs = rotationSigns(100, 12345n);
  assert.equal(signs.length, 128);
  assert.ok(signs.every((s) => s === 1 || s === -1));
  assert.deepEqual(rotationSigns(100, 12345n), signs);
  assert.notDeepEqual(rotationSigns(100, 12346n), signs);
  // The first signs do not depend on the dimension (one stream, drawn in order).
  assert.deepEqual(rotationSigns(3, 12345n), signs.subarray(0, 4));
  const rot = new RandomRotation(100, 7n);
  const src = new SeededSource(41);
  const x = Array.from({ length: 100 }, () => src.integer(2001) - 1000);
  const y = rot.apply(x);
  const norm = (v) => Math.sqrt(v.reduce((a, b) => a + b * b, 0));
  // Each output is a sum of <= 128 terms scaled by 1/sqrt(128): rounding error is a few
  // units in the last place of the norm (~1e-16 relative per operation, 7 stages).
  assert.ok(Math.abs(norm(y) - norm(x)) <= 1e-12 * norm(x));
  const back = rot.inverse(y);
  for (let i = 0; i < 100; i++) assert.ok(Math.abs(back[i] - x[i]) <= 1e-12 * norm(x));
  assert.throws(() => new RandomRotation(0, 1n), isInvalid);
  assert.throws(() => new RandomRotation(2.5, 1n), isInvalid);
  assert.throws(() => new RandomRotation(4, -1n), isInvalid);
  assert.throws(() => new RandomRotation(4, 2n ** 64n), isInvalid);
  assert.throws(() => new RandomRotation(4, 1), isInvalid);
  assert.throws(() => rot.apply([1, 2]), isInvalid);
  assert.throws(() => rot.inverse([1, 2]), isInvalid);
});
