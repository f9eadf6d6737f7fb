/**
 * Exact rational arithmetic and the exact noise samplers of Canonne, Kamath and Steinke,
 * "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020, below "CKS20").
 *
 * Mirrors the device path of `protocol/mechanisms/randomness.py` (`SystemSource`): the
 * samplers use only uniform integers and exact comparisons of integers, so their output
 * law is exactly the stated one, with no floating-point artefacts (cf. Mironov 2012).
 * A float parameter enters as its exact binary value ({@link floatToRational}, the value of
 * Python's `Fraction(x)`). Running time depends on the sample (not constant-time), as in CKS20.
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";

/** A rational number `num / den` with `den > 0` (not necessarily reduced unless stated). */
export type Rational = readonly [num: bigint, den: bigint];

/**
 * The primitive every exact sampler draws from: an exactly uniform integer on
 * `{0, ..., n - 1}` for a bigint `n >= 1`.
 */
export interface UniformIntegers {
  randBelow(n: bigint): bigint;
}

/**
 * Largest noise scale sampled: the discrete Laplace `scale` and the discrete Gaussian's
 * `sqrt(sigma2)` (Python's `MAX_NOISE_SCALE = 2**44`). At 2^44 a draw exceeds 2^50 in
 * magnitude with probability below exp(-64), so values stay far inside int64.
 */
export const MAX_NOISE_SCALE = 2 ** 44;
const MAX_NOISE_SCALE_BIG = 1n << 44n;

// --------------------------------------------------------------------------
// Rationals on bigint pairs
// --------------------------------------------------------------------------

/** Absolute value of a bigint. */
export function absBig(a: bigint): bigint {
  return a < 0n ? -a : a;
}

/** Greatest common divisor of two bigints (non-negative; gcd(0, 0) = 0). */
export function gcd(a: bigint, b: bigint): bigint {
  a = absBig(a);
  b = absBig(b);
  while (b !== 0n) {
    const r = a % b;
    a = b;
    b = r;
  }
  return a;
}

/** `num / den` in lowest terms with a positive denominator; throws on `den = 0`. */
export function reduce(num: bigint, den: bigint): Rational {
  if (den === 0n) throw new InvalidParameter("den", "denominator must not be 0");
  if (den < 0n) {
    num = -num;
    den = -den;
  }
  const g = gcd(num, den);
  return g > 1n ? [num / g, den / g] : [num, den];
}

/** `a + b`, reduced. */
export function addRational(a: Rational, b: Rational): Rational {
  return reduce(a[0] * b[1] + b[0] * a[1], a[1] * b[1]);
}

/** `a - b`, reduced. */
export function subRational(a: Rational, b: Rational): Rational {
  return reduce(a[0] * b[1] - b[0] * a[1], a[1] * b[1]);
}

/** `a * b`, reduced. */
export function mulRational(a: Rational, b: Rational): Rational {
  return reduce(a[0] * b[0], a[1] * b[1]);
}

/** `a / b`, reduced; throws when `b = 0`. */
export function divRational(a: Rational, b: Rational): Rational {
  if (b[0] === 0n) throw new InvalidParameter("b", "division by 0");
  return reduce(a[0] * b[1], a[1] * b[0]);
}

/** Sign of `a - b`: -1, 0 or 1 (denominators must be positive). */
export function compareRational(a: Rational, b: Rational): number {
  const l = a[0] * b[1];
  const r = b[0] * a[1];
  return l < r ? -1 : l > r ? 1 : 0;
}

/** `floor(num / den)` for `den > 0` (rounds towards minus infinity, like Python's `//`). */
export function floorDiv(num: bigint, den: bigint): bigint {
  const q = num / den; // truncates towards 0
  return q * den > num ? q - 1n : q;
}

/** `ceil(num / den)` for `den > 0`. */
export function ceilDiv(num: bigint, den: bigint): bigint {
  return -floorDiv(-num, den);
}

/** `floor(sqrt(n))` for a bigint `n >= 0` (Python's `math.isqrt`), by Newton's method. */
export function isqrt(n: bigint): bigint {
  if (n < 0n) throw new InvalidParameter("n", "isqrt of a negative number");
  if (n < 2n) return n;
  // Start above the root: 2^ceil(bits/2) > sqrt(n); Newton's iteration then decreases monotonically.
  let x = 1n << BigInt(Math.ceil(n.toString(2).length / 2));
  for (;;) {
    const y = (x + n / x) >> 1n;
    if (y >= x) return x;
    x = y;
  }
}

// --------------------------------------------------------------------------
// Floats as exact rationals
// --------------------------------------------------------------------------

const f64 = new Float64Array(1);
const u32 = new Uint32Array(f64.buffer);
// Index of the high word of a double in u32 (platform byte order).
const HI = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1 ? 1 : 0;

/**
 * The exact value of a finite double as a reduced rational `[num, den]` (den a power of two),
 * the same value as Python's `Fraction(x)`. Throws {@link InvalidParameter} for NaN or infinity.
 */
export function floatToRational(x: number): Rational {
  if (typeof x !== "number" || !Number.isFinite(x)) {
    throw new InvalidParameter("x", `must be a finite number, got ${String(x)}`);
  }
  f64[0] = x;
  const hi = u32[HI];
  const lo = u32[1 - HI];
  const negative = hi >>> 31 === 1;
  const biased = (hi >>> 20) & 0x7ff;
  let mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let exponent: number; // x = +-mantissa * 2^exponent
  if (biased === 0) {
    exponent = -1074; // subnormal or zero
  } else {
    mantissa |= 1n << 52n;
    exponent = biased - 1075;
  }
  if (mantissa === 0n) return [0n, 1n];
  let num: bigint;
  let den: bigint;
  if (exponent >= 0) {
    num = mantissa << BigInt(exponent);
    den = 1n;
  } else {
    // Strip common factors of two so the fraction is in lowest terms.
    let shift = -exponent;
    while (shift > 0 && (mantissa & 1n) === 0n) {
      mantissa >>= 1n;
      shift -= 1;
    }
    num = mantissa;
    den = 1n << BigInt(shift);
  }
  return [negative ? -num : num, den];
}

