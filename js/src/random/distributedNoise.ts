/**
 * Distributed noise for multi-message summation: Pólya and Skellam shares, device path.
 *
 * Mirrors the `SystemSource` path of `protocol/mechanisms/distributed_noise.py`. Each of
 * `users` users adds one share of noise per coordinate; no share protects anything alone,
 * but the sum of all `users` shares is a full noise draw of a known law:
 *
 * - Pólya shares: `NB(1/users, 1 - alpha) - NB(1/users, 1 - alpha)`; the `users` shares sum
 *   to the discrete Laplace `DLap(alpha)`, `P(k)` proportional to `alpha^|k|` (Goryczka &
 *   Xiong, IEEE TDSC 2017; Balle, Bell, Gascón & Nissim, CCS 2020, arXiv:2002.00817).
 *   Convention: `NB(r, p)` counts failures before `r` successes, `p` the SUCCESS
 *   probability (numpy's and scipy's convention), so the share passes `p = 1 - alpha`.
 * - Skellam shares: `Poisson(mu/users) - Poisson(mu/users)`; they sum to `Skellam(mu)`
 *   (Agarwal, Kairouz & Liu, NeurIPS 2021).
 *
 * Exactness: Skellam shares are exact (`mu` converted exactly to a rational, Poisson drawn
 * exactly from uniform integers). Pólya shares are NOT exact: `NB(r, p)` is the mixture
 * `Poisson(Lambda)`, `Lambda ~ Gamma(r, scale (1-p)/p)` with `Lambda` a double-precision
 * gamma variate built from CSPRNG uniforms (Ahrens–Dieter GS for shape < 1, Cheng's GB for
 * shape > 1, as Python's `random.gammavariate`); given the double `Lambda` the Poisson draw is
 * exact. Running time is linear in the Poisson mean (hence {@link DEVICE_MAX_MEAN}) and
 * depends on the sample (not constant-time).
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";
import { ceilDiv, floatToRational, MAX_NOISE_SCALE, reduce, type Rational } from "./exact.js";
import type { RandomSource } from "./source.js";

/** Largest per-user mean the exact Poisson accepts: Skellam `mu/users`, Pólya gamma scale `alpha/(1-alpha)`. */
export const DEVICE_MAX_MEAN = 2 ** 16;
/** Largest total Poisson mean of one Skellam call (`mu/users` times the number of draws). */
export const DEVICE_MAX_TOTAL_MEAN = 2 ** 18;
/** Largest number of draws one call returns. */
export const MAX_DRAWS = 2 ** 31;
const MAX_USERS = 2 ** 40;

// --------------------------------------------------------------------------
// Validation (Python's _check_* of distributed_noise.py)
// --------------------------------------------------------------------------

function checkReal(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new InvalidParameter(name, `must be a finite number, got ${String(value)}`);
  }
  return value;
}

function checkAlpha(alpha: number): number {
  const a = checkReal("alpha", alpha);
  if (!(a > 0 && a < 1)) throw new InvalidParameter("alpha", `must lie in the open interval (0, 1), got ${a}`);
  const scale = -1.0 / Math.log(a);
  if (scale > MAX_NOISE_SCALE) {
    throw new InvalidParameter("alpha", `noise scale -1/ln(alpha) = ${scale.toPrecision(3)} exceeds MAX_NOISE_SCALE = 2^44`);
  }
  return a;
}

function checkUsers(users: number): number {
  if (typeof users !== "number" || !Number.isSafeInteger(users)) {
    throw new InvalidParameter("users", `must be an integer, got ${String(users)}`);
  }
  if (!(users >= 1 && users <= MAX_USERS)) throw new InvalidParameter("users", `must lie in [1, 2^40], got ${users}`);
  return users;
}

function checkMu(muTotal: number): number {
  const mu = checkReal("mu_total", muTotal);
  if (!(mu > 0)) throw new InvalidParameter("mu_total", `must be > 0, got ${mu}`);
  if (mu > MAX_NOISE_SCALE) throw new InvalidParameter("mu_total", `${mu.toPrecision(3)} exceeds MAX_NOISE_SCALE = 2^44`);
  return mu;
}

function checkSize(size: number): number {
  if (typeof size !== "number" || !Number.isSafeInteger(size) || size < 0) {
    throw new InvalidParameter("size", `must be an integer >= 0, got ${String(size)}`);
  }
  if (size > MAX_DRAWS) throw new InvalidParameter("size", `${size} draws exceed the limit ${MAX_DRAWS}`);
  return size;
}

// --------------------------------------------------------------------------
// Exact Poisson from uniform integers
// --------------------------------------------------------------------------

/** `k >= 0` with `P(k) = 2^-(k+1)`: the number of trailing zero bits of a fair bit stream. */
export function geometricHalf(source: RandomSource): number {
  let k = 0;
  for (;;) {
    const x = source.integer(2 ** 32);
    if (x !== 0) return k + 31 - Math.clz32(x & -x);
    k += 32;
  }
}

