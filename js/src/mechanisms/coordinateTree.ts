/**
 * `coordinate-tree`: one node of one rotated coordinate's dyadic range tree, for one user
 * (mirrors `randomize_coordinate_tree` of `client/quantile_randomizer.py`).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { hadamardResponseOne, binIndexOne, paddedBins } from "./hadamardRange.js";
import { nextPowerOfTwo } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector, rotationOf } from "./vectorInput.js";

/** What this module reads of `coordinate-tree` parameters. */
export interface CoordinateTreeFields {
  readonly low: number;
  readonly high: number;
  readonly tau: number;
  readonly dim: number | bigint;
  readonly rotationSeed: number | bigint;
}

/** Levels of the tree below the root: `log2 K`. */
export function treeLevelCount(params: CoordinateTreeFields): number {
  return Math.round(Math.log2(paddedBins(params)));
}

/**
 * One user's report `[[group, row, bit]]`, `group = coordinate * levels + level - 1`.
 *
 * Mechanism: rotate the vector with the round's public randomized Hadamard transform, draw
 * one rotated coordinate (`integer(D)`) and one level `h` in `1..levels` (`integer(levels) + 1`)
 * uniformly, and answer Hadamard response (`integer(K)`, `bernoulli(p(epsilon0))`) for the
 * node at level `h` above the coordinate's leaf (the leaf index shifted right by `levels - h`).
 *
 * Guarantee: local pure `epsilon0`-DP: the group is drawn independently of the data, and
 * Hadamard response is `epsilon0`-LDP for any input index. Reference: Huang, Liang & Yi,
 * NeurIPS 2021, Sec. 5 step 2; Cormode, Kulkarni & Srivastava, VLDB 2019.
 */
export function randomize(
  params: CoordinateTreeFields,
  epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const rotated = rotationOf(params.dim, params.rotationSeed).apply(asRealVector(localData));
  const levels = treeLevelCount(params);
  const coord = source.integer(rotated.length);
  const level = source.integer(levels) + 1;
  // A coordinate that overflowed in the rotation: +-Infinity clamps to an end bin; NaN takes bin 0,
  // where numpy's cast of NaN to int64, clipped, puts it (the Python batch path does not refuse).
  const value = rotated[coord];
  const leaf = Number.isNaN(value) ? 0 : binIndexOne(value, params);
  const node = Math.floor(leaf / 2 ** (levels - level));
  const [row, bit] = hadamardResponseOne(node, paddedBins(params), epsilon0, source);
  return [[BigInt(coord * levels + level - 1), BigInt(row), BigInt(bit)]];
}

/** `[group in [0, D levels)], [row in [0, K)], [bit in {-1, +1}]`. */
export function reportRanges(params: CoordinateTreeFields, _epsilon0: number, _delta0: number): ValueRange[] {
  const groups = nextPowerOfTwo(Number(params.dim)) * treeLevelCount(params);
  return [valueRange(0n, BigInt(groups - 1)), valueRange(0n, BigInt(paddedBins(params) - 1)), valueRange(-1n, 1n, 2n)];
}

/** Pure: `delta0` must be 0. */
export function checkBudget(_params: CoordinateTreeFields, _epsilon0: number, delta0: number): void {
  if (delta0 !== 0) throw new InvalidParameter("delta0", "must be 0: randomized response is pure epsilon-LDP");
}
