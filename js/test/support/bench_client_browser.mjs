// bench_client.mjs's answerMany in headless Chromium, for benchmarks/bench_js_client.py.
//
// Request on stdin: bench_client.mjs's request plus { chromium: path to the browser executable }.
// Bundles bench_client_page.mjs with esbuild (format esm, platform browser), serves it on
// 127.0.0.1 (a secure context: Web Crypto is available), starts Chromium through playwright-core
// with a fresh profile directory and the flags below, runs the request in the page, and prints
// answerMany's result JSON on stdout. Everything it starts it stops, and the profile is removed.

import http from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";

const FLAGS = [
  "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync",
];

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const { chromium: executablePath, ...request } = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const bundled = await build({
  entryPoints: [fileURLToPath(new URL("./bench_client_page.mjs", import.meta.url))],
  bundle: true, format: "esm", platform: "browser", minify: true, write: false, logLevel: "error",
});
const files = {
  "/": { type: "text/html; charset=utf-8", body: '<!doctype html><meta charset="utf-8"><title>shuffledp client benchmark</title><script type="module" src="/bench.js"></script>\n' },
  "/bench.js": { type: "text/javascript; charset=utf-8", body: bundled.outputFiles[0].contents },
};
const server = http.createServer((req, res) => {
  const file = files[new URL(req.url, "http://127.0.0.1").pathname];
  if (file === undefined) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "content-type": file.type, "cache-control": "no-store" }).end(file.body);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const profile = await mkdtemp(join(tmpdir(), "shuffledp-bench-chromium-"));
let context;
try {
  context = await chromium.launchPersistentContext(profile, { executablePath, headless: true, args: FLAGS });
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(`http://127.0.0.1:${server.address().port}/`);
  await page.waitForFunction(() => typeof globalThis.runBench === "function", null, { timeout: 60_000 }).catch(() => {
    throw new Error(`the benchmark page did not load: ${errors.join("; ") || "no runBench"}`);
  });
  const result = await page.evaluate((r) => globalThis.runBench(r), request);
  result.bundleBytes = bundled.outputFiles[0].contents.length;
  process.stdout.write(JSON.stringify(result) + "\n");
} finally {
  if (context !== undefined) await context.close();
  server.close();
  await rm(profile, { recursive: true, force: true });
}
