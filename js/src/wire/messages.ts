/**
 * The nine message types of wire format 3 (`docs/wire-format.md`), with their encoder and a
 * decoder that checks every shape rule and range, mirroring `protocol/wire/messages.py`
 * (the rules) and `protocol/wire/codec.py` (the envelope of `v`, `t`, size limits and keys).
 *
 * Decoding is total: any input gives a message or a {@link MalformedMessage} (or one of its
 * subclasses {@link MessageTooLarge}, {@link UnsupportedVersion}). Unknown keys, missing
 * keys, wrong types (a float is not an integer) and out-of-range values are refused, in the
 * same order as the Python decoder checks them, with messages naming the field.
 *
 * Encoding validates the message as the Python constructors do (throwing
 * {@link InvalidParameter}) and writes the one deterministic encoding: a field typed float is
 * always written as a float, so the encoding of a decoded round spec is its canonical form.
 * A device verifies a signed spec over the bytes it received, never over a re-encoding
 * (`decodeRoundSpec` works on those bytes; the caller keeps them).
 */

import { checkMechanismBudget } from "../mechanisms/budget.js";
import { type CborMap, type CborValue, type ReadOptions, asBytes, decodeCbor, encodeCbor } from "./cbor.js";
import { checkEd25519Key } from "./ed25519Keys.js";
import { InvalidParameter, MalformedMessage, MessageTooLarge, ShuffleDPError, UnsupportedVersion } from "./errors.js";

// ---------------------------------------------------------------------------------------------
// Constants (protocol/wire/messages.py)

export const WIRE_VERSION = 3;
export const SPEC_DIGEST_BYTES = 32;
export const SESSION_ID_BYTES = 16;
export const NONCE_BYTES = 16;
export const X25519_KEY_BYTES = 32;
export const ED25519_KEY_BYTES = 32;
export const SIGNATURE_BYTES = 64;
/** A credential: client id (16 bytes) and its HMAC-SHA256 tag (32). */
export const CREDENTIAL_BYTES = 48;
export const BATCH_ID_BYTES = 16;
/** Largest sealed report a round may use. */
export const MAX_SEALED_BYTES = 1024;
/** Largest outer ciphertext of an envelope. */
export const MAX_OUTER_BYTES = 2048;
export const MAX_BINS = 1 << 20;
export const MAX_GRID_LEVELS = 1 << 24;
/** Most reports one user may send in a round. */
export const MAX_MESSAGES_PER_USER = 4096;
export const MAX_EPSILON = 30.0;
export const MIN_EPSILON = 1e-6;
/** Most reports a round may batch (a round's max_batch, and its default). */
export const MAX_BATCH = 1 << 24;
export const MAX_SHUFFLER_INSTANCES = 64;
/** Largest dimension a vector round may name. */
export const MAX_VECTOR_DIM = 1 << 10;
/** Most nonces one receipts message may list. */
export const MAX_RECEIPTS = 1 << 16;
/** Largest noise scale in grid units a round may ask for (`protocol/mechanisms/randomness.py`). */
export const MAX_NOISE_SCALE = 2 ** 44;
/** Magnitude every report value stays below. */
export const VALUE_LIMIT = 1n << 62n;
const ROUND_ID_MAX = (1n << 63n) - 1n;
const SEED_MAX = (1n << 64n) - 1n;

export const NOISE_KINDS = ["laplace", "gaussian"] as const;
export const VECTOR_MODES = ["sampled", "paper"] as const;
export const SUM_NOISE_KINDS = ["polya"] as const;
export const VECTOR_SUM_NOISE_KINDS = ["skellam"] as const;
export const ROUND_OUTCOMES = ["released", "failed"] as const;

/** Every message type tag and its hard size limit in bytes. */
export const MESSAGE_LIMITS = {
  "round-spec": 24 * 1024,
  "signed-round-spec": 25 * 1024,
  report: 256,
  admission: 2048,
  envelope: 4096,
  "shuffled-batch": 512 * 1024 * 1024,
  "batch-ack": 256,
  "admission-receipts": 4 * 1024 * 1024,
  "round-outcome": 512,
} as const;
export type MessageType = keyof typeof MESSAGE_LIMITS;
/** The largest size limit of any message type. */
export const MAX_MESSAGE_BYTES = 512 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Types

export type NoiseKind = (typeof NOISE_KINDS)[number];
export type VectorMode = (typeof VECTOR_MODES)[number];

export interface HadamardRangeParams {
  mechanism: "hadamard-range";
  low: number;
  high: number;
  tau: number;
}
export interface ProjectedMeanParams {
  mechanism: "projected-mean";
  lower: number;
  upper: number;
  noise: NoiseKind;
  gridLevels: number;
}
export interface VectorRangeParams {
  mechanism: "vector-range";
  low: number;
  high: number;
  tau: number;
  dim: number;
  rotationSeed: bigint;
  mode: VectorMode;
}
export interface VectorMeanParams {
  mechanism: "vector-mean";
  dim: number;
  rotationSeed: bigint;
  lower: number[];
  upper: number[];
  noise: NoiseKind;
  gridLevels: number;
}
export interface ModularSumParams {
  mechanism: "modular-sum";
  lower: number;
  upper: number;
  /** Fixed point: a value encodes to {0..precision}; at most 2^40, so exact as a number. */
  precision: number;
  modulus: bigint;
  messages: number;
  users: number;
  noise: "polya";
}
export interface VectorSumParams {
  mechanism: "vector-sum";
  dim: number;
  radius: number;
  levels: number;
  rotationSeed: bigint;
  modulus: bigint;
  messages: number;
  users: number;
  mu: number;
  noise: "skellam";
}
export interface CoordinateTreeParams {
  mechanism: "coordinate-tree";
  low: number;
  high: number;
  tau: number;
  dim: number;
  rotationSeed: bigint;
}
export interface ShiftedNormParams {
  mechanism: "shifted-norm";
  center: number[];
  low: number;
  high: number;
  tau: number;
}
export interface ShiftedVectorSumParams extends Omit<VectorSumParams, "mechanism"> {
  mechanism: "shifted-vector-sum";
  center: number[];
}
export interface LocalVectorParams {
  mechanism: "local-vector";
  dim: number;
  radius: number;
  levels: number;
  rotationSeed: bigint;
  mu: number;
  center: number[];
}

