/**
 * A privacy ledger kept in the browser's IndexedDB (the budget rules are those of
 * `ledger/ledger.ts`, mirroring `client/ledger.py`).
 *
 * The whole {@link LedgerState} is one record of one object store. Every change runs in one
 * `readwrite` transaction that reads the record, applies the rule and writes it back; IndexedDB
 * runs `readwrite` transactions on one store one at a time, across tabs and workers of the
 * origin, so check-and-spend is atomic. Writes ask for `strict` durability: a transaction
 * completes only once its write is on disk. Opening a ledger asks the browser to keep the
 * origin's storage (`navigator.storage.persist()`); a browser that does not agree may evict it,
 * and the ledger with it ({@link IndexedDbLedger.persisted}). A rule that refuses aborts the transaction, which then
 * writes nothing. A stored record that is not a valid state is refused with
 * {@link CorruptLedger}, never reset.
 */

import { InvalidParameter } from "../wire/errors.js";
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

/** The object store holding the ledger, and the key of its one record. */
export const LEDGER_STORE = "ledger";
const STATE_KEY = "state";
const DATABASE_VERSION = 1;

function requestResult<T>(request: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/** What {@link IndexedDbLedger.open} asks to keep its storage: the browser's `navigator.storage`. */
export interface PersistentStorage {
  persist(): Promise<boolean>;
}

/** Options of {@link IndexedDbLedger.open}. */
export interface IndexedDbLedgerOptions {
  /**
   * Where to ask for persistent storage; `navigator.storage` by default, `null` not to ask.
   */
  storage?: PersistentStorage | null;
}

/** A ledger persisted in one IndexedDB database (see the module's description). */
export class IndexedDbLedger implements PrivacyLedger {
  /**
   * Whether the browser agreed to keep this origin's storage (`navigator.storage.persist()`):
   * `false` means it may evict the database under storage pressure or by policy (Safari deletes
   * the storage of sites not visited for seven days), and a ledger created again after that
   * hands the device a fresh budget. Undefined where nothing could be asked. An application
   * should not answer rounds on a ledger that is not persisted unless it keeps the budget
   * spent somewhere else too.
   */
  persisted: boolean | undefined = undefined;

  private constructor(private readonly db: IDBDatabase) {}

  /**
   * The ledger in database `name`. A database without a ledger gets one of `budget` (required
   * then); an existing ledger is checked ({@link CorruptLedger} if invalid) and must hold `budget`
   * if one is given ({@link InvalidParameter} otherwise). `factory`: the IndexedDB to use
   * (`globalThis.indexedDB` by default). The browser is asked to keep the storage
   * ({@link IndexedDbLedger.persisted} says whether it will).
   */
  static async open(
    name: string,
    budget?: LedgerBudget,
    factory?: IDBFactory,
    options: IndexedDbLedgerOptions = {},
  ): Promise<IndexedDbLedger> {
    const idb = factory ?? (globalThis as { indexedDB?: IDBFactory }).indexedDB;
    if (idb === undefined) {
      throw new InvalidParameter("factory", "this environment has no IndexedDB");
    }
    const fresh = budget === undefined ? undefined : newLedgerState(budget);
    const request = idb.open(name, DATABASE_VERSION);
    request.onupgradeneeded = () => {
      if (!request.result.objectStoreNames.contains(LEDGER_STORE)) {
        request.result.createObjectStore(LEDGER_STORE);
      }
    };
    const db = await requestResult(request);
    const ledger = new IndexedDbLedger(db);
    try {
      await ledger.transact((state) => {
        if (state === undefined) {
          if (fresh === undefined) {
            throw new InvalidParameter("budget", `the ledger ${name} does not exist; a budget is needed to create it`);
          }
          return fresh;
        }
        if (budget !== undefined && !sameBudget(state, budget)) {
          throw new InvalidParameter(
            "budget",
            `the ledger ${name} holds the budget (${state.epsilonBudget}, ${state.deltaBudget}), not the one given`,
          );
        }
        return state;
      });
    } catch (error) {
      db.close();
      throw error;
    }
    const storage =
      options.storage === undefined
        ? (globalThis as { navigator?: { storage?: PersistentStorage } }).navigator?.storage
        : options.storage;
    if (storage !== null && storage !== undefined && typeof storage.persist === "function") {
      ledger.persisted = await storage.persist().then(
        (granted) => granted === true,
        () => false,
      );
    }
    return ledger;
  }

  /** Closes the database connection; the ledger is unusable afterwards. */
  close(): void {
    this.db.close();
  }

  /**
   * Runs `change` on the stored state inside one readwrite transaction and writes what it returns
   * if it changed; a throw of `change` aborts the transaction and is rethrown.
   */
  private transact(change: (state: LedgerState | undefined) => LedgerState): Promise<LedgerState> {
    return new Promise((resolve, reject) => {
      // Strict: `complete` fires only once the write is on disk, so a charge survives a crash
      // of the browser or the device before any envelope leaves (the default lets it be lost).
      const transaction = this.db.transaction(LEDGER_STORE, "readwrite", { durability: "strict" });
      const store = transaction.objectStore(LEDGER_STORE);
      let failure: unknown;
      let result: LedgerState | undefined;
      const read = store.get(STATE_KEY);
      read.onsuccess = () => {
        try {
          const stored = read.result === undefined ? undefined : parseLedgerState(read.result);
          const next = change(stored);
          result = next;
          if (next !== stored) {
            store.put(next, STATE_KEY);
          }
        } catch (error) {
          failure = error;
          transaction.abort();
        }
      };
      transaction.oncomplete = () => resolve(result as LedgerState);
      transaction.onabort = () => reject(failure ?? transaction.error ?? new CorruptLedger("the ledger transaction aborted"));
      transaction.onerror = () => {
        /* the abort that follows reports it */
      };
    });
  }

  private read(): Promise<LedgerState> {
    return new Promise((resolve, reject) => {
      const transaction = this.db.transaction(LEDGER_STORE, "readonly");
      const read = transaction.objectStore(LEDGER_STORE).get(STATE_KEY);
      read.onsuccess = () => {
        try {
          if (read.result === undefined) {
            throw new CorruptLedger("the ledger record has disappeared");
          }
          resolve(parseLedgerState(read.result));
        } catch (error) {
          reject(error);
        }
      };
      read.onerror = () => reject(read.error);
    });
  }

  async check(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    checkRound(await this.read(), roundKey(sessionId, roundId), epsilon, delta);
  }

  async spend(sessionId: Uint8Array, roundId: bigint, epsilon: number, delta: number): Promise<void> {
    const key = roundKey(sessionId, roundId);
    await this.transact((state) => chargeRound(present(state), key, epsilon, delta));
  }

  async recordOutcome(sessionId: Uint8Array, roundId: bigint, outcome: string): Promise<void> {
    const key = roundKey(sessionId, roundId);
    await this.transact((state) => withOutcome(present(state), key, outcome));
  }

  async outcomeOf(sessionId: Uint8Array, roundId: bigint): Promise<string | undefined> {
    return (await this.read()).outcomes[roundKey(sessionId, roundId)];
  }

  async lostRounds(): Promise<RoundRef[]> {
    return lostRoundsOf(await this.read());
  }

  async snapshot(): Promise<LedgerState> {
    return copyLedgerState(await this.read());
  }
}

function present(state: LedgerState | undefined): LedgerState {
  if (state === undefined) {
    throw new CorruptLedger("the ledger record has disappeared");
  }
  return state;
}
