/**
 * The mechanism's own rules of a round spec's budget (Python's `params.check_budget`, called by
 * `RoundSpec` validation): e.g. `delta0 = 0` for randomized response, `delta0 > 0` exactly when a
 * mean report's noise is Gaussian, noise scales an exact sampler can draw, and a summation's
 * central analysis (`protocol/mechanisms/summation_params.py`).
 *
 * @module
 */

import type { MechanismParams } from "../wire/messages.js";
import type { InvalidParameter } from "../wire/errors.js";
import { mechanismOf } from "./index.js";
import { checkEpsilonDelta } from "./projectedMean.js";

/**
 * Throw {@link InvalidParameter} unless `(epsilon0, delta0)` lies in the common range
 * (`[1e-6, 30]` and `[0, 1)`) and satisfies the rules of `params`' mechanism.
 */
export function checkMechanismBudget(params: MechanismParams, epsilon0: number, delta0: number): void {
  checkEpsilonDelta(epsilon0, delta0);
  mechanismOf(params).checkBudget(epsilon0, delta0);
}
