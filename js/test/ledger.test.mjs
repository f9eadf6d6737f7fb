// The privacy ledgers: the budget rules of client/ledger.py, persistence, refusal of corrupt
// stores, and atomic check-and-spend.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { CorruptLedger, MemoryLedger } from "../dist/ledger/ledger.js";
import { FileLedger } from "../dist/ledger/fileLedger.js";
import { IndexedDbLedger } from "../dist/ledger/indexedDbLedger.js";
import { BudgetExceeded, InvalidParameter } from "../dist/wire/errors.js";

const SESSION = Uint8Array.from({ length: 16 }, (_, i) => i);
const OTHER_SESSION = new Uint8Array(16).fill(7);

async function temporaryFolder(t) {
  const folder = await mkdtemp(join(tmpdir(), "shuffledp-ledger-"));
  t.after(() => rm(folder, { recursive: true, force: true }));
  return folder;
}

/**
 * A small in-memory IndexedDB (the calls IndexedDbLedger makes: open with an upgrade, one object
 * store, get and put in transactions), with the property the ledger relies on: readwrite
 * transactions on a store run one at a time, and an aborted one writes nothing. Values are kept
 * as structured clones. Node has no IndexedDB; this checks the ledger's use of it, not a browser's.
 */
class FakeIndexedDb {
  constructor() {
    this.databases = new Map();
  }
  open(name) {
    const request = {};
    queueMicrotask(() => {
      let db = this.databases.get(name);
      const fresh = db === undefined;
      if (fresh) {
        db = new FakeDatabase();
        this.databases.set(name, db);
      }
      request.result = db.connection();
      if (fresh) request.onupgradeneeded?.();
      request.onsuccess?.();
    });
    return request;
  }
}

class FakeDatabase {
  constructor() {
    this.stores = new Map();
    this.queue = Promise.resolve();
  }
  connection() {
    const db = this;
    return {
      objectStoreNames: { contains: (name) => db.stores.has(name) },
      createObjectStore: (name) => db.stores.set(name, new Map()),
      transaction: (name, mode) => db.transaction(name, mode),
      close: () => {},
    };
  }
  transaction(name, mode) {
    const db = this;
    const writes = new Map(); // applied when the transaction commits
    let aborted = false;
    let outstanding = 0;
    let finished = false;
    let release;
    const done = new Promise((resolve) => (release = resolve));
    // A readwrite transaction waits for the readwrite transactions before it to finish.
    const turn = mode === "readwrite" ? db.queue : Promise.resolve();
    if (mode === "readwrite") db.queue = turn.then(() => done);
    const transaction = {
      error: null,
      abort() {
        aborted = true;
      },
      objectStore: () => store,
    };
    const finish = () => {
      if (finished || outstanding > 0) return;
      finished = true;
      if (aborted) {
        transaction.onabort?.();
      } else {
        for (const [key, value] of writes) db.stores.get(name).set(key, value);
        transaction.oncomplete?.();
      }
      release();
    };
    const store = {
      get(key) {
        const request = {};
        outstanding++;
        turn.then(() => {
          const value = writes.has(key) ? writes.get(key) : db.stores.get(name).get(key);
          request.result = value === undefined ? undefined : structuredClone(value);
          try {
            request.onsuccess?.();
          } finally {
            outstanding--;
            queueMicrotask(finish);
          }
        });
        return request;
      },
      put(value, key) {
        if (mode !== "readwrite") throw new Error("read-only transaction");
        writes.set(key, structuredClone(value));
        return {};
      },
    };
    return transaction;
  }
}

const makers = {
  memory: async (_t, budget) => new MemoryLedger(budget),
  file: async (t, budget) => FileLedger.open(join(await temporaryFolder(t), "ledger.json"), budget),
  indexedDb: async (_t, budget) => IndexedDbLedger.open("ledger", budget, new FakeIndexedDb()),
};

