/**
 * A strict reader and a deterministic writer for the CBOR subset of the wire format
 * (`docs/wire-format.md`; mirrors `protocol/wire/cbor_strict.py`).
 *
 * Value model: a `bigint` is a CBOR integer (major types 0/1, at most 64 bits), a `number`
 * is always a CBOR float (the shortest of half/single/double precision that holds it
 * exactly), a `string` is UTF-8 text, a `Uint8Array` a byte string, an `Array` an array
 * and a `Map<string, CborValue>` a map with text keys. The reader returns the same model,
 * so the integer 2 and the float 2.0 never mix.
 *
 * The reader accepts only the deterministic encoding (RFC 8949 §4.2.1) of that subset and
 * refuses, at the first byte that shows it: tags, indefinite lengths, simple values
 * (`false`, `true`, `null`, `undefined`), NaN and infinities, integers and lengths not in
 * their shortest form, floats not in their shortest exact form, map keys that are not text
 * or not in strictly increasing bytewise order of their encodings, nesting deeper than
 * {@link MAX_DEPTH}, and lengths larger than the bytes that remain or (arrays) than the
 * caller's item limit. Every refusal is a {@link MalformedMessage}.
 *
 * Cost: every item consumes at least one input byte and costs O(1) work plus the copy of
 * its own bytes, so reading L bytes takes O(L) time; memory is bounded by the same
 * allowance as the Python reader (each item charged {@link ITEM_COST} plus its string
 * length, at most {@link ALLOCATION_FACTOR} L + {@link ALLOCATION_SLACK}), so both readers
 * accept the same inputs.
 */

import { InvalidParameter, MalformedMessage } from "./errors.js";

/** A value of the wire format's CBOR subset. */
export type CborValue = bigint | number | string | Uint8Array | CborValue[] | CborMap;
/** A CBOR map: text keys only. */
export type CborMap = Map<string, CborValue>;

/** Deepest nesting of arrays and maps the reader accepts. */
export const MAX_DEPTH = 4;
/** Bytes charged per item read, on top of its string length. */
export const ITEM_COST = 40;
/** Reading stops once the charge exceeds ALLOCATION_FACTOR * input length + ALLOCATION_SLACK. */
export const ALLOCATION_FACTOR = 4;
/** Room for the largest honest round spec (2,048 bounds of a vector-mean round). */
export const ALLOCATION_SLACK = 128 * 1024;

const UINT64_MAX = (1n << 64n) - 1n;
const TWO_POW_32 = 4294967296;
const utf8Decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const utf8Encoder = new TextEncoder();
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Options of the reader. */
export interface ReadOptions {
  /** Largest array length accepted (a batch reader passes the round's `max_batch`). */
  maxItems?: number;
}

/** `data` as a `Uint8Array`, or a {@link MalformedMessage} for anything that is not bytes. */
export function asBytes(data: unknown): Uint8Array {
  if (data instanceof Uint8Array) return data;
  throw new MalformedMessage(`expected bytes, got ${describeType(data)}`);
}

function describeType(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "object") return (value as object).constructor?.name ?? "object";
  return typeof value;
}

/** Reads one CBOR data item from a byte array under the rules of this module. */
export class StrictReader {
  /** Offset of the next byte to read. */
  pos = 0;
  /** Items read so far (never more than the bytes consumed). */
  items = 0;
  private readonly data: Uint8Array;
  private readonly view: DataView;
  private readonly end: number;
  private readonly maxItems: number | undefined;
  private charge = 0;
  private readonly allowance: number;

  constructor(data: Uint8Array, options: ReadOptions = {}) {
    const bytes = asBytes(data);
    // a plain view, so that byte strings read are plain Uint8Array copies (Buffer.slice would alias)
    this.data = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.view = new DataView(this.data.buffer, this.data.byteOffset, this.data.byteLength);
    this.end = this.data.length;
    this.maxItems = options.maxItems;
    this.allowance = ALLOCATION_FACTOR * this.end + ALLOCATION_SLACK;
  }

  /** The number of bytes after {@link pos}. */
  get remaining(): number {
    return this.end - this.pos;
  }

  private fail(problem: string): MalformedMessage {
    return new MalformedMessage(`CBOR at byte ${this.pos}: ${problem}`);
  }

