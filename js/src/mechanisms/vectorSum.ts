/**
 * Vector multi-message summation, `vector-sum` and `shifted-vector-sum`, for one user
 * (mirrors `randomize_vector_sum`, `randomize_shifted_vector_sum` and `encode_vectors` of
 * `client/summation.py`).
 *
 * @module
 */

import { skellamShares } from "../random/distributedNoise.js";
import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { splitShares } from "./fixedPoint.js";
import { checkVectorSum, nextPowerOfTwo } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealVector, euclideanNorm, largestMagnitude, rotationOf } from "./vectorInput.js";

/** What the encoding reads of `vector-sum`, `shifted-vector-sum` and `local-vector` parameters. */
export interface VectorEncodingFields {
  readonly dim: number | bigint;
  readonly radius: number;
  readonly levels: number | bigint;
  readonly rotationSeed: number | bigint;
}

/** What this module reads of `vector-sum` parameters (`shifted-vector-sum` adds `center`). */
export interface VectorSumFields extends VectorEncodingFields {
  readonly mechanism?: string;
  readonly modulus: number | bigint;
  readonly messages: number | bigint;
  readonly users: number | bigint;
  readonly mu: number;
  readonly center?: readonly number[];
}

/** `np.finfo(float).tiny`, the smallest normal double. */
const TINY = 2.2250738585072014e-308;

/**
 * `x` scaled down to l2 norm at most `radius` (unchanged inside the ball), overflow-safe for
 * entries near 1e308: the same double operations as Python's `clip_to_ball`.
 */
export function clipToBall(x: readonly number[], radius: number): number[] {
  const m = largestMagnitude(x);
  const largest = m > TINY ? m : TINY;
  const unit = x.map((v) => v / largest);
  const relative = euclideanNorm(unit);
  const limit = radius / largest;
  const scale = relative <= limit ? largest : radius / (relative > 0 ? relative : 1.0);
  return unit.map((v) => v * scale);
}

/**
 * `x - center`, for clipping to the ball about the centre (Python's `shifted_vectors`). Data of
 * another dimension than the round's is refused, never broadcast; a difference past the
 * largest double becomes its direction at the full radius (what clipping the exact difference gives).
 */
export function shiftedVector(x: readonly number[], center: readonly number[], dim: number, radius: number): number[] {
  if (x.length !== dim) throw new InvalidParameter("vectors", `have ${x.length} coordinates; the round is for ${dim}`);
  if (center.length !== dim) throw new InvalidParameter("center", `must give one coordinate per input dimension (${dim})`);
  const shifted = x.map((v, i) => v - center[i]);
  if (shifted.every((v) => Number.isFinite(v))) return shifted;
  const halves = x.map((v, i) => v / 2.0 - center[i] / 2.0);
  return clipToBall(halves, 1.0).map((v) => v * radius);
}

/**
 * Clip to the l2 ball of `radius`, rotate (`U = H D / sqrt(D)`, the round's public seed), scale
 * by `levels / radius` and round every coordinate at random (`floor + Bernoulli(frac)`, one
 * `source.bernoulli` per coordinate in order): `D` integers, unbiased for the scaled rotated
 * vector, with `||encoded||_2 <= levels + sqrt(D)`. Mirrors `encode_vectors`.
 */
export function encodeVector(x: readonly number[], params: VectorEncodingFields, source: RandomSource): bigint[] {
  const levels = Number(params.levels);
  const clipped = clipToBall(x, params.radius);
  const rotated = rotationOf(params.dim, params.rotationSeed).apply(clipped);
  const gridScale = levels / params.radius;
  const out: bigint[] = new Array(rotated.length);
  for (let i = 0; i < rotated.length; i++) {
    const scaled = rotated[i] * gridScale;
    const base = Math.floor(scaled);
    const up = source.bernoulli(scaled - base);
    out[i] = BigInt(base) + (up ? 1n : 0n);
  }
  return out;
}

/**
 * `vector-sum` (and `shifted-vector-sum`, of `x - center`): one user's `D * messages` reports
 * `[coordinate, share]`.
 *
 * Mechanism: encode the vector ({@link encodeVector}), add one Skellam share
 * `Poisson(mu / users) - Poisson(mu / users)` per coordinate (exact sampler; the `users`
 * shares sum to `Skellam(mu)`), and split every coordinate into `messages` additive shares
 * mod `modulus`, coordinate by coordinate.
 *
 * Guarantee: CENTRAL only. A user's shares alone are not private (together they reveal its
 * noisy encoding); the round is `(epsilon0, delta0)`-DP for the sum of all `users` users'
 * shares mixed by an honest shuffler, by the split-and-mix bound plus the Skellam RDP bound
 * ({@link checkBudget}). Reference: Huang, Liang & Yi, NeurIPS 2021, Sec. 5, Lemma 5;
 * Balle, Bell, Gascón & Nissim, CCS 2020; Agarwal, Kairouz & Liu, NeurIPS 2021.
 */
export function randomize(
  params: VectorSumFields,
  _epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  let x = asRealVector(localData);
  if (params.mechanism === "shifted-vector-sum" || params.center !== undefined) {
    x = shiftedVector(x, params.center ?? [], Number(params.dim), params.radius);
  }
  const encoded = encodeVector(x, params, source);
  const noise = skellamShares(params.mu, Number(params.users), encoded.length, source);
  const modulus = BigInt(params.modulus);
  const messages = Number(params.messages);
  const reports: bigint[][] = [];
  for (let l = 0; l < encoded.length; l++) {
    for (const share of splitShares(encoded[l] + noise[l], modulus, messages, source)) {
      reports.push([BigInt(l), share]);
    }
  }
  return reports;
}

/** `[coordinate in [0, D)], [share in [0, q)]`. A share can be any residue: this bounds nothing of the sum. */
export function reportRanges(params: VectorSumFields, _epsilon0: number, _delta0: number): ValueRange[] {
  const padded = nextPowerOfTwo(Number(params.dim));
  return [valueRange(0n, BigInt(padded - 1)), valueRange(0n, BigInt(params.modulus) - 1n)];
}

/** The round's central `(epsilon0, delta0)` must follow from the split and the Skellam noise (`check_vector_sum`). */
export function checkBudget(params: VectorSumFields, epsilon0: number, delta0: number): void {
  checkVectorSum(params, epsilon0, delta0);
}
