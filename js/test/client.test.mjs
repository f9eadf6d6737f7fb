// The device Client: answering rounds (randomize, pad, seal, wrap, charge), its refusals, and
// settling the shuffler's receipts and outcomes.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Client } from "../dist/client/client.js";
import { MemoryLedger } from "../dist/ledger/ledger.js";
import { reportRanges, checkReportValues } from "../dist/mechanisms/index.js";
import { SeededSource } from "../dist/random/source.js";
import { envelopeFormat } from "../dist/wire/onion.js";
import { assignedInstance } from "../dist/wire/credentials.js";
import {
  BudgetExceeded,
  InvalidParameter,
  RoundExpired,
  SealingError,
  UnknownRound,
  UntrustedRound,
} from "../dist/wire/errors.js";
import {
  ANALYZER,
  SHUFFLER,
  credentialOf,
  hex,
  openEnvelope,
  roundSpec,
  signedMessage,
  signedSpec,
} from "./support/rounds.mjs";

const NOW = 1_800_000_000;
const MEAN_PARAMS = { mechanism: "projected-mean", lower: -0.7, upper: 4.1, noise: "gaussian", gridLevels: 4096 };
const SUM_PARAMS = { mechanism: "modular-sum", lower: 0.0, upper: 1.0, precision: 100, modulus: 2_000_003n, messages: 8, users: 10_000, noise: "polya" };
const sumSpec = (overrides = {}) =>
  roundSpec({ roundId: 2n, params: SUM_PARAMS, epsilon0: 1.0, delta0: 1e-6, minBatch: 80_000, maxBatch: 80_000, messagesPerUser: 8, ...overrides });

function device(overrides = {}, budget = { epsilonBudget: 10, deltaBudget: 1e-3 }) {
  const ledger = overrides.ledger ?? new MemoryLedger(budget);
  const client = new Client({
    localData: 1.5,
    analyzerSigningKey: ANALYZER.signingPublic,
    credential: credentialOf(0xc1),
    ledger,
    shufflerSigningKey: SHUFFLER.signingPublic,
    shufflerKey: SHUFFLER.hpkePublic,
    source: new SeededSource(20261207),
    clock: () => NOW,
    ...overrides,
  });
  return { client, ledger };
}

for (const [name, spec] of [
  ["hadamard-range", roundSpec()],
  ["projected-mean", roundSpec({ roundId: 1n, params: MEAN_PARAMS, delta0: 1e-7, maxBatch: 4000, shufflerInstances: 4 })],
]) {
  test(`${name}: the envelopes open to reports an honest randomizer sends, and the ledger is charged`, async () => {
    const { client, ledger } = device();
    const answer = await client.answer(signedSpec(spec));
    assert.equal(answer.envelopes.length, 1);
    assert.equal(answer.envelopes[0].length, envelopeFormat(spec.roundId, name).size);
    const opened = await openEnvelope(answer.envelopes[0], spec);
    checkReportValues(opened.values, reportRanges(spec));
    assert.deepEqual(opened.admission.credential, credentialOf(0xc1));
    assert.deepEqual(opened.admission.nonce, answer.nonces[0]);
    assert.deepEqual(opened.envelope.sessionId, spec.sessionId);
    assert.equal(opened.envelope.roundId, spec.roundId);
    assert.equal(answer.instance, assignedInstance(credentialOf(0xc1).subarray(0, 16), spec.shufflerInstances, answer.digest));
    const state = await ledger.snapshot();
    assert.equal(state.spentEpsilon, spec.epsilon0);
    assert.equal(state.spentDelta, spec.delta0);
    // The same round again: refused, nothing more charged.
    await assert.rejects(client.answer(signedSpec(spec)), BudgetExceeded);
    assert.equal((await ledger.snapshot()).spentEpsilon, spec.epsilon0);
  });
}

test("multi-message rounds: every message sealed on its own, all of the round's one size", async () => {
  const spec = sumSpec();
  const { client } = device({ acceptCentralOnly: true });
  const answer = await client.answer(signedSpec(spec));
  assert.equal(answer.envelopes.length, 8);
  const size = envelopeFormat(2n, "modular-sum").size;
  const encapsulated = new Set();
  let total = 0n;
  for (const envelope of answer.envelopes) {
    assert.equal(envelope.length, size);
    const opened = await openEnvelope(envelope, spec);
    encapsulated.add(hex(opened.admission.sealed.subarray(0, 32)));
    total += opened.values[0];
  }
  assert.equal(encapsulated.size, 8); // a fresh HPKE encapsulation per message
  assert.equal(new Set(answer.nonces.map(hex)).size, 8);
  // The shares sum, mod q, to the encoding of 1.5 clipped to [0, 1] (100) plus this user's Pólya noise share.
  const residue = Number(total % 2_000_003n);
  const centered = residue > 1_000_001 ? residue - 2_000_003 : residue;
  // One user's noise share is a difference of two Polya(1/n, e^(-1/100)) draws (n = 10^4 users, scale
  // 100 grid units for epsilon 1): P(|share| >= 1000) is about 2 (1/n) E1(10) < 1e-9, a false failure
  // probability far below anything that matters (and the seed is fixed).
  assert.ok(Math.abs(centered - 100) < 1000, String(centered));
});

