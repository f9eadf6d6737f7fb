/**
 * `local-vector`: a clipped, shifted vector with local Skellam noise, for one user (mirrors
 * `randomize_local_vector` of `client/summation.py` and `LocalVectorParams`).
 *
 * @module
 */

import { skellamShares } from "../random/distributedNoise.js";
import type { RandomSource } from "../random/source.js";
import { checkEpsilonDelta } from "./projectedMean.js";
import { checkLocalSkellam, localVectorBound, nextPowerOfTwo } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector } from "./vectorInput.js";
import { encodeVector, shiftedVector, type VectorEncodingFields } from "./vectorSum.js";

/** What this module reads of `local-vector` parameters. */
export interface LocalVectorFields extends VectorEncodingFields {
  readonly mu: number;
  readonly center: readonly number[];
}

/**
 * One user's `D` reports `[coordinate, value]`.
 *
 * Mechanism: subtract the public `center`, clip to the l2 ball of `radius`, rotate, scale by
 * `levels / radius` and round at random (the encoding of `vector-sum`), add `Skellam(mu)`
 * to every coordinate from this user alone (exact sampler), and clamp to `[-bound, bound]`
 * (post-processing of the noisy value: no privacy cost; the clamp binds with probability below
 * `2^-64` per value).
 *
 * Guarantee: local `(epsilon0, delta0)`-DP with `delta0 > 0`, from the Skellam RDP bound of
 * Agarwal, Kairouz & Liu (NeurIPS 2021) at the encoding's l1 and l2 sensitivities, converted by
 * Canonne, Kamath & Steinke 2020, Prop. 12 ({@link checkBudget}). Not pure: no amplification by
 * shuffling is claimed. Reference: Huang, Liang & Yi, NeurIPS 2021, Sec. 5 step 4 (local version).
 */
export function randomize(
  params: LocalVectorFields,
  _epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const x = shiftedVector(asRealVector(localData), params.center, Number(params.dim), params.radius);
  const encoded = encodeVector(x, params, source);
  const noise = skellamShares(params.mu, 1, encoded.length, source);
  const bound = localVectorBound(params.levels, params.mu);
  return encoded.map((value, l) => {
    const noisy = value + noise[l];
    return [BigInt(l), noisy < -bound ? -bound : noisy > bound ? bound : noisy];
  });
}

/** `[coordinate in [0, D)], [value in [-bound, bound]]`. */
export function reportRanges(params: LocalVectorFields, _epsilon0: number, _delta0: number): ValueRange[] {
  const padded = nextPowerOfTwo(Number(params.dim));
  const bound = localVectorBound(params.levels, params.mu);
  return [valueRange(0n, BigInt(padded - 1)), valueRange(-bound, bound)];
}

/** The common budget range, `delta0 > 0`, and the Skellam noise must give `(epsilon0, delta0)` for one user's report. */
export function checkBudget(params: LocalVectorFields, epsilon0: number, delta0: number): void {
  checkEpsilonDelta(epsilon0, delta0);
  checkLocalSkellam(params, epsilon0, delta0);
}
