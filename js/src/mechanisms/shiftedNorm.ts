/**
 * `shifted-norm`: Hadamard response of the bin of `log2 ||x - center||`, for one user (mirrors
 * `randomize_shifted_norm` and `shifted_log_norms` of `client/quantile_randomizer.py`).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { binIndexOne, hadamardResponseOne, paddedBins } from "./hadamardRange.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector, euclideanNorm, largestMagnitude } from "./vectorInput.js";

/** What this module reads of `shifted-norm` parameters. */
export interface ShiftedNormFields {
  readonly center: readonly number[];
  readonly low: number;
  readonly high: number;
  readonly tau: number;
}

/**
 * `log2 ||x - center||`, overflow-safe: `-Infinity` for a zero distance, `+Infinity` for a
 * difference past the largest double (the top bin). The same double operations as Python.
 */
export function shiftedLogNorm(x: readonly number[], center: readonly number[]): number {
  if (x.length !== center.length) {
    throw new InvalidParameter("vectors", `have ${x.length} coordinates; the round's center has ${center.length}`);
  }
  const diff = x.map((v, i) => v - center[i]);
  const largest = largestMagnitude(diff);
  if (!Number.isFinite(largest)) return Infinity;
  if (!(largest > 0)) return -Infinity;
  const relative = euclideanNorm(diff.map((v) => v / largest));
  return Math.log2(largest) + Math.log2(relative > 1.0 ? relative : 1.0);
}

/**
 * One user's report `[[row, bit]]`.
 *
 * Mechanism: the bin (width `2 tau` over `[low, high]`, clamped) of `log2 ||x - center||`, a zero
 * distance counting as `low`, answered by Hadamard response (`integer(K)`, `bernoulli(p(epsilon0))`).
 *
 * Guarantee: local pure `epsilon0`-DP (Hadamard response of a function of the data).
 * Reference: Huang, Liang & Yi, NeurIPS 2021, Sec. 5 step 3; Girgis, Data & Diggavi 2022, Alg. 4.
 */
export function randomize(
  params: ShiftedNormFields,
  epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const logNorm = shiftedLogNorm(asRealVector(localData), params.center);
  const leaf = binIndexOne(logNorm > params.low ? logNorm : params.low, params);
  const [row, bit] = hadamardResponseOne(leaf, paddedBins(params), epsilon0, source);
  return [[BigInt(row), BigInt(bit)]];
}

/** `[row in [0, K)], [bit in {-1, +1}]`. */
export function reportRanges(params: ShiftedNormFields, _epsilon0: number, _delta0: number): ValueRange[] {
  return [valueRange(0n, BigInt(paddedBins(params) - 1)), valueRange(-1n, 1n, 2n)];
}

/** Pure: `delta0` must be 0. */
export function checkBudget(_params: ShiftedNormFields, _epsilon0: number, delta0: number): void {
  if (delta0 !== 0) throw new InvalidParameter("delta0", "must be 0: randomized response is pure epsilon-LDP");
}
