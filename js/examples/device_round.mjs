#!/usr/bin/env node
// One device, one round, in Node: the JavaScript client answering the Python parties.
//
//   node js/examples/device_round.mjs --keys DIR --ledger FILE [--budget EPS] [--value X] [--device I]
//
// The device reads its enrollment from the key directory `shuffledp keys init DIR` writes (the
// keys it pins from public.json, credential number I of credentials.json), keeps its privacy
// ledger in FILE (created with a budget of EPS the first time), and holds one local value X.
// `examples/js_device.py` runs it and plays the analyzer and the shuffler; here the broker is
// replaced by JSON lines on stdin and stdout, one per step of the round:
//
//   stdin  {"signedSpec": hex}                    the analyzer's signed round spec, as received
//   stdout {"envelopes": [hex], "nonces": [hex], "instance": n}
//   stdin  {"receipts": hex, "outcome": hex}      the shuffler's signed receipts and round outcome
//   stdout {"outcome": "released" | "failed:<reason>", "admitted": n, "again": reason}
//
// What the device does is told on stderr. Over MQTT, `DeviceSession` of `@shuffledp/client/mqtt`
// runs these steps for every round of a session.

import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { BudgetExceeded, Client, ShuffleDPError } from "@shuffledp/client";
import { FileLedger, loadEnrollments } from "@shuffledp/client/node";

const { values: args } = parseArgs({
  options: {
    keys: { type: "string" },
    ledger: { type: "string" },
    budget: { type: "string", default: "1" },
    value: { type: "string", default: "1.7" },
    device: { type: "string", default: "0" },
  },
  strict: true,
});

const say = (line) => process.stderr.write(`[js device] ${line}\n`);
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const bytes = (text) => new Uint8Array(Buffer.from(text, "hex"));

async function main() {
  if (!args.keys || !args.ledger) {
    process.stderr.write("device_round.mjs: need --keys DIR and --ledger FILE\n");
    return 2;
  }
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const request = async () => {
    const { value, done } = await lines.next();
    if (done) throw new Error("stdin closed before the round ended");
    return JSON.parse(value);
  };
  const reply = (object) => process.stdout.write(`${JSON.stringify(object)}\n`);

  // Enrollment: the keys this device pins and its credential (never a private key).
  const [enrollment] = loadEnrollments(args.keys, Number(args.device), 1);
  const ledger = await FileLedger.open(args.ledger, { epsilonBudget: Number(args.budget) });
  const client = new Client({
    localData: Number(args.value),
    sessionId: enrollment.sessionId,
    analyzerSigningKey: enrollment.analyzerSigningKey,
    shufflerSigningKey: enrollment.shufflerSigningKey,
    shufflerKey: enrollment.shufflerKey,
    credential: enrollment.credential,
    ledger,
  });

  // The round: verify the analyzer's signature, check the budget, randomize, seal, wrap, charge.
  const signedSpec = bytes((await request()).signedSpec);
  const answer = await client.answer(signedSpec);
  const { spec } = answer;
  say(`verified round ${spec.roundId} (${spec.params.mechanism}, eps0 ${spec.epsilon0}) signed by the pinned analyzer`);
  say(`sent ${answer.envelopes.length} envelope of ${answer.envelopes[0].length} bytes to shuffler instance ${answer.instance}`);
  const charged = await ledger.snapshot();
  say(`ledger file: spent eps ${charged.spentEpsilon} of ${charged.epsilonBudget}, before anything left the device`);
  reply({ envelopes: answer.envelopes.map(hex), nonces: answer.nonces.map(hex), instance: answer.instance });

  // The shuffler's signed word: receipts for the envelopes, then the round's outcome.
  const word = await request();
  const sent = client.settleReceipts(bytes(word.receipts));
  await client.settleOutcome(bytes(word.outcome));
  say(`shuffler receipts: ${sent.admitted} of ${sent.nonces.length} admitted; outcome ${sent.outcome}, kept in the ledger`);

  // A second answer to the same round is refused by the ledger, even after a restart (it is a file).
  let again = "answered";
  try {
    await client.answer(signedSpec);
  } catch (error) {
    if (!(error instanceof BudgetExceeded)) throw error;
    again = error.reason;
    say(`answering again is refused: ${error.message}`);
  }
  reply({ outcome: sent.outcome, admitted: sent.admitted, again });
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    const reason = error instanceof ShuffleDPError ? `${error.reason}: ` : "";
    process.stderr.write(`device_round.mjs: ${reason}${error?.message ?? error}\n`);
    process.exit(1);
  },
);
