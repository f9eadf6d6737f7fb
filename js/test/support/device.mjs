#!/usr/bin/env node
// A fleet of JavaScript devices in one Node process, for tests against the Python services.
//
//   node test/support/device.mjs --keys DIR --first K --count N --broker mqtts://HOST:PORT --ca-file CA.pem \
//        --account USER:PASSWORD_FILE [--account ...] --data FILE.json [--rounds 2] [--budget 1] \
//        [--retry-interval MS] [--follow MS] [--ledger-dir DIR] [--expect released|lost] [--timeout S]
//        [--output FILE]
//
// Devices K .. K+N-1 of the key directory (`shuffledp keys init`: public.json, credentials.json) each
// hold one local value (entry i of the JSON array in --data) and a ledger of --budget epsilon: in
// memory, or with --ledger-dir a FileLedger `DIR/device-<credential index>.json` each (what a test
// reads afterwards). They are spread evenly over the --account entries, one broker connection
// (DeviceSession) per account, as devices with their own accounts would connect. Every device draws
// its noise from the system CSPRNG (SystemSource). --follow is the sessions' `follow` option: how
// long after the last round ended a released round's outcome is still followed (a later `failed`
// is recorded as a lost round). Prints one JSON summary on stdout (and to --output), with each
// device's ledger outcome per round; exits 0 once every session saw --rounds rounds end as
// --expect says (released: every round released; lost: every round failed and recorded as lost in
// every device's ledger), 1 otherwise (or on --timeout).

import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { Client } from "../../dist/client/client.js";
import { loadBrokerAccount, loadEnrollments } from "../../dist/enrollmentFiles.js";
import { FileLedger } from "../../dist/ledger/fileLedger.js";
import { MemoryLedger } from "../../dist/ledger/ledger.js";
import { DeviceSession, roundReleased } from "../../dist/transport/mqtt.js";

const { values: args } = parseArgs({
  options: {
    keys: { type: "string" },
    first: { type: "string", default: "0" },
    count: { type: "string" },
    broker: { type: "string" },
    "ca-file": { type: "string" },
    account: { type: "string", multiple: true },
    data: { type: "string" },
    rounds: { type: "string", default: "2" },
    budget: { type: "string", default: "1" },
    "retry-interval": { type: "string", default: "2000" },
    follow: { type: "string" },
    "ledger-dir": { type: "string" },
    expect: { type: "string", default: "released" },
    timeout: { type: "string", default: "0" },
    output: { type: "string" },
  },
  strict: true,
});

function usage(message) {
  process.stderr.write(`device.mjs: ${message}\n`);
  process.exit(2);
}

function replacer(_key, value) {
  return typeof value === "bigint" ? Number(value) : value;
}

async function main() {
  if (!args.keys || !args.count || !args.broker || !args.account?.length || !args.data) {
    usage("need --keys, --count, --broker, --account and --data");
  }
  const first = Number(args.first);
  const count = Number(args.count);
  const rounds = Number(args.rounds);
  const data = JSON.parse(readFileSync(args.data, "utf8"));
  if (!Array.isArray(data) || data.length !== count) {
    usage(`--data must hold ${count} numbers`);
  }
  const enrollments = loadEnrollments(args.keys, first, count);
  const accounts = args.account.map((entry) => {
    const colon = entry.indexOf(":");
    if (colon < 1) {
      usage(`--account: USER:PASSWORD_FILE, got ${entry}`);
    }
    return loadBrokerAccount(args.broker, entry.slice(0, colon), entry.slice(colon + 1), args["ca-file"]);
  });
  if (!["released", "lost"].includes(args.expect)) {
    usage(`--expect: released or lost, got ${args.expect}`);
  }
  const budget = { epsilonBudget: Number(args.budget) };
  const ledgerFiles = enrollments.map((_, i) => (args["ledger-dir"] ? join(args["ledger-dir"], `device-${first + i}.json`) : undefined));
  const ledgers = [];
  for (const file of ledgerFiles) {
    ledgers.push(file === undefined ? new MemoryLedger(budget) : await FileLedger.open(file, budget));
  }
  const devices = enrollments.map(
    (enrollment, i) =>
      new Client({
        localData: data[i],
        analyzerSigningKey: enrollment.analyzerSigningKey,
        sessionId: enrollment.sessionId,
        shufflerSigningKey: enrollment.shufflerSigningKey,
        shufflerKey: enrollment.shufflerKey,
        credential: enrollment.credential,
        ledger: ledgers[i],
      }),
  );
  const groups = accounts.map((_, a) => devices.filter((_, i) => i % accounts.length === a));
  const log = (event) => process.stderr.write(`[js ${event.kind}] ${event.text}\n`);
  const sessions = [];
  for (const [a, account] of accounts.entries()) {
    sessions.push(
      await DeviceSession.open({
        broker: account,
        sessionId: enrollments[0].sessionId,
        analyzerSigningKey: enrollments[0].analyzerSigningKey,
        devices: groups[a],
        rounds,
        retryInterval: Number(args["retry-interval"]),
        ...(args.follow === undefined ? {} : { follow: Number(args.follow) }),
        onEvent: log,
      }),
    );
  }
  process.stderr.write(`[js] ${count} device(s) on ${sessions.length} connection(s), waiting for ${rounds} round(s)\n`);
  const timeout = Number(args.timeout) * 1000;
  let timer;
  const timedOut = new Promise((resolve) => {
    if (timeout > 0) {
      timer = setTimeout(() => resolve("timeout"), timeout);
    }
  });
  const served = Promise.all(sessions.map((s) => s.serve())).then(() => "served");
  const how = await Promise.race([served, timedOut]);
  clearTimeout(timer);
  for (const session of sessions) {
    await session.close();
  }
  const results = sessions.map((s) => s.result());
  const lost = [];
  const ledgerOutcomes = [];
  for (const [i, ledger] of ledgers.entries()) {
    lost.push((await ledger.lostRounds()).length);
    const state = await ledger.snapshot();
    // round id -> "released" / "failed:<reason>", as this device's ledger holds it
    const outcomes = Object.fromEntries(Object.entries(state.outcomes).map(([key, word]) => [key.split("/")[1], word]));
    ledgerOutcomes.push({ device: first + i, file: ledgerFiles[i] ?? null, spentEpsilon: state.spentEpsilon, outcomes });
  }
  const lostRound = (round) => round.instances.length > 0 && round.instances.every((i) => round.outcomes[i]?.startsWith("failed:"));
  const roundsAsExpected = results.every(
    (r) => r.rounds.length === rounds && r.rounds.every((round) => (args.expect === "lost" ? lostRound(round) : roundReleased(round))),
  );
  const ledgersAsExpected =
    args.expect === "released" || ledgerOutcomes.every((l) => Object.keys(l.outcomes).length === rounds && lost[l.device - first] === rounds);
  const ok = how === "served" && roundsAsExpected && ledgersAsExpected;
  const summary = {
    devices: count,
    first,
    connections: sessions.length,
    sessions: results,
    devices_with_lost_rounds: lost.filter((n) => n > 0).length,
    ledgers: ledgerOutcomes,
    timed_out: how === "timeout",
    ok,
  };
  const text = JSON.stringify(summary, replacer);
  if (args.output) {
    writeFileSync(args.output, text + "\n");
  }
  process.stdout.write(text + "\n");
  return ok ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    // A typed refusal is one line; anything else is a bug: show its stack.
    process.stderr.write(`device.mjs: ${error?.reason ? `${error.reason}: ${error.message}` : (error?.stack ?? error)}\n`);
    process.exit(1);
  },
);
