#!/usr/bin/env node
/**
 * The package's randomizers behind the external client protocol of `shuffledp audit --client`
 * (the Python module `shuffledp/audit/external.py` and docs/cli.md describe it), so that the
 * auditor can check this implementation's privacy claims on its own outputs:
 *
 *     shuffledp audit --client "node js/dist/cli/randomize.js"
 *
 * Requests, one JSON line each on stdin: `{"spec": hex, "input": number | number[], "count": n}`,
 * `spec` the deterministic CBOR of a round spec (decoded and checked with `decodeRoundSpec`),
 * `input` the local data, `count` in 1..65536 runs (at most 2^24 values in all). Each request gets one binary frame on stdout,
 * in order: `SDPR`, then `count`, `messages`, `values` as little-endian uint32, then
 * count x messages x values little-endian int64 (run by run, message by message), the values of
 * `randomizeRound(spec, input, source)`; or, when the request is refused, `SDPE`, a little-endian
 * uint32 length (at most 1024) and that many bytes of UTF-8 text (`reason: message`).
 *
 * Randomness: `SystemSource` (the platform CSPRNG), the device's source. `--seed N` uses the
 * deterministic `SeededSource` instead (the same sampling code over a seeded word stream), for
 * reproducible tests only.
 */

import { randomizeRound } from "../mechanisms/index.js";
import { SeededSource, SystemSource, type RandomSource } from "../random/source.js";
import { ShuffleDPError, TooLarge } from "../wire/errors.js";
import { decodeRoundSpec, messagesPerUserOf, valuesPerReport, type RoundSpec } from "../wire/messages.js";

/** Most runs one request may ask for (the auditor's limit too). */
const MAX_REQUEST_OUTPUTS = 65536;
/** Most values one answer may hold (count x messages x values): 128 MiB of int64. */
const MAX_ANSWER_VALUES = 1 << 24;
/** Longest refusal text sent, in bytes. */
const MAX_ERROR_TEXT = 1024;
/** Longest request line accepted, in bytes (a 1024-coordinate spec and input fit many times over). */
const MAX_REQUEST_LINE = 4 * 1024 * 1024;

const ANSWER_MAGIC = [0x53, 0x44, 0x50, 0x52]; // "SDPR"
const ERROR_MAGIC = [0x53, 0x44, 0x50, 0x45]; // "SDPE"

/** A request that does not follow the protocol; answered with a refusal. */
class BadRequest extends ShuffleDPError {
  constructor(message: string) {
    super(message, "malformed");
  }
}

/** A parsed request. */
interface Request {
  spec: RoundSpec;
  input: number | number[];
  count: number;
}

function hexToBytes(hex: string): Uint8Array {
  if (hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) throw new BadRequest("spec: must be an even number of hex digits");
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** The request of one line, every field checked (the spec by `decodeRoundSpec`). */
function parseRequest(line: string): Request {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    throw new BadRequest("the request line is not JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new BadRequest("the request must be a JSON object");
  const { spec, input, count } = value as { spec?: unknown; input?: unknown; count?: unknown };
  if (typeof spec !== "string") throw new BadRequest("spec: must be a hex string");
  if (typeof count !== "number" || !Number.isSafeInteger(count) || count < 1 || count > MAX_REQUEST_OUTPUTS) {
    throw new BadRequest(`count: must be an integer in [1, ${MAX_REQUEST_OUTPUTS}]`);
  }
  let local: number | number[];
  if (typeof input === "number") {
    local = input;
  } else if (Array.isArray(input) && input.every((x) => typeof x === "number")) {
    local = input as number[];
  } else {
    throw new BadRequest("input: must be a number or an array of numbers");
  }
  return { spec: decodeRoundSpec(hexToBytes(spec)), input: local, count };
}

/** The answer frame of `count` runs: header and int64 values, every run checked to have the round's shape. */
function answerFrame(request: Request, source: RandomSource): Uint8Array {
  const messages = messagesPerUserOf(request.spec.params);
  const values = valuesPerReport(request.spec.params.mechanism);
  if (request.count * messages * values > MAX_ANSWER_VALUES) {
    throw new TooLarge(`${request.count} runs of ${messages} x ${values} values exceed ${MAX_ANSWER_VALUES} values`);
  }
  const frame = new Uint8Array(16 + request.count * messages * values * 8);
  const view = new DataView(frame.buffer);
  frame.set(ANSWER_MAGIC, 0);
  view.setUint32(4, request.count, true);
  view.setUint32(8, messages, true);
  view.setUint32(12, values, true);
  let offset = 16;
  for (let run = 0; run < request.count; run++) {
    const report = randomizeRound(request.spec, request.input, source);
    if (report.length !== messages) throw new Error(`randomizeRound gave ${report.length} messages, expected ${messages}`);
    for (const message of report) {
      if (message.length !== values) throw new Error(`randomizeRound gave ${message.length} values, expected ${values}`);
      for (const v of message) {
        view.setBigInt64(offset, v, true);
        offset += 8;
      }
    }
  }
  return frame;
}

/** The refusal frame for `error`: `reason: message`, cut to {@link MAX_ERROR_TEXT} bytes of UTF-8. */
function refusalFrame(error: unknown): Uint8Array {
  const reason = error instanceof ShuffleDPError ? error.reason : "internal-error";
  const message = error instanceof Error ? error.message : String(error);
  let text = new TextEncoder().encode(`${reason}: ${message}`.replace(/\s+/g, " "));
  if (text.length > MAX_ERROR_TEXT) {
    // cut on a character boundary: drop continuation bytes (10xxxxxx) at the cut
    let end = MAX_ERROR_TEXT;
    while (end > 0 && (text[end] & 0xc0) === 0x80) end--;
    text = text.subarray(0, end);
  }
  const frame = new Uint8Array(8 + text.length);
  frame.set(ERROR_MAGIC, 0);
  new DataView(frame.buffer).setUint32(4, text.length, true);
  frame.set(text, 8);
  return frame;
}

function sourceFromArguments(argv: string[]): RandomSource {
  if (argv.length === 0) return new SystemSource();
  if (argv.length === 2 && argv[0] === "--seed" && /^[0-9]{1,20}$/.test(argv[1])) return new SeededSource(BigInt(argv[1]));
  process.stderr.write("usage: randomize.js [--seed N]   (requests on stdin, answers on stdout; see shuffledp audit --client)\n");
  process.exit(2);
}

async function write(frame: Uint8Array): Promise<void> {
  if (!process.stdout.write(frame)) await new Promise<void>((resolve) => process.stdout.once("drain", () => resolve()));
}

async function main(): Promise<void> {
  const source = sourceFromArguments(process.argv.slice(2));
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  for await (const chunk of process.stdin as AsyncIterable<Buffer>) {
    let start = 0;
    for (let newline = chunk.indexOf(10); newline !== -1; newline = chunk.indexOf(10, start)) {
      pending.push(chunk.subarray(start, newline));
      const line = Buffer.concat(pending).toString("utf8");
      pending = [];
      pendingBytes = 0;
      start = newline + 1;
      if (line.trim() === "") continue;
      let frame: Uint8Array;
      try {
        frame = answerFrame(parseRequest(line), source);
      } catch (error) {
        frame = refusalFrame(error);
      }
      await write(frame);
    }
    pendingBytes += chunk.length - start;
    if (pendingBytes > MAX_REQUEST_LINE) {
      await write(refusalFrame(new BadRequest(`a request line longer than ${MAX_REQUEST_LINE} bytes`)));
      process.exit(1);
    }
    pending.push(chunk.subarray(start));
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`randomize.js: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
