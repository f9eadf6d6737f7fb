// The MQTT round loop against a broker that is the attacker (test/support/fakeBroker.mjs): it
// withholds acknowledgements, floods the topics the device reads, and drops receipts. Every wait
// below ends on a message from the device; the limits are safety nets only.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Client } from "../dist/client/client.js";
import { MemoryLedger } from "../dist/ledger/ledger.js";
import { SeededSource } from "../dist/random/source.js";
import { DeviceSession, MAX_FOLLOWED_ROUNDS, outcomeTopic, receiptsTopic, reportsTopic, specTopic } from "../dist/transport/mqtt.js";
import { FakeBroker } from "./support/fakeBroker.mjs";
import { ANALYZER, SESSION, SHUFFLER, credentialOf, roundSpec, signedMessage, signedSpec } from "./support/rounds.mjs";
import { specDigest } from "../dist/wire/onion.js";
import { encodeMessage } from "../dist/wire/messages.js";

const NOW = 1_800_000_000;

function device(ledger = new MemoryLedger({ epsilonBudget: 10 })) {
  return new Client({
    localData: 1.5,
    analyzerSigningKey: ANALYZER.signingPublic,
    credential: credentialOf(0xd1),
    ledger,
    shufflerSigningKey: SHUFFLER.signingPublic,
    shufflerKey: SHUFFLER.hpkePublic,
    source: new SeededSource(7),
    clock: () => NOW,
  });
}

async function open(broker, devices, overrides = {}) {
  const url = await broker.start();
  return DeviceSession.open({
    broker: { url, username: "client", password: "x" },
    sessionId: SESSION,
    analyzerSigningKey: ANALYZER.signingPublic,
    devices,
    clock: () => NOW,
    connectTimeout: 5000,
    ...overrides,
  });
}

test("junk and copies on the spec topic are dropped on arrival while a round's subscription is never acknowledged, and close() does not wait for it", async (t) => {
  // The broker acknowledges the spec topic's subscription only: the first round's stays pending
  // for ever, so the loop is stuck answering that round.
  const broker = new FakeBroker({ holdSubacks: (topics) => !topics.includes(specTopic(SESSION)) });
  const session = await open(broker, [device()]);
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const spec = roundSpec({ deadline: NOW + 3600 });
  broker.deliver(specTopic(SESSION), signedSpec(spec));
  await broker.until(() => broker.subscriptions.some((topic) => topic.endsWith("/0/0/receipts")), "the round's subscription");
  // A flood while the loop waits: nothing of it may be held until the round is answered.
  const junk = 300;
  for (let i = 0; i < junk; i++) broker.deliver(specTopic(SESSION), Uint8Array.of(0xa1, 0x61, 0x76, i & 0x7f));
  for (let i = 0; i < 50; i++) broker.deliver(specTopic(SESSION), signedSpec(spec));
  broker.deliver(specTopic(SESSION), Uint8Array.of(0xff)); // after the copies: once refused, they were taken
  const refused = () => Object.values(session.badMessages).reduce((a, b) => a + b, 0);
  await broker.until(() => refused() >= junk + 1, `${junk + 1} refusals`);
  assert.equal(refused(), junk + 1); // the copies of the genuine spec are no refusals: they are ignored,
  assert.equal(session.queuedRounds.size, 1); // and none of them waits behind the round
  assert.ok(Object.keys(session.badMessages).every((reason) => reason.startsWith("spec-")));
  // Closing does not wait for the acknowledgement the broker withholds (it would wait for ever).
  await session.close();
});

