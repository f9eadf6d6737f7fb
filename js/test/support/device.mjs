#!/usr/bin/env node
// A fleet of JavaScript devices in one Node process, for tests against the Python services.
//
//   node test/support/device.mjs --keys DIR --first K --count N --broker mqtts://HOST:PORT --ca-file CA.pem \
//        --account USER:PASSWORD_FILE [--account ...] --data FILE.json [--rounds 2] [--budget 1] \
//        [--retry-interval MS] [--timeout S] [--output FILE]
//
// Devices K .. K+N-1 of the key directory (`shuffledp keys init`: public.json, credentials.json) each
// hold one local value (entry i of the JSON array in --data) and a memory ledger of --budget epsilon.
// They are spread evenly over the --account entries, one broker connection (DeviceSession) per
// account, as devices with their own accounts would connect. Every device draws its noise from
// the system CSPRNG (SystemSource). Prints one JSON summary on stdout (and to --output); exits 0
// once every session saw --rounds rounds released, 1 otherwise (a round failed, or --timeout).

import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { Client } from "../../dist/client/client.js";
import { loadBrokerAccount, loadEnrollments } from "../../dist/enrollmentFiles.js";
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
  const ledgers = enrollments.map(() => new MemoryLedger({ epsilonBudget: Number(args.budget) }));
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
  for (const ledger of ledgers) {
    lost.push((await ledger.lostRounds()).length);
  }
  const ok =
    how === "served" && results.every((r) => r.rounds.length === rounds && r.rounds.every((round) => roundReleased(round)));
  const summary = {
    devices: count,
    first,
    connections: sessions.length,
    sessions: results,
    devices_with_lost_rounds: lost.filter((n) => n > 0).length,
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
