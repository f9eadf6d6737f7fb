/**
 * Where the device client's randomness comes from.
 *
 * Every randomizer draws through a {@link RandomSource}. Two implementations:
 *
 * - {@link SystemSource}, the device path (`secure = true`): every bit comes from
 *   `globalThis.crypto.getRandomValues` (the platform CSPRNG, in Node >= 20 and browsers).
 * - {@link SeededSource}, deterministic and for tests only (`secure = false`): a
 *   xoshiro128** generator seeded through SplitMix64; not cryptographic.
 *
 * Both run the same exact algorithms on top of their bits, mirroring Python's
 * `SystemSource` (`protocol/mechanisms/randomness.py`): uniform integers by rejection
 * (exactly uniform), `bernoulli(p)` as a uniform 53-bit integer below `floor(p 2^53)`, and
 * the CKS20 exact discrete Laplace and discrete Gaussian samplers (`./exact.ts`).
 *
 * @module
 */

import { InvalidParameter } from "../wire/errors.js";
import {
  bernoulliRationalExact,
  checkNoiseScale,
  checkPositiveRational,
  discreteGaussianExact,
  discreteLaplaceExact,
  type UniformIntegers,
} from "./exact.js";

/** Everything a randomizer draws (one user at a time). */
export interface RandomSource {
  /** True only for sources backed by the platform CSPRNG. */
  readonly secure: boolean;
  /**
   * Exactly uniform on `{0, ..., high - 1}` (`high >= 1`; a number `high` at most 2^53); the
   * result has the type of `high`.
   */
  integer(high: number): number;
  integer(high: bigint): bigint;
  integer(high: bigint | number): number | bigint;
  /**
   * True with probability `floor(p 2^53) / 2^53`: `p` rounded down to a multiple of 2^-53,
   * so never above the requested `p`; `p = 0` never and `p = 1` always.
   */
  bernoulli(p: number): boolean;
  /** True with probability exactly `num / den` (`0 <= num <= den`, `den > 0`). */
  bernoulliRational(num: bigint, den: bigint): boolean;
  /** CKS20 exact discrete Laplace: `P(k)` proportional to `exp(-|k| den / num)`. */
  discreteLaplace(scaleNum: bigint, scaleDen: bigint): bigint;
  /** CKS20 exact discrete Gaussian: `P(k)` proportional to `exp(-k^2 den / (2 num))`. */
  discreteGaussian(sigma2Num: bigint, sigma2Den: bigint): bigint;
  /** `n` uniformly random bytes. */
  randomBytes(n: number): Uint8Array;
}

const TWO_32 = 2 ** 32;
const TWO_53 = 2 ** 53;
const WORDS_PER_REFILL = 256;

/** Bit length of a positive safe integer. */
function bitLengthNumber(n: number): number {
  return n < TWO_32 ? 32 - Math.clz32(n) : 32 + (32 - Math.clz32(Math.floor(n / TWO_32)));
}

/**
 * The exact algorithms on top of a stream of uniform 32-bit words. Subclasses supply the
 * words ({@link WordSource.fillWords}); everything else is shared, so a seeded source
 * exercises the same code as the secure one. A subclass is secure only if its words are.
 */
export abstract class WordSource implements RandomSource, UniformIntegers {
  abstract readonly secure: boolean;
  // Hard-private (#): the words not yet used are the randomness of the draws to come, so they
  // never show in `console.log`, `util.inspect` or JSON of a source (or of a Client holding it).
  readonly #buffer = new Uint32Array(WORDS_PER_REFILL);
  #position = WORDS_PER_REFILL;

  /** Fill `out` with independent uniform 32-bit words. */
  protected abstract fillWords(out: Uint32Array): void;

