/**
 * The device client: verify a round, check the budget, randomize, seal, wrap, charge. Mirrors
 * `client/client.py`.
 *
 * A {@link Client} holds one user's local data (its local mean: a number, or a vector for the
 * vector mechanisms) and its admission credential. Given an encoded signed round spec,
 * {@link Client.answer}
 *
 * 1. verifies the analyzer's Ed25519 signature over the spec bytes as received, against the key
 *    the device pinned, and binds the round to the digest of those bytes;
 * 2. refuses rounds of a session other than the one it enrolled for (when it was given one),
 *    expired rounds, rounds naming a shuffler other than the pinned one (either of its
 *    two keys), rounds whose batch holds fewer users than the device's floor, rounds with no
 *    local guarantee (summations) unless the device accepts them, and rounds its ledger cannot
 *    afford;
 * 3. runs the round's randomizer (`mechanisms/index.ts`; randomness from {@link SystemSource}
 *    unless a source is given) and checks every message against what an honest randomizer of
 *    the round can report;
 * 4. pads each message to the round's one size and seals it on its own to the analyzer (the
 *    inner layer), then wraps it with the credential and a fresh nonce, sealed to the shuffler
 *    (the outer layer): one envelope per message, all of one length;
 * 5. charges the ledger (an atomic check-and-spend) and only then returns the envelopes: a round
 *    refused anywhere above costs nothing, and nothing leaves the device uncharged.
 *
 * Afterwards the shuffler's signed receipts and round outcome ({@link Client.settleReceipts},
 * {@link Client.settleOutcome}) say whether the envelopes were admitted and whether the round
 * was released or lost. Only messages verifying under the spec's `shuffler_signing_key` and
 * naming the spec the device answered count; an outcome of another shuffler instance is
 * ignored; outcomes only move forward (a failed round stays failed, and a replayed older
 * `released` changes nothing). A lost round stays charged (see `ledger/ledger.ts`).
 */

import { bytesToHex } from "@noble/hashes/utils.js";

import type { PrivacyLedger } from "../ledger/ledger.js";
import { checkReportValues, randomizeRound, reportRanges } from "../mechanisms/index.js";
import { SystemSource, type RandomSource } from "../random/source.js";
import { assignedInstance, clientIdOf } from "../wire/credentials.js";
import { checkEd25519Key } from "../wire/ed25519Keys.js";
import { InvalidParameter, RoundExpired, UnknownRound, UntrustedRound } from "../wire/errors.js";
import { CREDENTIAL_BYTES, SESSION_ID_BYTES, decodeMessage, hasLocalGuarantee, messagesPerUserOf, type RoundSpec } from "../wire/messages.js";
import { decodeVerified, EnvelopeWrapper, verifiedSpec } from "../wire/onion.js";
import { encodePadded } from "../wire/reportFormat.js";
import { reportSealer } from "../wire/sealing.js";

const KEY_BYTES = 32;

/** A device's settings from its enrollment, and its data. */
export interface ClientOptions {
  /** The user's local mean: a number, or a vector (one number per coordinate) for vector rounds. */
  localData: number | number[];
  /**
   * The analyzer's Ed25519 public key (32 bytes): the device answers only specs it signed. A key
   * anyone could sign under (a small-order point or a non-canonical encoding) is refused, as a
   * pinned shuffler signing key of that kind is.
   */
  analyzerSigningKey: Uint8Array;
  /** The 48-byte admission credential issued at enrollment (shown to the shuffler only). */
  credential: Uint8Array;
  /** The device's privacy ledger. */
  ledger: PrivacyLedger;
  /**
   * The shuffler the device trusts, pinned at enrollment: its Ed25519 signing key and its X25519
   * sealing key, both or neither (neither: the shuffler the analyzer's signed spec names).
   * Pinning keeps a malicious analyzer from naming itself as the shuffler; both are pinned
   * together, since a spec keeping the signing key but naming another sealing key would have
   * the device seal its credential and nonces (and every share of a summation) to that key.
   */
  shufflerSigningKey?: Uint8Array;
  shufflerKey?: Uint8Array;
  /**
   * The session the device enrolled for (`public.json`'s `session_id`, 16 bytes): a spec of any
   * other session is refused (`untrusted-round`). Unset: every session the pinned analyzer signs.
   */
  sessionId?: Uint8Array;
  /** Refuse rounds whose batch holds fewer users (`ceil(min_batch / messages per user)`) than this. Default 1. */
  minBatchFloor?: number;
  /**
   * Answer rounds whose mechanism has no local guarantee (summations: a user's shares, linked,
   * reveal its value), and only with a pinned shuffler. Default false.
   */
  acceptCentralOnly?: boolean;
  /** Randomness of the randomizers; a fresh {@link SystemSource} by default. */
  source?: RandomSource;
  /** Unix seconds now; `Date.now() / 1000` by default. */
  clock?: () => number;
}

