// Draws from the package's samplers for the Python tests (tests/js/test_js_samplers.py).
//
// Request (JSON on stdin):
//   { "sampler": name, "params": {...}, "count": n, "seed": null | "decimal" }
// seed null draws from SystemSource (the platform CSPRNG), a decimal string from SeededSource.
// Bigint parameters travel as decimal strings. Answer on stdout: the draws as little-endian
// int64 (integer samplers, booleans as 0/1) or float64 (rotation samplers), raw bytes.
//
// Samplers: integer {high}, bernoulli {p}, bernoulliRational {num, den}, discreteLaplace {num, den},
// discreteGaussian {num, den}, polyaShares {alpha, users}, skellamShares {mu, users},
// rotationSigns {dim, seed}, rotationApply {dim, seed, x: number[]} (count ignored for rotations).

import { SeededSource, SystemSource } from "../../dist/random/source.js";
import { polyaShares, skellamShares } from "../../dist/random/distributedNoise.js";
import { RandomRotation, rotationSigns } from "../../dist/random/numpyRotationSigns.js";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const { sampler, params = {}, count = 0, seed = null } = request;
const source = seed === null ? new SystemSource() : new SeededSource(BigInt(seed));

function repeat(draw) {
  const out = new BigInt64Array(count);
  for (let i = 0; i < count; i++) out[i] = BigInt(draw());
  return out;
}

let result;
switch (sampler) {
  case "integer":
    result = repeat(() => source.integer(BigInt(params.high)));
    break;
  case "bernoulli":
    result = repeat(() => (source.bernoulli(params.p) ? 1n : 0n));
    break;
  case "bernoulliRational":
    result = repeat(() => (source.bernoulliRational(BigInt(params.num), BigInt(params.den)) ? 1n : 0n));
    break;
  case "discreteLaplace":
    result = repeat(() => source.discreteLaplace(BigInt(params.num), BigInt(params.den)));
    break;
  case "discreteGaussian":
    result = repeat(() => source.discreteGaussian(BigInt(params.num), BigInt(params.den)));
    break;
  case "polyaShares":
    result = BigInt64Array.from(polyaShares(params.alpha, params.users, count, source));
    break;
  case "skellamShares":
    result = BigInt64Array.from(skellamShares(params.mu, params.users, count, source));
    break;
  case "rotationSigns":
    result = rotationSigns(params.dim, BigInt(params.seed));
    break;
  case "rotationApply":
    result = new RandomRotation(params.dim, BigInt(params.seed)).apply(params.x);
    break;
  default:
    process.stderr.write(`unknown sampler ${sampler}\n`);
    process.exit(2);
}
// Written through a DataView so the bytes are little-endian whatever the platform's order.
const bytes = new Uint8Array(result.length * 8);
const view = new DataView(bytes.buffer);
for (let i = 0; i < result.length; i++) {
  if (result instanceof BigInt64Array) view.setBigInt64(8 * i, result[i], true);
  else view.setFloat64(8 * i, result[i], true);
}
process.stdout.write(bytes);
