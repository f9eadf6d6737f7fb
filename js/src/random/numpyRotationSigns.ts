/**
 * The public random rotation `U = H diag(signs) / sqrt(D)` of the vector mechanisms,
 * reproduced bit for bit from Python's `RandomRotation(dim, seed)`
 * (`protocol/mechanisms/rotation.py`, `protocol/mechanisms/hadamard.py`).
 *
 * Python draws the signs as
 * `np.random.default_rng(np.random.SeedSequence([seed, 0x207A7E])).choice(np.array([-1.0, 1.0]), size=D)`.
 * This module implements, from numpy's documented algorithms:
 *
 * - `SeedSequence` entropy pooling (pool of four 32-bit words, `hashmix` / `mix`) and
 *   `generate_state` as 64-bit words (O'Neill's seed_seq_fe design, as adopted by numpy);
 * - `PCG64` (128-bit LCG, XSL-RR output) seeded from `generate_state(4)`: the first two
 *   words are the initial state (high, low), the next two the stream (high, low);
 * - `Generator.choice(a, size)` on two items without `p`, which numpy computes as
 *   `integers(0, 2, size)`: Lemire's bounded method on 32-bit halves of 64-bit outputs
 *   (low half first), which for the range 2 never rejects and returns the top bit of each
 *   half. Index 0 picks -1.0, index 1 picks +1.0.
 *
 * The signs are public (the seed is in the round spec): nothing here is secret and this
 * generator must never be used as a source of private randomness.
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";

const M32 = 0xffffffff;
const MASK_64 = (1n << 64n) - 1n;
const MASK_128 = (1n << 128n) - 1n;

// SeedSequence constants (numpy/random/bit_generator.pyx).
const INIT_A = 0x43b0d7e5;
const MULT_A = 0x931e8875;
const INIT_B = 0x8b51f9dd;
const MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd;
const MIX_MULT_R = 0x4973f715;
const XSHIFT = 16;
const POOL_SIZE = 4;

/** The salt `RandomRotation` appends to its seed. */
export const ROTATION_SALT = 0x207a7en;

/** Little-endian 32-bit words of a non-negative integer; `[0]` for 0 (numpy's `_int_to_uint32_array`). */
function uint32Words(n: bigint): number[] {
  if (n === 0n) return [0];
  const out: number[] = [];
  while (n > 0n) {
    out.push(Number(n & 0xffffffffn));
    n >>= 32n;
  }
  return out;
}

/** numpy's `SeedSequence(entropy)` pool (no spawn key), as four uint32 words. */
export function seedSequencePool(entropy: readonly bigint[]): Uint32Array {
  const words: number[] = [];
  for (const e of entropy) {
    if (e < 0n) throw new InvalidParameter("entropy", "must be non-negative");
    words.push(...uint32Words(e));
  }
  let hashConst = INIT_A;
  const hashmix = (value: number): number => {
    let v = (value ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_A) >>> 0;
    v = Math.imul(v, hashConst) >>> 0;
    return (v ^ (v >>> XSHIFT)) >>> 0;
  };
  const mix = (x: number, y: number): number => {
    const r = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
    return (r ^ (r >>> XSHIFT)) >>> 0;
  };
  const pool = new Uint32Array(POOL_SIZE);
  for (let i = 0; i < POOL_SIZE; i++) pool[i] = hashmix(i < words.length ? words[i] : 0);
  for (let src = 0; src < POOL_SIZE; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) {
      if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
    }
  }
  for (let src = POOL_SIZE; src < words.length; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst], hashmix(words[src]));
  }
  return pool;
}

/** numpy's `SeedSequence.generate_state(nWords, np.uint64)` from a pool. */
export function generateState64(pool: Uint32Array, nWords: number): bigint[] {
  let hashConst = INIT_B;
  const words32: number[] = [];
  for (let i = 0; i < 2 * nWords; i++) {
    let v = (pool[i % POOL_SIZE] ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_B) >>> 0;
    v = Math.imul(v, hashConst) >>> 0;
    words32.push((v ^ (v >>> XSHIFT)) >>> 0);
  }
  const out: bigint[] = [];
  for (let i = 0; i < nWords; i++) {
    out.push(BigInt(words32[2 * i]) | (BigInt(words32[2 * i + 1]) << 32n)); // little-endian view
  }
  return out;
}

const PCG_MULT = 0x2360ed051fc65da44385df649fccf645n;

/** numpy's PCG64 bit generator (PCG XSL-RR 128/64), seeded like `PCG64(SeedSequence)`. */
export class Pcg64 {
  private state = 0n;
  private readonly inc: bigint;

  /** `words`: `generate_state(4, np.uint64)`; state = (w0, w1), stream = (w2, w3), high word first. */
  constructor(words: readonly bigint[]) {
    if (words.length !== 4) throw new InvalidParameter("words", "PCG64 needs four 64-bit words");
    const initState = ((words[0] & MASK_64) << 64n) | (words[1] & MASK_64);
    const initSeq = ((words[2] & MASK_64) << 64n) | (words[3] & MASK_64);
    this.inc = ((initSeq << 1n) | 1n) & MASK_128;
    this.step();
    this.state = (this.state + initState) & MASK_128;
    this.step();
  }

  private step(): void {
    this.state = (this.state * PCG_MULT + this.inc) & MASK_128;
  }

