/**
 * Calibration of the discrete Gaussian mechanism, a port of
 * `protocol/mechanisms/gaussian_calibration.py` (the parts a device needs).
 *
 * For an integer query of sensitivity `D` and noise `X ~ N_Z(0, sigma2)` the mechanism is
 * `(eps, delta)`-DP with the hockey-stick divergence of Canonne, Kamath & Steinke, "The
 * Discrete Gaussian for Differential Privacy" (NeurIPS 2020, Theorem 7):
 *
 *     delta = P[X > c] - e^eps P[X > c + D],   c = eps sigma2 / D - D / 2.
 *
 * {@link discreteGaussianDelta} returns an UPPER bound on it (windowed summation with a
 * rigorous tail bound for small sigma, Euler-Maclaurin tail sums with a rigorous remainder
 * for large sigma, each with a relative floating-point margin of 1e-12 or 1e-13), and
 * {@link calibrateDiscreteGaussian} the upper end of a bisection bracket on which that bound
 * is at most `delta`, so the noise it returns gives `(eps, delta)`.
 *
 * The double operations are those of the Python module, in the same order, so that a
 * device and the analyzer compute the same `sigma2` (and the same report range). Three
 * elementary pieces differ by construction: `Math.exp`/`Math.expm1`/`Math.log` may differ
 * from glibc's and numpy's in the last ulp, the complementary error function (absent from
 * JavaScript) is computed here ({@link erfc}, a few ulps), and numpy's pairwise summation
 * is reproduced exactly ({@link pairwiseSum}). Those differences are about 1e-15 relative,
 * a thousandth of the margins above, so the bound stays an upper bound; the calibrated
 * value can differ from Python's only where a bisection step lands within that distance of
 * the threshold (the package's tests measure the agreement over a grid of parameters).
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";

const SQRT2 = Math.sqrt(2.0);
const SQRT_PI = Math.sqrt(Math.PI);
const LOG_HALF = Math.log(0.5);
const SQRT_PI_OVER_2 = Math.sqrt(Math.PI / 2.0);
const SQRT_2PI = Math.sqrt(2.0 * Math.PI);
const TWO_OVER_SQRT_PI = 2.0 / SQRT_PI;

// --------------------------------------------------------------------------
// validation
// --------------------------------------------------------------------------

function finiteNumber(name: string, value: unknown): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new InvalidParameter(name, `must be a finite number, got ${String(value)}`);
  }
  return value;
}

function positive(name: string, value: unknown): number {
  const out = finiteNumber(name, value);
  if (out <= 0.0) throw new InvalidParameter(name, `must be > 0, got ${out}`);
  return out;
}

function checkEpsilon(value: unknown): number {
  const out = finiteNumber("epsilon", value);
  if (out < 0.0) throw new InvalidParameter("epsilon", `must be >= 0, got ${out}`);
  return out;
}

function checkDelta(value: unknown): number {
  const out = finiteNumber("delta", value);
  if (!(out > 0.0 && out < 1.0)) throw new InvalidParameter("delta", `must lie in (0, 1), got ${out}`);
  return out;
}

function checkSensitivity(value: unknown): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 1) {
    throw new InvalidParameter("sensitivity", `must be a positive integer, got ${String(value)}`);
  }
  return value;
}

// --------------------------------------------------------------------------
// special functions
// --------------------------------------------------------------------------

/** `exp(-x^2)` with `x^2` split exactly into a double and its rounding error (Veltkamp/Dekker). */
function expNegSquare(x: number): number {
  const split = 134217729.0 * x; // 2^27 + 1
  const hi = split - (split - x);
  const lo = x - hi;
  const square = x * x;
  const error = hi * hi - square + 2.0 * hi * lo + lo * lo; // x^2 = square + error, exactly up to rounding of error
  const e = Math.exp(-square);
  return e - e * error;
}

/**
 * `erfc(x)` for any real x (JavaScript has none), to a few ulps.
 *
 * - `|x| < 0.5`: `1 - erf(x)` with the Maclaurin series
 *   `erf(x) = 2/sqrt(pi) sum_n (-1)^n x^(2n+1) / (n! (2n+1))` (terms shrink by at least 4 per step);
 * - `x >= 0.5`: `exp(-x^2) / sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, Laplace's
 *   continued fraction, evaluated backwards from enough levels to converge to double precision
 *   (`400 / x^2 + 40`, measured against 40-digit values at 0.5 <= x);
 * - `x <= -0.5`: `2 - erfc(-x)`.
 */