/** The public parameters of a round, discriminated by their wire name. */
export type MechanismParams =
  | HadamardRangeParams
  | ProjectedMeanParams
  | VectorRangeParams
  | VectorMeanParams
  | ModularSumParams
  | VectorSumParams
  | CoordinateTreeParams
  | ShiftedNormParams
  | ShiftedVectorSumParams
  | LocalVectorParams;
export type Mechanism = MechanismParams["mechanism"];

/** Everything public about one round. */
export interface RoundSpec {
  type: "round-spec";
  sessionId: Uint8Array;
  roundId: bigint;
  params: MechanismParams;
  epsilon0: number;
  delta0: number;
  analyzerKey: Uint8Array;
  shufflerKey: Uint8Array;
  shufflerSigningKey: Uint8Array;
  minBatch: number;
  deadline: number;
  messagesPerUser: number;
  maxBatch: number;
  shufflerInstances: number;
}
export interface SignedRoundSpec {
  type: "signed-round-spec";
  specBytes: Uint8Array;
  signature: Uint8Array;
}
export interface Report {
  type: "report";
  roundId: bigint;
  mechanism: Mechanism;
  values: bigint[];
}
export interface Admission {
  type: "admission";
  roundId: bigint;
  credential: Uint8Array;
  nonce: Uint8Array;
  sealed: Uint8Array;
}
export interface Envelope {
  type: "envelope";
  sessionId: Uint8Array;
  roundId: bigint;
  outer: Uint8Array;
}
export interface ShuffledBatch {
  type: "shuffled-batch";
  sessionId: Uint8Array;
  roundId: bigint;
  specDigest: Uint8Array;
  batchId: Uint8Array;
  chunk: number;
  chunks: number;
  total: number;
  payloads: Uint8Array[];
  signature: Uint8Array;
}
export interface BatchAck {
  type: "batch-ack";
  sessionId: Uint8Array;
  roundId: bigint;
  specDigest: Uint8Array;
  batchId: Uint8Array;
  signature: Uint8Array;
}
export interface AdmissionReceipts {
  type: "admission-receipts";
  sessionId: Uint8Array;
  roundId: bigint;
  specDigest: Uint8Array;
  admitted: Uint8Array[];
  refused: Uint8Array[];
  reasons: string[];
  signature: Uint8Array;
}
export interface RoundOutcome {
  type: "round-outcome";
  sessionId: Uint8Array;
  roundId: bigint;
  specDigest: Uint8Array;
  outcome: (typeof ROUND_OUTCOMES)[number];
  reason: string;
  admitted: number;
  batchId: Uint8Array;
  instance: number;
  signature: Uint8Array;
}

export type Message =
  | RoundSpec
  | SignedRoundSpec
  | Report
  | Admission
  | Envelope
  | ShuffledBatch
  | BatchAck
  | AdmissionReceipts
  | RoundOutcome;
/** The message interface of a type tag. */
export type MessageOf<T extends MessageType> = Extract<Message, { type: T }>;

// ---------------------------------------------------------------------------------------------
// Derived quantities of parameters (the Python params classes' properties)

/** The smallest power of two >= k (k >= 1). */
export function nextPowerOfTwo(k: number): number {
  if (!Number.isSafeInteger(k) || k < 1) throw new InvalidParameter("k", `must be an integer >= 1, got ${k}`);
  let p = 1;
  while (p < k) p *= 2;
  return p;
}

/** Bins of width 2 tau over [low, high]: `max(1, ceil((high - low) / (2 tau) - 1e-12))`. */
export function numBins(params: { low: number; high: number; tau: number }): number {
  return Math.max(1, Math.ceil((params.high - params.low) / (2.0 * params.tau) - 1e-12));
}

/** The Hadamard matrix's size: the number of bins rounded up to a power of two. */
export function paddedBins(params: { low: number; high: number; tau: number }): number {
  return nextPowerOfTwo(numBins(params));
}

/** Centre of bin `index`: `low + tau (2 index + 1)`. */
export function binCenter(params: { low: number; tau: number }, index: number): number {
  return params.low + params.tau * (2 * index + 1);
}

/** The rotation's padded dimension: `dim` rounded up to a power of two. */
export function paddedDim(params: { dim: number }): number {
  return nextPowerOfTwo(params.dim);
}

/** The scalar range round of a rotated range round (its interval and bins). */
export function scalarRange(params: { low: number; high: number; tau: number }): HadamardRangeParams {
  return { mechanism: "hadamard-range", low: params.low, high: params.high, tau: params.tau };
}

/** Levels of a coordinate tree below its root: log2 of its padded leaves. */
export function treeLevels(params: CoordinateTreeParams): number {
  return Math.round(Math.log2(paddedBins(params)));
}

/** Groups of a coordinate tree: `padded_dim * levels`, one per (coordinate, level). */
export function treeGroups(params: CoordinateTreeParams): number {
  return paddedDim(params) * treeLevels(params);
}

/** Grid step of a projected mean round: `(upper - lower) / grid_levels`. */
export function gridStep(params: { lower: number; upper: number; gridLevels: number }): number {
  return (params.upper - params.lower) / params.gridLevels;
}

/** Values in one report of a mechanism. */
export function valuesPerReport(mechanism: Mechanism): number {
  const width = VALUES_PER_REPORT[mechanism];
  if (width === undefined) throw new InvalidParameter("mechanism", `unknown mechanism ${shortRepr(mechanism)}`);
  return width;
}

/** Reports each user sends in a round with these parameters. */
export function messagesPerUserOf(params: MechanismParams): number {
  switch (params.mechanism) {
    case "vector-range":
      return params.mode === "sampled" ? 1 : paddedDim(params);
    case "modular-sum":
      return params.messages;
    case "vector-sum":
    case "shifted-vector-sum":
      return params.messages * paddedDim(params);
    case "local-vector":
      return paddedDim(params);
    default:
      return 1;
  }
}