  /** One uniform 32-bit word (as a non-negative number). */
  protected nextWord(): number {
    if (this.#position === WORDS_PER_REFILL) {
      this.fillWords(this.#buffer);
      this.#position = 0;
    }
    const w = this.#buffer[this.#position];
    this.#buffer[this.#position] = 0; // do not keep consumed bits around
    this.#position += 1;
    return w;
  }

  /** Uniform on `{0..n-1}` for an integer `1 <= n <= 2^53`, by rejection on the bit length of n-1. */
  private belowNumber(n: number): number {
    if (n === 1) return 0;
    const k = bitLengthNumber(n - 1);
    if (k <= 32) {
      const shift = 32 - k;
      for (;;) {
        const r = this.nextWord() >>> shift;
        if (r < n) return r;
      }
    }
    const hiBits = k - 32;
    const hiDiv = 2 ** (32 - hiBits);
    for (;;) {
      const hi = Math.floor(this.nextWord() / hiDiv);
      const r = hi * TWO_32 + this.nextWord();
      if (r < n) return r;
    }
  }

  /** `k` uniform bits as a bigint in `[0, 2^k)`. */
  private bitsBig(k: number): bigint {
    let out = 0n;
    let have = 0;
    while (have < k) {
      const take = Math.min(32, k - have);
      const w = take === 32 ? this.nextWord() : this.nextWord() >>> (32 - take);
      out = (out << BigInt(take)) | BigInt(w);
      have += take;
    }
    return out;
  }

  /** Exactly uniform on `{0..n-1}` for a bigint `n >= 1`. */
  randBelow(n: bigint): bigint {
    if (n <= 0n) throw new InvalidParameter("high", `must be >= 1, got ${n}`);
    if (n <= 0x20000000000000n) return BigInt(this.belowNumber(Number(n)));
    const k = (n - 1n).toString(2).length;
    for (;;) {
      const r = this.bitsBig(k);
      if (r < n) return r;
    }
  }

  integer(high: number): number;
  integer(high: bigint): bigint;
  integer(high: bigint | number): number | bigint;
  integer(high: bigint | number): number | bigint {
    if (typeof high === "bigint") {
      if (high < 1n) throw new InvalidParameter("high", `must be >= 1, got ${high}`);
      return this.randBelow(high);
    }
    if (typeof high !== "number" || !Number.isInteger(high) || high < 1 || high > TWO_53) {
      throw new InvalidParameter("high", `must be an integer in [1, 2^53], got ${String(high)}`);
    }
    return this.belowNumber(high);
  }

  bernoulli(p: number): boolean {
    if (typeof p !== "number" || !(p >= 0 && p <= 1)) {
      throw new InvalidParameter("p", `must lie in [0, 1], got ${String(p)}`);
    }
    // p * 2^53 is exact for a double p in [0, 1] (scaling by a power of two), so its floor
    // is floor(p 2^53) computed exactly.
    const threshold = Math.floor(p * TWO_53);
    const u = Math.floor(this.nextWord() / 2 ** 11) * TWO_32 + this.nextWord(); // 21 + 32 bits
    return u < threshold;
  }

  bernoulliRational(num: bigint, den: bigint): boolean {
    if (typeof num !== "bigint" || typeof den !== "bigint" || den <= 0n || num < 0n || num > den) {
      throw new InvalidParameter("p", `must be a rational num/den with 0 <= num <= den, den > 0, got ${num}/${den}`);
    }
    return bernoulliRationalExact(num, den, this);
  }

  discreteLaplace(scaleNum: bigint, scaleDen: bigint): bigint {
    const scale = checkPositiveRational("scale", scaleNum, scaleDen);
    checkNoiseScale("scale", scale);
    return discreteLaplaceExact(scale[0], scale[1], this);
  }

  discreteGaussian(sigma2Num: bigint, sigma2Den: bigint): bigint {
    const sigma2 = checkPositiveRational("sigma2", sigma2Num, sigma2Den);
    checkNoiseScale("sigma2", sigma2, 2);
    return discreteGaussianExact(sigma2[0], sigma2[1], this);
  }

  randomBytes(n: number): Uint8Array {
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
      throw new InvalidParameter("n", `must be an integer >= 0, got ${String(n)}`);
    }
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i += 4) {
      let w = this.nextWord();
      for (let j = i; j < Math.min(n, i + 4); j++) {
        out[j] = w & 0xff;
        w >>>= 8;
      }
    }
    return out;
  }
}

