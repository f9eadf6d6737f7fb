/**
 * A device's enrollment: the keys it pins and the credential it shows, read from the files
 * `shuffledp keys init DIR` writes (`shuffledp/deploy/keys.py`, format `shuffledp-keys/1`).
 *
 * * `public.json` names the session and the public keys every party reads. A device pins
 *   `analyzer.signing_public` (a round spec must carry its signature) and the shuffler's two
 *   keys (a spec naming another shuffler is refused; the device seals its outer layer to
 *   `shuffler.hpke_public`).
 * * `credentials.json` holds the enrolled credentials (`shuffledp-credentials/1`), one per
 *   device, each 48 bytes in hex: a device holds one, never the issuer key.
 *
 * The broker account (address, username, password, the broker's CA) is handed to a device
 * apart from these, as the Python services take it (`--broker`, `--username`,
 * `--password-file`, `--ca-file`); see {@link BrokerAccount}.
 *
 * Parsing is strict and total, as `keys.py` loads them: any document that is not exactly
 * such a file (wrong format tag, a key of the wrong length, hex that is not hex, a signing key
 * anyone could sign under, credentials of another session) is refused with {@link EnrollmentError}, naming the field. Nothing here
 * reads files: `enrollmentFiles.ts` does that in Node; a web page fetches the documents.
 */

import { weakEd25519Key } from "./wire/ed25519Keys.js";
import { ShuffleDPError } from "./wire/errors.js";

/** Format tag of `public.json`. */
export const PUBLIC_FORMAT = "shuffledp-keys/1";
/** Format tag of `credentials.json`. */
export const CREDENTIALS_FORMAT = "shuffledp-credentials/1";
/** Bytes of a session id. */
export const SESSION_ID_BYTES = 16;
/** Bytes of every public key in `public.json` (X25519 and Ed25519 alike). */
export const PUBLIC_KEY_BYTES = 32;
/** Bytes of one enrolled credential: client id (16) || tag (32). */
export const ENROLLED_CREDENTIAL_BYTES = 48;
/** Most credentials one `credentials.json` is read with (as `keys.py`'s 16 MiB file limit allows). */
export const MAX_CREDENTIALS = 160_000;

/** An enrollment document that cannot be used (the message names the field and why). */
export class EnrollmentError extends ShuffleDPError {
  constructor(message: string) {
    super(message, "key-file");
  }
}

/** The contents of `public.json`. */
export interface PublicInfo {
  sessionId: Uint8Array;
  /** Ed25519 key the analyzer signs round specs with: every device pins it. */
  analyzerSigningKey: Uint8Array;
  /** The analyzer's X25519 key (for the operator: devices seal to the key in the signed spec). */
  analyzerHpkeKey: Uint8Array;
  /** The shuffler's X25519 key (the outer layer); a spec naming another is refused. */
  shufflerKey: Uint8Array;
  /** The shuffler's Ed25519 key (receipts and outcomes); a spec naming another is refused. */
  shufflerSigningKey: Uint8Array;
}

/** What one device holds: the pinned keys of its session and its own credential. */
export interface DeviceEnrollment extends PublicInfo {
  credential: Uint8Array;
}

/**
 * How a device reaches the broker, with its client account.
 *
 * `url`: `mqtts://host:port` (MQTT over TLS; Node) or `wss://host:port/` (MQTT over WebSocket
 * over TLS; browsers, and Node). `ca`: the PEM of the CA the broker's certificate must verify
 * against (Node; a browser verifies against its own trust store). A plaintext URL
 * (`mqtt://`, `ws://`) is refused by the transport unless the host is this machine's loopback.
 */
export interface BrokerAccount {
  url: string;
  username: string;
  password: string;
  ca?: string | Uint8Array;
}

function fail(field: string, why: string): never {
  throw new EnrollmentError(`${field}: ${why}`);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `value` as bytes from lower- or upper-case hex of exactly `size` bytes, else an error naming `field`. */
export function hexBytes(value: unknown, size: number, field: string): Uint8Array {
  if (typeof value !== "string" || value.length !== 2 * size || !/^[0-9a-fA-F]*$/.test(value)) {
    fail(field, `must be ${size} bytes in hex`);
  }
  const out = new Uint8Array(size);
  for (let i = 0; i < size; i++) {
    out[i] = parseInt(value.slice(2 * i, 2 * i + 2), 16);
  }
  return out;
}

function field(doc: Record<string, unknown>, path: string[]): unknown {
  let value: unknown = doc;
  for (const key of path) {
    if (!isRecord(value) || !Object.prototype.hasOwnProperty.call(value, key)) {
      fail(path.join("."), "missing");
    }
    value = value[key];
  }
  return value;
}

function parseJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    fail(what, `not JSON (${(error as Error).message})`);
  }
}