test("an envelope without a receipt is sent again, byte for byte the same, and a replayed older 'released' after a 'failed' changes nothing", async (t) => {
  const broker = new FakeBroker();
  const ledger = new MemoryLedger({ epsilonBudget: 10 });
  let roundEnded;
  const ended = new Promise((resolve) => (roundEnded = resolve));
  const onEvent = (event) => event.kind === "round-ended" && roundEnded();
  const session = await open(broker, [device(ledger)], { retryInterval: 20, maxCopies: 4, grace: 0, onEvent });
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const spec = roundSpec({ deadline: NOW + 3600 });
  broker.deliver(specTopic(SESSION), signedSpec(spec));
  const reports = reportsTopic(SESSION, 0n, 0);
  await broker.until(() => broker.published.filter((p) => p.topic === reports).length >= 4, "four copies");
  const copies = broker.published.filter((p) => p.topic === reports);
  assert.equal(copies.length, 4);
  for (const copy of copies) assert.deepEqual(copy.payload, copies[0].payload);
  assert.equal(broker.published.length, 4); // nothing else left the device
  // The shuffler's failed outcome, then its older released one replayed by the broker.
  const digest = specDigest(encodeMessage(spec));
  const outcome = (word, reason) =>
    signedMessage({
      type: "round-outcome", sessionId: SESSION, roundId: 0n, specDigest: digest, outcome: word, reason,
      admitted: 1000, batchId: new Uint8Array(16).fill(3), instance: 0,
    });
  broker.deliver(outcomeTopic(SESSION, 0n, 0), outcome("failed", "not-acknowledged"));
  broker.deliver(outcomeTopic(SESSION, 0n, 0), outcome("released", ""));
  await ended;
  const [round] = session.roundRecords();
  assert.equal(round.outcomes[0], "failed:not-acknowledged");
  assert.equal(round.retransmitted, 3);
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "failed:not-acknowledged");
  // An ended round keeps its record only; its spec delivered again opens nothing.
  assert.equal(session.rounds.size, 0);
  broker.deliver(specTopic(SESSION), signedSpec(spec));
  broker.deliver(specTopic(SESSION), Uint8Array.of(0xff)); // in order after it: once refused, the copy was taken
  await broker.until(() => session.badMessages["spec-malformed"] === 1, "the refusal after the copy");
  assert.equal(session.rounds.size, 0);
  assert.equal(session.roundRecords().length, 1);
});

test("a broker sending QoS 2 publishes it never releases makes the device hold none of them", async (t) => {
  // The device subscribes at QoS 1: a QoS 2 publish is the broker's own doing. Left to mqtt.js, each
  // would wait in memory for a PUBREL that never comes, 65,535 payloads of the broker's choosing.
  const broker = new FakeBroker();
  const session = await open(broker, [device()]);
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const payload = new Uint8Array(20_000);
  for (let id = 1; id <= 100; id++) broker.deliverUnreleased(specTopic(SESSION), payload, id);
  broker.deliver(specTopic(SESSION), Uint8Array.of(0xff)); // after them: once refused, they were all taken
  await broker.until(() => (session.badMessages["spec-malformed"] ?? 0) >= 1, "the refusal after them");
  const store = session.client.incomingStore;
  for (let id = 1; id <= 100; id++) {
    store.get({ messageId: id }, (error, packet) => assert.ok(error !== undefined && packet === undefined, `publish ${id} kept`));
  }
  assert.deepEqual(session.badMessages, { "spec-malformed": 1 }); // nor were they handed to the loop
});

// ---------------------------------------------------------------- a round lost after its release

/** The shuffler's signed outcome of `spec`'s round on instance 0. */
function outcomeOf(spec, word, reason = "") {
  return signedMessage({
    type: "round-outcome", sessionId: SESSION, roundId: spec.roundId, specDigest: specDigest(encodeMessage(spec)),
    outcome: word, reason, admitted: 1000, batchId: new Uint8Array(16).fill(3), instance: 0,
  });
}

/** Delivers `spec` and resolves once the device published its report of the round. */
async function answered(broker, spec) {
  const reports = reportsTopic(SESSION, spec.roundId, 0);
  broker.deliver(specTopic(SESSION), signedSpec(spec));
  await broker.until(() => broker.published.some((p) => p.topic === reports), `the report of round ${spec.roundId}`);
}