/** Reports a batch must hold for the noise of these parameters (every share of `users` users); 1 otherwise. */
export function minReports(params: MechanismParams): number {
  switch (params.mechanism) {
    case "modular-sum":
    case "vector-sum":
    case "shifted-vector-sum":
      return params.users * messagesPerUserOf(params);
    default:
      return 1;
  }
}

/** Whether the round's guarantee is local (user-level); false for the summations (central only). */
export function hasLocalGuarantee(mechanism: Mechanism): boolean {
  return !(mechanism === "modular-sum" || mechanism === "vector-sum" || mechanism === "shifted-vector-sum");
}

const VALUES_PER_REPORT: Record<string, number> = {
  "hadamard-range": 2,
  "projected-mean": 1,
  "vector-range": 3,
  "vector-mean": 2,
  "modular-sum": 1,
  "vector-sum": 2,
  "coordinate-tree": 3,
  "shifted-norm": 2,
  "shifted-vector-sum": 2,
  "local-vector": 2,
};

// ---------------------------------------------------------------------------------------------
// Validation helpers (messages.py's _require, _finite, _count, ...), on the wire form

/** A value quoted in an error message, cut short (messages quote hostile input). */
function shortRepr(value: unknown, limit = 40): string {
  let text: string;
  if (typeof value === "string") text = codePoints(value) > limit ? `<str of length ${codePoints(value)}>` : quoteText(value);
  else if (typeof value === "bigint" || typeof value === "number") text = String(value);
  else if (value instanceof Uint8Array) text = value.length > limit ? `<bytes of length ${value.length}>` : quoteBytes(value);
  else if (Array.isArray(value)) text = `<list of length ${value.length}>`;
  else text = `<${wireTypeName(value)}>`;
  return text.length <= limit ? text : text.slice(0, limit - 3) + "...";
}

/** A string quoted as Python's `repr` quotes it: control characters and backslashes escaped. */
function quoteText(text: string): string {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of text) {
    const code = ch.codePointAt(0)!;
    if (ch === "\\" || ch === quote) out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || (code >= 0x7f && code < 0xa0)) out += "\\x" + code.toString(16).padStart(2, "0");
    else if (code >= 0xd800 && code <= 0xdfff) out += "\\u" + code.toString(16);
    else out += ch;
  }
  return out + quote;
}

/** Bytes quoted as Python's `repr` quotes them (`b'...'`). */
function quoteBytes(bytes: Uint8Array): string {
  let text = "";
  for (const byte of bytes) text += String.fromCharCode(byte);
  const body = quoteText(text);
  return "b" + body.replace(/[\u00a0-\u00ff]/g, (ch) => "\\x" + ch.charCodeAt(0).toString(16));
}

/** Length in Unicode code points (as Python's `len` of a str). */
function codePoints(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) i++;
    }
    n++;
  }
  return n;
}

/** The Python type name of a value of the CBOR model (error messages match the reference's). */
function wireTypeName(value: unknown): string {
  if (typeof value === "bigint") return "int";
  if (typeof value === "number") return "float";
  if (typeof value === "string") return "str";
  if (value instanceof Uint8Array) return "bytes";
  if (Array.isArray(value)) return "list";
  if (value instanceof Map) return "dict";
  if (value === null) return "null";
  return typeof value;
}

function require(condition: boolean, name: string, problem: string): void {
  if (!condition) throw new InvalidParameter(name, problem);
}

function finite(value: unknown, name: string): asserts value is number {
  require(typeof value === "number", name, "must be a number");
  require(Number.isFinite(value as number), name, `must be finite, got ${shortRepr(value)}`);
}

function bytesOf(value: unknown, length: number, name: string): void {
  require(value instanceof Uint8Array, name, "must be bytes");
  require((value as Uint8Array).length === length, name, `must be ${length} bytes, got ${(value as Uint8Array).length}`);
}

function count(value: unknown, name: string, low: bigint, high: bigint): void {
  require(typeof value === "bigint", name, "must be an integer");
  const v = value as bigint;
  if (!(low <= v && v <= high)) throw new InvalidParameter(name, `must be in [${low}, ${high}], got ${shortRepr(v)}`);
}

function roundId(value: unknown): void {
  count(value, "round_id", 0n, ROUND_ID_MAX);
}

/** The header of every message the shuffler signs about a round: its session, round and spec digest. */
function roundHeader(message: Wire): void {
  bytesOf(message.session_id, SESSION_ID_BYTES, "session_id");
  roundId(message.round_id);
  bytesOf(message.spec_digest, SPEC_DIGEST_BYTES, "spec_digest");
}

/** Distance from |x| to the next larger double (Python's math.ulp). */
export function ulp(x: number): number {
  if (!Number.isFinite(x)) return NaN;
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, Math.abs(x));
  const biased = (view.getUint32(0) >>> 20) & 0x7ff;
  return biased === 0 ? 2 ** -1074 : 2 ** (biased - 1023 - 52);
}

/** Refuse a grid whose step is lost in double precision at the interval's magnitude. */
function resolvable(low: number, high: number, step: number, name: string): void {
  const width = high - low;
  require(Number.isFinite(width), name, `interval [${low}, ${high}] is wider than a double can hold`);
  const magnitude = Math.max(Math.abs(low), Math.abs(high));
  const floor = 4.0 * ulp(magnitude);
  require(step >= floor, name, `gives a step of ${step.toPrecision(3)}, below 4 ulps (${floor.toPrecision(3)}) at magnitude ${magnitude.toPrecision(3)}`);
}

/**
 * The range every round's guarantee must lie in: `MIN_EPSILON <= epsilon0 <= MAX_EPSILON`,
 * `0 <= delta0 < 1` (messages.py `check_epsilon_delta`); throws {@link InvalidParameter}.
 */