const factorials: bigint[] = [1n];
function factorial(k: number): bigint {
  while (factorials.length <= k) factorials.push(factorials[factorials.length - 1] * BigInt(factorials.length));
  return factorials[k];
}

/**
 * Exact `Poisson(1)` by rejection from `Geometric(1/2)`: proposal `P(k) = 2^-(k+1)`, accepted
 * with probability `2^k / (2 k!) <= 1`, decided by `randBelow(2 k!) < 2^k`. Accepted values
 * have `P(k)` proportional to `1 / k!`. Acceptance rate e/4.
 */
export function poissonOneExact(source: RandomSource): number {
  for (;;) {
    const k = geometricHalf(source);
    if (source.integer(2n * factorial(k)) < 1n << BigInt(k)) return k;
  }
}

/**
 * Exact `Poisson(lam)` for a rational `lam = num/den >= 0`, in time linear in `lam`: with
 * `m = ceil(lam)`, `N` = sum of `m` i.i.d. `Poisson(1)` is `Poisson(m)`, and binomial thinning
 * `X | N ~ Binomial(N, lam/m)` gives `X ~ Poisson(lam)`.
 */
export function poissonExact(lam: Rational, source: RandomSource): bigint {
  const [num, den] = reduce(lam[0], lam[1]);
  if (num <= 0n) return 0n;
  const m = ceilDiv(num, den);
  let n = 0;
  for (let i = 0n; i < m; i += 1n) n += poissonOneExact(source);
  if (num === m * den) return BigInt(n);
  const [tn, td] = reduce(num, den * m);
  let kept = 0n;
  for (let i = 0; i < n; i++) if (source.integer(td) < tn) kept += 1n;
  return kept;
}

// --------------------------------------------------------------------------
// Double-precision gamma from the source's uniforms (for Pólya shares)
// --------------------------------------------------------------------------

/** Uniform on [0, 1) in multiples of 2^-53 (Python's `SystemRandom.random`). */
function uniform01(source: RandomSource): number {
  return source.integer(2 ** 53) * 2 ** -53;
}

const LOG4 = Math.log(4.0);
const SG_MAGICCONST = 1.0 + Math.log(4.5);

/**
 * A Gamma(shape, scale) variate in double precision (an approximation of the gamma law, as
 * Python's `random.gammavariate`): shape < 1 by Ahrens & Dieter's algorithm GS (1974),
 * shape = 1 by inversion of the exponential, shape > 1 by Cheng's algorithm GB (1977).
 */
export function gammaVariate(shape: number, scale: number, source: RandomSource): number {
  if (!(shape > 0 && scale > 0)) throw new InvalidParameter("shape, scale", "must be > 0");
  if (shape === 1) return -Math.log(1.0 - uniform01(source)) * scale;
  if (shape < 1) {
    const b = (Math.E + shape) / Math.E;
    for (;;) {
      const p = b * uniform01(source);
      const x = p <= 1.0 ? p ** (1.0 / shape) : -Math.log((b - p) / shape);
      const u = uniform01(source);
      if (p > 1.0) {
        if (u <= x ** (shape - 1.0)) return x * scale;
      } else if (u <= Math.exp(-x)) {
        return x * scale;
      }
    }
  }
  // Cheng (1977), GB: log-logistic envelope.
  const aInv = Math.sqrt(2.0 * shape - 1.0);
  const bbb = shape - LOG4;
  const ccc = shape + aInv;
  for (;;) {
    const u1 = uniform01(source);
    if (!(u1 > 1e-7 && u1 < 0.9999999)) continue;
    const u2 = 1.0 - uniform01(source);
    const v = Math.log(u1 / (1.0 - u1)) / aInv;
    const x = shape * Math.exp(v);
    const z = u1 * u1 * u2;
    const r = bbb + ccc * v - x;
    if (r + SG_MAGICCONST - 4.5 * z >= 0.0 || r >= Math.log(z)) return x * scale;
  }
}

// --------------------------------------------------------------------------
// Public API
// --------------------------------------------------------------------------

/** Variance `2 alpha / (1 - alpha)^2` of `DLap(alpha)`. */
export function discreteLaplaceVariance(alpha: number): number {
  const a = checkAlpha(alpha);
  return (2.0 * a) / (1.0 - a) ** 2;
}

/** Variance `2 mu` of `Skellam(mu)`. */
export function skellamVariance(muTotal: number): number {
  return 2.0 * checkMu(muTotal);
}

