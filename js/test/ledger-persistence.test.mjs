// The persistent ledgers against crashes and odd storage: a lock left by a process that crashed
// with this process's pid (a restarted container gets the same one), a ledger reached through a
// symbolic link, the rename made durable, a failed write leaving no temporary file, and IndexedDB
// transactions asking for strict durability and storage the browser does not evict.
import { test } from "node:test";
import assert from "node:assert/strict";
import { promises as fsPromises } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { FileLedger } from "../dist/ledger/fileLedger.js";
import { IndexedDbLedger } from "../dist/ledger/indexedDbLedger.js";
import { BudgetExceeded } from "../dist/wire/errors.js";

const SESSION = Uint8Array.from({ length: 16 }, (_, i) => i);

async function temporaryFolder(t) {
  const folder = await mkdtemp(join(tmpdir(), "shuffledp-ledger-"));
  t.after(() => rm(folder, { recursive: true, force: true }));
  return folder;
}

test("file: a lock left by a crashed process that had this process's pid is taken over", async (t) => {
  const file = join(await temporaryFolder(t), "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1 });
  // A device restarted in a container runs with the pid its crashed predecessor had.
  await writeFile(`${file}.lock`, String(process.pid));
  await ledger.spend(SESSION, 0n, 0.5, 0);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0.5);
});

test("file: a lock left empty by a process that crashed while creating it is taken over once it is old", async (t) => {
  const file = join(await temporaryFolder(t), "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1 });
  await writeFile(`${file}.lock`, ""); // created, the pid not yet written: then the crash
  const anHourAgo = new Date(Date.now() - 3600_000);
  await utimes(`${file}.lock`, anHourAgo, anHourAgo);
  await ledger.spend(SESSION, 0n, 0.5, 0);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0.5);
});

test("file: one ledger reached by two paths (a symbolic link) is still charged atomically", async (t) => {
  const folder = await temporaryFolder(t);
  await mkdir(join(folder, "real"));
  const real = join(folder, "real", "ledger.json");
  const first = await FileLedger.open(real, { epsilonBudget: 1 });
  await symlink(real, join(folder, "alias.json"));
  const second = await FileLedger.open(join(folder, "alias.json"));
  for (let round = 0n; round < 20n; round += 2n) {
    const results = await Promise.allSettled([first.spend(SESSION, round, 0.05, 0), second.spend(SESSION, round + 1n, 0.05, 0)]);
    assert.ok(results.every((r) => r.status === "fulfilled"));
  }
  // Twenty charges of 0.05: every one of them counted, none lost to a concurrent write.
  assert.equal((await first.snapshot()).answered.length, 20);
  assert.equal((await second.snapshot()).answered.length, 20);
  await assert.rejects(first.spend(SESSION, 99n, 0.01, 0), BudgetExceeded);
});

test("file: a charge is durable before spend returns (the file synced, then the folder after the rename)", async (t) => {
  const folder = await temporaryFolder(t);
  const file = join(folder, "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1 });
  const log = [];
  const { open, rename } = fsPromises;
  fsPromises.open = async (where, ...rest) => {
    const handle = await open(where, ...rest);
    const sync = handle.sync.bind(handle);
    handle.sync = async () => {
      log.push(`sync ${where}`);
      return sync();
    };
    return handle;
  };
  fsPromises.rename = async (from, to) => {
    log.push(`rename ${to}`);
    return rename(from, to);
  };
  try {
    await ledger.spend(SESSION, 0n, 0.5, 0);
  } finally {
    fsPromises.open = open;
    fsPromises.rename = rename;
  }
  const renamed = log.indexOf(`rename ${file}`);
  assert.ok(renamed > 0 && log.slice(0, renamed).some((line) => line.startsWith("sync ")), log.join("; "));
  assert.ok(log.slice(renamed + 1).includes(`sync ${folder}`), log.join("; "));
});

test("file: a write that fails leaves no temporary file behind", async (t) => {
  const folder = await temporaryFolder(t);
  const file = join(folder, "ledger.json");
  const ledger = await FileLedger.open(file, { epsilonBudget: 1 });
  const { open } = fsPromises;
  fsPromises.open = async (where, ...rest) => {
    const handle = await open(where, ...rest);
    if (String(where).endsWith(".tmp")) {
      handle.sync = async () => {
        throw Object.assign(new Error("no space left on device"), { code: "ENOSPC" });
      };
    }
    return handle;
  };
  try {
    await assert.rejects(ledger.spend(SESSION, 0n, 0.5, 0), /no space/);
  } finally {
    fsPromises.open = open;
  }
  assert.deepEqual((await readdir(folder)).sort(), ["ledger.json"]);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0);
});

test("indexedDb: the ledger asks the browser to keep its storage (best-effort storage may be evicted) and says whether it will", async () => {
  for (const granted of [true, false]) {
    const asked = [];
    const storage = { persist: async () => (asked.push("persist"), granted) };
    const ledger = await IndexedDbLedger.open("device", { epsilonBudget: 1 }, recordingIndexedDb([]), { storage });
    assert.deepEqual(asked, ["persist"]);
    assert.equal(ledger.persisted, granted);
  }
  // Where there is no StorageManager (Node, old browsers), nothing can be asked.
  const ledger = await IndexedDbLedger.open("device", { epsilonBudget: 1 }, recordingIndexedDb([]), { storage: null });
  assert.equal(ledger.persisted, undefined);
});

test("indexedDb: every readwrite transaction asks for strict durability", async () => {
  const modes = [];
  const factory = recordingIndexedDb(modes);
  const ledger = await IndexedDbLedger.open("device", { epsilonBudget: 1 }, factory);
  await ledger.spend(SESSION, 0n, 0.5, 0);
  await ledger.recordOutcome(SESSION, 0n, "released");
  const writes = modes.filter((mode) => mode.startsWith("readwrite"));
  assert.equal(writes.length, 3);
  assert.ok(writes.every((mode) => mode === "readwrite:strict"), modes.join(", "));
});

/** A recording IndexedDB: one store, transactions that complete at once, their mode and durability kept in `modes`. */
function recordingIndexedDb(modes) {
  let record;
  const database = {
    objectStoreNames: { contains: () => true },
    close: () => {},
    transaction(_name, mode, options) {
      modes.push(`${mode}:${options?.durability ?? "default"}`);
      const transaction = {
        abort() {
          queueMicrotask(() => transaction.onabort?.());
        },
        objectStore: () => ({
          get() {
            const request = {};
            queueMicrotask(() => {
              request.result = record === undefined ? undefined : structuredClone(record);
              request.onsuccess?.();
              queueMicrotask(() => transaction.oncomplete?.());
            });
            return request;
          },
          put(value) {
            record = structuredClone(value);
            return {};
          },
        }),
      };
      return transaction;
    },
  };
  return {
    open() {
      const request = { result: database };
      queueMicrotask(() => request.onsuccess?.());
      return request;
    },
  };
}
