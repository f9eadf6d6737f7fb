/**
 * Per-mechanism client logic in one place: the randomizer a round runs and the range of values
 * an honest randomizer of that round can report (mirrors `client/mechanisms.py`).
 *
 * Every mechanism module exports the same three functions ({@link MechanismModule}); this module
 * dispatches on the wire name of the round's parameters. The device client randomizes with
 * {@link randomizeRound} and checks every message with {@link checkReportValues} against
 * {@link reportRanges} before anything is sealed: what a device may send and what the analyzer
 * accepts are one definition.
 *
 * @module
 */

import type { RandomSource } from "../random/source.js";
import type { MechanismParams, RoundSpec } from "../wire/messages.js";
import { InvalidParameter } from "../wire/errors.js";
import * as coordinateTree from "./coordinateTree.js";
import * as hadamardRange from "./hadamardRange.js";
import * as localVector from "./localVector.js";
import * as modularSum from "./modularSum.js";
import * as projectedMean from "./projectedMean.js";
import * as shiftedNorm from "./shiftedNorm.js";
import * as vectorMean from "./vectorMean.js";
import * as vectorRange from "./vectorRange.js";
import * as vectorSum from "./vectorSum.js";
import { checkReportValues, type ValueRange } from "./valueRange.js";

export { checkReportValues, inRange, valueRange, type ValueRange } from "./valueRange.js";

/** What every mechanism module exports. */
export interface MechanismModule<P> {
  /** One user's messages, each a list of report values. */
  randomize(params: P, epsilon0: number, delta0: number, localData: number | number[], source: RandomSource): bigint[][];
  /** What an honest randomizer of the round can report, value by value. */
  reportRanges(params: P, epsilon0: number, delta0: number): ValueRange[];
  /** The mechanism's own budget rules of a round spec; throws InvalidParameter. */
  checkBudget(params: P, epsilon0: number, delta0: number): void;
}

/** A mechanism's module, bound to its parameters. */
export interface BoundMechanism {
  randomize(epsilon0: number, delta0: number, localData: number | number[], source: RandomSource): bigint[][];
  reportRanges(epsilon0: number, delta0: number): ValueRange[];
  checkBudget(epsilon0: number, delta0: number): void;
}

function bind<P>(module: MechanismModule<P>, params: P): BoundMechanism {
  return {
    randomize: (epsilon0, delta0, localData, source) => module.randomize(params, epsilon0, delta0, localData, source),
    reportRanges: (epsilon0, delta0) => module.reportRanges(params, epsilon0, delta0),
    checkBudget: (epsilon0, delta0) => module.checkBudget(params, epsilon0, delta0),
  };
}

/** The module of `params`' mechanism, bound to them; {@link InvalidParameter} for an unknown mechanism. */
export function mechanismOf(params: MechanismParams): BoundMechanism {
  switch (params?.mechanism) {
    case "hadamard-range":
      return bind(hadamardRange, params);
    case "projected-mean":
      return bind(projectedMean, params);
    case "vector-range":
      return bind(vectorRange, params);
    case "vector-mean":
      return bind(vectorMean, params);
    case "modular-sum":
      return bind(modularSum, params);
    case "vector-sum":
    case "shifted-vector-sum":
      return bind(vectorSum, params);
    case "coordinate-tree":
      return bind(coordinateTree, params);
    case "shifted-norm":
      return bind(shiftedNorm, params);
    case "local-vector":
      return bind(localVector, params);
    default:
      throw new InvalidParameter("params", `unsupported mechanism ${String((params as { mechanism?: unknown })?.mechanism)}`);
  }
}

/**
 * Every message of ONE user for a round: `messages x values` (Python's `randomize_round` for a
 * batch of one; for `hadamard-range` and `projected-mean` its scalar twin `randomize_one`, with
 * the same draws). `localData` is the user's local mean (a number) or, for vector mechanisms,
 * its vector. The mechanism, its guarantee and its reference are documented in its module.
 */
export function randomizeRound(spec: RoundSpec, localData: number | number[], source: RandomSource): bigint[][] {
  return mechanismOf(spec.params).randomize(spec.epsilon0, spec.delta0, localData, source);
}

/** What an honest randomizer of `spec`'s round can report, value by value (Python's `report_ranges`). */
export function reportRanges(spec: RoundSpec): ValueRange[] {
  return mechanismOf(spec.params).reportRanges(spec.epsilon0, spec.delta0);
}

/** {@link randomizeRound}, then {@link checkReportValues} of every message: never return what an honest randomizer cannot send. */
export function randomizeChecked(spec: RoundSpec, localData: number | number[], source: RandomSource): bigint[][] {
  const messages = randomizeRound(spec, localData, source);
  const ranges = reportRanges(spec);
  for (const message of messages) checkReportValues(message, ranges);
  return messages;
}

export {
  keepProbability,
  nextDown,
  numBins,
  paddedBins,
  binIndexOne,
  hadamardResponseOne,
} from "./hadamardRange.js";
export {
  gaussianSigma2,
  gridReportRange,
  laplaceScale,
  noiseTailBound,
  randomizeGridValue,
  toGridOne,
  type NoiseKind,
} from "./projectedMean.js";
export { calibrateDiscreteGaussian, discreteGaussianDelta } from "./gaussianCalibration.js";
export { krrKeepProbability, randomizeKrr, dyadicFloor } from "./krr.js";
export {
  hadamardResponseParams,
  hadamardResponseProbabilities,
  optimalBlocks,
  randomizeHadamardResponse,
  type HadamardResponseParams,
} from "./blockHadamard.js";
export { hadamardEntry, popcount } from "./hadamard.js";