test("a released round stays followed: a later failed is recorded lost in the Client and its ledger, an older released replayed after it changes nothing, and the subscription goes", async (t) => {
  const broker = new FakeBroker();
  const ledger = new MemoryLedger({ epsilonBudget: 10 });
  const client = device(ledger);
  const events = [];
  // No `rounds`: a long-lived session, which follows a released round while it is open by default.
  const session = await open(broker, [client], { onEvent: (event) => events.push(event) });
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const spec = roundSpec({ deadline: NOW + 3600 });
  const outcomes = outcomeTopic(SESSION, 0n, 0);
  await answered(broker, spec);
  broker.deliver(outcomes, outcomeOf(spec, "released"));
  await broker.until(() => broker.unsubscriptions.includes(receiptsTopic(SESSION, 0n, 0)), "the receipts topic dropped");
  assert.ok(events.some((e) => e.kind === "round-ended" && /instance 0: released/.test(e.text)));
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "released");
  assert.ok(!broker.unsubscriptions.includes(outcomes)); // the outcome topic is still followed
  assert.equal(session.followed.size, 1);
  assert.equal(session.rounds.size, 0); // the round ended
  // The shuffler gives the batch up; the broker replays the older released right behind it.
  broker.deliver(outcomes, outcomeOf(spec, "failed", "not-acknowledged"));
  broker.deliver(outcomes, outcomeOf(spec, "released"));
  await broker.until(() => broker.unsubscriptions.includes(outcomes), "the outcome topic dropped");
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "failed:not-acknowledged");
  assert.deepEqual(await ledger.lostRounds(), [{ sessionId: SESSION, roundId: 0n }]);
  assert.equal(client.sentRound(SESSION, 0n).outcome, "failed:not-acknowledged");
  const [round] = session.roundRecords();
  assert.deepEqual(round.outcomes, { 0: "failed:not-acknowledged" });
  assert.equal(events.filter((e) => e.kind === "round-lost").length, 1);
  assert.equal(session.followed.size, 0);
  // Replayed once more (the broker is the attacker): still failed, and still charged once.
  broker.deliver(outcomes, outcomeOf(spec, "released"));
  broker.deliver(specTopic(SESSION), Uint8Array.of(0xff)); // in order after it: once refused, the replay was taken
  await broker.until(() => session.badMessages["spec-malformed"] === 1, "the refusal after the replay");
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "failed:not-acknowledged");
  assert.equal(session.roundRecords()[0].outcomes[0], "failed:not-acknowledged");
  assert.equal((await ledger.snapshot()).spentEpsilon, spec.epsilon0);
  assert.ok(Object.keys(session.badMessages).every((reason) => ["spec-malformed", "unexpected-topic"].includes(reason)));
});