test("central-only rounds: refused unless the device accepts them, which needs a pinned shuffler", async () => {
  const { client, ledger } = device();
  await assert.rejects(client.answer(signedSpec(sumSpec())), UntrustedRound);
  assert.equal((await ledger.snapshot()).answered.length, 0);
  assert.throws(() => device({ acceptCentralOnly: true, shufflerKey: undefined, shufflerSigningKey: undefined }), InvalidParameter);
  // Without a pinned shuffler, local rounds name their own.
  const { client: unpinned } = device({ shufflerKey: undefined, shufflerSigningKey: undefined });
  assert.equal((await unpinned.answer(signedSpec(roundSpec()))).envelopes.length, 1);
});

test("the crowd floor: ceil(min_batch / messages per user) users at least", async () => {
  // 80,000 reports of 8 messages each: 10,000 users.
  const { client: at } = device({ acceptCentralOnly: true, minBatchFloor: 10_000 });
  assert.equal((await at.answer(signedSpec(sumSpec()))).envelopes.length, 8);
  const { client: above, ledger } = device({ acceptCentralOnly: true, minBatchFloor: 10_001 });
  await assert.rejects(above.answer(signedSpec(sumSpec())), UntrustedRound);
  assert.equal((await ledger.snapshot()).answered.length, 0);
  // 1000 reports of one message: 1000 users.
  await assert.rejects(device({ minBatchFloor: 1001 }).client.answer(signedSpec(roundSpec())), UntrustedRound);
  assert.throws(() => device({ minBatchFloor: 0 }), InvalidParameter);
});

test("an expired round is refused, charging nothing", async () => {
  const spec = roundSpec({ deadline: NOW - 1 });
  const { client, ledger } = device();
  await assert.rejects(client.answer(signedSpec(spec)), RoundExpired);
  assert.equal((await ledger.snapshot()).answered.length, 0);
  const { client: onTime } = device({ clock: () => NOW - 1 });
  assert.equal((await onTime.answer(signedSpec(spec))).envelopes.length, 1);
});

test("a round over the budget is refused before anything is drawn or sealed", async () => {
  const { client, ledger } = device({}, { epsilonBudget: 0.75, deltaBudget: 0 });
  await client.answer(signedSpec(roundSpec()));
  await assert.rejects(client.answer(signedSpec(roundSpec({ roundId: 5n }))), BudgetExceeded);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0.5);
  // delta: a Gaussian round needs a delta budget.
  await assert.rejects(client.answer(signedSpec(roundSpec({ roundId: 6n, params: MEAN_PARAMS, epsilon0: 0.1, delta0: 1e-7 }))), BudgetExceeded);
});

test("a failure while sealing charges nothing", async () => {
  const { client, ledger } = device({ shufflerKey: undefined, shufflerSigningKey: undefined });
  await assert.rejects(client.answer(signedSpec(roundSpec({ analyzerKey: new Uint8Array(32) }))), SealingError);
  await assert.rejects(client.answer(signedSpec(roundSpec({ shufflerKey: new Uint8Array(32) }))), SealingError);
  assert.equal((await ledger.snapshot()).answered.length, 0);
});

test("two answers racing for one round: one is charged and returned, the other refused", async () => {
  const { client, ledger } = device();
  const signed = signedSpec(roundSpec());
  const results = await Promise.allSettled([client.answer(signed), client.answer(signed), client.answer(signed)]);
  assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
  for (const r of results.filter((r) => r.status === "rejected")) assert.ok(r.reason instanceof BudgetExceeded);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0.5);
  // Two devices sharing one ledger racing for its last epsilon.
  const shared = new MemoryLedger({ epsilonBudget: 0.5, deltaBudget: 0 });
  const a = device({ ledger: shared }).client;
  const b = device({ ledger: shared, credential: credentialOf(0xc2) }).client;
  const race = await Promise.allSettled([a.answer(signedSpec(roundSpec({ roundId: 1n }))), b.answer(signedSpec(roundSpec({ roundId: 2n })))]);
  assert.equal(race.filter((r) => r.status === "fulfilled").length, 1);
});

