/**
 * `@shuffledp/client/node`: the Node entry point of the device client.
 *
 * Everything of the browser-safe entry point (`@shuffledp/client`), plus what needs Node's file
 * system: a privacy ledger kept in a JSON file ({@link FileLedger}, atomic and locked across
 * processes) and the readers of a device's enrollment and broker account from files
 * (`public.json` and `credentials.json` of `shuffledp keys init`, a password file, the broker's
 * CA certificate for TLS), each refusing files that others could have written or read.
 *
 * A web page imports `@shuffledp/client`; this module is never reached by a browser bundle.
 *
 * @module
 */

export * from "./index.js";

export { FileLedger, LedgerBusy } from "./ledger/fileLedger.js";
export {
  loadBrokerAccount,
  loadEnrollments,
  readCaFile,
  readCheckedFile,
  readPasswordFile,
} from "./enrollmentFiles.js";
