// Draws many reports of one device randomizer, for the Python tests of the JavaScript client
// (tests/js/test_js_scalar_randomizers.py).
//
// Request (JSON on stdin):
//   {"op": "randomize", "params": {...} | "spec_hex": "...", "epsilon0": e, "delta0": d,
//    "inputs": [x, ...], "count": n, "source": "system" | "seeded", "seed": s}
//       -> for each input in turn, `count` messages of one user: every value as an int64
//          little-endian, binary, on stdout (messages x values, flattened).
//   {"op": "krr", "k": k, "epsilon": e, "inputs": [...], "count": n, "source": ...}
//   {"op": "block-hr", "k": k, "epsilon": e, "blocks": B | null, "inputs": [...], "count": n, "source": ...}
//       -> the same binary layout, one value per report.
//   {"op": "ranges", "cases": [[G, noise, epsilon, delta], ...]}
//       -> JSON: [[low, high] as decimal strings, ...] (projected-mean report ranges).
//   {"op": "sigma2", "cases": [[epsilon, delta, G], ...]}
//       -> JSON: the calibrated discrete Gaussian sigma2 of each case.
//   {"op": "budget", "cases": [[params, epsilon0, delta0], ...]}
//       -> JSON: for each case null (accepted) or the refusal's [reason, parameter].
// Params use the package's camelCase fields, e.g. {"mechanism": "projected-mean", "lower": 0,
// "upper": 1, "noise": "laplace", "gridLevels": 16}.

import { readFileSync } from "node:fs";
import { SeededSource, SystemSource } from "../../dist/random/source.js";
import { randomizeRound } from "../../dist/mechanisms/index.js";
import { checkMechanismBudget } from "../../dist/mechanisms/budget.js";
import { gridReportRange } from "../../dist/mechanisms/projectedMean.js";
import { calibrateDiscreteGaussian } from "../../dist/mechanisms/gaussianCalibration.js";
import { randomizeKrr } from "../../dist/mechanisms/krr.js";
import { hadamardResponseParams, randomizeHadamardResponse } from "../../dist/mechanisms/blockHadamard.js";

const request = JSON.parse(readFileSync(0, "utf8"));

function sourceOf(req) {
  if (req.source === "seeded") return new SeededSource(BigInt(req.seed ?? 0));
  return new SystemSource();
}

function writeValues(values) {
  const out = new BigInt64Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = BigInt(values[i]);
  process.stdout.write(new Uint8Array(out.buffer));
}

async function specOf(req) {
  if (req.spec_hex !== undefined) {
    const { decodeRoundSpec } = await import("../../dist/wire/messages.js");
    return decodeRoundSpec(Uint8Array.from(Buffer.from(req.spec_hex, "hex")));
  }
  return { params: req.params, epsilon0: req.epsilon0, delta0: req.delta0 };
}

if (request.op === "randomize") {
  const spec = await specOf(request);
  const source = sourceOf(request);
  const values = [];
  for (const input of request.inputs) {
    for (let i = 0; i < request.count; i++) {
      for (const message of randomizeRound(spec, input, source)) values.push(...message);
    }
  }
  writeValues(values);
} else if (request.op === "krr") {
  const source = sourceOf(request);
  const values = [];
  for (const input of request.inputs) {
    for (let i = 0; i < request.count; i++) values.push(randomizeKrr(input, request.k, request.epsilon, source));
  }
  writeValues(values);
} else if (request.op === "block-hr") {
  const source = sourceOf(request);
  const params = hadamardResponseParams(request.k, request.epsilon, request.blocks ?? undefined);
  const values = [];
  for (const input of request.inputs) {
    for (let i = 0; i < request.count; i++) values.push(randomizeHadamardResponse(input, params, source));
  }
  writeValues(values);
} else if (request.op === "ranges") {
  const out = request.cases.map(([g, noise, eps, delta]) => gridReportRange(g, noise, eps, delta).map(String));
  process.stdout.write(JSON.stringify(out));
} else if (request.op === "sigma2") {
  process.stdout.write(JSON.stringify(request.cases.map(([eps, delta, g]) => calibrateDiscreteGaussian(eps, delta, g))));
} else if (request.op === "budget") {
  const out = request.cases.map(([params, eps, delta]) => {
    try {
      checkMechanismBudget(params, eps, delta);
      return null;
    } catch (error) {
      if (error.reason === undefined) throw error;
      return [error.reason, error.parameter ?? null];
    }
  });
  process.stdout.write(JSON.stringify(out));
} else {
  throw new Error(`unknown op ${request.op}`);
}
