/**
 * What the vector mechanisms share: the check of a device's own vector, the public rotation
 * a round names, and numpy's summation order for a Euclidean norm (so norms, hence clipping
 * and bins, agree with the Python randomizers to the last bit).
 *
 * @module
 */

import { RandomRotation } from "../random/numpyRotationSigns.js";
import { InvalidParameter } from "../wire/errors.js";

/**
 * `localData` as a vector of finite reals, refused otherwise (Python's
 * `as_real_array(values, name, ndim=2)` for a batch of one): a device never randomizes NaN,
 * infinities or anything that is not a number.
 */
export function asRealVector(localData: unknown, name = "vectors"): number[] {
  if (!Array.isArray(localData)) {
    throw new InvalidParameter(name, "must be a vector (an array of numbers) for this mechanism");
  }
  const out: number[] = new Array(localData.length);
  for (let i = 0; i < localData.length; i++) {
    const v: unknown = localData[i];
    if (typeof v !== "number") throw new InvalidParameter(name, "must hold real numbers");
    if (!Number.isFinite(v)) throw new InvalidParameter(name, "must be finite (no NaN or infinity)");
    out[i] = v;
  }
  return out;
}

/** `localData` as one finite real (`as_real_array(values, name)` for a batch of one scalar). */
export function asRealScalar(localData: unknown, name = "local_means"): number {
  if (typeof localData !== "number") throw new InvalidParameter(name, "must be a real number for this mechanism");
  if (!Number.isFinite(localData)) throw new InvalidParameter(name, "must be finite (no NaN or infinity)");
  return localData;
}

const ROTATIONS = new Map<string, RandomRotation>();
const ROTATION_CACHE_SIZE = 16;

/** The public rotation `U = H diag(signs) / sqrt(D)` of `(dim, seed)`, cached (its signs cost a PCG64 stream). */
export function rotationOf(dim: number | bigint, seed: number | bigint): RandomRotation {
  const d = Number(dim);
  const s = BigInt(seed);
  const key = `${d}/${s}`;
  const hit = ROTATIONS.get(key);
  if (hit !== undefined) {
    ROTATIONS.delete(key); // most recently used last
    ROTATIONS.set(key, hit);
    return hit;
  }
  const rotation = new RandomRotation(d, s);
  ROTATIONS.set(key, rotation);
  if (ROTATIONS.size > ROTATION_CACHE_SIZE) {
    const oldest = ROTATIONS.keys().next().value;
    if (oldest !== undefined) ROTATIONS.delete(oldest);
  }
  return rotation;
}

/**
 * numpy's pairwise summation of doubles (`add.reduce` along a contiguous axis): fewer than 8
 * terms in order; up to 128 in eight interleaved partial sums combined as
 * `((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))` plus the remainder in order; beyond,
 * the two halves (the first a multiple of 8 long) summed recursively.
 */
export function pairwiseSum(a: ArrayLike<number>, start = 0, n = a.length - start): number {
  if (n < 8) {
    let res = 0.0;
    for (let i = 0; i < n; i++) res += a[start + i];
    return res;
  }
  if (n <= 128) {
    const r = [0, 1, 2, 3, 4, 5, 6, 7].map((j) => a[start + j]);
    let i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (let j = 0; j < 8; j++) r[j] += a[start + i + j];
    }
    let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += a[start + i];
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(a, start, n2) + pairwiseSum(a, start + n2, n - n2);
}

/** `np.linalg.norm(x)` of one row, in numpy's operation order. */
export function euclideanNorm(x: ArrayLike<number>): number {
  const squares = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) squares[i] = x[i] * x[i];
  return Math.sqrt(pairwiseSum(squares));
}

/** `np.abs(x).max(initial=0.0)`. */
export function largestMagnitude(x: ArrayLike<number>): number {
  let m = 0.0;
  for (let i = 0; i < x.length; i++) {
    const v = Math.abs(x[i]);
    if (v > m || Number.isNaN(v)) m = v;
  }
  return m;
}
