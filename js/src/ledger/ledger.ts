/**
 * The device's ledger of local privacy spent, mirroring `client/ledger.py`.
 *
 * A device answers a round only if its budget allows. Local guarantees of one user's answers
 * compose by basic composition (Dwork & Roth 2014, Thm. 3.16): answering rounds with
 * `(eps_i, delta_i)` is `(sum eps_i, sum delta_i)`-LDP, an upper bound valid for any adaptively
 * chosen sequence of rounds, and one the device can check knowing nothing of other users. The
 * budget is the device's whole budget (every session draws on it); each (session, round) is
 * charged at most once, so a re-delivered spec never spends twice.
 *
 * {@link PrivacyLedger.spend} is an atomic check-and-spend: two answers racing for the last of
 * the budget cannot both take it. A client calls {@link PrivacyLedger.check} first (no charge)
 * and {@link PrivacyLedger.spend} last, once its envelopes are ready, and before any leaves.
 *
 * Lost rounds stay charged. When the shuffler's signed outcome says a round failed, the ledger
 * records it (see {@link PrivacyLedger.lostRounds}) and refunds nothing: the report left the
 * device, and the local guarantee must hold even against a shuffler that lies about having
 * discarded it. Outcomes only move forward: a failed round stays failed, and a round's first
 * word is not replaced by a replayed copy of an older one.
 *
 * This module holds the interface, the budget rules as pure functions of a JSON-friendly
 * {@link LedgerState}, and {@link MemoryLedger}. Persistent ledgers: `ledger/fileLedger.ts`
 * (Node) and `ledger/indexedDbLedger.ts` (browsers).
 */

import { bytesToHex } from "@noble/hashes/utils.js";

import { BudgetExceeded, InvalidParameter, ShuffleDPError } from "../wire/errors.js";

/** Slack for floating-point sums of epsilons (e.g. 0.5 + 0.5 against a budget of 1.0). */
export const SUM_TOLERANCE = 1e-12;

/** Version of the persisted {@link LedgerState} layout. */
export const LEDGER_STATE_VERSION = 1;

/** A stored ledger that does not hold a valid ledger state: refused, never reset. */
export class CorruptLedger extends ShuffleDPError {
  constructor(message: string) {
    super(message, "corrupt-ledger");
  }
}

/** A device's budget: total local `(epsilon, delta)` it may spend. */
export interface LedgerBudget {
  epsilonBudget: number;
  deltaBudget?: number;
}

/** Everything a ledger holds, in a form that survives JSON. */
export interface LedgerState {
  version: number;
  epsilonBudget: number;
  deltaBudget: number;
  spentEpsilon: number;
  spentDelta: number;
  /** Keys ({@link roundKey}) of the rounds answered, each charged once. */
  answered: string[];
  /** Round key -> `"released"` or `"failed:<reason>"`, as the shuffler signed it. */
  outcomes: Record<string, string>;
}

/** One round: its session and id. */
export interface RoundRef {
  sessionId: Uint8Array;
  roundId: bigint;
}

/** A device's privacy ledger. Every method may be asynchronous (persistent ledgers are). */
export interface PrivacyLedger {
  /** Throws {@link BudgetExceeded} unless the round may be answered; charges nothing. */
  check(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void>;
  /** Checks and charges the round atomically, or throws having charged nothing. */
  spend(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void>;
  /**
   * Records what became of an answered round (`"released"` or `"failed:<reason>"`); the charge
   * stands either way. Forward only: a failed round stays failed, a released one may only turn failed.
   */
  recordOutcome(sessionId: Uint8Array, roundId: bigint, outcome: string): Promise<void>;
  /** The recorded outcome of a round, if any. */
  outcomeOf(sessionId: Uint8Array, roundId: bigint): Promise<string | undefined>;
  /** Answered rounds the shuffler says failed: charged, and (if it is honest) never analyzed. */
  lostRounds(): Promise<RoundRef[]>;
  /** A copy of everything the ledger holds. */
  snapshot(): Promise<LedgerState>;
}

/** The key of a round in a {@link LedgerState}: `"<session hex>/<round id>"`. */
export function roundKey(sessionId: Uint8Array, roundId: bigint): string {
  if (!(sessionId instanceof Uint8Array) || sessionId.length !== 16) {
    throw new InvalidParameter("session_id", "must be 16 bytes");
  }
  if (typeof roundId !== "bigint" || roundId < 0n || roundId >= 1n << 63n) {
    throw new InvalidParameter("round_id", "must be an integer in [0, 2^63)");
  }
  return `${bytesToHex(sessionId)}/${roundId.toString()}`;
}

const ROUND_KEY_PATTERN = /^[0-9a-f]{32}\/(0|[1-9][0-9]{0,18})$/;

function parseRoundKey(key: string): RoundRef {
  const [session, round] = key.split("/") as [string, string];
  const sessionId = new Uint8Array(16);
  for (let i = 0; i < 16; i++) {
    sessionId[i] = parseInt(session.slice(2 * i, 2 * i + 2), 16);
  }
  return { sessionId, roundId: BigInt(round) };
}

function finiteNumber(value: unknown, name: string): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new InvalidParameter(name, `must be a finite number, got ${String(value)}`);
  }
  return value;
}

