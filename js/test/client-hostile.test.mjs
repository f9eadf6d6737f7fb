// The device Client against hostile parties and bad luck: a spec of another session, a ledger
// that fails while an outcome is recorded (the word must reach it when the outcome comes again),
// a spec naming a small-order shuffler key (refused; outcomes forged under it refused too), a log
// of the Client object (no credential, no buffered randomness), and a crash between the charge
// and the publish (no second answer).
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
import { BadSignature, BudgetExceeded, InvalidParameter, MalformedMessage, UnknownRound, UntrustedRound } from "../dist/wire/errors.js";
import { encodeMessage } from "../dist/wire/messages.js";
import { decodeVerified, specDigest } from "../dist/wire/onion.js";
import { signSpecBytes } from "../dist/wire/signing.js";
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

test("a spec naming a small-order shuffler signing key is refused, and forged outcomes under that key are refused", async () => {
  // The neutral point as the key, and (R = neutral point, s = 0) as the signature, satisfy the
  // cofactorless check [s]B = R + [k]A for every message: anyone could sign as that "shuffler".
  // The device refuses the spec (malformed: the key is not a usable Ed25519 key, as Python's
  // RoundSpec refuses it) before charging anything; an outcome under that key is refused too.
  const neutral = new Uint8Array(32);
  neutral[0] = 1;
  const forged = new Uint8Array(64);
  forged[0] = 1;
  const { client, ledger } = device({ shufflerSigningKey: undefined, shufflerKey: undefined });
  const honest = encodeMessage(roundSpec());
  const specBytes = withShufflerSigningKey(honest, neutral);
  const signed = encodeMessage({ type: "signed-round-spec", specBytes, signature: signSpecBytes(ANALYZER.signingSeed, specBytes) });
  await assert.rejects(client.answer(signed), (error) => {
    assert.ok(error instanceof MalformedMessage, String(error));
    assert.equal(error.reason, "malformed");
    assert.match(error.message, /shuffler_signing_key/);
    return true;
  });
  assert.equal((await ledger.snapshot()).answered.length, 0);
  const outcome = encodeMessage({
    type: "round-outcome", sessionId: SESSION, roundId: 0n, specDigest: specDigest(specBytes), outcome: "failed",
    reason: "forged", admitted: 0, batchId: new Uint8Array(16), instance: 0, signature: forged,
  });
  // nothing was sent for that round, so no word about it is taken
  await assert.rejects(client.settleOutcome(outcome), UnknownRound);
  assert.equal(await ledger.outcomeOf(SESSION, 0n), undefined);
  // and a forged outcome under that key does not verify, should a spec naming it ever get through
  assert.throws(() => decodeVerified(outcome, "round-outcome", neutral), BadSignature);
});

/** `specBytes` (an encoded spec naming SHUFFLER's signing key once) naming `key` instead. */
function withShufflerSigningKey(specBytes, key) {
  const at = Buffer.from(specBytes).indexOf(Buffer.from(SHUFFLER.signingPublic));
  assert.ok(at >= 0 && Buffer.from(specBytes).indexOf(Buffer.from(SHUFFLER.signingPublic), at + 1) < 0);
  const out = specBytes.slice();
  out.set(key, at);
  return out;
}

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