/**
 * Pólya / negative binomial `NB(shape, successProb)` with real `shape > 0`: the number of
 * FAILURES before `shape` successes, `successProb` the SUCCESS probability
 * (`P(k) = Gamma(k+shape)/(k! Gamma(shape)) p^shape (1-p)^k`, mean `shape (1-p)/p`), drawn as
 * `Poisson(Lambda)`, `Lambda ~ Gamma(shape, (1-p)/p)` in double precision (not exact; see
 * the module documentation). Mirrors Python's `negative_binomial` device path.
 */
export function negativeBinomial(shape: number, successProb: number, size: number, source: RandomSource): bigint[] {
  const r = checkReal("shape", shape);
  if (!(r > 0)) throw new InvalidParameter("shape", `must be > 0, got ${r}`);
  const p = checkReal("success_prob", successProb);
  if (!(p > 0 && p <= 1)) throw new InvalidParameter("success_prob", `must lie in (0, 1], got ${p}`);
  const theta = (1.0 - p) / p; // gamma scale
  if (theta * r > MAX_NOISE_SCALE) {
    throw new InvalidParameter("success_prob", `mean ${(theta * r).toPrecision(3)} exceeds MAX_NOISE_SCALE = 2^44`);
  }
  const count = checkSize(size);
  if (theta > DEVICE_MAX_MEAN) {
    throw new InvalidParameter(
      "success_prob",
      `gamma scale (1-p)/p = ${theta.toPrecision(3)} exceeds DEVICE_MAX_MEAN = 2^16 (the exact Poisson runs in time linear in its mean)`,
    );
  }
  const out: bigint[] = new Array(count);
  for (let i = 0; i < count; i++) {
    const lam = theta > 0 ? gammaVariate(r, theta, source) : 0.0;
    out[i] = poissonExact(floatToRational(lam), source);
  }
  return out;
}

/**
 * One user's Pólya noise shares, `size` independent draws of
 * `NB(1/users, 1-alpha) - NB(1/users, 1-alpha)`.
 *
 * Mechanism: each of `users` users adds one share per coordinate; the `users` shares of a
 * coordinate sum to `DLap(alpha)`. Guarantee (upper bound on the privacy loss, for exact NB
 * draws and all `users` shares present): with `alpha = exp(-eps / Delta)` the sum makes a
 * sum of sensitivity `Delta` eps-DP; one share alone gives almost nothing. The gamma step is
 * double precision, so the law is approximate. Reference: Balle, Bell, Gascón & Nissim,
 * CCS 2020; Goryczka & Xiong, TDSC 2017; Python `distributed_noise.polya_shares`.
 */
export function polyaShares(alpha: number, users: number, size: number, source: RandomSource): bigint[] {
  const a = checkAlpha(alpha);
  const n = checkUsers(users);
  const count = checkSize(size);
  const p = 1.0 - a; // success probability: NOT alpha
  const x = negativeBinomial(1.0 / n, p, count, source);
  const y = negativeBinomial(1.0 / n, p, count, source);
  return x.map((xi, i) => xi - y[i]);
}

/**
 * One user's Skellam noise shares, `size` independent exact draws of
 * `Poisson(mu/users) - Poisson(mu/users)` with `mu/users` the exact rational value of the
 * double `muTotal` divided by `users`.
 *
 * Mechanism: the `users` shares of a coordinate sum to `Skellam(muTotal)` exactly.
 * Guarantee: the Skellam mechanism's Rényi-DP bound for the sum (Agarwal, Kairouz & Liu,
 * NeurIPS 2021). Reference: Python `distributed_noise.skellam_shares` (device path).
 */
export function skellamShares(muTotal: number, users: number, size: number, source: RandomSource): bigint[] {
  const mu = checkMu(muTotal);
  const n = checkUsers(users);
  const count = checkSize(size);
  const [mn, md] = floatToRational(mu);
  const lamExact = reduce(mn, md * BigInt(n));
  if (lamExact[0] > BigInt(DEVICE_MAX_MEAN) * lamExact[1]) {
    throw new InvalidParameter(
      "mu_total",
      `per-user mean mu_total/users = ${(mu / n).toPrecision(3)} exceeds DEVICE_MAX_MEAN = 2^16 (the exact Poisson runs in time linear in its mean)`,
    );
  }
  // mu / n in doubles is the correctly rounded value of the exact rational (n <= 2^40 is exact).
  const lamFloat = mu / n;
  if (lamFloat * count > DEVICE_MAX_TOTAL_MEAN * (1 + 1e-9)) {
    throw new InvalidParameter(
      "mu_total",
      `${count} draws of mean mu_total/users = ${lamFloat.toPrecision(3)} total ${(lamFloat * count).toPrecision(3)}, over DEVICE_MAX_TOTAL_MEAN = 2^18`,
    );
  }
  const out: bigint[] = new Array(count);
  for (let i = 0; i < count; i++) out[i] = poissonExact(lamExact, source) - poissonExact(lamExact, source);
  return out;
}
