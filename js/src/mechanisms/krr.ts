/**
 * k-ary randomized response (k-RR) for frequency estimation, for one user; mirrors
 * `client/krr.py` (and the dyadic probabilities of `protocol/mechanisms/local_params.py`).
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import { InvalidParameter } from "../wire/errors.js";

const TWO_53 = 2 ** 53;
/** Relative margin taken off a float probability before rounding it down to the 2^-53 grid (16 ulps). */
const MARGIN = 2 ** -48;

/** `epsilon` as a finite number `> 0`, else {@link InvalidParameter} (Python's `check_epsilon`). */
export function checkEpsilon(epsilon: unknown): number {
  if (typeof epsilon !== "number" || !(epsilon > 0 && Number.isFinite(epsilon))) {
    throw new InvalidParameter("epsilon", `must be finite and > 0, got ${String(epsilon)}`);
  }
  return epsilon;
}

/** `k` as a safe integer `>= 2`, else {@link InvalidParameter} (Python's `check_domain_size`). */
export function checkDomainSize(k: unknown): number {
  if (typeof k !== "number" || !Number.isSafeInteger(k)) throw new InvalidParameter("k", `must be an integer, got ${String(k)}`);
  if (k < 2) throw new InvalidParameter("k", `must be >= 2, got ${k}`);
  return k;
}

/**
 * `p (1 - 2^-48)` rounded down to a multiple of `2^-53` (Python's `dyadic_floor`): at most the
 * exact value a float `p` approximates to better than `2^-48` relative, and realised exactly by
 * the random sources (`bernoulli` keeps `floor(p 2^53) / 2^53 = p`).
 */
export function dyadicFloor(p: number): number {
  return Math.floor(p * (1.0 - MARGIN) * TWO_53) / TWO_53;
}

/**
 * The probability `p <= e^eps / (e^eps + k - 1)` with which k-RR reports the true symbol, a
 * multiple of 2^-53 (Python's `krr_keep_probability`). Refuses an `epsilon` so small that `p`
 * would not exceed `1/k`.
 */
export function krrKeepProbability(k: number, epsilon: number): number {
  k = checkDomainSize(k);
  const eps = checkEpsilon(epsilon);
  const p = dyadicFloor(1.0 / (1.0 + (k - 1) * Math.exp(-eps)));
  if (!(p * k > 1.0)) throw new InvalidParameter("epsilon", `too small for k-RR over k = ${k}: ${eps}`);
  return p;
}

/** `symbol` as a safe integer in `[0, k)`, else {@link InvalidParameter}. */
export function checkSymbol(symbol: unknown, k: number): number {
  if (typeof symbol !== "number" || !Number.isSafeInteger(symbol)) {
    throw new InvalidParameter("symbols", `must be integers, got ${String(symbol)}`);
  }
  if (symbol < 0 || symbol >= k) throw new InvalidParameter("symbols", `every symbol must lie in [0, ${k})`);
  return symbol;
}

/**
 * k-RR of one symbol `x` in `[0, k)`: `x` with probability {@link krrKeepProbability}, otherwise a
 * uniform one of the `k - 1` other symbols. Draws (Python's `randomize_krr`): `integer(k - 1)`,
 * then `bernoulli(p)`.
 *
 * Mechanism: k-ary randomized response (Warner 1965; Kairouz, Bonawitz & Ramage 2016; Wang et al.,
 * USENIX Security 2017, "direct encoding"). Guarantee: pure `epsilon`-LDP: every output has
 * probability `p` under one input and `(1 - p) / (k - 1)` under the others, a ratio at most `e^eps`
 * because `p` is never above the ideal value.
 */
export function randomizeKrr(symbol: number, k: number, epsilon: number, source: RandomSource): number {
  k = checkDomainSize(k);
  const p = krrKeepProbability(k, epsilon);
  const x = checkSymbol(symbol, k);
  let other = source.integer(k - 1);
  const keep = source.bernoulli(p);
  if (other >= x) other += 1;
  return keep ? x : other;
}
