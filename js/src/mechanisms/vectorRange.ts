/**
 * `vector-range`: the range round of the vector mean protocol, for one user (mirrors
 * `randomize_vector_range` of `client/vector_randomizer.py` as `randomize_round` calls it).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { hadamardEntry } from "./hadamard.js";
import { binIndexOne, keepProbability, paddedBins } from "./hadamardRange.js";
import { MIN_EPSILON, realScalar } from "./projectedMean.js";
import { nextPowerOfTwo } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector, rotationOf } from "./vectorInput.js";

/** What this module reads of `vector-range` parameters. */
export interface VectorRangeFields {
  readonly low: number;
  readonly high: number;
  readonly tau: number;
  readonly dim: number | bigint;
  readonly rotationSeed: number | bigint;
  readonly mode: string;
}

/** Reports per user: 1 (`sampled`) or `D` (`paper`). */
export function reportsPerUser(params: VectorRangeFields): number {
  return params.mode === "sampled" ? 1 : nextPowerOfTwo(Number(params.dim));
}

/**
 * One user's reports `[coordinate, row, bit]`: one (`sampled`) or `D` (`paper`).
 *
 * Mechanism: rotate the local mean with the round's public randomized Hadamard transform
 * (`U = H diag(signs) / sqrt(D)`), then Hadamard response over the bins of width `2 tau` of
 * `[low, high]`: `sampled` draws one coordinate uniformly (`integer(D)`), then `integer(K)` and
 * `bernoulli(p(epsilon0))`; `paper` answers every coordinate at `epsilon0 / D`, drawing the `D`
 * rows first, then the `D` keep decisions, as Python's batch path.
 *
 * A rotated coordinate that overflows (inputs near the largest double) is refused when it is
 * the one answered (sampled) or always (paper), as Python's batch path refuses it.
 *
 * Guarantee: local pure `epsilon0`-DP: the coordinate is drawn independently of the data and
 * Hadamard response is `eps`-LDP for any input index; in paper mode by basic composition of
 * `D` reports at `epsilon0 / D`. Reference: Girgis, Data & Diggavi 2022, Algorithm 5 lines 4-10.
 */
export function randomize(
  params: VectorRangeFields,
  epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const rotated = rotationOf(params.dim, params.rotationSeed).apply(asRealVector(localData, "local_data"));
  const dim = rotated.length;
  const bins = paddedBins(params);
  if (params.mode === "sampled") {
    const coord = source.integer(dim);
    const nu = binIndexOne(realScalar(rotated[coord], "local_means"), params);
    const row = source.integer(bins);
    const keep = source.bernoulli(keepProbability(epsilon0));
    const sign = hadamardEntry(row, nu);
    return [[BigInt(coord), BigInt(row), BigInt(keep ? sign : -sign)]];
  }
  if (params.mode !== "paper") throw new InvalidParameter("mode", `must be one of sampled, paper, got ${String(params.mode)}`);
  for (const value of rotated) realScalar(value, "local_means");
  const rows: number[] = [];
  for (let l = 0; l < dim; l++) rows.push(source.integer(bins));
  const p = keepProbability(epsilon0 / dim);
  const reports: bigint[][] = [];
  for (let l = 0; l < dim; l++) {
    const keep = source.bernoulli(p);
    const sign = hadamardEntry(rows[l], binIndexOne(rotated[l], params));
    reports.push([BigInt(l), BigInt(rows[l]), BigInt(keep ? sign : -sign)]);
  }
  return reports;
}

/** `[coordinate in [0, D)], [row in [0, K)], [bit in {-1, +1}]`. */
export function reportRanges(params: VectorRangeFields, _epsilon0: number, _delta0: number): ValueRange[] {
  const padded = nextPowerOfTwo(Number(params.dim));
  return [valueRange(0n, BigInt(padded - 1)), valueRange(0n, BigInt(paddedBins(params) - 1)), valueRange(-1n, 1n, 2n)];
}

/** Pure: `delta0` must be 0; in paper mode each of the `D` reports gets `epsilon0 / D`, at least `MIN_EPSILON`. */
export function checkBudget(params: VectorRangeFields, epsilon0: number, delta0: number): void {
  if (delta0 !== 0) throw new InvalidParameter("delta0", "must be 0: randomized response is pure epsilon-LDP");
  const reports = reportsPerUser(params);
  if (!(epsilon0 / reports >= MIN_EPSILON)) {
    throw new InvalidParameter("epsilon0", `${epsilon0} over ${reports} reports is below ${MIN_EPSILON} per report`);
  }
}
