// Answers one round with the JavaScript device Client, for the Python interoperability tests
// (tests/js/test_interop_onion.py). Reads one JSON request on stdin:
//   { signed_spec: hex, credential: hex, local_data: number | number[],
//     analyzer_signing_key: hex, shuffler_signing_key?: hex, shuffler_key?: hex,
//     accept_central_only?: bool, min_batch_floor?: int, epsilon_budget?: number,
//     delta_budget?: number, now?: number (Unix seconds), outcomes?: [hex] }
// answers the round, then settles each signed round-outcome of `outcomes` in order, and prints
// { envelopes: [hex], nonces: [hex], instance, digest: hex, spent_epsilon, spent_delta,
//   settled: [{ outcome } | { error: reason }], lost_rounds: [round id as a string] },
// or { error: { name, reason, message } } for a typed refusal (exit status 0 either way; any
// other exception is a failure, exit status 1).
// Not a test file: run under the test runner (which sets NODE_TEST_CONTEXT) it does nothing.
import { Client } from "../../dist/client/client.js";
import { MemoryLedger } from "../../dist/ledger/ledger.js";
import { ShuffleDPError } from "../../dist/wire/errors.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const bytes = (text) => Uint8Array.from(Buffer.from(text, "hex"));

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function main() {
  const request = JSON.parse(await readStdin());
  const ledger = new MemoryLedger({ epsilonBudget: request.epsilon_budget ?? 100, deltaBudget: request.delta_budget ?? 0.5 });
  try {
    const client = new Client({
      localData: request.local_data,
      analyzerSigningKey: bytes(request.analyzer_signing_key),
      credential: bytes(request.credential),
      ledger,
      shufflerSigningKey: request.shuffler_signing_key ? bytes(request.shuffler_signing_key) : undefined,
      shufflerKey: request.shuffler_key ? bytes(request.shuffler_key) : undefined,
      acceptCentralOnly: request.accept_central_only ?? false,
      minBatchFloor: request.min_batch_floor ?? 1,
      ...(request.now === undefined ? {} : { clock: () => request.now }),
    });
    const answer = await client.answer(bytes(request.signed_spec));
    const settled = [];
    for (const outcome of request.outcomes ?? []) {
      try {
        settled.push({ outcome: (await client.settleOutcome(bytes(outcome))).outcome ?? null });
      } catch (error) {
        if (!(error instanceof ShuffleDPError)) throw error;
        settled.push({ error: error.reason });
      }
    }
    const state = await ledger.snapshot();
    const lost = await ledger.lostRounds();
    return {
      envelopes: answer.envelopes.map(hex),
      nonces: answer.nonces.map(hex),
      instance: answer.instance,
      digest: hex(answer.digest),
      spent_epsilon: state.spentEpsilon,
      spent_delta: state.spentDelta,
      settled,
      lost_rounds: lost.map((round) => round.roundId.toString()),
    };
  } catch (error) {
    if (!(error instanceof ShuffleDPError)) throw error;
    const state = await ledger.snapshot();
    return {
      error: { name: error.name, reason: error.reason, message: error.message },
      spent_epsilon: state.spentEpsilon,
      spent_delta: state.spentDelta,
    };
  }
}

if (process.env.NODE_TEST_CONTEXT === undefined) {
  process.stdout.write(JSON.stringify(await main()));
}