/** A fresh state of `budget`, checked: epsilon finite and > 0, delta in [0, 1). */
export function newLedgerState(budget: LedgerBudget): LedgerState {
  const epsilonBudget = finiteNumber(budget?.epsilonBudget, "epsilon_budget");
  const deltaBudget = finiteNumber(budget?.deltaBudget ?? 0, "delta_budget");
  if (!(epsilonBudget > 0)) {
    throw new InvalidParameter("epsilon_budget", `must be finite and > 0, got ${epsilonBudget}`);
  }
  if (!(deltaBudget >= 0 && deltaBudget < 1)) {
    throw new InvalidParameter("delta_budget", `must be in [0, 1), got ${deltaBudget}`);
  }
  return {
    version: LEDGER_STATE_VERSION,
    epsilonBudget,
    deltaBudget,
    spentEpsilon: 0,
    spentDelta: 0,
    answered: [],
    outcomes: {},
  };
}

/** Whether a stored state holds `budget` (the budgets a caller expects of it). */
export function sameBudget(state: LedgerState, budget: LedgerBudget): boolean {
  return state.epsilonBudget === budget.epsilonBudget && state.deltaBudget === (budget.deltaBudget ?? 0);
}

/**
 * A stored value as a {@link LedgerState}, or {@link CorruptLedger}: every field present, of its
 * type, in its domain, and nothing spent past the budget. A ledger that fails this is refused,
 * never reset (resetting would hand the device a fresh budget).
 */
export function parseLedgerState(value: unknown): LedgerState {
  const fail = (why: string): never => {
    throw new CorruptLedger(`the stored ledger is not valid: ${why}`);
  };
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return fail("not an object");
  }
  const record = value as Record<string, unknown>;
  const expected = ["answered", "deltaBudget", "epsilonBudget", "outcomes", "spentDelta", "spentEpsilon", "version"];
  const keys = Object.keys(record).sort();
  if (keys.length !== expected.length || keys.some((key, i) => key !== expected[i])) {
    return fail(`fields ${keys.join(", ")}, expected ${expected.join(", ")}`);
  }
  if (record.version !== LEDGER_STATE_VERSION) {
    return fail(`version ${String(record.version)}, expected ${LEDGER_STATE_VERSION}`);
  }
  const real = (name: string): number => {
    const x = record[name];
    if (typeof x !== "number" || !Number.isFinite(x) || x < 0) {
      return fail(`${name} is not a finite non-negative number`);
    }
    return x;
  };
  const epsilonBudget = real("epsilonBudget");
  const deltaBudget = real("deltaBudget");
  const spentEpsilon = real("spentEpsilon");
  const spentDelta = real("spentDelta");
  if (!(epsilonBudget > 0) || !(deltaBudget < 1)) {
    fail("budget out of its domain");
  }
  if (spentEpsilon > epsilonBudget * (1 + SUM_TOLERANCE) || spentDelta > deltaBudget * (1 + SUM_TOLERANCE)) {
    fail("more spent than the budget");
  }
  const answered = record.answered;
  if (!Array.isArray(answered) || answered.some((key) => typeof key !== "string" || !ROUND_KEY_PATTERN.test(key))) {
    return fail("answered is not a list of round keys");
  }
  if (new Set(answered).size !== answered.length) {
    fail("a round answered twice");
  }
  const outcomes = record.outcomes;
  if (typeof outcomes !== "object" || outcomes === null || Array.isArray(outcomes)) {
    return fail("outcomes is not an object");
  }
  const answeredSet = new Set(answered as string[]);
  const outcomeMap: Record<string, string> = {};
  for (const [key, outcome] of Object.entries(outcomes as Record<string, unknown>)) {
    if (!answeredSet.has(key) || typeof outcome !== "string" || !isOutcome(outcome)) {
      fail(`outcome of ${key} is not an outcome of an answered round`);
    }
    outcomeMap[key] = outcome as string;
  }
  return {
    version: LEDGER_STATE_VERSION,
    epsilonBudget,
    deltaBudget,
    spentEpsilon,
    spentDelta,
    answered: [...(answered as string[])],
    outcomes: outcomeMap,
  };
}