for (const [kind, make] of Object.entries(makers)) {
  test(`${kind}: spends until the budget is gone, then refuses`, async (t) => {
    const ledger = await make(t, { epsilonBudget: 1.0, deltaBudget: 1e-6 });
    await ledger.spend(SESSION, 0n, 0.5, 0);
    await ledger.check(SESSION, 1n, 0.5, 0);
    await ledger.spend(SESSION, 1n, 0.5, 0); // 0.5 + 0.5 = 1.0 exactly: within the budget
    await assert.rejects(ledger.check(SESSION, 2n, 1e-3, 0), BudgetExceeded);
    await assert.rejects(ledger.spend(SESSION, 2n, 1e-3, 0), BudgetExceeded);
    const state = await ledger.snapshot();
    assert.equal(state.spentEpsilon, 1.0);
    assert.equal(state.answered.length, 2);
  });

  test(`${kind}: a round is charged once, other sessions are other rounds`, async (t) => {
    const ledger = await make(t, { epsilonBudget: 10, deltaBudget: 0 });
    await ledger.spend(SESSION, 3n, 1, 0);
    await assert.rejects(ledger.spend(SESSION, 3n, 1, 0), (e) => e instanceof BudgetExceeded && /already answered/.test(e.message));
    await ledger.spend(OTHER_SESSION, 3n, 1, 0);
    assert.equal((await ledger.snapshot()).spentEpsilon, 2);
  });

  test(`${kind}: delta is a budget of its own`, async (t) => {
    const ledger = await make(t, { epsilonBudget: 10, deltaBudget: 1e-6 });
    await ledger.spend(SESSION, 0n, 1, 1e-6);
    await assert.rejects(ledger.spend(SESSION, 1n, 1, 1e-7), /delta/);
    await assert.rejects(ledger.spend(SESSION, 1n, -1, 0), InvalidParameter);
    await assert.rejects(ledger.spend(SESSION, 1n, Number.NaN, 0), InvalidParameter);
    assert.equal((await ledger.snapshot()).answered.length, 1);
  });

  test(`${kind}: outcomes are recorded forward only, and a lost round stays charged`, async (t) => {
    const ledger = await make(t, { epsilonBudget: 2, deltaBudget: 0 });
    await assert.rejects(ledger.recordOutcome(SESSION, 0n, "released"), InvalidParameter); // never answered
    await ledger.spend(SESSION, 0n, 1, 0);
    await ledger.spend(SESSION, 1n, 1, 0);
    await ledger.recordOutcome(SESSION, 0n, "released");
    await ledger.recordOutcome(SESSION, 1n, "failed:batch-too-small");
    await ledger.recordOutcome(SESSION, 1n, "released"); // a replayed older word: changes nothing
    await ledger.recordOutcome(SESSION, 1n, "failed:other"); // failed is final
    assert.equal(await ledger.outcomeOf(SESSION, 1n), "failed:batch-too-small");
    assert.equal(await ledger.outcomeOf(SESSION, 0n), "released");
    await ledger.recordOutcome(SESSION, 0n, "failed:late"); // released may still turn failed
    const lost = await ledger.lostRounds();
    assert.deepEqual(lost.map((r) => r.roundId).sort(), [0n, 1n]);
    assert.deepEqual(lost[0].sessionId, SESSION);
    assert.equal((await ledger.snapshot()).spentEpsilon, 2); // nothing refunded
    await assert.rejects(ledger.spend(SESSION, 2n, 0.1, 0), BudgetExceeded);
    await assert.rejects(ledger.recordOutcome(SESSION, 0n, "served"), InvalidParameter);
  });

  test(`${kind}: concurrent spends cannot both take the last of the budget`, async (t) => {
    const ledger = await make(t, { epsilonBudget: 1, deltaBudget: 0 });
    await ledger.spend(SESSION, 0n, 0.5, 0);
    const results = await Promise.allSettled([1n, 2n, 3n, 4n].map((round) => ledger.spend(SESSION, round, 0.5, 0)));
    assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
    for (const r of results.filter((r) => r.status === "rejected")) assert.ok(r.reason instanceof BudgetExceeded);
    const state = await ledger.snapshot();
    assert.equal(state.spentEpsilon, 1);
    assert.equal(state.answered.length, 2);
  });

  test(`${kind}: refuses a budget out of its domain`, async (t) => {
    for (const budget of [{ epsilonBudget: 0 }, { epsilonBudget: Infinity }, { epsilonBudget: 1, deltaBudget: 1 }, {}]) {
      await assert.rejects(make(t, budget), InvalidParameter);
    }
  });
}

test("file: the ledger persists across instances and processes' reopenings", async (t) => {
  const file = join(await temporaryFolder(t), "ledger.json");
  const first = await FileLedger.open(file, { epsilonBudget: 1, deltaBudget: 0 });
  await first.spend(SESSION, 0n, 0.75, 0);
  await first.recordOutcome(SESSION, 0n, "failed:batch-too-small");
  const second = await FileLedger.open(file); // no budget: the file's
  await assert.rejects(second.spend(SESSION, 1n, 0.5, 0), BudgetExceeded);
  await assert.rejects(second.spend(SESSION, 0n, 0.1, 0), BudgetExceeded); // answered already
  await second.spend(SESSION, 1n, 0.25, 0);
  await assert.rejects(first.spend(SESSION, 2n, 0.01, 0), BudgetExceeded); // first sees second's charge
  assert.equal(await first.outcomeOf(SESSION, 0n), "failed:batch-too-small");
  // Reopening never changes the budget.
  await assert.rejects(FileLedger.open(file, { epsilonBudget: 5, deltaBudget: 0 }), InvalidParameter);
  await assert.rejects(FileLedger.open(join(file, "..", "missing.json")), InvalidParameter);
});

