/**
 * A privacy ledger kept in a JSON file, for devices running Node (the budget rules are those of
 * `ledger/ledger.ts`, mirroring `client/ledger.py`).
 *
 * Every operation reads the file, applies the rule and, if anything changed, writes the new
 * state to a temporary file in the same folder, flushes it, renames it over the ledger and
 * flushes the folder: a crash leaves either the old state or the new, never half of one, and a
 * charge is on disk before `spend` returns (so before any envelope leaves). The path is resolved
 * to the file's one name (symbolic links followed), so every spelling of it shares one lock. A file that does not hold a
 * valid ledger state is refused with {@link CorruptLedger}; it is never reset, since a reset
 * would hand the device a fresh budget.
 *
 * Check-and-spend is atomic: within a process, operations on one file (through any number of
 * `FileLedger` objects) run one at a time; across processes, each holds an exclusive lock file
 * (`<path>.lock`, created with O_EXCL, naming its process; a lock whose process is gone, or that
 * names this process while this process does not hold it, is taken over) while it reads and writes.
 *
 * Not defended: a file rolled back to an older copy (restored from a backup, say) hands back the
 * budget spent since; nothing on the device outside the file could tell. Two processes taking
 * over one stale lock at the same instant may both proceed (there is no compare-and-swap on a
 * file name); that needs a crash while holding the lock and then a race. Processes that share
 * the file but not a process-id namespace (two containers on one volume) cannot see each other's
 * pids, and would take each other's locks for stale: one ledger file per device.
 *
 * Node only: this module imports `node:fs`, so it is exported from the package's Node entry
 * point and never reached by a browser bundle.
 */

import { randomBytes } from "node:crypto";
import { promises as fs } from "node:fs";
import * as path from "node:path";

import { InvalidParameter, ShuffleDPError } from "../wire/errors.js";
import {
  chargeRound,
  checkRound,
  copyLedgerState,
  CorruptLedger,
  lostRoundsOf,
  newLedgerState,
  parseLedgerState,
  roundKey,
  sameBudget,
  withOutcome,
  type LedgerBudget,
  type LedgerState,
  type PrivacyLedger,
  type RoundRef,
} from "./ledger.js";

/** Another process held the ledger's lock for longer than a ledger operation takes. */
export class LedgerBusy extends ShuffleDPError {
  constructor(message: string) {
    super(message, "ledger-busy");
  }
}

/** Tail of every in-process operation on a file, by resolved path: operations chain behind it. */
const queues = new Map<string, Promise<unknown>>();

function serialized<T>(file: string, operation: () => Promise<T>): Promise<T> {
  const previous = queues.get(file) ?? Promise.resolve();
  const run = previous.then(operation, operation);
  const tail = run.then(
    () => undefined,
    () => undefined,
  );
  queues.set(file, tail);
  void tail.then(() => {
    if (queues.get(file) === tail) {
      queues.delete(file);
    }
  });
  return run;
}

/** Attempts at the lock file before giving up, and the pause between two (doubling, capped). */
const LOCK_ATTEMPTS = 200;
const LOCK_PAUSE_MS = 5;
const LOCK_PAUSE_CAP_MS = 100;

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Age after which a lock naming no process (created, the pid never written) is taken over. */
const UNNAMED_LOCK_STALE_MS = 30_000;

async function lockOlderThan(lock: string, milliseconds: number): Promise<boolean> {
  const info = await fs.stat(lock).catch(() => undefined);
  return info !== undefined && Date.now() - info.mtimeMs > milliseconds;
}

/** Lock files this process holds now. Within a process, operations on one file are serialized. */
const heldLocks = new Set<string>();

async function withLockFile<T>(file: string, operation: () => Promise<T>): Promise<T> {
  const lock = `${file}.lock`;
  let pause = LOCK_PAUSE_MS;
  for (let attempt = 0; attempt < LOCK_ATTEMPTS; attempt++) {
    let handle: fs.FileHandle | undefined;
    try {
      handle = await fs.open(lock, "wx");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
        throw error;
      }
    }
    if (handle !== undefined) {
      heldLocks.add(lock);
      try {
        await handle.writeFile(String(process.pid));
        await handle.close();
        return await operation();
      } finally {
        heldLocks.delete(lock);
        await fs.rm(lock, { force: true });
      }
    }
    const text = await fs.readFile(lock, "utf8").catch(() => undefined);
    if (text === undefined) {
      continue; // released meanwhile
    }
    const holder = /^[1-9][0-9]{0,15}$/.test(text) ? Number(text) : undefined;
    // Stale: its process is gone, or it names this process, which does not hold it (a process
    // that crashed holding it had this pid: a restarted container's process gets the same one),
    // or it names no process and is older than any creation takes (a crash between creating it
    // and writing the pid).
    const stale =
      holder === undefined
        ? await lockOlderThan(lock, UNNAMED_LOCK_STALE_MS)
        : holder === process.pid
          ? !heldLocks.has(lock)
          : !processAlive(holder);
    if (stale) {
      await fs.rm(lock, { force: true }); // left by a process that ended while holding it
      continue;
    }
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(2 * pause, LOCK_PAUSE_CAP_MS);
  }
  throw new LedgerBusy(`the ledger ${file} stayed locked by another process`);
}

