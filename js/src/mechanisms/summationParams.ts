/**
 * The privacy analysis of multi-message summation that a device runs on every summation
 * round it is asked to answer, mirroring `protocol/mechanisms/summation_params.py`
 * (`check_scalar_sum`, `check_vector_sum`) and the Skellam check of
 * `LocalVectorParams.check_budget` in `protocol/wire/messages.py`.
 *
 * *Split and mix* (Balle, Bell, Gascón & Nissim, "Improved Summation from Shuffling",
 * arXiv:1909.11225, Thm. 1): `n >= 3` users each sending `M >= 3` additive shares mod `q`
 * give shuffled views within statistical distance `2^-sigma`,
 * `sigma = ((M - 1)(log2 n - log2 e) - log2 q) / 2`; over `D` independent instances the
 * round pays `delta_split = (1 + e^eps) D 2^-sigma`.
 *
 * *Skellam noise* (Agarwal, Kairouz & Liu, NeurIPS 2021, arXiv:2110.04995): RDP of integer
 * order `a`, `a D2^2 / (4 mu) + min(((2a - 1) D2^2 + 6 D1) / (16 mu^2), 3 D1 / (4 mu))`,
 * converted to `(eps, delta)` by Canonne, Kamath & Steinke 2020, Prop. 12.
 *
 * The arithmetic is the Python module's, in the same double operations and the same order,
 * so a device accepts and refuses the parameters the Python parties accept and refuse (up to
 * the last-ulp differences of the platforms' `log`/`exp`).
 *
 * @module
 */

import { DEVICE_MAX_MEAN, DEVICE_MAX_TOTAL_MEAN } from "../random/distributedNoise.js";
import { InvalidParameter } from "../wire/errors.js";

/** `log2(e)`, as Python's `math.log2(math.e)`. */
export const LOG2_E = Math.log2(Math.E);

export { DEVICE_MAX_MEAN, DEVICE_MAX_TOTAL_MEAN };

/** Orders at which the Skellam RDP bound is evaluated (integers, as the bound requires). */
export const RDP_ORDERS: readonly number[] = (() => {
  const orders: number[] = [];
  for (let a = 2; a < 257; a++) orders.push(a);
  for (let a = 264; a < 1025; a += 8) orders.push(a);
  orders.push(1536, 2048, 4096, 8192);
  return orders;
})();

/** The smallest power of two `>= k` (`k >= 1`), as `hadamard.next_power_of_two`. */
export function nextPowerOfTwo(k: number): number {
  if (!Number.isSafeInteger(k) || k < 1) throw new InvalidParameter("k", `must be an integer >= 1, got ${String(k)}`);
  let p = 1;
  while (p < k) p *= 2;
  return p;
}

/** Python's `min(a, b)`: `a` unless `b < a` (so a NaN `b` is ignored). */
function pyMin(a: number, b: number): number {
  return b < a ? b : a;
}

/** Python's `f"{x:.3g}"`, closely enough for a refusal's text. */
function g3(x: number): string {
  return Number.isFinite(x) ? String(Number(x.toPrecision(3))) : String(x);
}

// --------------------------------------------------------------------------
// Split and mix
// --------------------------------------------------------------------------

/** The `sigma` (statistical distance `2^-sigma`) BBGN's bound gives `n` users of `M` shares mod `q`; `-Infinity` below 3 of either. */
export function splitSigma(users: number, messages: number, modulus: bigint | number): number {
  if (users < 3 || messages < 3) return -Infinity;
  return ((messages - 1) * (Math.log2(users) - LOG2_E) - log2Integer(modulus)) / 2.0;
}

/** `log2` of a positive integer up to 2^62 as Python's `math.log2(int)` (exact conversion first for bigints). */
function log2Integer(value: bigint | number): number {
  return Math.log2(Number(value));
}

/** Fewest shares per user with statistical distance `2^-sigma` (BBGN, arXiv:1909.11225, Thm. 1). */
export function messagesNeeded(users: number, modulus: bigint | number, sigma: number): number {
  if (users < 3) throw new InvalidParameter("users", `split and mix needs at least 3 users, got ${users}`);
  const need = (2.0 * sigma + log2Integer(modulus)) / (Math.log2(users) - LOG2_E) + 1.0;
  const rounded = Math.ceil(need - 1e-12);
  if (!Number.isFinite(rounded)) {
    throw new InvalidParameter("epsilon0", "the mechanism's analysis fails at this budget (OverflowError)");
  }
  return Math.max(3, rounded);
}

/** `log2(1 + e^eps)` without overflow. */
export function log2OnePlusExp(epsilon: number): number {
  return epsilon > 0 ? (epsilon + Math.log1p(Math.exp(-epsilon))) / Math.log(2.0) : Math.log2(1.0 + Math.exp(epsilon));
}