export function checkEpsilonDelta(epsilon0: number, delta0: number): void {
  finite(epsilon0, "epsilon0");
  require(MIN_EPSILON <= epsilon0 && epsilon0 <= MAX_EPSILON, "epsilon0", `must be in [${MIN_EPSILON}, ${MAX_EPSILON}], got ${shortRepr(epsilon0)}`);
  finite(delta0, "delta0");
  require(0.0 <= delta0 && delta0 < 1.0, "delta0", `must be in [0, 1), got ${shortRepr(delta0)}`);
}

/** {@link checkEpsilonDelta}, and `delta0 > 0` exactly when the noise is Gaussian (messages.py `check_local_budget`). */
export function checkLocalBudget(epsilon0: number, delta0: number, noise: string): void {
  checkEpsilonDelta(epsilon0, delta0);
  require((NOISE_KINDS as readonly string[]).includes(noise), "noise", `must be one of laplace, gaussian, got ${shortRepr(noise)}`);
  require((noise === "gaussian") === delta0 > 0, "delta0", "must be > 0 exactly when the noise is Gaussian");
}

function oneOf(value: unknown, options: readonly string[], name: string): void {
  require(typeof value === "string" && options.includes(value), name, `must be one of ${options.join(", ")}, got ${shortRepr(value)}`);
}

function byteStrings(values: unknown, name: string, low: number, high: number): void {
  require(Array.isArray(values), name, "must be a list of bytes");
  for (const v of values as unknown[]) {
    if (!(v instanceof Uint8Array && low <= v.length && v.length <= high)) require(false, name, `each must be ${low}..${high} bytes`);
  }
}

// ---------------------------------------------------------------------------------------------
// Schemas: the wire form of every message and parameter type, field by field in the reference's order

/** A message or parameter map on the wire: wire key -> CBOR-model value (ints as bigint). */
type Wire = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

type Kind = "float" | "int" | "bytes" | "str" | "floats" | "ints" | "bytesList" | "strs" | "params";

interface Field {
  /** Key on the wire. */
  wire: string;
  /** Property of the TS interface. */
  js: string;
  kind: Kind;
  /** An integer kept as a bigint in the TS interface (otherwise a number). */
  big?: boolean;
}

interface Schema {
  name: string;
  fields: Field[];
  /** The constructor checks of the reference class, on the wire form; throws InvalidParameter. */
  check(wire: Wire): void;
}

