/**
 * `vector-mean`: the mean round of the vector mean protocol, for one user (mirrors
 * `randomize_vector_mean` of `client/vector_randomizer.py` as `randomize_round` calls it).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { checkGridBudget, gridReportRange, randomizeGridValue, type NoiseKind } from "./projectedMean.js";
import { nextPowerOfTwo } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector, rotationOf } from "./vectorInput.js";

/** What this module reads of `vector-mean` parameters. */
export interface VectorMeanFields {
  readonly dim: number | bigint;
  readonly rotationSeed: number | bigint;
  readonly lower: readonly number[];
  readonly upper: readonly number[];
  readonly noise: NoiseKind;
  readonly gridLevels: number;
}

/**
 * One user's report `[[coordinate, grid value]]`.
 *
 * Mechanism: rotate the local mean with the round's public randomized Hadamard transform,
 * draw one rotated coordinate `l` uniformly (`source.integer(D)`, independent of the data),
 * project it onto the announced `[lower[l], upper[l]]`, round it at random to the grid of
 * `gridLevels` levels and add exact discrete Laplace (`G / epsilon0`) or discrete Gaussian noise
 * (`randomizeGridValue`, Algorithm 2), clamped to the public report range (post-processing).
 *
 * Guarantee: local pure `epsilon0`-DP with Laplace noise, local `(epsilon0, delta0)`-DP with
 * Gaussian noise (CKS20 Thm. 7): the coordinate is drawn independently of the data, and the
 * report's sensitivity is `gridLevels` grid units whichever coordinate is drawn.
 * Reference: Girgis, Data & Diggavi 2022, Algorithm 5 lines 11-14.
 */
export function randomize(
  params: VectorMeanFields,
  epsilon0: number,
  delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const rotated = rotationOf(params.dim, params.rotationSeed).apply(asRealVector(localData, "local_data"));
  const padded = rotated.length;
  if (params.lower.length !== padded || params.upper.length !== padded) {
    throw new InvalidParameter("ranges", `must have shape (${padded}, 2)`);
  }
  const coord = source.integer(padded);
  const value = randomizeGridValue(
    params.lower[coord],
    params.upper[coord],
    params.noise,
    params.gridLevels,
    epsilon0,
    delta0,
    rotated[coord],
    source,
  );
  return [[BigInt(coord), value]];
}

/** `[coordinate in [0, D)], [grid value in [-B, G + B]]` (the range in grid units depends on `G`, the noise and the budget only). */
export function reportRanges(params: VectorMeanFields, epsilon0: number, delta0: number): ValueRange[] {
  const padded = nextPowerOfTwo(Number(params.dim));
  const [low, high] = gridReportRange(params.gridLevels, params.noise, epsilon0, delta0);
  return [valueRange(0n, BigInt(padded - 1)), valueRange(low, high)];
}

/** As a `projected-mean` round on every coordinate's interval. */
export function checkBudget(params: VectorMeanFields, epsilon0: number, delta0: number): void {
  for (let i = 0; i < Math.min(params.lower.length, params.upper.length); i++) {
    checkGridBudget(params.lower[i], params.upper[i], params.noise, params.gridLevels, epsilon0, delta0);
  }
}