/** The `delta` the split costs: `(1 + e^eps) instances 2^-sigma`. */
export function splitDelta(users: number, messages: number, modulus: bigint | number, epsilon: number, instances = 1): number {
  const sigma = splitSigma(users, messages, modulus);
  if (sigma === -Infinity) return Infinity;
  const exponent = pyMin(1024.0, log2OnePlusExp(epsilon) + Math.log2(instances) - sigma);
  if (exponent >= 1024.0) {
    // Python's 2.0 ** 1024.0 raises OverflowError, which RoundSpec turns into this refusal.
    throw new InvalidParameter("epsilon0", "the mechanism's analysis fails at this budget (OverflowError)");
  }
  return 2.0 ** exponent;
}

/** The `sigma` with `(1 + e^eps) instances 2^-sigma = delta`. */
export function sigmaNeeded(epsilon: number, delta: number, instances = 1): number {
  return log2OnePlusExp(epsilon) + Math.log2(instances) - Math.log2(delta);
}

// --------------------------------------------------------------------------
// Skellam RDP and conversion
// --------------------------------------------------------------------------

/** Agarwal, Kairouz & Liu 2021: RDP of `Skellam(mu)` noise at integer `order`, as ratios (no overflow). */
export function skellamRdp(order: number, l1: number, l2: number, mu: number): number {
  const a = order;
  const r2 = (l2 / mu) * l2;
  const r1 = l1 / mu;
  return (a * r2) / 4.0 + pyMin(((2 * a - 1) * r2 + 6.0 * r1) / (16.0 * mu), (3.0 * r1) / 4.0);
}

/** `eps` of `(eps, delta)`-DP from an RDP curve (Canonne, Kamath & Steinke 2020, Prop. 12), never below 0. */
export function rdpToDp(orders: readonly number[], rdp: readonly number[], delta: number): number {
  if (!(delta > 0.0 && delta < 1.0)) throw new InvalidParameter("delta", `must be in (0, 1), got ${delta}`);
  let best = Infinity;
  const n = Math.min(orders.length, rdp.length);
  for (let i = 0; i < n; i++) {
    const a = orders[i];
    best = pyMin(best, rdp[i] + Math.log((a - 1) / a) - (Math.log(delta) + Math.log(a)) / (a - 1));
  }
  return best > 0.0 ? best : 0.0;
}

/** `[D1, D2]`: l1 and l2 sensitivities of a replaced user's encoded vector. */
export function vectorSensitivities(levels: number, paddedDim: number): [number, number] {
  const l2 = 2.0 * (levels + Math.sqrt(paddedDim));
  return [l2 * pyMin(Math.sqrt(paddedDim), l2), l2];
}

/** Central (or, for one user's report, local) `eps` at `delta` of `Skellam(mu)` noise on every coordinate. */
export function skellamEpsilon(mu: number, levels: number, paddedDim: number, delta: number): number {
  const [l1, l2] = vectorSensitivities(levels, paddedDim);
  return rdpToDp(
    RDP_ORDERS,
    RDP_ORDERS.map((a) => skellamRdp(a, l1, l2, mu)),
    delta,
  );
}

/** A `t` with `P(|Skellam(mu)| >= t) <= failure` (Bernstein for a difference of Poisson sums). */
export function skellamTail(mu: number, failure: number): number {
  const c = -Math.log(failure / 2.0);
  const t = ((2.0 * c) / 3.0 + Math.sqrt(((2.0 * c) / 3.0) ** 2 + 16.0 * mu * c)) / 2.0;
  return Math.ceil(t);
}

// --------------------------------------------------------------------------
// The checks a device runs
// --------------------------------------------------------------------------

/** What {@link checkScalarSum} reads of `modular-sum` parameters. */
export interface ScalarSumFields {
  readonly precision: number | bigint;
  readonly modulus: number | bigint;
  readonly messages: number | bigint;
  readonly users: number | bigint;
}

/** What {@link checkVectorSum} reads of `vector-sum` parameters. */
export interface VectorSumFields {
  readonly dim: number | bigint;
  readonly levels: number | bigint;
  readonly modulus: number | bigint;
  readonly messages: number | bigint;
  readonly users: number | bigint;
  readonly mu: number;
}

/**
 * Refuse scalar summation parameters under which the round is not central `(epsilon, delta)`-DP:
 * `delta > 0`; `q > 2 n p`; enough shares for `(1 + e^eps) 2^-sigma <= delta`; a Pólya noise the
 * device sampler can draw (gamma scale `alpha / (1 - alpha) <= 2^16`). Throws {@link InvalidParameter}.
 */
