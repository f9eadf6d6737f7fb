/**
 * `projected-mean`: the projected mean report of Girgis, Data & Diggavi 2022 (Algorithm 2
 * and Remark 3), for one user; mirrors the device path of `client/mean_randomizer.py`
 * (`randomize_mean_one`, `to_grid_one`, `noise_tail_bound`, `report_range`).
 *
 * A user projects its local mean onto `[lower, upper]`, maps it to the grid
 * `lower + step * u`, `u` in `{0, ..., G}` (`G = gridLevels`, `step = (upper - lower) / G`), by
 * unbiased randomized rounding, adds exact integer noise and clamps the result to
 * `[-B, G + B]` (post-processing):
 *
 * - `laplace`: discrete Laplace `P(k) ~ exp(-eps |k| / G)`; two inputs move `u` by at most `G`,
 *   so the report is pure `eps`-LDP.
 * - `gaussian`: discrete Gaussian `N_Z(0, sigma2)` with `sigma2` calibrated so that the
 *   hockey-stick divergence at sensitivity `G` is at most `delta` (CKS20 Thm. 7): `(eps, delta)`-LDP.
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { floatToRational, gcd, type Rational } from "../random/exact.js";
import { InvalidParameter } from "../wire/errors.js";
import { calibrateDiscreteGaussian } from "./gaussianCalibration.js";
import { valueRange, type ValueRange } from "./valueRange.js";

/** The two noises of a mean report. */
export type NoiseKind = "laplace" | "gaussian";

/** What this module reads of `projected-mean` parameters. */
export interface ProjectedMeanFields {
  readonly lower: number;
  readonly upper: number;
  readonly noise: NoiseKind;
  readonly gridLevels: number;
}

/** A report's noise is clamped with probability below `2^-TAIL_BITS` (Python's `TAIL_BITS`). */
export const TAIL_BITS = 40;

function checkGridLevels(gridLevels: number): number {
  if (typeof gridLevels !== "number" || !Number.isSafeInteger(gridLevels) || gridLevels < 1) {
    throw new InvalidParameter("grid_levels", `must be a positive integer, got ${String(gridLevels)}`);
  }
  return gridLevels;
}

function checkNoise(noise: unknown): NoiseKind {
  if (noise !== "laplace" && noise !== "gaussian") {
    throw new InvalidParameter("noise", `must be one of laplace, gaussian, got ${String(noise)}`);
  }
  return noise;
}

/** The discrete Laplace scale `G / eps` in grid units, as an exact reduced rational `[num, den]` (Python's `laplace_scale`). */
export function laplaceScale(gridLevels: number, epsilon: number): Rational {
  checkGridLevels(gridLevels);
  if (typeof epsilon !== "number" || !(epsilon > 0) || !Number.isFinite(epsilon)) {
    throw new InvalidParameter("epsilon", `must be > 0, got ${String(epsilon)}`);
  }
  const [en, ed] = floatToRational(epsilon);
  const num = BigInt(gridLevels) * ed;
  const g = gcd(num, en);
  return [num / g, en / g];
}

const sigma2Cache = new Map<string, number>();
const SIGMA2_CACHE_SIZE = 64;

/**
 * The discrete Gaussian variance parameter, in grid units, for `(epsilon, delta)` at sensitivity
 * `gridLevels` (Python's `gaussian_sigma2`: {@link calibrateDiscreteGaussian}, cached).
 */
export function gaussianSigma2(epsilon: number, delta: number, gridLevels: number): number {
  checkGridLevels(gridLevels);
  if (typeof delta !== "number" || !(delta > 0 && delta < 1)) {
    throw new InvalidParameter("delta", `must be in (0, 1) for Gaussian noise, got ${String(delta)}`);
  }
  const key = `${epsilon}|${delta}|${gridLevels}`;
  const cached = sigma2Cache.get(key);
  if (cached !== undefined) return cached;
  const sigma2 = calibrateDiscreteGaussian(epsilon, delta, gridLevels);
  if (sigma2Cache.size >= SIGMA2_CACHE_SIZE) sigma2Cache.delete(sigma2Cache.keys().next().value as string);
  sigma2Cache.set(key, sigma2);
  return sigma2;
}

/**
 * An integer `B` with `P(|noise| > B) <= 2^-40` (Python's `noise_tail_bound`): `ceil(s (T + 1) ln 2)`
 * for the discrete Laplace of scale `s = G / eps`, `ceil(sqrt(2 sigma2 (T + 1) ln 2))` for the
 * discrete Gaussian (`sigma2`-subgaussian, CKS20 Prop. 25).
 */