/** What {@link Client.answer} returns: the round, its envelopes (charged already), their nonces. */
export interface Answer {
  spec: RoundSpec;
  /** The digest of the spec bytes answered (`SHA-256("shuffledp/v3/spec" || spec_bytes)`). */
  digest: Uint8Array;
  /** One encoded envelope per message of the round, all of the round's one size. */
  envelopes: Uint8Array[];
  /** The nonce inside each envelope, in the same order. */
  nonces: Uint8Array[];
  /** The shuffler instance the envelopes go to (its reports topic). */
  instance: number;
}

/** What a client sent in one round, and what the shuffler has said of it. */
export class SentRound {
  /** Nonce (hex) -> `"admitted"` or the refusal's reason, from signed receipts. */
  readonly receipts = new Map<string, string>();
  /** `"released"` or `"failed:<reason>"`, from the signed round outcome of this client's instance. */
  outcome: string | undefined = undefined;

  constructor(
    readonly spec: RoundSpec,
    readonly digest: Uint8Array,
    readonly instance: number,
    readonly nonces: readonly Uint8Array[],
  ) {}

  /** How many of this client's envelopes the shuffler says it admitted. */
  get admitted(): number {
    let count = 0;
    for (const status of this.receipts.values()) {
      if (status === "admitted") {
        count++;
      }
    }
    return count;
  }
}

function checkKey(key: unknown, name: string): Uint8Array {
  if (!(key instanceof Uint8Array) || key.length !== KEY_BYTES) {
    throw new InvalidParameter(name, `must be a ${KEY_BYTES}-byte public key`);
  }
  return key.slice();
}

/** A pinned Ed25519 key, refused if anyone could sign under it (`ed25519Keys.ts`): it would pin nothing. */
function checkSigningKey(key: unknown, name: string): Uint8Array {
  return checkEd25519Key(checkKey(key, name), name, KEY_BYTES);
}