export function erfc(x: number): number {
  if (Number.isNaN(x)) return NaN;
  if (x < 0.5 && x > -0.5) {
    const x2 = x * x;
    let term = x; // (-1)^n x^(2n+1) / n!
    let sum = x;
    for (let n = 1; n < 40; n++) {
      term = (-term * x2) / n;
      const add = term / (2 * n + 1);
      sum += add;
      if (Math.abs(add) < 1e-18 * Math.abs(sum)) break;
    }
    return 1.0 - TWO_OVER_SQRT_PI * sum;
  }
  if (x < 0) return 2.0 - erfc(-x);
  if (x > 27.3) return 0.0; // below the smallest subnormal
  const levels = Math.min(2000, Math.ceil(400 / (x * x)) + 40);
  let acc = x;
  for (let k = levels; k >= 1; k--) acc = x + k / 2.0 / acc;
  return expNegSquare(x) / (SQRT_PI * acc);
}

/** Scaled complementary error function `exp(z^2) erfc(z)` for `z >= 0` (Python's `_erfcx`). */
function erfcx(z: number): number {
  if (z < 5.0) return erfc(z) * Math.exp(z * z);
  let acc = z;
  for (let k = 60; k >= 1; k--) acc = z + k / 2.0 / acc;
  return 1.0 / (SQRT_PI * acc);
}

/** `log(erfc(z))` without underflow for large z. */
function logErfc(z: number): number {
  if (z < 5.0) return Math.log(erfc(z));
  if (z === Infinity) return -Infinity;
  return -z * z + Math.log(erfcx(z));
}

/** `log Phi(x)`, the standard normal CDF, stable in both tails. */
function logNdtr(x: number): number {
  if (x > 0.0) return Math.log1p(-0.5 * erfc(x / SQRT2));
  return LOG_HALF + logErfc(-x / SQRT2);
}

/** numpy's pairwise summation of `a[lo .. lo + n)` (the order `np.sum` adds a contiguous float64 array in). */
export function pairwiseSum(a: Float64Array, lo = 0, n = a.length - lo): number {
  if (n < 8) {
    let res = 0.0;
    for (let i = 0; i < n; i++) res += a[lo + i];
    return res;
  }
  if (n <= 128) {
    let r0 = a[lo], r1 = a[lo + 1], r2 = a[lo + 2], r3 = a[lo + 3];
    let r4 = a[lo + 4], r5 = a[lo + 5], r6 = a[lo + 6], r7 = a[lo + 7];
    let i = 8;
    const whole = n - (n % 8);
    for (; i < whole; i += 8) {
      r0 += a[lo + i];
      r1 += a[lo + i + 1];
      r2 += a[lo + i + 2];
      r3 += a[lo + i + 3];
      r4 += a[lo + i + 4];
      r5 += a[lo + i + 5];
      r6 += a[lo + i + 6];
      r7 += a[lo + i + 7];
    }
    let res = r0 + r1 + (r2 + r3) + (r4 + r5 + (r6 + r7));
    for (; i < n; i++) res += a[lo + i];
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2);
}

// --------------------------------------------------------------------------
// continuous Gaussian mechanism (the starting point of the calibration)
// --------------------------------------------------------------------------

/** Exact `delta(eps)` of the Gaussian mechanism `N(0, sigma^2)` (Balle & Wang 2018, Thm. 8). */
export function gaussianDelta(sigma: number, epsilon: number, sensitivity: number): number {
  sigma = positive("sigma", sigma);
  epsilon = checkEpsilon(epsilon);
  sensitivity = positive("sensitivity", sensitivity);
  const r = sensitivity / (2.0 * sigma);
  const s = (epsilon * sigma) / sensitivity;
  const la = logNdtr(r - s);
  const lb = logNdtr(-r - s);
  const expo = epsilon + lb - la;
  if (expo >= 0.0) return 0.0;
  return Math.max(0.0, Math.exp(la) * -Math.expm1(expo));
}