function isOutcome(outcome: string): boolean {
  return outcome === "released" || (outcome.startsWith("failed:") && outcome.length <= 7 + 128);
}

function checkAmounts(epsilon: number, delta: number): void {
  finiteNumber(epsilon, "epsilon");
  finiteNumber(delta, "delta");
  if (epsilon < 0 || delta < 0) {
    throw new InvalidParameter("epsilon, delta", "a round cannot spend a negative amount");
  }
}

/** Throws {@link BudgetExceeded} unless `state` can answer the round (a pure check). */
export function checkRound(state: LedgerState, key: string, epsilon: number, delta: number): void {
  checkAmounts(epsilon, delta);
  if (state.answered.includes(key)) {
    throw new BudgetExceeded(`round ${key} was already answered`);
  }
  if (state.spentEpsilon + epsilon > state.epsilonBudget * (1 + SUM_TOLERANCE)) {
    const remaining = state.epsilonBudget - state.spentEpsilon;
    throw new BudgetExceeded(`round asks epsilon ${epsilon}; ${remaining} of ${state.epsilonBudget} remains`);
  }
  if (state.spentDelta + delta > state.deltaBudget * (1 + SUM_TOLERANCE)) {
    const remaining = state.deltaBudget - state.spentDelta;
    throw new BudgetExceeded(`round asks delta ${delta}; ${remaining} of ${state.deltaBudget} remains`);
  }
}

/** The state after charging the round (checked first: throws having changed nothing). */
export function chargeRound(state: LedgerState, key: string, epsilon: number, delta: number): LedgerState {
  checkRound(state, key, epsilon, delta);
  return {
    ...state,
    spentEpsilon: state.spentEpsilon + epsilon,
    spentDelta: state.spentDelta + delta,
    answered: [...state.answered, key],
    outcomes: { ...state.outcomes },
  };
}

/**
 * The state with the round's outcome recorded, forward only: nothing replaces a failed outcome,
 * a released one may turn failed, and the same word again changes nothing. The round must have
 * been answered ({@link InvalidParameter} otherwise).
 */
export function withOutcome(state: LedgerState, key: string, outcome: string): LedgerState {
  if (typeof outcome !== "string" || !isOutcome(outcome)) {
    throw new InvalidParameter("outcome", `must be "released" or "failed:<reason>", got ${String(outcome)}`);
  }
  if (!state.answered.includes(key)) {
    throw new InvalidParameter("round_id", `round ${key} was not answered by this ledger`);
  }
  const previous = state.outcomes[key];
  if (previous !== undefined && (previous.startsWith("failed:") || outcome === "released")) {
    return state;
  }
  return { ...state, outcomes: { ...state.outcomes, [key]: outcome } };
}

/** The answered rounds whose outcome is a failure. */
export function lostRoundsOf(state: LedgerState): RoundRef[] {
  return Object.entries(state.outcomes)
    .filter(([, outcome]) => outcome.startsWith("failed:"))
    .map(([key]) => parseRoundKey(key));
}

function copyState(state: LedgerState): LedgerState {
  return { ...state, answered: [...state.answered], outcomes: { ...state.outcomes } };
}

/** A ledger held in memory (lost when the page or process ends). Every call is atomic. */
export class MemoryLedger implements PrivacyLedger {
  private state: LedgerState;

  constructor(budget: LedgerBudget) {
    this.state = newLedgerState(budget);
  }

  async check(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    checkRound(this.state, roundKey(sessionId, roundId), epsilon, delta);
  }

  async spend(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    // One synchronous step between reading and writing the state: nothing can interleave.
    this.state = chargeRound(this.state, roundKey(sessionId, roundId), epsilon, delta);
  }

  async recordOutcome(sessionId: Uint8Array, roundId: bigint, outcome: string): Promise<void> {
    this.state = withOutcome(this.state, roundKey(sessionId, roundId), outcome);
  }

  async outcomeOf(sessionId: Uint8Array, roundId: bigint): Promise<string | undefined> {
    return this.state.outcomes[roundKey(sessionId, roundId)];
  }

  async lostRounds(): Promise<RoundRef[]> {
    return lostRoundsOf(this.state);
  }

  async snapshot(): Promise<LedgerState> {
    return copyState(this.state);
  }
}

export { copyState as copyLedgerState };