  /**
   * The argument of a head whose additional information is `info`, as a number when it is
   * below 2^32 and as a bigint otherwise; refuses indefinite lengths, reserved values,
   * truncation and non-shortest forms.
   */
  private argument(info: number): number | bigint {
    if (info < 24) return info;
    let width: number;
    let smallest: number;
    switch (info) {
      case 24: width = 1; smallest = 24; break;
      case 25: width = 2; smallest = 256; break;
      case 26: width = 4; smallest = 65536; break;
      case 27: width = 8; smallest = TWO_POW_32; break;
      case 31: throw this.fail("indefinite lengths are not allowed");
      default: throw this.fail(`reserved additional information ${info}`);
    }
    const start = this.pos;
    if (start + width > this.end) throw this.fail("truncated");
    let value: number | bigint;
    if (width === 1) value = this.data[start]!;
    else if (width === 2) value = this.view.getUint16(start);
    else if (width === 4) value = this.view.getUint32(start);
    else {
      const high = this.view.getUint32(start);
      const low = this.view.getUint32(start + 4);
      value = high === 0 ? low : (BigInt(high) << 32n) | BigInt(low);
    }
    if (typeof value === "number" && value < smallest) throw this.fail("integer or length not in its shortest form");
    this.pos = start + width;
    return value;
  }

  private length(info: number, what: string): number {
    const declared = this.argument(info);
    const left = this.end - this.pos;
    if (typeof declared === "bigint" || declared > left) {
      throw this.fail(`${what} of ${declared} declared, only ${left} bytes remain`);
    }
    return declared;
  }

  /** The next data item (see the module's value model); `depth` is its nesting depth. */
  read(depth = 0): CborValue {
    if (this.pos >= this.end) throw this.fail("truncated");
    this.items += 1;
    this.charge += ITEM_COST;
    if (this.charge > this.allowance) {
      throw this.fail(`expands past ${ALLOCATION_FACTOR} times its ${this.end} bytes in objects`);
    }
    const initial = this.data[this.pos]!;
    this.pos += 1;
    const major = initial >> 5;
    const info = initial & 0x1f;
    switch (major) {
      case 0: {
        const value = this.argument(info);
        return typeof value === "bigint" ? value : BigInt(value);
      }
      case 1: {
        const value = this.argument(info);
        return -1n - (typeof value === "bigint" ? value : BigInt(value));
      }
      case 2: {
        const length = this.length(info, "byte string");
        this.charge += length;
        const start = this.pos;
        this.pos += length;
        return this.data.slice(start, this.pos);
      }
      case 3: {
        const length = this.length(info, "text string");
        this.charge += length;
        const start = this.pos;
        this.pos += length;
        try {
          return utf8Decoder.decode(this.data.subarray(start, this.pos));
        } catch {
          throw this.fail("text string is not valid UTF-8");
        }
      }
      case 4: {
        const count = this.container(info, depth, "array");
        const out: CborValue[] = [];
        for (let i = 0; i < count; i++) out.push(this.read(depth + 1));
        return out;
      }
      case 5:
        return this.map(this.container(info, depth, "map"), depth);
      case 6:
        throw this.fail("tags are not allowed");
      default:
        return this.float(info);
    }
  }

  private container(info: number, depth: number, what: "array" | "map"): number {
    if (depth >= MAX_DEPTH) throw this.fail(`nesting deeper than ${MAX_DEPTH}`);
    const count = this.length(info, what);
    if (what === "array" && this.maxItems !== undefined && count > this.maxItems) {
      throw this.fail(`${what} of ${count} items, over the limit of ${this.maxItems}`);
    }
    return count;
  }

  private map(count: number, depth: number): CborMap {
    const out: CborMap = new Map();
    let previousStart = -1;
    let previousEnd = -1;
    for (let i = 0; i < count; i++) {
      const start = this.pos;
      if (start < this.end && this.data[start]! >> 5 !== 3) throw this.fail("map keys must be text strings");
      const key = this.read(depth + 1) as string;
      const end = this.pos;
      if (previousStart >= 0 && compareRanges(this.data, previousStart, previousEnd, start, end) >= 0) {
        throw this.fail("map keys not in strictly increasing deterministic order (or duplicated)");
      }
      previousStart = start;
      previousEnd = end;
      out.set(key, this.read(depth + 1));
    }
    return out;
  }