export function checkScalarSum(params: ScalarSumFields, epsilon: number, delta: number): void {
  const users = Number(params.users);
  const messages = Number(params.messages);
  const precision = Number(params.precision);
  const modulus = BigInt(params.modulus);
  if (!(delta > 0.0)) {
    throw new InvalidParameter("delta0", "summation is (eps, delta)-DP with delta > 0 (the split's statistical distance)");
  }
  const floor = 2n * BigInt(params.users) * BigInt(params.precision);
  if (modulus <= floor) {
    throw new InvalidParameter("modulus", `${modulus} <= 2 n p = ${floor}: honest sums would wrap around`);
  }
  const cost = splitDelta(users, messages, modulus, epsilon);
  if (cost > delta) {
    const need = messagesNeeded(users, modulus, sigmaNeeded(epsilon, delta));
    throw new InvalidParameter(
      "messages",
      `${messages} shares from ${users} users mod ${modulus} cost delta ${g3(cost)} > ${g3(delta)}; ` +
        `the split-and-mix bound needs at least ${need}`,
    );
  }
  const oneMinusAlpha = -Math.expm1(-epsilon / precision);
  if (!(oneMinusAlpha > 0.0) || !((1.0 - oneMinusAlpha) / oneMinusAlpha <= DEVICE_MAX_MEAN)) {
    throw new InvalidParameter(
      "precision",
      `noise alpha = exp(-eps/p) = exp(-${g3(epsilon / precision)}) is beyond the device sampler (lower the precision)`,
    );
  }
}

/**
 * Refuse vector summation parameters under which the round is not central `(epsilon, delta)`-DP:
 * the split's cost over the `D` coordinates plus the Skellam noise's `delta` at `epsilon` must not
 * exceed `delta`; the device's total Poisson mean `D mu / users` at most 2^18; a modulus that holds
 * a typical coordinate sum. Throws {@link InvalidParameter}.
 */
export function checkVectorSum(params: VectorSumFields, epsilon: number, delta: number): void {
  const users = Number(params.users);
  const messages = Number(params.messages);
  const levels = Number(params.levels);
  const paddedDim = nextPowerOfTwo(Number(params.dim));
  const modulus = BigInt(params.modulus);
  const mu = params.mu;
  if (!(delta > 0.0)) throw new InvalidParameter("delta0", "vector summation is (eps, delta)-DP with delta > 0");
  const split = splitDelta(users, messages, modulus, epsilon, paddedDim);
  if (split >= delta) {
    throw new InvalidParameter("messages", `the split of ${messages} shares per coordinate costs delta ${g3(split)} >= ${g3(delta)}`);
  }
  const epsNoise = skellamEpsilon(mu, levels, paddedDim, delta - split);
  if (epsNoise > epsilon) {
    throw new InvalidParameter("mu", `Skellam noise mu = ${mu} gives eps ${epsNoise.toPrecision(4)} > ${epsilon} at delta ${g3(delta - split)}`);
  }
  if ((paddedDim * mu) / users > DEVICE_MAX_TOTAL_MEAN) {
    throw new InvalidParameter(
      "mu",
      `a device would draw Poisson means of ${g3((paddedDim * mu) / users)} in all (D mu / users), over ` +
        `${g3(DEVICE_MAX_TOTAL_MEAN)}: the exact sampler's time is linear in it`,
    );
  }
  const floor = 2.0 * users * levels * Math.sqrt((2.0 * Math.log(4.0 * paddedDim)) / paddedDim);
  // Python compares the int q with the double exactly: q <= floor iff q <= floor(floor).
  if (floor === Infinity || (Number.isFinite(floor) && modulus <= BigInt(Math.floor(floor)))) {
    throw new InvalidParameter("modulus", `${modulus} cannot hold even a typical coordinate sum of ${users} users (${g3(floor)})`);
  }
}

/** What {@link checkLocalSkellam} reads of `local-vector` parameters. */
export interface LocalSkellamFields {
  readonly dim: number | bigint;
  readonly levels: number | bigint;
  readonly mu: number;
}

/** `local-vector`: `delta > 0` and the Skellam RDP bound at the encoding's sensitivities gives `eps <= epsilon` for one report. */
export function checkLocalSkellam(params: LocalSkellamFields, epsilon: number, delta: number): void {
  if (!(delta > 0)) throw new InvalidParameter("delta0", "must be > 0: Skellam noise is not pure DP");
  const achieved = skellamEpsilon(params.mu, Number(params.levels), nextPowerOfTwo(Number(params.dim)), delta);
  if (achieved > epsilon) {
    throw new InvalidParameter("mu", `Skellam noise mu = ${params.mu} gives eps ${achieved.toPrecision(4)} > ${epsilon} at delta ${g3(delta)}`);
  }
}

/** `local-vector`'s clamp: `levels + 1 + t`, `P(|Skellam(mu)| >= t) <= 2^-64` (`LocalVectorParams.bound`). */
export function localVectorBound(levels: number | bigint, mu: number): bigint {
  return BigInt(levels) + 1n + BigInt(skellamTail(mu, 2.0 ** -64));
}