function camel(name: string): string {
  return name.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

function field(wire: string, kind: Kind, big = false): Field {
  return { wire, js: camel(wire), kind, big };
}

function checkHadamardRange(p: Wire): void {
  finite(p.low, "low");
  finite(p.high, "high");
  finite(p.tau, "tau");
  require(p.high > p.low, "high", `must exceed low (${p.low}), got ${p.high}`);
  require(p.tau > 0, "tau", `must be > 0, got ${p.tau}`);
  const ratio = (p.high - p.low) / (2.0 * p.tau);
  require(Number.isFinite(ratio) && ratio <= MAX_BINS, "tau", `gives ${ratio.toPrecision(3)} bins over [${p.low}, ${p.high}]; at most ${MAX_BINS} allowed`);
  const bins = numBins(p as { low: number; high: number; tau: number });
  require(bins <= MAX_BINS, "tau", `gives ${bins} bins over [${p.low}, ${p.high}]; at most ${MAX_BINS} allowed`);
  resolvable(p.low, p.high, 2.0 * p.tau, "tau");
  require(Number.isFinite(Math.abs(p.low) + Math.abs(p.high) + 8.0 * p.tau), "tau", "announced range overflows");
}

function checkProjectedMean(lower: unknown, upper: unknown, noise: unknown, gridLevels: unknown): void {
  finite(lower, "lower");
  finite(upper, "upper");
  require(upper > lower, "upper", `must exceed lower (${lower}), got ${upper}`);
  oneOf(noise, NOISE_KINDS, "noise");
  count(gridLevels, "grid_levels", 1n, BigInt(MAX_GRID_LEVELS));
  resolvable(lower, upper, (upper - lower) / Number(gridLevels), "grid_levels");
}

function checkDimSeed(p: Wire): void {
  count(p.dim, "dim", 1n, BigInt(MAX_VECTOR_DIM));
  count(p.rotation_seed, "rotation_seed", 0n, SEED_MAX);
}

function paddedDimOf(dim: bigint): number {
  return nextPowerOfTwo(Number(dim));
}

function checkGridScale(levels: bigint, radius: number): void {
  require(Number.isFinite(Number(levels) / radius), "radius", `${shortRepr(radius)} is too small for ${levels} levels: levels / radius overflows`);
}

function checkMu(mu: unknown): void {
  finite(mu, "mu");
  require(1.0 <= mu && mu <= MAX_NOISE_SCALE ** 2, "mu", `must be in [1, ${(MAX_NOISE_SCALE ** 2).toPrecision(3)}], got ${shortRepr(mu)}`);
}

function checkCenter(center: unknown, dim: bigint): void {
  require(Array.isArray(center) && BigInt(center.length) === dim, "center", `must give one coordinate per input dimension (${dim})`);
  for (const value of center as unknown[]) finite(value, "center");
}

function checkVectorSum(p: Wire): void {
  count(p.dim, "dim", 1n, BigInt(MAX_VECTOR_DIM));
  finite(p.radius, "radius");
  require(p.radius > 0, "radius", `must be > 0, got ${shortRepr(p.radius)}`);
  count(p.levels, "levels", 1n, 1n << 32n);
  checkGridScale(p.levels, p.radius);
  count(p.rotation_seed, "rotation_seed", 0n, SEED_MAX);
  count(p.modulus, "modulus", 3n, 1n << 62n);
  count(p.users, "users", 2n, BigInt(MAX_BATCH));
  count(p.messages, "messages", 2n, BigInt(MAX_MESSAGES_PER_USER));
  const padded = paddedDimOf(p.dim);
  require(
    Number(p.messages) * padded <= MAX_MESSAGES_PER_USER,
    "messages",
    `${p.messages} per coordinate x ${padded} coordinates exceeds ${MAX_MESSAGES_PER_USER} messages per user`,
  );
  checkMu(p.mu);
  oneOf(p.noise, VECTOR_SUM_NOISE_KINDS, "noise");
}

const VECTOR_SUM_FIELDS: Field[] = [
  field("dim", "int"),
  field("radius", "float"),
  field("levels", "int"),
  field("rotation_seed", "int", true),
  field("modulus", "int", true),
  field("messages", "int"),
  field("users", "int"),
  field("mu", "float"),
  field("noise", "str"),
];

const PARAMS: Record<Mechanism, Schema> = {
  "hadamard-range": {
    name: "hadamard-range",
    fields: [field("low", "float"), field("high", "float"), field("tau", "float")],
    check: checkHadamardRange,
  },
  "projected-mean": {
    name: "projected-mean",
    fields: [field("lower", "float"), field("upper", "float"), field("noise", "str"), field("grid_levels", "int")],
    check: (p) => checkProjectedMean(p.lower, p.upper, p.noise, p.grid_levels),
  },
  "vector-range": {
    name: "vector-range",
    fields: [
      field("low", "float"), field("high", "float"), field("tau", "float"), field("dim", "int"),
      field("rotation_seed", "int", true), field("mode", "str"),
    ],
    check: (p) => {
      checkHadamardRange(p);
      checkDimSeed(p);
      oneOf(p.mode, VECTOR_MODES, "mode");
    },
  },
  "vector-mean": {
    name: "vector-mean",
    fields: [
      field("dim", "int"), field("rotation_seed", "int", true), field("lower", "floats"), field("upper", "floats"),
      field("noise", "str"), field("grid_levels", "int"),
    ],
    check: (p) => {
      checkDimSeed(p);
      const padded = paddedDimOf(p.dim);
      for (const name of ["lower", "upper"]) {
        require(Array.isArray(p[name]) && p[name].length === padded, name, `must give one bound per rotated coordinate (${padded})`);
      }
      for (let i = 0; i < padded; i++) checkProjectedMean(p.lower[i], p.upper[i], p.noise, p.grid_levels);
    },
  },
  "modular-sum": {
    name: "modular-sum",
    fields: [
      field("lower", "float"), field("upper", "float"), field("precision", "int"), field("modulus", "int", true),
      field("messages", "int"), field("users", "int"), field("noise", "str"),
    ],
    check: (p) => {
      finite(p.lower, "lower");
      finite(p.upper, "upper");
      require(p.upper > p.lower, "upper", `must exceed lower (${p.lower}), got ${p.upper}`);
      count(p.precision, "precision", 1n, 1n << 40n);
      count(p.users, "users", 2n, BigInt(MAX_BATCH));
      count(p.messages, "messages", 2n, BigInt(MAX_MESSAGES_PER_USER));
      count(p.modulus, "modulus", 3n, 1n << 62n);
      oneOf(p.noise, SUM_NOISE_KINDS, "noise");
      resolvable(p.lower, p.upper, (p.upper - p.lower) / Number(p.precision), "precision");
    },
  },
  "vector-sum": { name: "vector-sum", fields: VECTOR_SUM_FIELDS, check: checkVectorSum },
  "coordinate-tree": {
    name: "coordinate-tree",
    fields: [field("low", "float"), field("high", "float"), field("tau", "float"), field("dim", "int"), field("rotation_seed", "int", true)],
    check: (p) => {
      checkHadamardRange(p);
      require(numBins(p as HadamardRangeParams) >= 2, "tau", "a tree needs at least two leaves: tau must be below (high - low) / 2");
      checkDimSeed(p);
    },
  },
  "shifted-norm": {
    name: "shifted-norm",
    fields: [field("center", "floats"), field("low", "float"), field("high", "float"), field("tau", "float")],
    check: (p) => {
      checkHadamardRange(p);
      require(Array.isArray(p.center) && 1 <= p.center.length && p.center.length <= MAX_VECTOR_DIM, "center", `must hold 1 to ${MAX_VECTOR_DIM} coordinates`);
      for (const value of p.center) finite(value, "center");
      require(p.high <= 1000.0 && p.low >= -1000.0, "high", "the log2-norm grid must lie in [-1000, 1000] (norms of doubles)");
    },
  },
  "shifted-vector-sum": {
    name: "shifted-vector-sum",
    fields: [...VECTOR_SUM_FIELDS, field("center", "floats")],
    check: (p) => {
      checkVectorSum(p);
      checkCenter(p.center, p.dim);
    },
  },
  "local-vector": {
    name: "local-vector",
    fields: [
      field("dim", "int"), field("radius", "float"), field("levels", "int"), field("rotation_seed", "int", true),
      field("mu", "float"), field("center", "floats"),
    ],
    check: (p) => {
      count(p.dim, "dim", 1n, BigInt(MAX_VECTOR_DIM));
      finite(p.radius, "radius");
      require(p.radius > 0, "radius", `must be > 0, got ${shortRepr(p.radius)}`);
      count(p.levels, "levels", 1n, 1n << 32n);
      checkGridScale(p.levels, p.radius);
      count(p.rotation_seed, "rotation_seed", 0n, SEED_MAX);
      checkMu(p.mu);
      checkCenter(p.center, p.dim);
    },
  },
};

function checkRoundSpec(s: Wire): void {
  bytesOf(s.session_id, SESSION_ID_BYTES, "session_id");
  roundId(s.round_id);
  checkEpsilonDelta(s.epsilon0, s.delta0);
  const params = paramsToJs(s.params);
  try {
    // the mechanism's own rules (e.g. delta0 > 0 iff Gaussian; a summation's analysis)
    checkMechanismBudget(params, s.epsilon0, s.delta0);
  } catch (error) {
    if (error instanceof RangeError) {
      throw new InvalidParameter("epsilon0", `the mechanism's analysis fails at this budget (${error.name})`);
    }
    throw error;
  }
  bytesOf(s.analyzer_key, X25519_KEY_BYTES, "analyzer_key");
  bytesOf(s.shuffler_key, X25519_KEY_BYTES, "shuffler_key");
  bytesOf(s.shuffler_signing_key, ED25519_KEY_BYTES, "shuffler_signing_key");
  // a small-order or non-canonical key would let anyone sign as this round's shuffler
  checkEd25519Key(s.shuffler_signing_key, "shuffler_signing_key", ED25519_KEY_BYTES);
  count(s.max_batch, "max_batch", 1n, BigInt(MAX_BATCH));
  count(s.min_batch, "min_batch", 1n, s.max_batch);
  const floor = minReports(params);
  require(s.min_batch >= BigInt(floor), "min_batch", `must be at least ${floor}: the noise of these parameters is calibrated to that many reports`);
  finite(s.deadline, "deadline");
  count(s.messages_per_user, "messages_per_user", 1n, BigInt(MAX_MESSAGES_PER_USER));
  count(s.shuffler_instances, "shuffler_instances", 1n, BigInt(MAX_SHUFFLER_INSTANCES));
  const perUser = messagesPerUserOf(params);
  require(s.messages_per_user === BigInt(perUser), "messages_per_user", `must be ${perUser}, the reports one user sends with these parameters`);
}

const MESSAGES: Record<MessageType, Schema> = {
  "round-spec": {
    name: "round-spec",
    fields: [
      field("session_id", "bytes"), field("round_id", "int", true), field("params", "params"), field("epsilon0", "float"),
      field("analyzer_key", "bytes"), field("shuffler_key", "bytes"), field("shuffler_signing_key", "bytes"),
      field("min_batch", "int"), field("deadline", "float"), field("delta0", "float"), field("messages_per_user", "int"),
      field("max_batch", "int"), field("shuffler_instances", "int"),
    ],
    check: checkRoundSpec,
  },
  "signed-round-spec": {
    name: "signed-round-spec",
    fields: [field("spec_bytes", "bytes"), field("signature", "bytes")],
    check: (s) => {
      require(s.spec_bytes instanceof Uint8Array && s.spec_bytes.length > 0, "spec_bytes", "must be non-empty bytes");
      bytesOf(s.signature, SIGNATURE_BYTES, "signature");
    },
  },
  report: {
    name: "report",
    fields: [field("round_id", "int", true), field("mechanism", "str"), field("values", "ints")],
    check: (r) => {
      roundId(r.round_id);
      require(typeof r.mechanism === "string" && Object.hasOwn(VALUES_PER_REPORT, r.mechanism), "mechanism", `unknown mechanism ${shortRepr(r.mechanism)}`);
      const width = VALUES_PER_REPORT[r.mechanism]!;
      require(Array.isArray(r.values) && r.values.length === width, "values", `must be ${width} integer(s)`);
      for (const v of r.values) {
        require(typeof v === "bigint", "values", "must be integers");
        require(-VALUE_LIMIT <= v && v < VALUE_LIMIT, "values", "out of range");
      }
    },
  },
  admission: {
    name: "admission",
    fields: [field("round_id", "int", true), field("credential", "bytes"), field("nonce", "bytes"), field("sealed", "bytes")],
    check: (a) => {
      roundId(a.round_id);
      bytesOf(a.credential, CREDENTIAL_BYTES, "credential");
      bytesOf(a.nonce, NONCE_BYTES, "nonce");
      require(a.sealed instanceof Uint8Array && a.sealed.length > 0 && a.sealed.length <= MAX_SEALED_BYTES, "sealed", `must be 1..${MAX_SEALED_BYTES} bytes`);
    },
  },
  envelope: {
    name: "envelope",
    fields: [field("session_id", "bytes"), field("round_id", "int", true), field("outer", "bytes")],
    check: (e) => {
      bytesOf(e.session_id, SESSION_ID_BYTES, "session_id");
      roundId(e.round_id);
      require(e.outer instanceof Uint8Array && e.outer.length > 0 && e.outer.length <= MAX_OUTER_BYTES, "outer", `must be 1..${MAX_OUTER_BYTES} bytes`);
    },
  },
  "shuffled-batch": {
    name: "shuffled-batch",
    fields: [
      field("session_id", "bytes"), field("round_id", "int", true), field("spec_digest", "bytes"), field("batch_id", "bytes"),
      field("chunk", "int"), field("chunks", "int"), field("total", "int"), field("payloads", "bytesList"), field("signature", "bytes"),
    ],
    check: (b) => {
      roundHeader(b);
      bytesOf(b.batch_id, BATCH_ID_BYTES, "batch_id");
      count(b.total, "total", 1n, BigInt(MAX_BATCH));
      count(b.chunks, "chunks", 1n, b.total);
      count(b.chunk, "chunk", 0n, b.chunks - 1n);
      byteStrings(b.payloads, "payloads", 1, MAX_SEALED_BYTES);
      require(b.payloads.length > 0 && BigInt(b.payloads.length) <= b.total, "payloads", `a chunk holds 1..total (${b.total}) payloads`);
      bytesOf(b.signature, SIGNATURE_BYTES, "signature");
    },
  },
  "batch-ack": {
    name: "batch-ack",
    fields: [field("session_id", "bytes"), field("round_id", "int", true), field("spec_digest", "bytes"), field("batch_id", "bytes"), field("signature", "bytes")],
    check: (b) => {
      roundHeader(b);
      bytesOf(b.batch_id, BATCH_ID_BYTES, "batch_id");
      bytesOf(b.signature, SIGNATURE_BYTES, "signature");
    },
  },
  "admission-receipts": {
    name: "admission-receipts",
    fields: [
      field("session_id", "bytes"), field("round_id", "int", true), field("spec_digest", "bytes"), field("admitted", "bytesList"),
      field("refused", "bytesList"), field("reasons", "strs"), field("signature", "bytes"),
    ],
    check: (r) => {
      roundHeader(r);
      byteStrings(r.admitted, "admitted", NONCE_BYTES, NONCE_BYTES);
      byteStrings(r.refused, "refused", NONCE_BYTES, NONCE_BYTES);
      require(r.admitted.length + r.refused.length <= MAX_RECEIPTS, "admitted", `at most ${MAX_RECEIPTS} receipts`);
      require(Array.isArray(r.reasons) && r.reasons.length === r.refused.length, "reasons", "one per refused nonce");
      for (const reason of r.reasons) {
        require(typeof reason === "string" && reason.length > 0 && codePoints(reason) <= 32, "reasons", "each must be 1..32 characters");
      }
      bytesOf(r.signature, SIGNATURE_BYTES, "signature");
    },
  },
  "round-outcome": {
    name: "round-outcome",
    fields: [
      field("session_id", "bytes"), field("round_id", "int", true), field("spec_digest", "bytes"), field("outcome", "str"),
      field("reason", "str"), field("admitted", "int"), field("batch_id", "bytes"), field("instance", "int"), field("signature", "bytes"),
    ],
    check: (o) => {
      roundHeader(o);
      count(o.instance, "instance", 0n, BigInt(MAX_SHUFFLER_INSTANCES - 1));
      require(typeof o.outcome === "string" && (ROUND_OUTCOMES as readonly string[]).includes(o.outcome), "outcome", "must be one of released, failed");
      require(typeof o.reason === "string" && codePoints(o.reason) <= 32, "reason", "at most 32 characters");
      count(o.admitted, "admitted", 0n, BigInt(MAX_BATCH));
      bytesOf(o.batch_id, BATCH_ID_BYTES, "batch_id");
      bytesOf(o.signature, SIGNATURE_BYTES, "signature");
    },
  },
};

// ---------------------------------------------------------------------------------------------
// Decoding: CBOR model -> wire form (codec.py _from_wire / _build) -> TS interface

function scalarFromWire(kind: Kind, value: CborValue, where: string): unknown {
  switch (kind) {
    case "float":
    case "floats":
      if (typeof value === "number") return value;
      if (typeof value === "bigint") return Number(value); // a float / uint field may carry an integer
      throw new MalformedMessage(`${where}: expected a number, got ${wireTypeName(value)}`);
    case "int":
    case "ints":
      if (typeof value === "bigint") return value;
      throw new MalformedMessage(`${where}: expected int, got ${wireTypeName(value)}`);
    case "bytes":
    case "bytesList":
      if (value instanceof Uint8Array) return value;
      throw new MalformedMessage(`${where}: expected bytes, got ${wireTypeName(value)}`);
    default:
      if (typeof value === "string") return value;
      throw new MalformedMessage(`${where}: expected str, got ${wireTypeName(value)}`);
  }
}

function fromWire(kind: Kind, value: CborValue, where: string): unknown {
  if (kind === "params") {
    const mechanism = value instanceof Map ? value.get("mechanism") : undefined;
    if (!(value instanceof Map) || typeof mechanism !== "string") {
      throw new MalformedMessage(`${where}: expected a parameter map with a 'mechanism' name`);
    }
    if (!Object.hasOwn(PARAMS, mechanism)) throw new MalformedMessage(`${where}: unknown mechanism ${shortRepr(mechanism)}`);
    const schema = PARAMS[mechanism as Mechanism];
    const params = build(schema, value, where, new Set(["mechanism"]));
    params.mechanism = mechanism;
    return params;
  }
  if (kind === "floats" || kind === "ints" || kind === "bytesList" || kind === "strs") {
    if (!Array.isArray(value)) throw new MalformedMessage(`${where}: expected an array, got ${wireTypeName(value)}`);
    return value.map((item) => scalarFromWire(kind, item, where));
  }
  return scalarFromWire(kind, value, where);
}

function build(schema: Schema, body: CborMap, where: string, skip: ReadonlySet<string>): Wire {
  const known = new Set(schema.fields.map((f) => f.wire));
  const unknown: string[] = [];
  for (const key of body.keys()) if (!known.has(key) && !skip.has(key)) unknown.push(key);
  if (unknown.length > 0) {
    unknown.sort();
    throw new MalformedMessage(`${where}: ${unknown.length} unknown key(s), e.g. ${shortRepr(unknown[0])}`);
  }
  const wire: Wire = {};
  for (const f of schema.fields) {
    // Every key is required, defaulted ones too: the deterministic encoding writes every field.
    if (!body.has(f.wire)) throw new MalformedMessage(`${where}: missing key '${f.wire}'`);
    wire[f.wire] = fromWire(f.kind, body.get(f.wire)!, `${where}.${f.wire}`);
  }
  try {
    schema.check(wire);
  } catch (error) {
    if (error instanceof InvalidParameter) throw new MalformedMessage(`${where}: ${error.message}`);
    throw error;
  }
  return wire;
}

function toJs(schema: Schema, wire: Wire): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const f of schema.fields) {
    const value = wire[f.wire];
    if (f.kind === "int" && !f.big) out[f.js] = Number(value);
    else if (f.kind === "params") out[f.js] = paramsToJs(value);
    else out[f.js] = value;
  }
  return out;
}