  private float(info: number): number {
    let width: number;
    if (info === 25) width = 2;
    else if (info === 26) width = 4;
    else if (info === 27) width = 8;
    else throw this.fail("simple values (true, false, null, undefined) are not allowed");
    const start = this.pos;
    if (start + width > this.end) throw this.fail("truncated");
    let value: number;
    if (width === 2) value = halfToNumber(this.view.getUint16(start));
    else if (width === 4) value = this.view.getFloat32(start);
    else value = this.view.getFloat64(start);
    if (!Number.isFinite(value)) throw this.fail("NaN and infinities are not allowed");
    if (width > 2 && halfBitsOf(value) !== undefined) throw this.fail("float not in its shortest exact form");
    if (width === 8 && Math.fround(value) === value) throw this.fail("float not in its shortest exact form");
    this.pos = start + width;
    return value;
  }
}

/** Bytewise comparison of data[a0, a1) with data[b0, b1) (a proper prefix sorts first). */
function compareRanges(data: Uint8Array, a0: number, a1: number, b0: number, b1: number): number {
  const n = Math.min(a1 - a0, b1 - b0);
  for (let i = 0; i < n; i++) {
    const d = data[a0 + i]! - data[b0 + i]!;
    if (d !== 0) return d;
  }
  return (a1 - a0) - (b1 - b0);
}

/** Read exactly one strict CBOR item spanning all of `data`. */
export function decodeCbor(data: Uint8Array, options: ReadOptions = {}): CborValue {
  const reader = new StrictReader(asBytes(data), options);
  const value = reader.read();
  if (reader.remaining !== 0) throw new MalformedMessage(`${reader.remaining} trailing bytes after the CBOR item`);
  return value;
}

/** Read one strict CBOR item at the start of `data`; returns it and the offset just past it. */
export function readCborItem(data: Uint8Array, options: ReadOptions = {}): { value: CborValue; end: number } {
  const reader = new StrictReader(asBytes(data), options);
  const value = reader.read();
  return { value, end: reader.pos };
}

// ---------------------------------------------------------------------------------------------
// Half precision, written out: binary16 has 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.

/** The value of the binary16 bit pattern `bits` (NaN and infinities included). */
export function halfToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24; // zero and subnormals: fraction * 2^-24
  if (exponent === 31) return fraction === 0 ? sign * Infinity : NaN;
  return sign * (1024 + fraction) * 2 ** (exponent - 25); // (1.fraction) * 2^(exponent - 15)
}

const scratch = new DataView(new ArrayBuffer(8));

/** The binary16 bit pattern holding `value` exactly, or `undefined` if no half-precision float equals it. */
export function halfBitsOf(value: number): number | undefined {
  if (!Number.isFinite(value)) return undefined;
  if (value === 0) return Object.is(value, -0) ? 0x8000 : 0;
  const sign = value < 0 ? 0x8000 : 0;
  const magnitude = Math.abs(value);
  if (magnitude > 65504 || magnitude < 2 ** -24) return undefined;
  scratch.setFloat64(0, magnitude);
  const exponent = ((scratch.getUint32(0) >>> 20) & 0x7ff) - 1023; // magnitude >= 2^-24 is a normal double
  if (exponent >= -14) {
    const significand = magnitude * 2 ** (10 - exponent); // exact: a power-of-two scaling, in [1024, 2048)
    if (!Number.isInteger(significand)) return undefined;
    return sign | ((exponent + 15) << 10) | (significand - 1024);
  }
  const fraction = magnitude * 2 ** 24; // subnormal half: fraction * 2^-24, fraction in [1, 1024)
  if (!Number.isInteger(fraction)) return undefined;
  return sign | fraction;
}

// ---------------------------------------------------------------------------------------------
// Writer.

/** Growable output buffer of the writer. */
class ByteSink {
  bytes = new Uint8Array(256);
  length = 0;

  reserve(n: number): void {
    if (this.length + n <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.bytes.subarray(0, this.length));
    this.bytes = next;
  }

  push(byte: number): void {
    this.reserve(1);
    this.bytes[this.length++] = byte;
  }

  append(chunk: Uint8Array): void {
    this.reserve(chunk.length);
    this.bytes.set(chunk, this.length);
    this.length += chunk.length;
  }

  result(): Uint8Array {
    return this.bytes.slice(0, this.length);
  }
}