/**
 * The device source: every bit from `globalThis.crypto.getRandomValues`, the platform CSPRNG
 * (Web Crypto, in browsers and Node >= 20). Mirrors Python's `SystemSource`.
 * Timing: the exact samplers are not constant-time; their running time depends on the sample.
 */
export class SystemSource extends WordSource {
  readonly secure = true;
  readonly #crypto: Crypto;

  constructor() {
    super();
    const c = (globalThis as { crypto?: Crypto }).crypto;
    if (c === undefined || typeof c.getRandomValues !== "function") {
      throw new InvalidParameter("crypto", "globalThis.crypto.getRandomValues is not available");
    }
    this.#crypto = c;
  }

  protected fillWords(out: Uint32Array): void {
    this.#crypto.getRandomValues(out);
  }

  override randomBytes(n: number): Uint8Array {
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
      throw new InvalidParameter("n", `must be an integer >= 0, got ${String(n)}`);
    }
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i += 65536) {
      this.#crypto.getRandomValues(out.subarray(i, Math.min(n, i + 65536))); // Web Crypto's per-call limit
    }
    return out;
  }
}

const MASK_64 = (1n << 64n) - 1n;

/** SplitMix64 (Steele, Lea & Flood 2014) output number `index` from `seed`, used only to seed. */
function splitMix64(seed: bigint, index: bigint): bigint {
  let z = (seed + index * 0x9e3779b97f4a7c15n) & MASK_64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK_64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK_64;
  return z ^ (z >> 31n);
}

/**
 * A deterministic source for tests only (`secure = false`): xoshiro128** (Blackman & Vigna,
 * "Scrambled linear pseudorandom number generators", 2021) with its four 32-bit state words
 * from SplitMix64 of the seed. Not cryptographic: never use it to protect real data.
 */
export class SeededSource extends WordSource {
  readonly secure = false;
  readonly #state = new Uint32Array(4);

  constructor(seed: bigint | number) {
    super();
    let s: bigint;
    if (typeof seed === "number") {
      if (!Number.isSafeInteger(seed) || seed < 0) {
        throw new InvalidParameter("seed", `must be an integer >= 0, got ${String(seed)}`);
      }
      s = BigInt(seed);
    } else if (typeof seed === "bigint") {
      if (seed < 0n || seed > MASK_64) throw new InvalidParameter("seed", `must lie in [0, 2^64), got ${seed}`);
      s = seed;
    } else {
      throw new InvalidParameter("seed", "must be a bigint or a number");
    }
    const a = splitMix64(s, 1n);
    const b = splitMix64(s, 2n);
    this.#state[0] = Number(a & 0xffffffffn);
    this.#state[1] = Number(a >> 32n);
    this.#state[2] = Number(b & 0xffffffffn);
    this.#state[3] = Number(b >> 32n);
    if ((this.#state[0] | this.#state[1] | this.#state[2] | this.#state[3]) === 0) this.#state[0] = 1;
  }

  protected fillWords(out: Uint32Array): void {
    const st = this.#state;
    for (let i = 0; i < out.length; i++) {
      const x = Math.imul(st[1], 5);
      const rot = (x << 7) | (x >>> 25);
      out[i] = Math.imul(rot, 9);
      const t = st[1] << 9;
      st[2] ^= st[0];
      st[3] ^= st[1];
      st[1] ^= st[2];
      st[0] ^= st[3];
      st[2] ^= t;
      st[3] = (st[3] << 11) | (st[3] >>> 21);
    }
  }
}