function paramsToJs(wire: Wire): MechanismParams {
  const schema = PARAMS[wire.mechanism as Mechanism];
  return { mechanism: wire.mechanism, ...toJs(schema, wire) } as unknown as MechanismParams;
}

/** Options of {@link decodeMessage}. */
export interface DecodeOptions extends ReadOptions {}

/**
 * Decode bytes into a validated message; `expected` pins the message type.
 *
 * The size limit is checked first, against the expected type's limit (or the largest one),
 * then against the message's own type once its `t` is read. `maxItems` bounds every array
 * (a batch reader passes the round's `max_batch`). Throws {@link MessageTooLarge},
 * {@link UnsupportedVersion} or {@link MalformedMessage}; nothing else for any input.
 */
export function decodeMessage<T extends MessageType>(data: Uint8Array, expected: T, options?: DecodeOptions): MessageOf<T>;
export function decodeMessage(data: Uint8Array, expected?: MessageType, options?: DecodeOptions): Message;
export function decodeMessage(data: Uint8Array, expected?: MessageType, options: DecodeOptions = {}): Message {
  if (expected !== undefined && !Object.hasOwn(MESSAGE_LIMITS, expected)) {
    throw new InvalidParameter("expected", `must be a wire message type, got ${shortRepr(expected)}`);
  }
  const bytes = asBytes(data);
  const limit = expected === undefined ? MAX_MESSAGE_BYTES : MESSAGE_LIMITS[expected];
  if (bytes.length > limit) throw new MessageTooLarge(`${bytes.length} bytes, over the limit of ${limit}`);
  const body = decodeCbor(bytes, options);
  return messageFromBody(body, expected, bytes.length);
}

