/**
 * A test page: many devices in one browser tab answer a session's rounds over MQTT over
 * WebSocket with TLS (`wss://`), each with its own IndexedDB privacy ledger.
 *
 * It fetches `config.json` from its own origin:
 *
 *     { "public": <public.json>, "credentials": <credentials.json>, "first": K, "count": N,
 *       "data": [N local means], "budget": eps, "rounds": R, "retryInterval": ms,
 *       "broker": "wss://host:port/", "accounts": [{"username", "password"}, ...] }
 *
 * Devices K .. K+N-1 of the deployment are spread over the accounts, one connection each. The
 * page writes one line per event to `#log` and the console, and hands
 * `{ ok, sessions, devicesWithLostRounds, error? }` (JSON) to `window.shuffledpReport` (set by the
 * test's runner; also kept in `window.shuffledpDone`) when every connection has seen R rounds end (or on
 * failure). The browser verifies the broker's certificate against its own trust store: the
 * test adds its CA there, nothing here turns verification off.
 */

import { Client } from "../../src/client/client.js";
import { deviceEnrollments } from "../../src/enrollment.js";
import { IndexedDbLedger } from "../../src/ledger/indexedDbLedger.js";
import { DeviceSession, roundReleased, type DeviceSessionResult } from "../../src/transport/mqtt.js";

interface PageConfig {
  public: unknown;
  credentials: unknown;
  first: number;
  count: number;
  data: number[];
  budget: number;
  rounds: number;
  retryInterval: number;
  broker: string;
  accounts: Array<{ username: string; password: string }>;
}

interface PageResult {
  ok: boolean;
  sessions: DeviceSessionResult[];
  devicesWithLostRounds: number;
  ledgers: number;
  error?: string;
}

const logElement = document.getElementById("log");

function log(line: string): void {
  console.log(line);
  if (logElement) {
    logElement.textContent += `${line}\n`;
  }
}

function finish(result: PageResult): void {
  const json = JSON.stringify(result, (_key, value) => (typeof value === "bigint" ? Number(value) : value));
  log(`done: ok=${result.ok}${result.error ? ` error=${result.error}` : ""}`);
  const page = window as unknown as { shuffledpDone?: string; shuffledpReport?: (json: string) => void };
  page.shuffledpDone = json;
  page.shuffledpReport?.(json); // the test's runner exposes this function
}

async function run(): Promise<void> {
  const response = await fetch("config.json", { cache: "no-store" });
  const config = (await response.json()) as PageConfig;
  const enrollments = deviceEnrollments(config.public, config.credentials, config.first, config.count);
  const ledgers = await Promise.all(
    enrollments.map((_, i) => IndexedDbLedger.open(`shuffledp-device-${config.first + i}`, { epsilonBudget: config.budget })),
  );
  const devices = enrollments.map(
    (enrollment, i) =>
      new Client({
        localData: config.data[i] as number,
        analyzerSigningKey: enrollment.analyzerSigningKey,
        shufflerSigningKey: enrollment.shufflerSigningKey,
        shufflerKey: enrollment.shufflerKey,
        credential: enrollment.credential,
        ledger: ledgers[i] as IndexedDbLedger,
      }),
  );
  const sessions: DeviceSession[] = [];
  for (const [a, account] of config.accounts.entries()) {
    sessions.push(
      await DeviceSession.open({
        broker: { url: config.broker, username: account.username, password: account.password },
        sessionId: enrollments[0]!.sessionId,
        analyzerSigningKey: enrollments[0]!.analyzerSigningKey,
        devices: devices.filter((_, i) => i % config.accounts.length === a),
        rounds: config.rounds,
        retryInterval: config.retryInterval,
        onEvent: (event) => log(`[${account.username} ${event.kind}] ${event.text}`),
      }),
    );
  }
  log(`${devices.length} device(s) on ${sessions.length} wss connection(s), IndexedDB ledgers; waiting for ${config.rounds} round(s)`);
  await Promise.all(sessions.map((session) => session.serve()));
  for (const session of sessions) {
    await session.close();
  }
  const results = sessions.map((session) => session.result());
  let lost = 0;
  for (const ledger of ledgers) {
    // Read back from IndexedDB: what the devices' ledgers recorded of the rounds.
    const state = await ledger.snapshot();
    if ((await ledger.lostRounds()).length > 0 || state.answered.length !== config.rounds) {
      lost += 1;
    }
  }
  const ok = results.every((r) => r.rounds.length === config.rounds && r.rounds.every((round) => roundReleased(round)));
  finish({ ok: ok && lost === 0, sessions: results, devicesWithLostRounds: lost, ledgers: ledgers.length });
}

run().catch((error: unknown) => {
  const text = error instanceof Error ? `${error.name}: ${error.message}\n${error.stack ?? ""}` : String(error);
  log(`error: ${text}`);
  finish({ ok: false, sessions: [], devicesWithLostRounds: -1, ledgers: 0, error: text });
});