function checkLocalData(data: unknown): number | number[] {
  if (typeof data === "number") {
    if (!Number.isFinite(data)) {
      throw new InvalidParameter("localData", `must be finite, got ${data}`);
    }
    return data;
  }
  if (!Array.isArray(data) || data.length === 0) {
    throw new InvalidParameter("localData", "must be a number or a non-empty array of numbers");
  }
  for (const value of data) {
    if (typeof value !== "number" || !Number.isFinite(value)) {
      throw new InvalidParameter("localData", "every coordinate must be a finite number");
    }
  }
  return [...data];
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

function roundKey(sessionId: Uint8Array, roundId: bigint): string {
  return `${bytesToHex(sessionId)}/${roundId}`;
}

/** One user's device: its data, its pinned keys, its ledger and its credential. */
export class Client {
  readonly localData: number | number[];
  readonly analyzerSigningKey: Uint8Array;
  readonly sessionId: Uint8Array | undefined;
  readonly shufflerSigningKey: Uint8Array | undefined;
  readonly shufflerKey: Uint8Array | undefined;
  readonly minBatchFloor: number;
  readonly acceptCentralOnly: boolean;
  readonly ledger: PrivacyLedger;
  // Hard-private (#): never shown by `console.log`, `util.inspect` or JSON of a Client. The
  // credential is for the shuffler's eyes only, the source's buffered words are the noise of the
  // reports to come, and the nonces sent say which envelope was this device's.
  readonly #credential: Uint8Array;
  readonly #clientId: Uint8Array;
  readonly #source: RandomSource;
  readonly #clock: () => number;
  /** (session, round) -> what was sent and what the shuffler said of it. */
  readonly #sent = new Map<string, SentRound>();

  /** A device from its settings, checked ({@link InvalidParameter} otherwise). */
  constructor(options: ClientOptions) {
    if (typeof options !== "object" || options === null) {
      throw new InvalidParameter("options", "must be an object");
    }
    this.localData = checkLocalData(options.localData);
    this.analyzerSigningKey = checkSigningKey(options.analyzerSigningKey, "analyzerSigningKey");
    if (options.sessionId !== undefined && !(options.sessionId instanceof Uint8Array && options.sessionId.length === SESSION_ID_BYTES)) {
      throw new InvalidParameter("sessionId", `must be the ${SESSION_ID_BYTES}-byte session id the device enrolled for`);
    }
    this.sessionId = options.sessionId?.slice();
    if (!(options.credential instanceof Uint8Array) || options.credential.length !== CREDENTIAL_BYTES) {
      throw new InvalidParameter("credential", `must be the ${CREDENTIAL_BYTES}-byte credential issued at enrollment`);
    }
    this.#credential = options.credential.slice();
    this.#clientId = clientIdOf(this.#credential);
    const ledger = options.ledger as Partial<PrivacyLedger> | undefined;
    if (typeof ledger?.check !== "function" || typeof ledger.spend !== "function" || typeof ledger.recordOutcome !== "function") {
      throw new InvalidParameter("ledger", "must be a PrivacyLedger");
    }
    this.ledger = options.ledger;
    if ((options.shufflerSigningKey === undefined) !== (options.shufflerKey === undefined)) {
      throw new InvalidParameter("shufflerKey", "a device pins both of its shuffler's keys (signing and sealing) or neither");
    }
    this.shufflerSigningKey =
      options.shufflerSigningKey === undefined ? undefined : checkSigningKey(options.shufflerSigningKey, "shufflerSigningKey");
    this.shufflerKey = options.shufflerKey === undefined ? undefined : checkKey(options.shufflerKey, "shufflerKey");
    const floor = options.minBatchFloor ?? 1;
    if (!Number.isSafeInteger(floor) || floor < 1) {
      throw new InvalidParameter("minBatchFloor", `must be an integer >= 1, got ${String(floor)}`);
    }
    this.minBatchFloor = floor;
    this.acceptCentralOnly = options.acceptCentralOnly ?? false;
    if (typeof this.acceptCentralOnly !== "boolean") {
      throw new InvalidParameter("acceptCentralOnly", "must be a boolean");
    }
    if (this.acceptCentralOnly && this.shufflerSigningKey === undefined) {
      throw new InvalidParameter("shufflerSigningKey", "a device that accepts central-only rounds must pin its shuffler");
    }
    this.#source = options.source ?? new SystemSource();
    if (options.clock !== undefined && typeof options.clock !== "function") {
      throw new InvalidParameter("clock", "must be a function returning Unix seconds");
    }
    this.#clock = options.clock ?? (() => Date.now() / 1000);
  }

  /**
   * The envelopes answering the round of `signedSpec` (an encoded signed-round-spec), or a typed
   * error ({@link BadSignature}, {@link RoundExpired}, {@link UntrustedRound},
   * {@link BudgetExceeded}, ...). The ledger is charged before this returns.
   */
  async answer(signedSpec: Uint8Array): Promise<Answer> {
    const { spec, digest } = verifiedSpec(signedSpec, this.analyzerSigningKey);
    const expected = this.refuseUntrusted(spec);
    await this.ledger.check(spec.sessionId, spec.roundId, spec.epsilon0, spec.delta0);

    const messages = randomizeRound(spec, this.localData, this.#source);
    if (messages.length !== expected) {
      throw new InvalidParameter("messages", `the round takes ${expected} message(s) per user, got ${messages.length}`);
    }
    const ranges = reportRanges(spec);
    for (const message of messages) {
      checkReportValues(message, ranges); // never send what an honest randomizer cannot
    }
    const sealer = await reportSealer(spec.analyzerKey, spec.sessionId, spec.roundId, digest);
    const wrapper = await EnvelopeWrapper.create(spec, digest);
    const envelopes: Uint8Array[] = [];
    const nonces: Uint8Array[] = [];
    for (const message of messages) {
      // Each message on its own: a fresh encapsulation for each layer, and a fresh nonce.
      const sealed = await sealer.seal(encodePadded(spec.roundId, spec.params.mechanism, message));
      const { envelope, nonce } = await wrapper.wrap(this.#credential, sealed);
      envelopes.push(envelope);
      nonces.push(nonce);
    }

    await this.ledger.spend(spec.sessionId, spec.roundId, spec.epsilon0, spec.delta0);
    const instance = this.instanceFor(spec, digest);
    this.#sent.set(roundKey(spec.sessionId, spec.roundId), new SentRound(spec, digest, instance, nonces));
    return { spec, digest, envelopes, nonces: nonces.map((nonce) => nonce.slice()), instance };
  }

  /** Every check of a verified spec before the ledger's; the messages a user sends in the round. */
  private refuseUntrusted(spec: RoundSpec): number {
    if (this.sessionId !== undefined && !sameBytes(spec.sessionId, this.sessionId)) {
      throw new UntrustedRound(`the spec is of session ${bytesToHex(spec.sessionId)}, not the one this device enrolled for`);
    }
    if (this.#clock() > spec.deadline) {
      throw new RoundExpired(`round ${spec.roundId} closed at ${spec.deadline}`);
    }
    if (this.shufflerSigningKey !== undefined && !sameBytes(spec.shufflerSigningKey, this.shufflerSigningKey)) {
      throw new UntrustedRound("the spec names a shuffler other than the one this device pinned");
    }
    if (this.shufflerKey !== undefined && !sameBytes(spec.shufflerKey, this.shufflerKey)) {
      throw new UntrustedRound("the spec names a sealing key other than the one this device pinned for its shuffler");
    }
    const expected = messagesPerUserOf(spec.params);
    const users = Math.ceil(spec.minBatch / expected); // the fewest users that fill min_batch
    if (users < this.minBatchFloor) {
      throw new UntrustedRound(`the round's batch holds ${users} users' reports, below this device's floor ${this.minBatchFloor}`);
    }
    if (!hasLocalGuarantee(spec.params.mechanism) && !this.acceptCentralOnly) {
      throw new UntrustedRound(`${spec.params.mechanism} has no local guarantee; this device answers only rounds that do`);
    }
    return expected;
  }

  /** The shuffler instance of the round this client's envelopes go to. */
  instanceFor(spec: RoundSpec, digest: Uint8Array): number {
    return assignedInstance(this.#clientId, spec.shufflerInstances, digest);
  }

  /** What this client sent in a round, if it answered it. */
  sentRound(sessionId: Uint8Array, roundId: bigint): SentRound | undefined {
    return this.#sent.get(roundKey(sessionId, roundId));
  }

  /**
   * Records the shuffler's signed receipts for one of this client's rounds: every nonce of its
   * own the receipts name, as admitted or with the refusal's reason (an admitted nonce stays
   * admitted). A typed error if the receipts do not decode, name a round or spec this client
   * did not answer ({@link UnknownRound}), or do not verify ({@link BadSignature}).
   */
  settleReceipts(data: Uint8Array): SentRound {
    const receipts = decodeMessage(data, "admission-receipts");
    const sent = this.sentFor(receipts.sessionId, receipts.roundId, receipts.specDigest);
    decodeVerified(data, "admission-receipts", sent.spec.shufflerSigningKey);
    const mine = new Set(sent.nonces.map((nonce) => bytesToHex(nonce)));
    for (const nonce of receipts.admitted) {
      const key = bytesToHex(nonce);
      if (mine.has(key)) {
        sent.receipts.set(key, "admitted");
      }
    }
    receipts.refused.forEach((nonce, i) => {
      const key = bytesToHex(nonce);
      if (mine.has(key) && sent.receipts.get(key) !== "admitted") {
        sent.receipts.set(key, receipts.reasons[i] as string);
      }
    });
    return sent;
  }

  /**
   * Records the shuffler's signed outcome of one of this client's rounds, here and in the
   * ledger (typed errors as {@link settleReceipts}). An outcome of another instance says nothing
   * of this client's reports and is ignored. Forward only: a failed outcome is final, and a
   * `released` after one (a replayed older message) changes nothing. A failed round stays charged.
   */
  async settleOutcome(data: Uint8Array): Promise<SentRound> {
    const outcome = decodeMessage(data, "round-outcome");
    const sent = this.sentFor(outcome.sessionId, outcome.roundId, outcome.specDigest);
    decodeVerified(data, "round-outcome", sent.spec.shufflerSigningKey);
    if (outcome.instance !== sent.instance) {
      return sent;
    }
    const word = outcome.outcome === "released" ? "released" : `failed:${outcome.reason}`;
    const previous = sent.outcome;
    if (previous !== undefined && (previous.startsWith("failed:") || word === "released")) {
      return sent;
    }
    // The ledger first: if it cannot record the word, nothing here says it was, and the same
    // outcome delivered again (it is retained) is recorded then.
    await this.ledger.recordOutcome(outcome.sessionId, outcome.roundId, word);
    sent.outcome = word;
    return sent;
  }

  private sentFor(sessionId: Uint8Array, roundId: bigint, digest: Uint8Array): SentRound {
    const sent = this.#sent.get(roundKey(sessionId, roundId));
    if (sent === undefined) {
      throw new UnknownRound(`this client sent nothing in round ${roundId} of session ${bytesToHex(sessionId)}`);
    }
    if (!sameBytes(digest, sent.digest)) {
      throw new UnknownRound(`round ${roundId}: the shuffler's word is about another spec than the one this client answered`);
    }
    return sent;
  }
}