/**
 * The message of a decoded CBOR item spanning `size` bytes (the checks of codec.py after the
 * CBOR layer); used by {@link decodeMessage} and by the padded report reader.
 */
export function messageFromBody(body: CborValue, expected: MessageType | undefined, size: number): Message {
  if (!(body instanceof Map)) throw new MalformedMessage("top level must be a CBOR map");
  const version = body.get("v");
  if (typeof version !== "bigint") throw new MalformedMessage("missing or invalid wire version 'v'");
  if (version !== BigInt(WIRE_VERSION)) {
    throw new UnsupportedVersion(`wire version ${shortRepr(version)}; this build speaks ${WIRE_VERSION}`);
  }
  const tag = body.get("t");
  if (typeof tag !== "string" || !Object.hasOwn(MESSAGE_LIMITS, tag)) {
    throw new MalformedMessage(`unknown message type ${shortRepr(tag)}`);
  }
  const type = tag as MessageType;
  if (expected !== undefined && type !== expected) throw new MalformedMessage(`expected ${expected}, got ${type}`);
  const typeLimit = MESSAGE_LIMITS[type];
  if (size > typeLimit) throw new MessageTooLarge(`${type} of ${size} bytes, over its limit of ${typeLimit}`);
  const schema = MESSAGES[type];
  const wire = build(schema, body, type, new Set(["v", "t"]));
  return { type, ...toJs(schema, wire) } as unknown as Message;
}