/** Geometric bisection of `[lo, hi]` (`ok(hi)` true, `ok(lo)` false) to relative width `rtol`; returns the `ok` end. */
function shrinkBracket(ok: (x: number) => boolean, lo: number, hi: number, rtol: number): number {
  for (let i = 0; i < 200; i++) {
    if (hi - lo <= rtol * hi) break;
    const mid = Math.sqrt(lo * hi);
    if (!(lo < mid && mid < hi)) break;
    if (ok(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

/** Smallest sigma (to relative 1e-12) of the analytic Gaussian mechanism (Balle & Wang 2018). */
export function analyticGaussianSigma(epsilon: number, delta: number, sensitivity: number): number {
  epsilon = checkEpsilon(epsilon);
  delta = checkDelta(delta);
  sensitivity = positive("sensitivity", sensitivity);
  const ok = (sig: number): boolean => gaussianDelta(sig, epsilon, sensitivity) <= delta;
  let hi = sensitivity;
  while (!ok(hi)) hi *= 2.0;
  let lo = hi;
  while (ok(lo)) {
    lo *= 0.5;
    if (lo < 1e-300) return hi;
  }
  return shrinkBracket(ok, lo, hi, 1e-12);
}

// --------------------------------------------------------------------------
// discrete Gaussian mechanism
// --------------------------------------------------------------------------

const TAIL_L = 75.0;
const DIRECT_MAX_HALF_WIDTH = 1 << 16;
const FP_MARGIN = 1e-12;
const FP_MARGIN_EM = 1e-13;
const HE4_LAST_ROOT = Math.sqrt(3.0 + Math.sqrt(6.0));

function logGaussTailIntegral(a: number, sigma: number): number {
  return Math.log(sigma * SQRT_PI_OVER_2) + logErfc(a / (sigma * SQRT2));
}

/** Upper bound on the discrete Gaussian delta by windowed summation (Python's `_dg_delta_direct`). */
function dgDeltaDirect(sigma2: number, epsilon: number, sensitivity: number): number {
  const sigma = Math.sqrt(sigma2);
  const c = (epsilon * sigma2) / sensitivity - sensitivity / 2.0;
  const m = Math.floor(c) + 1; // |c| < 2^31 on this path: exact
  const bigK = Math.ceil(sigma * Math.sqrt(2.0 * TAIL_L));
  const x0 = Math.max(m, 0);
  const hi = Math.ceil(Math.sqrt(x0 * x0 + 2.0 * sigma2 * TAIL_L));
  const lo = Math.max(m, -bigK);
  const s0 = -(x0 * x0) / (2.0 * sigma2);

  const count = hi + 1 - lo;
  const terms = new Float64Array(Math.max(count, 0));
  const twoSigma2 = 2.0 * sigma2;
  for (let i = 0; i < count; i++) {
    const x = lo + i;
    const rel = -((x - x0) * (x + x0)) / twoSigma2;
    const expo = epsilon - (sensitivity * (2.0 * x + sensitivity)) / twoSigma2;
    const factor = Math.max(0.0, -Math.expm1(Math.min(expo, 0.0)));
    terms[i] = Math.exp(rel) * factor;
  }
  let total = pairwiseSum(terms);

  let n = hi + 1;
  const logFn = -((n - x0) * (n + x0)) / twoSigma2;
  const logInt = logGaussTailIntegral(n, sigma) - s0;
  total += Math.exp(logFn) + Math.exp(logInt);
  if (m < -bigK) {
    n = bigK + 1;
    total += Math.exp(-(n * n) / twoSigma2) + Math.exp(logGaussTailIntegral(n, sigma));
  }

  const width = 2 * bigK + 1;
  const weights = new Float64Array(width);
  for (let i = 0; i < width; i++) {
    const k = -bigK + i;
    weights[i] = Math.exp(-(k * k) / twoSigma2);
  }
  const zPartial = pairwiseSum(weights);
  const zLower = Math.max(zPartial * (1.0 - FP_MARGIN), sigma * SQRT_2PI);

  if (total <= 0.0) return 0.0;
  const logDelta = s0 + Math.log(total * (1.0 + FP_MARGIN)) - Math.log(zLower);
  return Math.min(1.0, Math.exp(logDelta));
}

/** Euler-Maclaurin bounds on `T(n) = sum_{k >= n} f(k)` (Python's `_em_tail`): `[logScale, lower, upper]`. */
function emTail(n: bigint, sigma: number, sigma2: number): [number, number, number] {
  const nf = Number(n); // float(n), rounded to nearest as Python does
  const u = nf / sigma;
  const he3 = u * (u * u - 3.0);
  let logScale: number;
  let rem: number;
  let value: number;
  if (n >= 0n) {
    logScale = -(nf * nf) / (2.0 * sigma2);
    const integral = sigma * SQRT_PI_OVER_2 * erfcx(u / SQRT2);
    const corr = 0.5 + u / (12.0 * sigma) - he3 / (720.0 * sigma2 * sigma);
    if (u >= HE4_LAST_ROOT) rem = he3 / (720.0 * sigma2 * sigma);
    else rem = (Math.sqrt(48.0 * Math.PI) / (720.0 * sigma2 * sigma)) * Math.exp(-logScale);
    value = integral + corr;
  } else {
    logScale = 0.0;
    const fn = Math.exp(-(nf * nf) / (2.0 * sigma2));
    const integral = sigma * SQRT_PI_OVER_2 * erfc(u / SQRT2);
    const corr = fn * (0.5 + u / (12.0 * sigma) - he3 / (720.0 * sigma2 * sigma));
    rem = Math.sqrt(48.0 * Math.PI) / (720.0 * sigma2 * sigma);
    value = integral + corr;
  }
  const lower = Math.max(0.0, (value - rem) * (1.0 - FP_MARGIN_EM));
  const upper = (value + rem) * (1.0 + FP_MARGIN_EM);
  return [logScale, lower, upper];
}

/** Upper bound on the discrete Gaussian delta via closed-form tail sums (Python's `_dg_delta_em`). */
function dgDeltaEm(sigma2: number, epsilon: number, sensitivity: number): number {
  const sigma = Math.sqrt(sigma2);
  const c = (epsilon * sigma2) / sensitivity - sensitivity / 2.0;
  const m1 = BigInt(Math.floor(c)) + 1n; // a Python int: exact however large c is
  const d = BigInt(sensitivity);
  const m2 = m1 + d;
  const [ls1, , up1] = emTail(m1, sigma, sigma2);
  const [ls2, lo2] = emTail(m2, sigma, sigma2);
  let scaleDiff: number;
  if (m1 >= 0n) scaleDiff = -Number(d * (2n * m1 + d)) / (2.0 * sigma2);
  else scaleDiff = ls2 - ls1;
  const logZLower = Math.log(sigma * SQRT_2PI);
  if (lo2 <= 0.0) return Math.min(1.0, Math.exp(ls1 + Math.log(up1) - logZLower));
  const expo = epsilon + scaleDiff + Math.log(lo2) - Math.log(up1);
  if (expo >= 0.0) return 0.0;
  const logDelta = ls1 + Math.log(up1) + Math.log(-Math.expm1(expo)) - logZLower;
  return Math.min(1.0, Math.exp(logDelta));
}

/**
 * An upper bound on `delta(eps)` of adding `N_Z(0, sigma2)` to an integer query of the given
 * sensitivity (CKS20 Thm. 7; Python's `discrete_gaussian_delta`).
 */
export function discreteGaussianDelta(sigma2: number, epsilon: number, sensitivity: number): number {
  sigma2 = positive("sigma2", sigma2);
  epsilon = checkEpsilon(epsilon);
  sensitivity = checkSensitivity(sensitivity);
  if (Math.sqrt(sigma2) * Math.sqrt(2.0 * TAIL_L) <= DIRECT_MAX_HALF_WIDTH) {
    return dgDeltaDirect(sigma2, epsilon, sensitivity);
  }
  return dgDeltaEm(sigma2, epsilon, sensitivity);
}

/**
 * The smallest `sigma2` (to relative 1e-10) whose {@link discreteGaussianDelta} is at most `delta`
 * (Python's `calibrate_discrete_gaussian`).
 *
 * Guarantee: adding `N_Z(0, sigma2)` with the returned value to an integer query of the given
 * sensitivity is `(epsilon, delta)`-DP (CKS20 Thm. 7): the value returned is the upper end of
 * a bisection bracket, where the upper bound on delta was checked to be at most `delta`.
 */
export function calibrateDiscreteGaussian(epsilon: number, delta: number, sensitivity: number): number {
  epsilon = checkEpsilon(epsilon);
  delta = checkDelta(delta);
  sensitivity = checkSensitivity(sensitivity);
  const ok = (s2: number): boolean => discreteGaussianDelta(s2, epsilon, sensitivity) <= delta;
  const sigma = analyticGaussianSigma(epsilon, delta, sensitivity);
  let hi = sigma * sigma;
  while (!ok(hi)) hi *= 1.1;
  let lo = hi / 1.1;
  while (ok(lo)) {
    hi = lo;
    lo /= 1.1;
    if (lo < 1e-300) return hi;
  }
  return shrinkBracket(ok, lo, hi, 1e-10);
}
