/**
 * Block ("general-eps") Hadamard response for k-ary frequency estimation, for one user;
 * mirrors `client/hadamard_response.py` and `protocol/mechanisms/hadamard_response_params.py`.
 *
 * The `K = B b` outputs are cut into `B` blocks of `b` (a power of two). Symbol `x` lives in
 * block `j(x) = x mod B` at row `r(x) = floor(x / B) + 1` of `H_b`, and `C_x` holds the `b/2`
 * outputs `j(x) b + v` with `H_b[r(x), v] = +1`. A user reports, with probability `t`, a uniform
 * element of `C_x`, and otherwise a uniform element of `[0, K)`.
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";
import { andSafe, nextPowerOfTwo, popcount } from "./hadamard.js";
import { checkDomainSize, checkEpsilon, checkSymbol, dyadicFloor } from "./krr.js";

/** Block Hadamard response parameters, derived as Python's `HadamardResponseParams` derives them. */
export interface HadamardResponseParams {
  /** The number of symbols. */
  readonly k: number;
  /** The local epsilon. */
  readonly epsilon: number;
  /** `B`, the number of blocks. */
  readonly blocks: number;
  /** `b`, the smallest power of two above `ceil(k / B)`. */
  readonly blockSize: number;
  /** `K = B b`; reports lie in `[0, K)`. */
  readonly outputSize: number;
  /** `s = b / 2 = |C_x|`. */
  readonly setSize: number;
  /** `t`, a multiple of 2^-53 at most `(e^eps - 1) / (e^eps - 1 + 2B)`. */
  readonly informativeProbability: number;
}

function ceilDiv(a: number, b: number): number {
  return Math.floor((a + b - 1) / b);
}

/**
 * `max` over data sets of `(1/k) sum_x n Var(fhat_x)` at `B` blocks (Python's
 * `worst_case_mean_variance`): `(a + 2B)/a (2/a + ceil(k/B)/k) - 1/k`, `a = e^eps - 1`.
 */
export function worstCaseMeanVariance(k: number, epsilon: number, blocks: number): number {
  k = checkDomainSize(k);
  const a = Math.expm1(checkEpsilon(epsilon));
  const perBlock = ceilDiv(k, blocks);
  if (a === Infinity) return perBlock / k - 1.0 / k;
  return ((a + 2.0 * blocks) / a) * (2.0 / a + perBlock / k) - 1.0 / k;
}

/** The block count in `[1, k]` minimising {@link worstCaseMeanVariance}, the smallest on ties (Python's `optimal_blocks`). */
export function optimalBlocks(k: number, epsilon: number): number {
  k = checkDomainSize(k);
  const eps = checkEpsilon(epsilon);
  let root = 1;
  while (root * root < k) root += 1; // ceil(sqrt(k)), i.e. isqrt(k - 1) + 1 for k >= 2
  const candidates = new Set<number>();
  for (let b = 1; b <= Math.min(root, k); b++) candidates.add(b);
  for (let m = 1; m <= root; m++) candidates.add(ceilDiv(k, m));
  const sorted = [...candidates].filter((b) => b >= 1 && b <= k).sort((x, y) => x - y);
  let best = sorted[0];
  let bestValue = worstCaseMeanVariance(k, eps, best);
  for (const b of sorted.slice(1)) {
    const value = worstCaseMeanVariance(k, eps, b);
    if (value < bestValue) {
      best = b;
      bestValue = value;
    }
  }
  return best;
}

/**
 * The parameters of block Hadamard response over `k` symbols at local `epsilon`, with `numBlocks`
 * blocks or, left undefined, {@link optimalBlocks} (a spec should carry `B` explicitly, so that
 * a device and the analyzer never re-derive it from a floating-point `exp` on different platforms).
 */
export function hadamardResponseParams(k: number, epsilon: number, numBlocks?: number): HadamardResponseParams {
  k = checkDomainSize(k);
  const eps = checkEpsilon(epsilon);
  let blocks: number;
  if (numBlocks === undefined) {
    blocks = optimalBlocks(k, eps);
  } else {
    if (typeof numBlocks !== "number" || !Number.isSafeInteger(numBlocks)) {
      throw new InvalidParameter("num_blocks", `must be an integer or undefined, got ${String(numBlocks)}`);
    }
    if (numBlocks < 1 || numBlocks > k) throw new InvalidParameter("num_blocks", `must lie in [1, k = ${k}], got ${numBlocks}`);
    blocks = numBlocks;
  }
  const a = Math.expm1(eps);
  const tFloat = a === Infinity ? 1.0 : a / (a + 2.0 * blocks);
  const t = dyadicFloor(tFloat);
  if (!(t > 0.0)) throw new InvalidParameter("epsilon", `too small to represent for B = ${blocks}: ${eps}`);
  const blockSize = nextPowerOfTwo(ceilDiv(k, blocks) + 1);
  const outputSize = blocks * blockSize;
  if (blockSize > 2 ** 30 || !Number.isSafeInteger(outputSize)) throw new InvalidParameter("k", "too many symbols per block");
  return { k, epsilon: eps, blocks, blockSize, outputSize, setSize: blockSize / 2, informativeProbability: t };
}

/** `[p_in, p_out]`: the probability of each output inside `C_x`, and outside it (Python's `hadamard_response_probabilities`). */
export function hadamardResponseProbabilities(params: HadamardResponseParams): [number, number] {
  const t = params.informativeProbability;
  const pOut = (1.0 - t) / params.outputSize;
  return [t / params.setSize + pOut, pOut];
}

/**
 * Block Hadamard response of one symbol `x` in `[0, k)`: an output in `[0, K)`.
 *
 * Draws (Python's `randomize_hadamard_response`): `u = integer(K)`, then `bernoulli(t)`. If the
 * Bernoulli is false the report is `u`; otherwise the position `v = u mod b` is moved into `C_x`
 * (`v XOR lowbit(r)` when `H_b[r, v] = -1`, a two-to-one map onto the `+1` positions of row `r`)
 * and the report is `j b + v`.
 *
 * Mechanism: Acharya, Sun & Zhang, "Hadamard Response: Estimating Distributions Privately,
 * Efficiently, and with Little Communication", AISTATS 2019, Sec. 5 (general privacy).
 * Guarantee: pure `epsilon`-LDP: every output has probability `p_in` or `p_out` under every
 * input, and `p_in / p_out = 1 + 2B t / (1 - t) <= e^eps` because `t` is never above its ideal value.
 */
export function randomizeHadamardResponse(symbol: number, params: HadamardResponseParams, source: RandomSource): number {
  const x = checkSymbol(symbol, params.k);
  const block = x % params.blocks;
  const row = Math.floor(x / params.blocks) + 1;
  const b = params.blockSize;
  const u = source.integer(params.outputSize);
  const informative = source.bernoulli(params.informativeProbability);
  let v = u % b;
  if ((popcount(andSafe(row, v)) & 1) === 1) v = v ^ (row & -row);
  return informative ? block * b + v : u;
}
