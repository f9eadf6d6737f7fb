/**
 * `modular-sum`: scalar multi-message summation, for one user (mirrors
 * `randomize_modular_sum` of `client/summation.py`).
 *
 * @module
 */

import { polyaShares } from "../random/distributedNoise.js";
import type { RandomSource } from "../random/source.js";
import { encodeFixedPoint, splitShares } from "./fixedPoint.js";
import { checkScalarSum } from "./summationParams.js";
import { valueRange, type ValueRange } from "./valueRange.js";
import { asRealScalar } from "./vectorInput.js";

/** What this module reads of `modular-sum` parameters. */
export interface ModularSumFields {
  readonly lower: number;
  readonly upper: number;
  readonly precision: number | bigint;
  readonly modulus: number | bigint;
  readonly messages: number | bigint;
  readonly users: number | bigint;
}

/** `alpha = exp(-eps / p)`: the discrete Laplace on the encoded sum (sensitivity `p`) that is `eps`-DP. */
export function sumAlpha(epsilon: number, precision: number): number {
  return Math.exp(-epsilon / precision);
}

/**
 * One user's `messages` reports `[share]`.
 *
 * Mechanism: clip the value to `[lower, upper]`, encode it in `{0, ..., precision}` by unbiased
 * randomized rounding, add one Pólya noise share `NB(1/users, 1 - alpha) - NB(1/users, 1 - alpha)`
 * (the `users` shares sum to the discrete Laplace `DLap(alpha)`, `alpha = exp(-epsilon0 / precision)`),
 * and split the result into `messages` additive shares mod `modulus`: `messages - 1` uniform,
 * the last fixing the sum.
 *
 * Guarantee: CENTRAL only. A user's shares alone are not private (together they reveal its
 * noisy encoding); the round is `(epsilon0, delta0)`-DP for the sum of all `users` users'
 * shares mixed by an honest shuffler, the noise giving pure `epsilon0` and the split its
 * statistical distance ({@link checkBudget}). The Pólya share is drawn through a
 * double-precision gamma variate, as Python's device path draws it: its law is that of the
 * Python client, not an exact negative binomial. Reference: Balle, Bell, Gascón & Nissim,
 * CCS 2020 (arXiv:2002.00817), Sec. 4; Ghazi, Manurangsi, Pagh & Velingker, Eurocrypt 2020.
 */
export function randomize(
  params: ModularSumFields,
  epsilon0: number,
  _delta0: number,
  localData: number | number[],
  source: RandomSource,
): bigint[][] {
  const value = asRealScalar(localData);
  const precision = Number(params.precision);
  const encoded = encodeFixedPoint(value, params.lower, params.upper, precision, source);
  const [noise] = polyaShares(sumAlpha(epsilon0, precision), Number(params.users), 1, source);
  return splitShares(encoded + noise, BigInt(params.modulus), Number(params.messages), source).map((share) => [share]);
}

/** `[share in [0, q)]`. A share can be any residue: this bounds nothing of the sum. */
export function reportRanges(params: ModularSumFields, _epsilon0: number, _delta0: number): ValueRange[] {
  return [valueRange(0n, BigInt(params.modulus) - 1n)];
}

/** The round's central `(epsilon0, delta0)` must follow from the split and the Pólya noise (`check_scalar_sum`). */
export function checkBudget(params: ModularSumFields, epsilon0: number, delta0: number): void {
  checkScalarSum(params, epsilon0, delta0);
}
