/**
 * Sylvester-Hadamard matrices without materialising them: `H[j, v] = (-1)^popcount(j & v)`
 * (mirrors `protocol/mechanisms/hadamard.py`).
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";

/** Number of set bits of a non-negative safe integer (below 2^53). */
export function popcount(x: number): number {
  let count = 0;
  let high = Math.floor(x / 2 ** 32);
  let low = x >>> 0;
  while (low !== 0) {
    low &= low - 1;
    count += 1;
  }
  while (high !== 0) {
    high &= high - 1;
    count += 1;
  }
  return count;
}

/** Bitwise AND of two non-negative safe integers (JS `&` works on 32 bits only). */
export function andSafe(a: number, b: number): number {
  const high = (Math.floor(a / 2 ** 32) & Math.floor(b / 2 ** 32)) >>> 0;
  const low = (a & b) >>> 0;
  return high * 2 ** 32 + low;
}

/** `H[j, v] = (-1)^popcount(j & v)` as +1 or -1; the indices must be non-negative safe integers. */
export function hadamardEntry(j: number, v: number): 1 | -1 {
  if (!Number.isSafeInteger(j) || !Number.isSafeInteger(v) || j < 0 || v < 0) {
    throw new InvalidParameter("j, v", "Hadamard indices must be non-negative");
  }
  return (popcount(andSafe(j, v)) & 1) === 0 ? 1 : -1;
}

/** Whether `k` is a power of two (`k >= 1`). */
export function isPowerOfTwo(k: number): boolean {
  return Number.isSafeInteger(k) && k >= 1 && popcount(k) === 1;
}

/** The smallest power of two `>= k` (`k >= 1`, a safe integer), as Python's `next_power_of_two`. */
export function nextPowerOfTwo(k: number): number {
  if (!Number.isSafeInteger(k) || k < 1) throw new InvalidParameter("k", `must be >= 1, got ${String(k)}`);
  let p = 1;
  while (p < k) p *= 2;
  return p;
}