  /** The next 64-bit output (`random_raw`): advance, then XSL-RR of the new state. */
  nextUint64(): bigint {
    this.step();
    const s = this.state;
    const xored = ((s >> 64n) ^ s) & MASK_64;
    const rot = s >> 122n;
    return ((xored >> rot) | (xored << ((64n - rot) & 63n))) & MASK_64;
  }
}

/** The smallest power of two `>= k` (`k >= 1`). */
export function nextPowerOfTwo(k: number): number {
  if (!Number.isSafeInteger(k) || k < 1) throw new InvalidParameter("k", `must be an integer >= 1, got ${String(k)}`);
  let p = 1;
  while (p < k) p *= 2;
  return p;
}

/** Largest padded dimension accepted (a Float64Array of 2^26 entries is 512 MiB). */
const MAX_PADDED_DIM = 2 ** 26;

function checkDim(dim: number): number {
  if (typeof dim !== "number" || !Number.isSafeInteger(dim) || dim < 1) {
    throw new InvalidParameter("dim", `must be an integer >= 1, got ${String(dim)}`);
  }
  const padded = nextPowerOfTwo(dim);
  if (padded > MAX_PADDED_DIM) throw new InvalidParameter("dim", `padded dimension ${padded} exceeds ${MAX_PADDED_DIM}`);
  return padded;
}

function checkSeed(seed: bigint): void {
  if (typeof seed !== "bigint" || seed < 0n || seed > MASK_64) {
    throw new InvalidParameter("seed", `must be an integer in [0, 2^64), got ${String(seed)}`);
  }
}

/**
 * The rotation signs of `RandomRotation(dim, seed)`: `D = nextPowerOfTwo(dim)` values in
 * {-1.0, +1.0}, equal to numpy's
 * `default_rng(SeedSequence([seed, 0x207A7E])).choice([-1.0, 1.0], size=D)`.
 */
export function rotationSigns(dim: number, seed: bigint): Float64Array {
  const padded = checkDim(dim);
  checkSeed(seed);
  const rng = new Pcg64(generateState64(seedSequencePool([seed, ROTATION_SALT]), 4));
  const signs = new Float64Array(padded);
  for (let i = 0; i < padded; i += 2) {
    const w = rng.nextUint64();
    // Lemire on range 2: the index is the top bit of each 32-bit half, low half first.
    signs[i] = (w >> 31n) & 1n ? 1.0 : -1.0;
    if (i + 1 < padded) signs[i + 1] = (w >> 63n) & 1n ? 1.0 : -1.0;
  }
  return signs;
}

/**
 * Unnormalised fast Walsh–Hadamard transform in place (`x @ H_K`, K = x.length a power of
 * two), with numpy's operation order of `hadamard.fwht`: stages h = 1, 2, 4, ...; in each,
 * for every pair (j, j + h), `a[j] = top + bottom` and `a[j + h] = top - bottom`. Each
 * output element is the same sequence of IEEE double additions as in Python, so the result
 * is identical to the last bit. Returns `x`.
 */
export function fwht(x: Float64Array): Float64Array {
  const k = x.length;
  if (k < 1 || (k & (k - 1)) !== 0) throw new InvalidParameter("x", `length must be a power of two, got ${k}`);
  for (let h = 1; h < k; h *= 2) {
    for (let block = 0; block < k; block += 2 * h) {
      for (let j = block; j < block + h; j++) {
        const top = x[j];
        const bottom = x[j + h];
        x[j] = top + bottom;
        x[j + h] = top - bottom;
      }
    }
  }
  return x;
}

/**
 * The random rotation `U = H diag(signs) / sqrt(D)` for vectors of dimension `dim`,
 * zero-padded to `D`, mirroring Python's `RandomRotation` (orthogonal; `U^{-1} = U^T`).
 * Used by the vector mechanisms so that every coordinate of `U v` is a Rademacher sum with
 * variance proxy `||v||^2 / D` (Levy et al. 2021; Girgis et al. 2022, Lemma 2).
 */
export class RandomRotation {
  readonly dim: number;
  readonly seed: bigint;
  readonly paddedDim: number;
  readonly signs: Float64Array;
  private readonly scale: number;

  constructor(dim: number, seed: bigint) {
    this.paddedDim = checkDim(dim);
    checkSeed(seed);
    this.dim = dim;
    this.seed = seed;
    this.signs = rotationSigns(dim, seed);
    this.scale = 1.0 / Math.sqrt(this.paddedDim);
  }

  /** `U x` for `x` of length `dim`; returns a new array of length `D`. */
  apply(x: ArrayLike<number>): Float64Array {
    if (x.length !== this.dim) throw new InvalidParameter("x", `length must be ${this.dim}, got ${x.length}`);
    const padded = new Float64Array(this.paddedDim);
    for (let i = 0; i < this.dim; i++) padded[i] = x[i] * this.signs[i];
    fwht(padded);
    for (let i = 0; i < padded.length; i++) padded[i] *= this.scale;
    return padded;
  }

  /** `U^{-1} z` for `z` of length `D`; returns the first `dim` coordinates. */
  inverse(z: ArrayLike<number>): Float64Array {
    if (z.length !== this.paddedDim) {
      throw new InvalidParameter("z", `length must be ${this.paddedDim}, got ${z.length}`);
    }
    const a = Float64Array.from(z);
    fwht(a);
    const out = new Float64Array(this.dim);
    for (let i = 0; i < this.dim; i++) out[i] = a[i] * this.scale * this.signs[i];
    return out;
  }
}