function writeHead(sink: ByteSink, major: number, argument: number | bigint): void {
  const top = major << 5;
  if (typeof argument === "number") {
    if (argument < 24) return sink.push(top | argument);
    if (argument < 0x100) {
      sink.push(top | 24);
      return sink.push(argument);
    }
    if (argument < 0x10000) {
      sink.push(top | 25);
      sink.push(argument >>> 8);
      return sink.push(argument & 0xff);
    }
    if (argument < TWO_POW_32) {
      sink.push(top | 26);
      for (let shift = 24; shift >= 0; shift -= 8) sink.push((argument >>> shift) & 0xff);
      return;
    }
    argument = BigInt(argument);
  }
  if (argument < BigInt(TWO_POW_32)) return writeHead(sink, major, Number(argument));
  sink.push(top | 27);
  for (let shift = 56n; shift >= 0n; shift -= 8n) sink.push(Number((argument >> shift) & 0xffn));
}

function writeFloat(sink: ByteSink, value: number): void {
  if (!Number.isFinite(value)) throw new InvalidParameter("value", "NaN and infinities have no encoding in this format");
  const half = halfBitsOf(value);
  if (half !== undefined) {
    sink.push(0xf9);
    sink.push(half >>> 8);
    sink.push(half & 0xff);
    return;
  }
  if (Math.fround(value) === value) {
    scratch.setFloat32(0, value);
    sink.push(0xfa);
    for (let i = 0; i < 4; i++) sink.push(scratch.getUint8(i));
    return;
  }
  scratch.setFloat64(0, value);
  sink.push(0xfb);
  for (let i = 0; i < 8; i++) sink.push(scratch.getUint8(i));
}

/** Bytewise order of key encodings: shorter UTF-8 first, then bytewise (the same order for text heads). */
function compareKeyBytes(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return a.length - b.length;
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) return a[i]! - b[i]!;
  }
  return 0;
}

function writeValue(sink: ByteSink, value: CborValue, depth: number): void {
  if (typeof value === "bigint") {
    if (value > UINT64_MAX || value < -1n - UINT64_MAX) {
      throw new InvalidParameter("value", "integers beyond 64 bits have no encoding in this format");
    }
    return value >= 0n ? writeHead(sink, 0, value) : writeHead(sink, 1, -1n - value);
  }
  if (typeof value === "number") return writeFloat(sink, value);
  if (typeof value === "string") {
    if (LONE_SURROGATE.test(value)) throw new InvalidParameter("value", "a string with a lone surrogate has no UTF-8 encoding");
    const encoded = utf8Encoder.encode(value);
    writeHead(sink, 3, encoded.length);
    return sink.append(encoded);
  }
  if (value instanceof Uint8Array) {
    writeHead(sink, 2, value.length);
    return sink.append(value);
  }
  if (depth >= MAX_DEPTH) throw new InvalidParameter("value", `nesting deeper than ${MAX_DEPTH}`);
  if (Array.isArray(value)) {
    writeHead(sink, 4, value.length);
    for (const item of value) writeValue(sink, item, depth + 1);
    return;
  }
  if (value instanceof Map) {
    const entries: [Uint8Array, CborValue][] = [];
    for (const [key, item] of value) {
      if (typeof key !== "string") throw new InvalidParameter("value", "map keys must be text strings");
      entries.push([utf8Encoder.encode(key), item]);
    }
    entries.sort((x, y) => compareKeyBytes(x[0], y[0]));
    for (let i = 1; i < entries.length; i++) {
      if (compareKeyBytes(entries[i - 1]![0], entries[i]![0]) === 0) {
        throw new InvalidParameter("value", "duplicate map key (two strings with one UTF-8 encoding)");
      }
    }
    writeHead(sink, 5, entries.length);
    for (const [key, item] of entries) {
      writeHead(sink, 3, key.length);
      sink.append(key);
      writeValue(sink, item, depth + 1);
    }
    return;
  }
  throw new InvalidParameter("value", `${describeType(value)} has no encoding in this format`);
}

/**
 * The deterministic encoding of `value`: shortest heads, floats in their shortest exact
 * form, map keys sorted by their encodings. Throws {@link InvalidParameter} for a value
 * outside the model (a non-finite number, an integer beyond 64 bits, nesting deeper than
 * {@link MAX_DEPTH}, anything that is not a {@link CborValue}).
 */
export function encodeCbor(value: CborValue): Uint8Array {
  const sink = new ByteSink();
  writeValue(sink, value, 0);
  return sink.result();
}