test("with `rounds`, a released round is followed while the session serves, and serve() ends when the follow period after the last round is over, unsubscribed", async (t) => {
  const broker = new FakeBroker();
  const ledger = new MemoryLedger({ epsilonBudget: 10 });
  const events = [];
  const session = await open(broker, [device(ledger)], {
    rounds: 2, follow: 30, retryInterval: 20, onEvent: (event) => events.push(event),
  });
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const first = roundSpec({ roundId: 0n, deadline: NOW + 3600 });
  const second = roundSpec({ roundId: 1n, deadline: NOW + 3600 });
  await answered(broker, first);
  broker.deliver(outcomeTopic(SESSION, 0n, 0), outcomeOf(first, "released"));
  await answered(broker, second); // round 0 ended: the session went on to round 1
  // Round 0 fails while round 1 runs: with `rounds`, the follow period runs from the last round's end, not round 0's.
  broker.deliver(outcomeTopic(SESSION, 0n, 0), outcomeOf(first, "failed", "not-acknowledged"));
  await broker.until(() => broker.unsubscriptions.includes(outcomeTopic(SESSION, 0n, 0)), "round 0's outcome topic dropped");
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "failed:not-acknowledged");
  // Round 1 releases: it is followed for 30 ms after it (the last round) ended, then serve() resolves.
  broker.deliver(outcomeTopic(SESSION, 1n, 0), outcomeOf(second, "released"));
  const rounds = await session.serve();
  assert.deepEqual(rounds.map((r) => r.outcomes[0]), ["failed:not-acknowledged", "released"]);
  await broker.until(() => broker.unsubscriptions.includes(outcomeTopic(SESSION, 1n, 0)), "round 1's outcome topic dropped");
  assert.equal(session.followed.size, 0);
  assert.ok(events.some((e) => e.kind === "follow-ended" && e.roundId === 1n));
  assert.equal(events.filter((e) => e.kind === "round-lost").length, 1);
  // A failure signed after the follow period is not seen: round 1 stays released for this device.
  broker.deliver(outcomeTopic(SESSION, 1n, 0), outcomeOf(second, "failed", "not-acknowledged"));
  broker.deliver(specTopic(SESSION), Uint8Array.of(0xff));
  await broker.until(() => session.badMessages["spec-malformed"] === 1, "the refusal after the late failure");
  assert.equal(await ledger.outcomeOf(SESSION, 1n), "released");
});

test("without `rounds`, a released round is followed for `follow` ms after its release, then unsubscribed", async (t) => {
  const broker = new FakeBroker();
  const ledger = new MemoryLedger({ epsilonBudget: 10 });
  const events = [];
  const session = await open(broker, [device(ledger)], { follow: 30, retryInterval: 20, onEvent: (event) => events.push(event) });
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  const spec = roundSpec({ deadline: NOW + 3600 });
  await answered(broker, spec);
  broker.deliver(outcomeTopic(SESSION, 0n, 0), outcomeOf(spec, "released"));
  await broker.until(() => broker.unsubscriptions.includes(outcomeTopic(SESSION, 0n, 0)), "the outcome topic dropped");
  assert.equal(session.followed.size, 0);
  assert.deepEqual(events.filter((e) => e.kind === "follow-ended").map((e) => e.roundId), [0n]);
  assert.equal(await ledger.outcomeOf(SESSION, 0n), "released");
});

test("`follow` must be a number of milliseconds >= 0", async () => {
  for (const follow of [-1, Number.NaN, "10"]) {
    await assert.rejects(
      DeviceSession.open({
        broker: { url: "mqtt://127.0.0.1:1", username: "client", password: "x" },
        sessionId: SESSION, analyzerSigningKey: ANALYZER.signingPublic, devices: [device()], follow,
      }),
      /follow must be/,
    );
  }
});

test("at most `maxFollowedRounds` released rounds are followed at once: the one released first stops first", async (t) => {
  const broker = new FakeBroker();
  const events = [];
  const most = 3;
  const session = await open(broker, [device()], { maxFollowedRounds: most, onEvent: (event) => events.push(event) });
  t.after(async () => {
    await session.close();
    await broker.close();
  });
  assert.equal(MAX_FOLLOWED_ROUNDS, 64); // the default
  for (let r = 0n; r <= BigInt(most); r++) {
    const spec = roundSpec({ roundId: r, deadline: NOW + 3600 });
    await answered(broker, spec);
    broker.deliver(outcomeTopic(SESSION, r, 0), outcomeOf(spec, "released"));
    await broker.until(() => broker.unsubscriptions.includes(receiptsTopic(SESSION, r, 0)), `round ${r} ended`);
  }
  assert.equal(session.followed.size, most);
  await broker.until(() => broker.unsubscriptions.includes(outcomeTopic(SESSION, 0n, 0)), "round 0's outcome topic dropped");
  for (let r = 1n; r <= BigInt(most); r++) assert.ok(!broker.unsubscriptions.includes(outcomeTopic(SESSION, r, 0)));
  assert.deepEqual(events.filter((e) => e.kind === "follow-ended").map((e) => e.roundId), [0n]);
});
