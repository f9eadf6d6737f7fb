// Decodes many wire messages with the package's codec (dist/wire/messages.js) and re-encodes
// the accepted ones, for the differential test against Python's codec
// (tests/js/test_codec_differential.py).
//
// Input (stdin): either one JSON array or JSON lines; each input is a hex string, or an object
//   {"hex": "...", "expected": "report" | ... (optional), "maxItems": n (optional)}
// where `expected` pins the message type and `maxItems` bounds every array (decodeMessage's
// arguments).
// Output (stdout), one answer per input, in order, in the same form as the input (one JSON
// array, or JSON lines):
//   {"ok": true, "type": "...", "hex": "<re-encoded>"}       accepted and re-encoded
//   {"ok": true, "type": "...", "encodeReason": "...", "message": "..."}   accepted, re-encoding refused
//   {"ok": false, "reason": "...", "message": "..."}          refused
// `reason` is the refusal's `reason` attribute; an error that is not a ShuffleDPError (which the
// decoder must never throw) is reported as the reason "untyped <ConstructorName>".

import { readFileSync } from "node:fs";
import { ShuffleDPError } from "../../dist/wire/errors.js";
import { decodeMessage, encodeMessage } from "../../dist/wire/messages.js";

function fromHex(text) {
  if (typeof text !== "string" || text.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(text)) {
    throw new Error(`not a hex string: ${String(text).slice(0, 40)}`);
  }
  return Uint8Array.from(text.match(/../g) ?? [], (pair) => parseInt(pair, 16));
}

const toHex = (bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");

function refusal(error) {
  if (error instanceof ShuffleDPError) return { reason: error.reason, message: error.message };
  const name = error?.constructor?.name ?? typeof error;
  return { reason: `untyped ${name}`, message: String(error?.message ?? error) };
}

/** The answer for one input (see the header). */
function answer(input) {
  const request = typeof input === "string" ? { hex: input } : input;
  const data = fromHex(request.hex);
  const options = request.maxItems === undefined || request.maxItems === null ? {} : { maxItems: request.maxItems };
  let message;
  try {
    message = decodeMessage(data, request.expected ?? undefined, options);
  } catch (error) {
    return { ok: false, ...refusal(error) };
  }
  try {
    return { ok: true, type: message.type, hex: toHex(encodeMessage(message)) };
  } catch (error) {
    const { reason, message: text } = refusal(error);
    return { ok: true, type: message.type, encodeReason: reason, message: text };
  }
}

const text = readFileSync(0, "utf8");
if (text.trimStart().startsWith("[")) {
  process.stdout.write(JSON.stringify(JSON.parse(text).map(answer)));
} else {
  const lines = text.split("\n").filter((line) => line.trim() !== "");
  process.stdout.write(lines.map((line) => JSON.stringify(answer(JSON.parse(line))) + "\n").join(""));
}
