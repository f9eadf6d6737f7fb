#!/usr/bin/env node
// Opens a page in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core) and
// waits until it calls `window.shuffledpReport(json)`; prints {"result": <its JSON>, "log": [console lines]}.
//
//   node test/support/browser_run.mjs --url https://127.0.0.1:PORT/index.html --home DIR --profile DIR \
//        [--timeout S] [--chromium /usr/bin/chromium]
//
// Trust: the browser verifies TLS certificates against its own store. On Linux Chromium reads
// user-trusted CAs from the NSS database in $HOME/.pki/nssdb, so the caller puts its CA there
// (certutil) and passes that HOME with --home; certificate errors are NOT ignored. --profile is a
// fresh user-data-dir. Exit status 0 if the page finished (whatever its result), 1 otherwise.

import { parseArgs } from "node:util";

import { chromium } from "playwright-core";

const { values: args } = parseArgs({
  options: {
    url: { type: "string" },
    home: { type: "string" },
    profile: { type: "string" },
    timeout: { type: "string", default: "120" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
  strict: true,
});

if (!args.url || !args.home || !args.profile) {
  process.stderr.write("browser_run.mjs: need --url, --home and --profile\n");
  process.exit(2);
}

const log = [];
let context;
let code = 1;
try {
  context = await chromium.launchPersistentContext(args.profile, {
    executablePath: args.chromium,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    env: { ...process.env, HOME: args.home },
    timeout: 60_000,
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (message) => log.push(`[console.${message.type()}] ${message.text()}`));
  page.on("pageerror", (error) => log.push(`[pageerror] ${error.message}`));
  page.on("requestfailed", (request) => log.push(`[requestfailed] ${request.url()}: ${request.failure()?.errorText}`));
  // The page calls window.shuffledpReport(json) when it is done: no polling.
  let report;
  const reported = new Promise((resolve) => {
    report = resolve;
  });
  await page.exposeFunction("shuffledpReport", (json) => report(json));
  const response = await page.goto(args.url, { waitUntil: "load", timeout: 30_000 });
  log.push(`[goto] ${args.url}: HTTP ${response?.status()}`);
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the page did not finish within ${args.timeout} s`)), Number(args.timeout) * 1000);
  });
  const result = JSON.parse(await Promise.race([reported, expired]));
  clearTimeout(timer);
  process.stdout.write(JSON.stringify({ result, log }) + "\n");
  code = 0;
} catch (error) {
  process.stdout.write(JSON.stringify({ result: null, error: String(error?.stack ?? error), log }) + "\n");
} finally {
  await context?.close().catch(() => {});
}
process.exit(code);
