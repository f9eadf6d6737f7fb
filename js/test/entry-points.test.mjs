// The package's entry points: what each exports, and that the browser ones reach no Node built-in.
//
// The entry points are imported by the package's own name (Node resolves a package's name from
// inside it through package.json "exports"), as an application imports them.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import * as main from "@shuffledp/client";
import * as mqtt from "@shuffledp/client/mqtt";
import * as node from "@shuffledp/client/node";
import * as testing from "@shuffledp/client/testing";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const manifest = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8"));

/** Every module file `entry` (a dist/ path) imports, transitively, and every bare import it makes. */
function importGraph(entry) {
  const files = new Set();
  const bare = new Set();
  const pending = [resolve(PACKAGE, entry)];
  while (pending.length > 0) {
    const file = pending.pop();
    if (files.has(file)) continue;
    files.add(file);
    const text = readFileSync(file, "utf8");
    for (const match of text.matchAll(/(?:^|[\s;])(?:import|export)\s[^"']*?from\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/gm)) {
      const target = match[1] ?? match[2];
      if (target.startsWith(".")) pending.push(resolve(dirname(file), target));
      else bare.add(target);
    }
  }
  return { files, bare };
}

test("the package exports the four documented entry points", () => {
  assert.deepEqual(Object.keys(manifest.exports).sort(), [".", "./mqtt", "./node", "./testing"]);
});

test("the main entry point holds the device, its ledgers, the codec, the errors and the randomizers", () => {
  for (const name of [
    "Client", "SentRound", "MemoryLedger", "IndexedDbLedger", "SystemSource", "encodeMessage", "decodeMessage",
    "decodeRoundSpec", "verifiedSpec", "decodeVerified", "specDigest", "randomizeRound", "reportRanges",
    "checkReportValues", "ShuffleDPError", "BudgetExceeded", "BadSignature", "RoundExpired", "UntrustedRound",
    "InvalidParameter", "MalformedMessage", "parsePublicInfo", "deviceEnrollments", "WIRE_VERSION",
  ]) {
    assert.ok(main[name] !== undefined, `@shuffledp/client lacks ${name}`);
  }
  assert.equal(main.WIRE_VERSION, 3);
  assert.equal(new main.BudgetExceeded("x").reason, "budget");
});

test("the deterministic source is only on the testing entry point", () => {
  assert.equal(main.SeededSource, undefined);
  assert.equal(node.SeededSource, undefined);
  assert.equal(new testing.SeededSource(1).secure, false);
  assert.equal(new main.SystemSource().secure, true);
});

test("the Node entry point is the main one plus the file ledger and the file readers", () => {
  for (const [name, value] of Object.entries(main)) {
    assert.equal(node[name], value, `@shuffledp/client/node re-exports ${name} as it is`);
  }
  const extra = Object.keys(node).filter((name) => !(name in main)).sort();
  assert.deepEqual(extra, ["FileLedger", "LedgerBusy", "loadBrokerAccount", "loadEnrollments", "readCaFile", "readCheckedFile", "readPasswordFile"]);
});

test("the MQTT entry point holds the round loop and the topics", () => {
  for (const name of ["DeviceSession", "runDevice", "roundReleased", "specTopic", "reportsTopic", "receiptsTopic", "outcomeTopic"]) {
    assert.equal(typeof mqtt[name], "function", `@shuffledp/client/mqtt lacks ${name}`);
  }
  assert.equal(mqtt.reportsTopic(new Uint8Array(16), 3n, 1), `shuffledp/${"00".repeat(16)}/3/1/reports`);
});

test("the browser entry points reach no Node built-in; the Node one does", () => {
  for (const subpath of [".", "./mqtt", "./testing"]) {
    const { bare } = importGraph(manifest.exports[subpath].default);
    const builtins = [...bare].filter((name) => name.startsWith("node:"));
    assert.deepEqual(builtins, [], `${subpath} imports ${builtins.join(", ")}`);
  }
  const { bare } = importGraph(manifest.exports["./node"].default);
  assert.ok(bare.has("node:fs"), "the import graph walk finds the Node entry point's node:fs");
});

test("the main entry point does not load the MQTT client", () => {
  const { bare } = importGraph(manifest.exports["."].default);
  assert.ok(!bare.has("mqtt"), "import mqtt only through @shuffledp/client/mqtt");
  assert.ok(importGraph(manifest.exports["./mqtt"].default).bare.has("mqtt"));
});

// The documentation: docs/api/js-client.md names every export, and the examples of this
// package's README import only what exists and parse.

const REPOSITORY = resolve(PACKAGE, "..");
const API_PAGE = join(REPOSITORY, "docs", "api", "js-client.md");

test("docs/api/js-client.md names every export of every entry point", () => {
  const page = readFileSync(API_PAGE, "utf8");
  for (const [subpath, module] of [[".", main], ["./node", node], ["./mqtt", mqtt], ["./testing", testing]]) {
    const missing = Object.keys(module).filter((name) => !new RegExp("`(?:[^`]*\\W)?" + name + "\\b").test(page));
    assert.deepEqual(missing, [], `docs/api/js-client.md does not name ${subpath}'s ${missing.join(", ")}`);
  }
  assert.match(page, /wire\s+format\s+3/);
});

test("the README's examples import what the entry points export, and type-check", async () => {
  const { execFileSync } = await import("node:child_process");
  const { mkdtempSync, rmSync, writeFileSync } = await import("node:fs");
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/^```js\n(.*?)^```$/gms)].map((match) => match[1]);
  assert.ok(blocks.length >= 3, "the README has its browser, Node and one-round examples");
  const modules = { "@shuffledp/client": main, "@shuffledp/client/node": node, "@shuffledp/client/mqtt": mqtt };
  // Inside the package, so that its own name resolves; the blocks as TypeScript modules, strict.
  const scratch = mkdtempSync(join(PACKAGE, ".readme-check-"));
  try {
    blocks.forEach((block, i) => {
      for (const [, names, from] of block.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)) {
        assert.ok(from in modules, `README block ${i} imports from ${from}`);
        for (const name of names.split(",").map((n) => n.trim()).filter(Boolean)) {
          assert.ok(name in modules[from], `README block ${i}: ${from} exports no ${name}`);
        }
      }
      // A block that uses names it does not define (an excerpt) declares them first, from the package's types.
      const free = [...block.matchAll(/\b(client|signedSpecBytes|receiptsBytes|outcomeBytes)\b/g)].map((m) => m[1]);
      const declared = block.includes("new Client(") ? [] : [...new Set(free)];
      const header = declared
        .map((name) =>
          name === "client" ? 'import type { Client } from "@shuffledp/client";\ndeclare const client: Client;' : `declare const ${name}: Uint8Array;`,
        )
        .join("\n");
      writeFileSync(join(scratch, `block${i}.mts`), `${header}\n${block}\nexport {};\n`);
    });
    writeFileSync(
      join(scratch, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", lib: ["ES2022", "DOM"], strict: true,
          noEmit: true, skipLibCheck: true, types: ["node"],
        },
        include: ["*.mts"],
      }),
    );
    const tsc = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");
    try {
      execFileSync(process.execPath, [tsc, "-p", join(scratch, "tsconfig.json")], { encoding: "utf8" });
    } catch (error) {
      assert.fail(`the README's examples do not type-check:\n${error.stdout}`);
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});
