/**
 * `hadamard-range`: the Hadamard-response range randomizer of Girgis, Data & Diggavi 2022
 * (Algorithm 4), for one user; mirrors the device path of `client/range_randomizer.py`
 * (`randomize_range_one`, `bin_index_one`, `hadamard_response_one`, `keep_probability`).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { hadamardEntry, nextPowerOfTwo } from "./hadamard.js";
import { MAX_EPSILON, MIN_EPSILON, realScalar } from "./projectedMean.js";
import { valueRange, type ValueRange } from "./valueRange.js";

/** What this module reads of `hadamard-range` parameters. */
export interface HadamardRangeFields {
  readonly low: number;
  readonly high: number;
  readonly tau: number;
}

const scratch = new DataView(new ArrayBuffer(8));

/**
 * The next double from a positive finite `x` toward 0 (Python's `math.nextafter(x, 0.0)` for `x > 0`),
 * by decrementing its IEEE 754 bit pattern.
 */
export function nextDown(x: number): number {
  if (!(x > 0) || !Number.isFinite(x)) throw new InvalidParameter("x", `must be a positive finite double, got ${String(x)}`);
  scratch.setFloat64(0, x);
  const bits = scratch.getBigUint64(0);
  scratch.setBigUint64(0, bits - 1n);
  return scratch.getFloat64(0);
}

/**
 * A double `p <= e^eps / (e^eps + 1)`: `1 / (1 + exp(-eps))` stepped down 4 ulps (its rounding
 * error is below 3 ulps: exp within 1, the sum and the quotient within half each), so the
 * realised likelihood ratio `p / (1 - p)` is at most `e^eps` (Python's `keep_probability`).
 */
export function keepProbability(epsilon: number): number {
  if (typeof epsilon !== "number" || !(MIN_EPSILON <= epsilon && epsilon <= MAX_EPSILON)) {
    throw new InvalidParameter("epsilon", `must be in [${MIN_EPSILON}, ${MAX_EPSILON}], got ${String(epsilon)}`);
  }
  let p = 1.0 / (1.0 + Math.exp(-epsilon));
  for (let i = 0; i < 4; i++) p = nextDown(p);
  return p;
}

/** Python's `HadamardRangeParams.num_bins`: `max(1, ceil((high - low) / (2 tau) - 1e-12))`. */
export function numBins(params: HadamardRangeFields): number {
  return Math.max(1, Math.ceil((params.high - params.low) / (2.0 * params.tau) - 1e-12));
}

/** Python's `HadamardRangeParams.padded_bins`: {@link numBins} rounded up to a power of two. */
export function paddedBins(params: HadamardRangeFields): number {
  return nextPowerOfTwo(numBins(params));
}

/** The index of the bin of one finite local mean, clamped (Python's `bin_index_one`). */
export function binIndexOne(y: number, params: HadamardRangeFields): number {
  const low = params.low;
  const high = params.high;
  const clipped = y < low ? low : y > high ? high : y;
  const index = Math.floor((clipped - low) / (2.0 * params.tau));
  const last = numBins(params) - 1;
  return index < 0 ? 0 : index > last ? last : index;
}

/**
 * Hadamard response of one input index `nu` in `[0, K)`: `[row, bit]` with `row` uniform on
 * `[0, K)` and `bit = H[row, nu]` kept with probability {@link keepProbability} (rounded down
 * by the source), negated otherwise. Draws: `integer(K)`, then `bernoulli(p)`.
 *
 * Guarantee: pure `epsilon`-LDP for any input index: every output has probability `p / K` or
 * `(1 - p) / K`, ratio at most `p / (1 - p) <= e^eps` (Girgis, Data & Diggavi 2022, Lemma 1).
 */
export function hadamardResponseOne(nu: number, paddedBinCount: number, epsilon: number, source: RandomSource): [number, number] {
  const row = source.integer(paddedBinCount);
  const keep = source.bernoulli(keepProbability(epsilon));
  const trueSign = hadamardEntry(row, nu);
  return [row, keep ? trueSign : -trueSign];
}

/**
 * One user's report `[[row, bit]]` of a `hadamard-range` round.
 *
 * Mechanism: Girgis, Data & Diggavi 2022, Algorithm 4 (`client/range_randomizer.py`): the
 * local mean's bin `nu` over `[low, high]` (bins of width `2 tau`), a uniform row `j` of the
 * `K x K` Sylvester-Hadamard matrix and `H[j, nu]`, kept with probability `e^eps / (e^eps + 1)`
 * (rounded down) and negated otherwise. Guarantee: pure `epsilon0`-LDP (Lemma 1 / Appendix A).
 */
export function randomize(
  params: HadamardRangeFields,
  epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  if (typeof localData !== "number") throw new InvalidParameter("local_data", "must be one number for hadamard-range");
  const y = realScalar(localData);
  const [row, bit] = hadamardResponseOne(binIndexOne(y, params), paddedBins(params), epsilon0, source);
  return [[BigInt(row), BigInt(bit)]];
}

/** `[row in [0, K), bit in {-1, +1}]`. */
export function reportRanges(params: HadamardRangeFields, _epsilon0: number, _delta0: number): ValueRange[] {
  return [valueRange(0n, BigInt(paddedBins(params) - 1)), valueRange(-1n, 1n, 2n)];
}

/** `HadamardRangeParams.check_budget`: randomized response is pure, so `delta0` must be 0. */
export function checkBudget(_params: HadamardRangeFields, _epsilon0: number, delta0: number): void {
  if (delta0 !== 0) throw new InvalidParameter("delta0", "must be 0: randomized response is pure epsilon-LDP");
}