test("file: two ledger objects on one file cannot both take the last of the budget", async (t) => {
  const file = join(await temporaryFolder(t), "ledger.json");
  const ledgers = await Promise.all([1, 2, 3].map(() => FileLedger.open(file, { epsilonBudget: 1, deltaBudget: 0 })));
  const results = await Promise.allSettled(ledgers.map((ledger, i) => ledger.spend(SESSION, BigInt(i), 0.6, 0)));
  assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
  assert.equal((await ledgers[0].snapshot()).answered.length, 1);
});

test("file: a corrupt ledger is refused, never reset", async (t) => {
  const folder = await temporaryFolder(t);
  const file = join(folder, "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1, deltaBudget: 0 });
  await ledger.spend(SESSION, 0n, 0.9, 0);
  const good = await readFile(file, "utf8");
  const state = JSON.parse(good);
  const corruptions = [
    good.slice(0, good.length - 3), // truncated
    "",
    "[]",
    JSON.stringify({ ...state, spentEpsilon: -1 }),
    JSON.stringify({ ...state, spentEpsilon: 2 }), // more spent than the budget
    JSON.stringify({ ...state, answered: ["not a round"] }),
    JSON.stringify({ ...state, extra: 1 }),
    JSON.stringify({ ...state, version: 2 }),
    JSON.stringify({ ...state, outcomes: { "00000000000000000000000000000000/5": "released" } }), // unanswered round
  ];
  for (const text of corruptions) {
    await writeFile(file, text);
    await assert.rejects(ledger.spend(SESSION, 1n, 0.05, 0), CorruptLedger, `accepted ${text.slice(0, 60)}`);
    await assert.rejects(FileLedger.open(file, { epsilonBudget: 1, deltaBudget: 0 }), CorruptLedger);
    assert.equal(await readFile(file, "utf8"), text); // left as it was for someone to look at
  }
  await writeFile(file, good);
  await ledger.spend(SESSION, 1n, 0.05, 0);
});

test("file: a failed write leaves the ledger as it was", async (t) => {
  const folder = await temporaryFolder(t);
  const file = join(folder, "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1, deltaBudget: 0 });
  await ledger.spend(SESSION, 0n, 0.5, 0);
  const before = await readFile(file, "utf8");
  await assert.rejects(ledger.spend(SESSION, 1n, 0.6, 0), BudgetExceeded); // refused: nothing written
  assert.equal(await readFile(file, "utf8"), before);
});

test("indexedDb: the ledger persists across connections to one database", async () => {
  const factory = new FakeIndexedDb();
  const first = await IndexedDbLedger.open("device", { epsilonBudget: 1, deltaBudget: 0 }, factory);
  await first.spend(SESSION, 0n, 0.75, 0);
  const second = await IndexedDbLedger.open("device", undefined, factory);
  await assert.rejects(second.spend(SESSION, 1n, 0.5, 0), BudgetExceeded);
  await assert.rejects(IndexedDbLedger.open("device", { epsilonBudget: 2, deltaBudget: 0 }, factory), InvalidParameter);
  await assert.rejects(IndexedDbLedger.open("other", undefined, factory), InvalidParameter);
  await assert.rejects(IndexedDbLedger.open("device", { epsilonBudget: 1 }, undefined), InvalidParameter); // Node: none
});

test("indexedDb: a corrupt record is refused", async () => {
  const factory = new FakeIndexedDb();
  const ledger = await IndexedDbLedger.open("device", { epsilonBudget: 1, deltaBudget: 0 }, factory);
  const store = factory.databases.get("device").stores.get("ledger");
  store.set("state", { ...store.get("state"), spentEpsilon: "0" });
  await assert.rejects(ledger.spend(SESSION, 1n, 0.1, 0), CorruptLedger);
  assert.equal(store.get("state").spentEpsilon, "0");
});

// The IndexedDbLedger in a real browser: headless Chromium (driven by playwright-core) runs the
// ledger on a page whose origin Playwright serves from memory (IndexedDB needs a real origin).
const CHROMIUM = "/usr/bin/chromium";

test("indexedDb in Chromium: atomic spends, persistence across connections, corrupt record refused", { skip: !existsSync(CHROMIUM) && `no ${CHROMIUM}`, timeout: 120_000 }, async (t) => {
  const { build } = await import("esbuild");
  const { chromium } = await import("playwright-core");
  const page = `
    import { IndexedDbLedger } from "./dist/ledger/indexedDbLedger.js";
    const session = new Uint8Array(16).map((_, i) => i);
    async function run() {
      const out = {};
      const ledger = await IndexedDbLedger.open("device", { epsilonBudget: 1, deltaBudget: 0 });
      await ledger.spend(session, 0n, 0.5, 0);
      const race = await Promise.allSettled([1n, 2n, 3n, 4n].map((round) => ledger.spend(session, round, 0.5, 0)));
      out.raceWinners = race.filter((r) => r.status === "fulfilled").length;
      out.raceReasons = race.filter((r) => r.status === "rejected").map((r) => r.reason.reason);
      // Two connections to one database, spending concurrently.
      const a = await IndexedDbLedger.open("shared", { epsilonBudget: 1, deltaBudget: 0 });
      const b = await IndexedDbLedger.open("shared");
      const both = await Promise.allSettled([a.spend(session, 0n, 0.6, 0), b.spend(session, 1n, 0.6, 0)]);
      out.sharedWinners = both.filter((r) => r.status === "fulfilled").length;
      await a.recordOutcome(session, both[0].status === "fulfilled" ? 0n : 1n, "failed:batch-too-small");
      a.close();
      const reopened = await IndexedDbLedger.open("shared");
      out.reopened = await reopened.snapshot();
      out.lost = (await reopened.lostRounds()).length;
      out.budgetChange = await IndexedDbLedger.open("shared", { epsilonBudget: 5 }).then(() => "accepted", (e) => e.reason);
      // Corrupt the stored record behind the ledger's back.
      await new Promise((resolve, reject) => {
        const request = indexedDB.open("shared", 1);
        request.onsuccess = () => {
          const tx = request.result.transaction("ledger", "readwrite");
          tx.objectStore("ledger").put({ ...out.reopened, spentEpsilon: "0" }, "state");
          tx.oncomplete = () => { request.result.close(); resolve(); };
          tx.onerror = () => reject(tx.error);
        };
      });
      out.corrupt = await reopened.spend(session, 9n, 0.1, 0).then(() => "accepted", (e) => e.reason);
      out.corruptOpen = await IndexedDbLedger.open("shared").then(() => "accepted", (e) => e.reason);
      return out;
    }
    run().then((out) => window.report(JSON.stringify(out, (k, v) => (typeof v === "bigint" ? String(v) : v))),
                (e) => window.report(JSON.stringify({ error: String(e && e.stack || e) })));
  `;
  const bundle = await build({
    stdin: { contents: page, resolveDir: new URL("..", import.meta.url).pathname, loader: "js" },
    bundle: true,
    format: "esm",
    platform: "browser",
    write: false,
    logLevel: "silent",
  });
  const script = bundle.outputFiles[0].text;
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu"] });
  t.after(() => browser.close());
  const context = await browser.newContext();
  await context.route("http://ledger.test/**", (route) =>
    route.fulfill({
      contentType: route.request().url().endsWith(".js") ? "text/javascript" : "text/html",
      body: route.request().url().endsWith(".js") ? script : '<!doctype html><script type="module" src="/page.js"></script>',
    }),
  );
  const tab = await context.newPage();
  let settle;
  const reported = new Promise((resolve, reject) => (settle = { resolve, reject }));
  tab.on("pageerror", (error) => settle.reject(error));
  await tab.exposeFunction("report", (json) => settle.resolve(json));
  await tab.goto("http://ledger.test/index.html");
  const out = JSON.parse(await reported);
  assert.equal(out.error, undefined, out.error);
  assert.equal(out.raceWinners, 1);
  assert.deepEqual(out.raceReasons, ["budget", "budget", "budget"]);
  assert.equal(out.sharedWinners, 1);
  assert.equal(out.reopened.spentEpsilon, 0.6);
  assert.equal(out.reopened.answered.length, 1);
  assert.equal(out.lost, 1);
  assert.equal(out.budgetChange, "invalid-parameter");
  assert.equal(out.corrupt, "corrupt-ledger");
  assert.equal(out.corruptOpen, "corrupt-ledger");
});
