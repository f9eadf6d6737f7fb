// Cost per report of the device Client (randomize + seal + wrap, through Client.answer with a
// MemoryLedger), for benchmarks/bench_js_client.py. One function, answerMany, runs the same way
// in Node (this file, run directly: request JSON on stdin, result JSON on stdout) and in a
// browser page (bench_client_page.mjs bundles it; bench_client_browser.mjs drives Chromium).
//
// Request: { analyzerSigningKey: hex, credential: hex, reports: n, repeats: r,
//            cases: [{ name, signedSpec: hex, localData: number | number[] }] }
// Result:  { runtime, cases: { name: { reports, seconds: [per repeat], best } } }
// Each repeat answers `reports` times with fresh clients and ledgers made before the clock
// starts (a ledger answers a round once), sequentially, awaiting each answer.

function fromHex(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** Time `request.reports` answers per case and repeat with the package's Client and MemoryLedger (`lib`). */
export async function answerMany(lib, request) {
  const { Client, MemoryLedger } = lib;
  const analyzerSigningKey = fromHex(request.analyzerSigningKey);
  const credential = fromHex(request.credential);
  const cases = {};
  for (const c of request.cases) {
    const signed = fromHex(c.signedSpec);
    const seconds = [];
    let envelopes = 0;
    for (let repeat = 0; repeat < request.repeats; repeat++) {
      const clients = [];
      for (let i = 0; i < request.reports; i++) {
        const ledger = new MemoryLedger({ epsilonBudget: 1e9, deltaBudget: 0.5 });
        clients.push(new Client({ localData: c.localData, analyzerSigningKey, credential, ledger }));
      }
      const start = performance.now();
      for (const client of clients) {
        const answer = await client.answer(signed);
        envelopes += answer.envelopes.length;
      }
      seconds.push((performance.now() - start) / 1000);
    }
    cases[c.name] = { reports: request.reports, envelopes, seconds, best: Math.min(...seconds) };
  }
  const runtime = typeof navigator !== "undefined" && navigator.userAgent ? navigator.userAgent : `node ${process.version}`;
  return { runtime, cases };
}

const runDirectly = typeof process !== "undefined" && process.argv?.[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href;
if (runDirectly) {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const { Client } = await import("../../dist/client/client.js");
  const { MemoryLedger } = await import("../../dist/ledger/ledger.js");
  process.stdout.write(JSON.stringify(await answerMany({ Client, MemoryLedger }, request)) + "\n");
}