async function readState(file: string): Promise<LedgerState | undefined> {
  let text: string;
  try {
    text = await fs.readFile(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      return undefined;
    }
    throw error;
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new CorruptLedger(`the ledger ${file} is not JSON`);
  }
  return parseLedgerState(value);
}

/**
 * Writes `state` to `file` durably: a temporary file written and synced, renamed over `file`, and
 * then the folder synced, so that once this returns the new state survives a power loss (a rename
 * not yet on disk could bring the old state, and with it spent budget, back). A failure removes the
 * temporary file and leaves `file` as it was.
 */
async function writeState(file: string, state: LedgerState): Promise<void> {
  const folder = path.dirname(file);
  const temporary = path.join(folder, `.${path.basename(file)}.${randomBytes(8).toString("hex")}.tmp`);
  try {
    const handle = await fs.open(temporary, "wx", 0o600);
    try {
      await handle.writeFile(JSON.stringify(state));
      await handle.sync();
    } finally {
      await handle.close();
    }
    await fs.rename(temporary, file);
  } catch (error) {
    await fs.rm(temporary, { force: true });
    throw error;
  }
  await syncFolder(folder);
}

/** Flushes a folder's entries (a rename in it) to disk; a no-op where folders cannot be opened (Windows). */
async function syncFolder(folder: string): Promise<void> {
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(folder, "r");
  } catch (error) {
    if (["EISDIR", "EPERM", "EACCES"].includes((error as NodeJS.ErrnoException).code ?? "")) {
      return;
    }
    throw error;
  }
  try {
    await handle.sync();
  } catch (error) {
    if (!["EINVAL", "EBADF", "EPERM"].includes((error as NodeJS.ErrnoException).code ?? "")) {
      throw error; // EINVAL/EBADF: a file system without folder sync
    }
  } finally {
    await handle.close();
  }
}

/**
 * The one name of the ledger file, whatever path reached it: symbolic links resolved (the file's,
 * if it exists, else its folder's). Two spellings of one ledger then share one queue and one lock
 * file, and a write replaces the file itself, never a link to it.
 */
async function canonicalPath(file: string): Promise<string> {
  const resolved = path.resolve(file);
  try {
    return await fs.realpath(resolved);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") {
      throw error;
    }
  }
  return path.join(await fs.realpath(path.dirname(resolved)), path.basename(resolved));
}

/** A ledger persisted in one JSON file (see the module's description). */
export class FileLedger implements PrivacyLedger {
  private constructor(readonly file: string) {}

  /**
   * The ledger in `file`. A missing file is created with `budget` (required then); an existing
   * one is read and checked ({@link CorruptLedger} if invalid), and must hold `budget` if one is
   * given ({@link InvalidParameter} otherwise: a budget is never changed by reopening).
   */
  static async open(file: string, budget?: LedgerBudget): Promise<FileLedger> {
    const resolved = await canonicalPath(file);
    const fresh = budget === undefined ? undefined : newLedgerState(budget);
    await serialized(resolved, () =>
      withLockFile(resolved, async () => {
        const state = await readState(resolved);
        if (state === undefined) {
          if (fresh === undefined) {
            throw new InvalidParameter("budget", `the ledger ${resolved} does not exist; a budget is needed to create it`);
          }
          await writeState(resolved, fresh);
        } else if (budget !== undefined && !sameBudget(state, budget)) {
          throw new InvalidParameter(
            "budget",
            `the ledger ${resolved} holds the budget (${state.epsilonBudget}, ${state.deltaBudget}), not the one given`,
          );
        }
      }),
    );
    return new FileLedger(resolved);
  }

  private async read(): Promise<LedgerState> {
    const state = await readState(this.file);
    if (state === undefined) {
      throw new CorruptLedger(`the ledger ${this.file} has disappeared`);
    }
    return state;
  }

  /** Runs `change` on the stored state under both locks and stores what it returns, if it changed. */
  private update(change: (state: LedgerState) => LedgerState): Promise<void> {
    return serialized(this.file, () =>
      withLockFile(this.file, async () => {
        const state = await this.read();
        const next = change(state);
        if (next !== state) {
          await writeState(this.file, next);
        }
      }),
    );
  }

  async check(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    const key = roundKey(sessionId, roundId);
    checkRound(await serialized(this.file, () => this.read()), key, epsilon, delta);
  }

  spend(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    const key = roundKey(sessionId, roundId);
    return this.update((state) => chargeRound(state, key, epsilon, delta));
  }

  recordOutcome(sessionId: Uint8Array, roundId: bigint, outcome: string): Promise<void> {
    const key = roundKey(sessionId, roundId);
    return this.update((state) => withOutcome(state, key, outcome));
  }

  async outcomeOf(sessionId: Uint8Array, roundId: bigint): Promise<string | undefined> {
    const key = roundKey(sessionId, roundId);
    return (await serialized(this.file, () => this.read())).outcomes[key];
  }

  async lostRounds(): Promise<RoundRef[]> {
    return lostRoundsOf(await serialized(this.file, () => this.read()));
  }

  async snapshot(): Promise<LedgerState> {
    return copyLedgerState(await serialized(this.file, () => this.read()));
  }
}