/**
 * The round spec encoded in `specBytes` (a signed spec's `spec_bytes`, as received), with
 * every check of the reference's RoundSpec, including the mechanism's own budget rules
 * (`checkMechanismBudget`). The caller verifies the signature over `specBytes` and keeps them.
 */
export function decodeRoundSpec(specBytes: Uint8Array): RoundSpec {
  return decodeMessage(specBytes, "round-spec");
}

// ---------------------------------------------------------------------------------------------
// Encoding: TS interface -> wire form (validated) -> deterministic CBOR

function scalarToWire(kind: Kind, value: unknown, name: string): unknown {
  switch (kind) {
    case "float":
    case "floats":
      require(typeof value === "number", name, "must be a number");
      return value;
    case "int":
    case "ints":
      if (typeof value === "bigint") return value;
      require(typeof value === "number" && Number.isSafeInteger(value), name, "must be an integer");
      return BigInt(value as number);
    case "bytes":
    case "bytesList":
      require(value instanceof Uint8Array, name, "must be bytes");
      return value;
    default:
      require(typeof value === "string", name, "must be a string");
      return value;
  }
}

function toWire(schema: Schema, source: Record<string, unknown>): Wire {
  const wire: Wire = {};
  for (const f of schema.fields) {
    const value = source[f.js];
    if (f.kind === "params") {
      require(typeof value === "object" && value !== null, f.wire, "must be mechanism parameters");
      const mechanism = (value as { mechanism?: unknown }).mechanism;
      require(typeof mechanism === "string" && Object.hasOwn(PARAMS, mechanism), f.wire, "unknown mechanism parameters");
      const paramsSchema = PARAMS[mechanism as Mechanism];
      const params = toWire(paramsSchema, value as Record<string, unknown>);
      paramsSchema.check(params);
      params.mechanism = mechanism;
      wire[f.wire] = params;
    } else if (f.kind === "floats" || f.kind === "ints" || f.kind === "bytesList" || f.kind === "strs") {
      require(Array.isArray(value), f.wire, "must be a list");
      wire[f.wire] = (value as unknown[]).map((item) => scalarToWire(f.kind, item, f.wire));
    } else {
      wire[f.wire] = scalarToWire(f.kind, value, f.wire);
    }
  }
  return wire;
}

function wireToCbor(schema: Schema, wire: Wire): CborMap {
  const map: CborMap = new Map();
  for (const f of schema.fields) {
    const value = wire[f.wire];
    if (f.kind === "params") {
      const paramsSchema = PARAMS[value.mechanism as Mechanism];
      const params = wireToCbor(paramsSchema, value);
      params.set("mechanism", value.mechanism);
      map.set(f.wire, params);
    } else {
      map.set(f.wire, value as CborValue);
    }
  }
  return map;
}

/**
 * The deterministic encoding of a message, after the checks its reference constructor makes
 * ({@link InvalidParameter}); {@link MessageTooLarge} if it exceeds its type's limit.
 */
export function encodeMessage(message: Message): Uint8Array {
  const type = (message as { type?: unknown }).type;
  if (typeof type !== "string" || !Object.hasOwn(MESSAGES, type)) {
    throw new InvalidParameter("message", `${shortRepr(type)} is not a wire message type`);
  }
  const schema = MESSAGES[type as MessageType];
  const wire = toWire(schema, message as unknown as Record<string, unknown>);
  schema.check(wire);
  const body = wireToCbor(schema, wire);
  body.set("v", BigInt(WIRE_VERSION));
  body.set("t", type);
  const data = encodeCbor(body);
  const limit = MESSAGE_LIMITS[type as MessageType];
  if (data.length > limit) throw new MessageTooLarge(`${type} encodes to ${data.length} bytes, over its limit of ${limit}`);
  return data;
}

/** Whether `error` is one the decoders raise on purpose (every refusal is a ShuffleDPError). */
export function isTypedError(error: unknown): error is ShuffleDPError {
  return error instanceof ShuffleDPError;
}