test("receipts: the device records its own nonces, admitted or refused with the reason", async () => {
  const spec = sumSpec();
  const { client } = device({ acceptCentralOnly: true });
  const answer = await client.answer(signedSpec(spec));
  const [n0, n1, n2] = answer.nonces;
  const strangers = [new Uint8Array(16).fill(9)];
  const receipts = (admitted, refused, reasons) =>
    signedMessage({ type: "admission-receipts", sessionId: spec.sessionId, roundId: 2n, specDigest: answer.digest, admitted, refused, reasons });
  let sent = client.settleReceipts(receipts([n0, ...strangers], [n1, ...strangers], ["quota", "replay"]));
  assert.equal(sent.admitted, 1);
  assert.equal(sent.receipts.get(hex(n1)), "quota");
  assert.equal(sent.receipts.size, 2);
  // A later refusal of an admitted nonce (a retransmission) leaves it admitted; a later admission counts.
  sent = client.settleReceipts(receipts([n1], [n0, n2], ["replay", "round-full"]));
  assert.equal(sent.admitted, 2);
  assert.equal(sent.receipts.get(hex(n2)), "round-full");
  // Receipts of a round this device did not answer, or of another spec of its round.
  const other = signedMessage({ type: "admission-receipts", sessionId: spec.sessionId, roundId: 3n, specDigest: answer.digest, admitted: [n0], refused: [], reasons: [] });
  assert.throws(() => client.settleReceipts(other), UnknownRound);
  const otherSpec = signedMessage({ type: "admission-receipts", sessionId: spec.sessionId, roundId: 2n, specDigest: new Uint8Array(32), admitted: [n0], refused: [], reasons: [] });
  assert.throws(() => client.settleReceipts(otherSpec), UnknownRound);
});

test("outcomes: only this device's instance, forward only, and a lost round stays charged", async () => {
  const spec = roundSpec({ roundId: 1n, params: MEAN_PARAMS, delta0: 1e-7, maxBatch: 4000, shufflerInstances: 4 });
  const { client, ledger } = device();
  const answer = await client.answer(signedSpec(spec));
  const outcome = (word, instance, reason = "") =>
    signedMessage({
      type: "round-outcome",
      sessionId: spec.sessionId,
      roundId: 1n,
      specDigest: answer.digest,
      outcome: word,
      reason,
      admitted: word === "released" ? 1000 : 7,
      batchId: word === "released" ? new Uint8Array(16).fill(1) : new Uint8Array(16),
      instance,
    });
  const otherInstance = (answer.instance + 1) % 4;
  let sent = await client.settleOutcome(outcome("failed", otherInstance, "batch-too-small"));
  assert.equal(sent.outcome, undefined); // another instance's batch says nothing of this device's report
  sent = await client.settleOutcome(outcome("released", answer.instance));
  assert.equal(sent.outcome, "released");
  sent = await client.settleOutcome(outcome("failed", answer.instance, "batch-too-small"));
  assert.equal(sent.outcome, "failed:batch-too-small");
  // A replayed older "released", or another failure, changes nothing: failed is final.
  sent = await client.settleOutcome(outcome("released", answer.instance));
  assert.equal(sent.outcome, "failed:batch-too-small");
  sent = await client.settleOutcome(outcome("failed", answer.instance, "other"));
  assert.equal(sent.outcome, "failed:batch-too-small");
  assert.equal(await ledger.outcomeOf(spec.sessionId, 1n), "failed:batch-too-small");
  assert.deepEqual((await ledger.lostRounds()).map((r) => r.roundId), [1n]);
  const state = await ledger.snapshot();
  assert.equal(state.spentEpsilon, 0.5); // not refunded
  assert.equal(state.spentDelta, 1e-7);
});

test("the constructor refuses settings out of their domain", () => {
  for (const overrides of [
    { localData: Number.NaN },
    { localData: [] },
    { localData: [1, Infinity] },
    { localData: "1" },
    { analyzerSigningKey: new Uint8Array(31) },
    { credential: new Uint8Array(47) },
    { ledger: {} },
    { shufflerKey: new Uint8Array(33) },
    { minBatchFloor: 1.5 },
    { acceptCentralOnly: "yes" },
    { clock: 5 },
  ]) {
    assert.throws(() => device(overrides), InvalidParameter, JSON.stringify(Object.keys(overrides)));
  }
});
