// The device Client against hostile parties and bad luck: a spec of another session, a ledger
// that fails while an outcome is recorded (the word must reach it when the outcome comes again),
// forged outcomes under a small-order shuffler key, a log of the Client object (no credential, no
// buffered randomness), and a crash between the charge and the publish (no second answer).
import { test } from "node:test";
import { inspect } from "node:util";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { FileLedger } from "../dist/ledger/fileLedger.js";
import assert from "node:assert/strict";

import { Client } from "../dist/client/client.js";
import { MemoryLedger } from "../dist/ledger/ledger.js";
import { SeededSource, SystemSource } from "../dist/random/source.js";
import { BadSignature, BudgetExceeded, InvalidParameter, UntrustedRound } from "../dist/wire/errors.js";
import { encodeMessage } from "../dist/wire/messages.js";
import { ANALYZER, SESSION, SHUFFLER, credentialOf, roundSpec, signedMessage, signedSpec } from "./support/rounds.mjs";

const NOW = 1_800_000_000;

function device(overrides = {}) {
  const ledger = overrides.ledger ?? new MemoryLedger({ epsilonBudget: 10 });
  const client = new Client({
    localData: 1.5,
    analyzerSigningKey: ANALYZER.signingPublic,
    credential: credentialOf(0xe1),
    ledger,
    shufflerSigningKey: SHUFFLER.signingPublic,
    shufflerKey: SHUFFLER.hpkePublic,
    source: new SeededSource(11),
    clock: () => NOW,
    ...overrides,
  });
  return { client, ledger };
}

test("a device enrolled for one session refuses a spec of another, charging nothing", async () => {
  const other = new Uint8Array(16).fill(0xee);
  const { client, ledger } = device({ sessionId: SESSION });
  await assert.rejects(client.answer(signedSpec(roundSpec({ sessionId: other }))), UntrustedRound);
  assert.equal((await ledger.snapshot()).answered.length, 0);
  assert.equal((await client.answer(signedSpec(roundSpec()))).envelopes.length, 1);
  assert.throws(() => device({ sessionId: new Uint8Array(15) }), InvalidParameter);
});

test("an outcome the ledger could not record is recorded when it comes again", async () => {
  const memory = new MemoryLedger({ epsilonBudget: 10 });
  let failures = 1;
  const flaky = {
    check: (...args) => memory.check(...args),
    spend: (...args) => memory.spend(...args),
    recordOutcome: async (...args) => {
      if (failures-- > 0) throw new Error("disk full");
      return memory.recordOutcome(...args);
    },
    outcomeOf: (...args) => memory.outcomeOf(...args),
    lostRounds: () => memory.lostRounds(),
    snapshot: () => memory.snapshot(),
  };
  const { client } = device({ ledger: flaky });
  const spec = roundSpec();
  const answer = await client.answer(signedSpec(spec));
  const failed = signedMessage({
    type: "round-outcome", sessionId: SESSION, roundId: 0n, specDigest: answer.digest, outcome: "failed",
    reason: "batch-too-small", admitted: 7, batchId: new Uint8Array(16), instance: answer.instance,
  });
  await assert.rejects(client.settleOutcome(failed), /disk full/);
  const sent = await client.settleOutcome(failed); // the retained outcome, delivered again
  assert.equal(sent.outcome, "failed:batch-too-small");
  assert.equal(await memory.outcomeOf(SESSION, 0n), "failed:batch-too-small");
  assert.deepEqual((await memory.lostRounds()).map((r) => r.roundId), [0n]);
});

test("a spec naming a small-order shuffler signing key does not let anyone forge that shuffler's outcomes", async () => {
  // The neutral point as the key, and (R = neutral point, s = 0) as the signature, satisfy the
  // cofactorless check [s]B = R + [k]A for every message; strict RFC 8032 verification refuses them.
  const neutral = new Uint8Array(32);
  neutral[0] = 1;
  const forged = new Uint8Array(64);
  forged[0] = 1;
  const { client, ledger } = device({ shufflerSigningKey: undefined, shufflerKey: undefined });
  const answer = await client.answer(signedSpec(roundSpec({ shufflerSigningKey: neutral })));
  const outcome = encodeMessage({
    type: "round-outcome", sessionId: SESSION, roundId: 0n, specDigest: answer.digest, outcome: "failed",
    reason: "forged", admitted: 0, batchId: new Uint8Array(16), instance: answer.instance, signature: forged,
  });
  await assert.rejects(client.settleOutcome(outcome), BadSignature);
  assert.equal(await ledger.outcomeOf(SESSION, 0n), undefined);
});

test("logging a device shows neither its credential nor the random words its next reports will use", async () => {
  // An application that logs its Client (console.log, JSON) must not write down the credential,
  // nor the source's buffered CSPRNG words: they are the noise of the reports to come.
  for (const source of [new SystemSource(), new SeededSource(5)]) {
    const { client } = device({ source });
    await client.answer(signedSpec(roundSpec())); // the source now holds unused words
    for (const text of [inspect(client, { depth: 10, showHidden: true }), JSON.stringify(client)]) {
      assert.ok(!/credential|Uint32Array|position/.test(text), text.slice(0, 400));
      assert.ok(!text.includes("225, 225, 225") && !text.includes('"0":225'), "the client id's bytes (0xe1) appear");
    }
    for (const text of [inspect(source, { depth: 10, showHidden: true }), JSON.stringify(source)]) {
      assert.ok(!/buffer|position|state|crypto|Uint32Array/.test(text), text.slice(0, 400));
    }
  }
});

test("a device that crashed between charging a round and publishing it never answers that round again", async (t) => {
  const folder = await mkdtemp(join(tmpdir(), "shuffledp-crash-"));
  t.after(() => rm(folder, { recursive: true, force: true }));
  const file = join(folder, "ledger.json");
  const signed = signedSpec(roundSpec());
  const before = device({ ledger: await FileLedger.open(file, { epsilonBudget: 10 }) }).client;
  await before.answer(signed); // charged on disk; the process dies before its envelope leaves
  // The restarted device, on the same file, is shown the (retained) spec again: a second answer
  // would be a second report of the same round with fresh noise.
  const { client: after, ledger } = device({ ledger: await FileLedger.open(file) });
  await assert.rejects(after.answer(signed), BudgetExceeded);
  const state = await ledger.snapshot();
  assert.equal(state.answered.length, 1);
  assert.equal(state.spentEpsilon, 0.5);
});