export function noiseTailBound(gridLevels: number, noise: NoiseKind, epsilon: number, delta: number): bigint {
  const tail = (TAIL_BITS + 1) * Math.log(2.0);
  let bound: number;
  if (checkNoise(noise) === "laplace") {
    laplaceScale(gridLevels, epsilon); // validation, as Python computes the Fraction first
    bound = Math.ceil((gridLevels / epsilon) * tail); // float(G / Fraction(eps)) is the correctly rounded G / eps
  } else {
    bound = Math.ceil(Math.sqrt(gaussianSigma2(epsilon, delta, gridLevels) * 2.0 * tail));
  }
  if (!Number.isFinite(bound)) throw new InvalidParameter("epsilon0", "gives an unbounded noise tail");
  return BigInt(bound);
}

/** `[-B, G + B]`: every grid value an honest report can take (Python's `report_range`). */
export function gridReportRange(gridLevels: number, noise: NoiseKind, epsilon: number, delta: number): [bigint, bigint] {
  const bound = noiseTailBound(gridLevels, noise, epsilon, delta);
  return [-bound, BigInt(gridLevels) + bound];
}

function clip(x: number, low: number, high: number): number {
  return x < low ? low : x > high ? high : x;
}

/** A finite local mean, else {@link InvalidParameter} (Python's `_real_scalar`). */
export function realScalar(value: unknown, name = "local_means"): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new InvalidParameter(name, "must be finite (no NaN or infinity)");
  }
  return value;
}

/**
 * Projection of one finite local mean onto the grid: `[integer part, fractional part]`
 * (Python's `to_grid_one`, the same double operations in the same order).
 */
export function toGridOne(y: number, lower: number, upper: number, gridLevels: number): [number, number] {
  const step = (upper - lower) / gridLevels;
  const clipped = clip(y, lower, upper);
  const u = (clipped - lower) / step;
  const whole = Math.floor(u);
  const floor = clip(whole === u ? u : whole, 0.0, gridLevels);
  const frac = clip(u - floor, 0.0, 1.0);
  return [floor, frac];
}

/**
 * Algorithm 2 for one value on the grid of `[lower, upper]`: the grid value `u + noise`, clamped
 * to {@link gridReportRange}. Draws (Python's `randomize_mean_one`): `bernoulli(frac)`, then
 * `discreteLaplace(G / eps)` or `discreteGaussian(sigma2)` (the calibrated double, exactly).
 *
 * Guarantee: pure `epsilon`-LDP with Laplace noise, `(epsilon, delta)`-LDP with Gaussian noise
 * (CKS20 Thm. 7); the clamp is post-processing. Reference: Girgis, Data & Diggavi 2022, Alg. 2.
 */
export function randomizeGridValue(
  lower: number,
  upper: number,
  noise: NoiseKind,
  gridLevels: number,
  epsilon: number,
  delta: number,
  y: number,
  source: RandomSource,
): bigint {
  const value = realScalar(y);
  checkNoise(noise);
  checkGridLevels(gridLevels);
  const [floor, frac] = toGridOne(value, lower, upper, gridLevels);
  let grid = floor + (source.bernoulli(frac) ? 1 : 0);
  if (grid > gridLevels) grid = gridLevels;
  let draw: bigint;
  if (noise === "laplace") {
    const [num, den] = laplaceScale(gridLevels, epsilon);
    draw = source.discreteLaplace(num, den);
  } else {
    const [num, den] = floatToRational(gaussianSigma2(epsilon, delta, gridLevels));
    draw = source.discreteGaussian(num, den);
  }
  const [low, high] = gridReportRange(gridLevels, noise, epsilon, delta);
  const out = BigInt(grid) + draw;
  return out < low ? low : out > high ? high : out;
}

/**
 * One user's report `[[grid value]]` of a `projected-mean` round.
 *
 * Mechanism: Girgis, Data & Diggavi 2022, Algorithm 2 (projection, randomized rounding to
 * `gridLevels` levels, exact discrete noise; {@link randomizeGridValue}), the device path of
 * `client/mean_randomizer.py`. Guarantee: pure `epsilon0`-LDP (Laplace) or `(epsilon0, delta0)`-LDP
 * (Gaussian, CKS20 Thm. 7).
 */
export function randomize(
  params: ProjectedMeanFields,
  epsilon0: number,
  delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  if (typeof localData !== "number") throw new InvalidParameter("local_data", "must be one number for projected-mean");
  return [[randomizeGridValue(params.lower, params.upper, params.noise, params.gridLevels, epsilon0, delta0, localData, source)]];
}

