// The browser side of bench_client_browser.mjs: bundled by esbuild (platform browser) into the
// benchmark page, it exposes globalThis.runBench(request) = answerMany with the package's Client.

import { Client } from "../../dist/client/client.js";
import { MemoryLedger } from "../../dist/ledger/ledger.js";
import { answerMany } from "./bench_client.mjs";

globalThis.runBench = (request) => answerMany({ Client, MemoryLedger }, request);