/** `public.json` (its text or its parsed JSON) as {@link PublicInfo}; refuses anything else. */
export function parsePublicInfo(document: unknown): PublicInfo {
  const doc = typeof document === "string" ? parseJson(document, "public.json") : document;
  if (!isRecord(doc) || doc["format"] !== PUBLIC_FORMAT) {
    fail("public.json", `not a ${PUBLIC_FORMAT} file`);
  }
  const hex = (path: string[], size: number) => hexBytes(field(doc, path), size, path.join("."));
  // An Ed25519 key that is a small-order point or a non-canonical encoding would let anyone sign
  // as that party (`wire/ed25519Keys.ts`; keys.py refuses it too).
  const signing = (path: string[]) => {
    const key = hex(path, PUBLIC_KEY_BYTES);
    const problem = weakEd25519Key(key);
    if (problem !== undefined) {
      fail(path.join("."), `is ${problem}`);
    }
    return key;
  };
  return {
    sessionId: hex(["session_id"], SESSION_ID_BYTES),
    analyzerSigningKey: signing(["analyzer", "signing_public"]),
    analyzerHpkeKey: hex(["analyzer", "hpke_public"], PUBLIC_KEY_BYTES),
    shufflerKey: hex(["shuffler", "hpke_public"], PUBLIC_KEY_BYTES),
    shufflerSigningKey: signing(["shuffler", "signing_public"]),
  };
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

/**
 * The credentials of `credentials.json` (its text or parsed JSON), checked against the session of
 * `publicInfo`: refuses another format, another session's credentials, a malformed entry, or more
 * than {@link MAX_CREDENTIALS}.
 */
export function parseCredentials(document: unknown, publicInfo: PublicInfo): Uint8Array[] {
  const doc = typeof document === "string" ? parseJson(document, "credentials.json") : document;
  if (!isRecord(doc) || doc["format"] !== CREDENTIALS_FORMAT || !Array.isArray(doc["credentials"])) {
    fail("credentials.json", `not a ${CREDENTIALS_FORMAT} file`);
  }
  const session = hexBytes(field(doc, ["session_id"]), SESSION_ID_BYTES, "session_id");
  if (!sameBytes(session, publicInfo.sessionId)) {
    fail("credentials.json", "credentials of another session than public.json's");
  }
  const entries = doc["credentials"] as unknown[];
  if (entries.length > MAX_CREDENTIALS) {
    fail("credentials.json", `more than ${MAX_CREDENTIALS} credentials`);
  }
  return entries.map((entry, index) => hexBytes(entry, ENROLLED_CREDENTIAL_BYTES, `credential ${index}`));
}

/**
 * The enrollments of devices `first .. first + count - 1` of a deployment, from its `public.json`
 * and `credentials.json` documents. Refuses (naming the fix) when fewer credentials are enrolled.
 * A simulated fleet gives device `i` entry `i`; two fleets of one session take disjoint ranges.
 */
export function deviceEnrollments(
  publicDocument: unknown,
  credentialsDocument: unknown,
  first = 0,
  count?: number,
): DeviceEnrollment[] {
  const info = parsePublicInfo(publicDocument);
  const credentials = parseCredentials(credentialsDocument, info);
  if (!Number.isSafeInteger(first) || first < 0) {
    fail("first", `must be a non-negative integer, got ${String(first)}`);
  }
  const wanted = count ?? credentials.length - first;
  if (!Number.isSafeInteger(wanted) || wanted < 0) {
    fail("count", `must be a non-negative integer, got ${String(count)}`);
  }
  if (first + wanted > credentials.length) {
    fail(
      "credentials.json",
      `${credentials.length} credential(s) enrolled, devices ${first}..${first + wanted - 1} need ${first + wanted} ` +
        `(issue more with \`shuffledp keys enroll DIR --users ${first + wanted - credentials.length}\`)`,
    );
  }
  return credentials.slice(first, first + wanted).map((credential) => ({ ...info, credential }));
}