/** The nearest double to `num / den` is not needed for sampling; this is for messages only. */
function approx(r: Rational): string {
  return (Number(r[0]) / Number(r[1])).toPrecision(3);
}

// --------------------------------------------------------------------------
// Parameter checks shared by the sources
// --------------------------------------------------------------------------

/** Validate a positive rational parameter and return it reduced. */
export function checkPositiveRational(name: string, num: bigint, den: bigint): Rational {
  if (typeof num !== "bigint" || typeof den !== "bigint") {
    throw new InvalidParameter(name, "numerator and denominator must be bigints");
  }
  if (den === 0n) throw new InvalidParameter(name, "denominator must not be 0");
  const r = reduce(num, den);
  if (r[0] <= 0n) throw new InvalidParameter(name, `must be > 0, got ${r[0]}/${r[1]}`);
  return r;
}

/**
 * Refuse a noise scale (`power = 2`: a variance) above {@link MAX_NOISE_SCALE}
 * (Python's `_check_noise_scale`).
 */
export function checkNoiseScale(name: string, scale: Rational, power: 1 | 2 = 1): void {
  const limit = power === 1 ? MAX_NOISE_SCALE_BIG : MAX_NOISE_SCALE_BIG * MAX_NOISE_SCALE_BIG;
  if (scale[0] > limit * scale[1]) {
    throw new InvalidParameter(
      name,
      `${approx(scale)} exceeds the largest noise scale sampled exactly, ${MAX_NOISE_SCALE.toPrecision(3)}^${power}`,
    );
  }
}

// --------------------------------------------------------------------------
// CKS20 exact samplers
// --------------------------------------------------------------------------

/** Bernoulli(num/den) for `0 <= num/den <= 1`: a uniform D on {0..den-1}, true iff D < num. */
export function bernoulliRationalExact(num: bigint, den: bigint, bits: UniformIntegers): boolean {
  return bits.randBelow(den) < num;
}

/**
 * CKS20 Algorithm 1: Bernoulli(exp(-gamma)) for a rational `gamma = num/den >= 0`.
 *
 * For gamma in [0, 1] (von Neumann / Forsythe): K <- 1; repeat A ~ Bernoulli(gamma/K), stop
 * when A = 0, else K <- K + 1; return [K odd]. For gamma > 1: floor(gamma) independent
 * Bernoulli(exp(-1)) draws (stopping at the first 0), then one Bernoulli(exp(-(gamma -
 * floor(gamma)))).
 */
export function bernoulliExpNeg(num: bigint, den: bigint, bits: UniformIntegers): boolean {
  if (num <= den) {
    let k = 1n;
    while (bits.randBelow(den * k) < num) k += 1n;
    return (k & 1n) === 1n;
  }
  const whole = num / den; // floor, num and den positive
  for (let i = 0n; i < whole; i += 1n) {
    if (!bernoulliExpNeg(1n, 1n, bits)) return false;
  }
  return bernoulliExpNeg(num - whole * den, den, bits);
}

/**
 * CKS20 Algorithm 2: one draw with `P(z)` proportional to `exp(-|z| / scale)`, for
 * `scale = t/s` with positive integers t, s (the reduced numerator and denominator).
 *
 * U uniform on {0..t-1} is accepted with probability exp(-U/t); V counts the successes of
 * Bernoulli(exp(-1)) before the first failure; X = U + tV is then geometric with
 * `P(X = x)` proportional to exp(-x/t) and Y = floor(X/s) geometric with `P(Y = y)`
 * proportional to exp(-y s/t); a fair sign B is attached and (B = 1, Y = 0) rejected so
 * that 0 is not counted twice.
 */
export function discreteLaplaceExact(t: bigint, s: bigint, bits: UniformIntegers): bigint {
  for (;;) {
    const u = bits.randBelow(t);
    if (!bernoulliExpNeg(u, t, bits)) continue;
    let v = 0n;
    while (bernoulliExpNeg(1n, 1n, bits)) v += 1n;
    const y = (u + t * v) / s;
    const b = bits.randBelow(2n);
    if (b === 1n && y === 0n) continue;
    return b === 1n ? -y : y;
  }
}

/**
 * CKS20 Algorithm 3: one draw with `P(y)` proportional to `exp(-y^2 / (2 sigma2))`,
 * `sigma2 = num/den > 0`.
 *
 * t = floor(sigma) + 1 (exactly: isqrt(floor(sigma2)) + 1); repeat: Y ~ discrete Laplace
 * with scale t; accept with probability exp(-(|Y| - sigma2/t)^2 / (2 sigma2)). Since
 * `-y^2/(2 s2) + |y|/t = -(|y| - s2/t)^2/(2 s2) + s2/(2 t^2)`, accepted values have the
 * discrete Gaussian law.
 */
export function discreteGaussianExact(num: bigint, den: bigint, bits: UniformIntegers): bigint {
  const t = isqrt(num / den) + 1n;
  // gamma = (|y| - num/(den t))^2 / (2 num/den) = (|y| den t - num)^2 / (2 num den t^2)
  const gammaDen = 2n * num * den * t * t;
  const denT = den * t;
  for (;;) {
    const y = discreteLaplaceExact(t, 1n, bits);
    const d = absBig(y) * denT - num;
    const [gn, gd] = reduce(d * d, gammaDen);
    if (bernoulliExpNeg(gn, gd, bits)) return y;
  }
}
