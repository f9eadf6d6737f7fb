// Runs one vector or summation randomizer of the compiled package many times and writes every
// value as a little-endian int64 to stdout: `count` users x messages x values, in order.
//
// Request (JSON on stdin):
//   { "mechanism": wire name, "params": { snake_case fields as Python's params class; integers
//     past 2^53 (rotation_seed, modulus) as decimal strings } }  or  { "spec": hex of round-spec bytes },
//   "epsilon0", "delta0" (ignored with "spec"), "data": the local vector (or number), "count",
//   "seed" (a SeededSource; omitted: SystemSource, the device's source), "check" (run the
//   mechanism's checkBudget first), "only_check" (run checkBudget alone; write "ok").
// Or { "checks": [{ "mechanism", "params", "epsilon0", "delta0" }, ...] }: run checkBudget on each
// and write a JSON array, null for an acceptance or the refused parameter's name.
// A refusal is written to stderr as "reason parameter: message" and the script exits with status 3.
import * as coordinateTree from "../../dist/mechanisms/coordinateTree.js";
import * as localVector from "../../dist/mechanisms/localVector.js";
import * as modularSum from "../../dist/mechanisms/modularSum.js";
import * as shiftedNorm from "../../dist/mechanisms/shiftedNorm.js";
import * as vectorMean from "../../dist/mechanisms/vectorMean.js";
import * as vectorRange from "../../dist/mechanisms/vectorRange.js";
import * as vectorSum from "../../dist/mechanisms/vectorSum.js";
import { SeededSource, SystemSource } from "../../dist/random/source.js";

const MODULES = {
  "vector-range": vectorRange,
  "vector-mean": vectorMean,
  "coordinate-tree": coordinateTree,
  "shifted-norm": shiftedNorm,
  "modular-sum": modularSum,
  "vector-sum": vectorSum,
  "shifted-vector-sum": vectorSum,
  "local-vector": localVector,
};
const BIG_FIELDS = new Set(["rotation_seed", "modulus"]);

function camel(name) {
  return name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
}

function paramsFromJson(mechanism, raw) {
  const out = { mechanism };
  for (const [key, value] of Object.entries(raw)) out[camel(key)] = BIG_FIELDS.has(key) ? BigInt(value) : value;
  return out;
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const request = await readStdin();
if (request.checks !== undefined) {
  const answers = request.checks.map((check) => {
    const params = paramsFromJson(check.mechanism, check.params);
    try {
      MODULES[check.mechanism].checkBudget(params, check.epsilon0, check.delta0);
      return null;
    } catch (error) {
      if (error?.reason !== "invalid-parameter") throw error;
      return error.parameter;
    }
  });
  process.stdout.write(JSON.stringify(answers));
  process.exit(0);
}
let params;
let epsilon0 = request.epsilon0;
let delta0 = request.delta0;
try {
  if (request.spec !== undefined) {
    const { decodeRoundSpec } = await import("../../dist/wire/messages.js");
    const spec = decodeRoundSpec(Uint8Array.from(Buffer.from(request.spec, "hex")));
    params = spec.params;
    epsilon0 = spec.epsilon0;
    delta0 = spec.delta0;
  } else {
    params = paramsFromJson(request.mechanism, request.params);
  }
  const module = MODULES[params.mechanism];
  if (module === undefined) throw new Error(`not a vector or summation mechanism: ${params.mechanism}`);
  if (request.check || request.only_check) module.checkBudget(params, epsilon0, delta0);
  if (request.only_check) {
    process.stdout.write("ok");
    process.exit(0);
  }
  const source = request.seed === undefined ? new SystemSource() : new SeededSource(BigInt(request.seed));
  const first = module.randomize(params, epsilon0, delta0, request.data, source);
  const width = first.length * first[0].length;
  const out = new BigInt64Array(request.count * width);
  let at = 0;
  for (let i = 0; i < request.count; i++) {
    const reports = i === 0 ? first : module.randomize(params, epsilon0, delta0, request.data, source);
    for (const report of reports) for (const value of report) out[at++] = value;
  }
  process.stdout.write(Buffer.from(out.buffer, out.byteOffset, out.byteLength));
} catch (error) {
  process.stderr.write(`${error?.reason ?? "error"} ${error?.parameter ?? "-"}: ${error?.message ?? String(error)}\n`);
  process.exit(3);
}