/** `[grid value in [-B, G + B]]`. */
export function reportRanges(params: ProjectedMeanFields, epsilon0: number, delta0: number): ValueRange[] {
  const [low, high] = gridReportRange(params.gridLevels, params.noise, epsilon0, delta0);
  return [valueRange(low, high)];
}

/** The largest noise scale either exact sampler is asked for (Python's `MAX_NOISE_SCALE`). */
export const MAX_NOISE_SCALE = 2 ** 44;
/** Most reports a batch may hold (Python's `MAX_BATCH`). */
export const MAX_BATCH = 2 ** 24;
/** The range of every round's epsilon0 (Python's `MIN_EPSILON`, `MAX_EPSILON`). */
export const MIN_EPSILON = 1e-6;
export const MAX_EPSILON = 30.0;

function require(condition: boolean, name: string, problem: string): void {
  if (!condition) throw new InvalidParameter(name, problem);
}

/** Python's `check_epsilon_delta`: `MIN_EPSILON <= epsilon0 <= MAX_EPSILON`, `0 <= delta0 < 1`. */
export function checkEpsilonDelta(epsilon0: number, delta0: number): void {
  require(typeof epsilon0 === "number" && Number.isFinite(epsilon0), "epsilon0", `must be finite, got ${String(epsilon0)}`);
  require(MIN_EPSILON <= epsilon0 && epsilon0 <= MAX_EPSILON, "epsilon0", `must be in [${MIN_EPSILON}, ${MAX_EPSILON}], got ${epsilon0}`);
  require(typeof delta0 === "number" && Number.isFinite(delta0), "delta0", `must be finite, got ${String(delta0)}`);
  require(0.0 <= delta0 && delta0 < 1.0, "delta0", `must be in [0, 1), got ${delta0}`);
}

/** Python's `check_local_budget`: the common range, and `delta0 > 0` exactly when the noise is Gaussian. */
export function checkLocalBudget(epsilon0: number, delta0: number, noise: unknown): void {
  checkEpsilonDelta(epsilon0, delta0);
  require(noise === "laplace" || noise === "gaussian", "noise", `must be one of laplace, gaussian, got ${String(noise)}`);
  require((noise === "gaussian") === delta0 > 0, "delta0", "must be > 0 exactly when the noise is Gaussian");
}

/**
 * The budget rules of `ProjectedMeanParams.check_budget` for one interval: the local budget, a
 * noise scale in grid units of at most {@link MAX_NOISE_SCALE} (Laplace `G / eps`; Gaussian the
 * zCDP bound `G / (sqrt(2) sqrt(rho))`, `sqrt(rho) = eps / (sqrt(log(1/delta) + eps) + sqrt(log(1/delta)))`,
 * which the calibrated sigma never exceeds), and decoded reports whose sum over `MAX_BATCH`
 * reports stays a finite double.
 */
export function checkGridBudget(lower: number, upper: number, noise: NoiseKind, gridLevels: number, epsilon: number, delta: number): void {
  checkLocalBudget(epsilon, delta, noise);
  let scale: number;
  if (noise === "laplace") {
    scale = gridLevels / epsilon;
  } else {
    const logInvDelta = -Math.log(delta);
    const sqrtRho = epsilon / (Math.sqrt(logInvDelta + epsilon) + Math.sqrt(logInvDelta));
    scale = gridLevels / (Math.sqrt(2.0) * sqrtRho);
  }
  require(
    scale <= MAX_NOISE_SCALE,
    "epsilon0",
    `gives a noise scale of ${scale.toPrecision(3)} grid units with ${gridLevels} levels; at most ${MAX_NOISE_SCALE.toPrecision(3)} (raise epsilon0 or lower grid_levels)`,
  );
  const step = (upper - lower) / gridLevels;
  const extent = Math.max(Math.abs(lower), Math.abs(upper)) + (gridLevels + 64.0 * scale) * step;
  require(
    extent * MAX_BATCH < Number.MAX_VALUE,
    "upper",
    `reports may decode to magnitude ${extent.toPrecision(3)}; a sum of ${MAX_BATCH} of them overflows a double`,
  );
}

/** `ProjectedMeanParams.check_budget`. */
export function checkBudget(params: ProjectedMeanFields, epsilon0: number, delta0: number): void {
  checkGridBudget(params.lower, params.upper, params.noise, params.gridLevels, epsilon0, delta0);
}
