/**
 * Fixed-point encoding with randomized rounding and additive secret sharing mod `q`, for one
 * user, mirroring `FixedPoint.encode` and `split` of `protocol/mechanisms/modular_sum.py`.
 *
 * Reference: Balle, Bell, Gascón & Nissim, "Private Summation in the Multi-Message Shuffle
 * Model", CCS 2020 (arXiv:2002.00817), Sec. 3-4; Ghazi, Manurangsi, Pagh & Velingker,
 * Eurocrypt 2020.
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";

/** Largest fixed-point precision (`modular_sum.MAX_PRECISION`): the scaled value's floor is exact. */
export const MAX_PRECISION = 2 ** 52;
/** Largest modulus (`modular_sum.MAX_MODULUS`). */
export const MAX_MODULUS = 1n << 62n;

/** `np.clip` of one number (`low <= high`; a NaN stays NaN, as numpy keeps it). */
function clip(x: number, low: number, high: number): number {
  return x < low ? low : x > high ? high : x;
}

/**
 * Unbiased encoding of a real in `[lower, upper]` as an integer of `{0, ..., precision}`:
 * clip, scale to `s = precision ((x - lower) / (upper - lower))` and round at random,
 * `floor(s) + Bernoulli(s - floor(s))` (one `source.bernoulli` draw, rounded down by a
 * secure source). `E[encode(x)] = s` for `x` inside the interval; clipped inputs encode
 * deterministically. The same double operations as Python's `FixedPoint.scaled` and `encode`.
 */
export function encodeFixedPoint(x: number, lower: number, upper: number, precision: number, source: RandomSource): bigint {
  if (!Number.isFinite(lower)) throw new InvalidParameter("lower", `must be finite, got ${String(lower)}`);
  if (!Number.isFinite(upper)) throw new InvalidParameter("upper", `must be finite, got ${String(upper)}`);
  if (!(lower < upper)) throw new InvalidParameter("upper", `must be > lower = ${lower}, got ${upper}`);
  if (!Number.isFinite(upper - lower)) throw new InvalidParameter("upper", "upper - lower overflows a double");
  if (!Number.isSafeInteger(precision) || precision < 1 || precision > MAX_PRECISION) {
    throw new InvalidParameter("precision", `must be in [1, ${MAX_PRECISION}], got ${String(precision)}`);
  }
  if (typeof x !== "number" || Number.isNaN(x)) throw new InvalidParameter("x", "must not contain NaN");
  const c = clip(x, lower, upper);
  const s = clip(precision * ((c - lower) / (upper - lower)), 0.0, precision);
  const base = Math.floor(s);
  const up = source.bernoulli(s - base);
  return BigInt(base) + (up ? 1n : 0n);
}

/** `value mod q` in `[0, q)` (floor mod, as numpy's `np.mod` for `q > 0`). */
export function floorMod(value: bigint, q: bigint): bigint {
  const r = value % q;
  return r < 0n ? r + q : r;
}

/**
 * Split `value` into `messages` additive shares mod `modulus`: shares `1 .. M-1` uniform on
 * `{0, ..., q-1}` (`source.integer(q)`, in order), the last `value - (their sum) mod q`.
 * The shares sum to `value` mod `q`, and any `M - 1` of them are i.i.d. uniform whatever the
 * value (BBGN20 Sec. 3). Mirrors `modular_sum.split` for a batch of one.
 */
export function splitShares(value: bigint, modulus: bigint, messages: number, source: RandomSource): bigint[] {
  if (typeof modulus !== "bigint" || modulus < 2n || modulus > MAX_MODULUS) {
    throw new InvalidParameter("modulus", `must lie in [2, 2^62], got ${String(modulus)}`);
  }
  if (!Number.isSafeInteger(messages) || messages < 1) {
    throw new InvalidParameter("messages", `must be >= 1, got ${String(messages)}`);
  }
  const shares: bigint[] = [];
  let acc = 0n;
  for (let j = 0; j < messages - 1; j++) {
    const share = source.integer(modulus);
    shares.push(share);
    acc = (acc + share) % modulus;
  }
  shares.push(floorMod(floorMod(value, modulus) - acc, modulus));
  return shares;
}
