/**
 * Admission credentials and the shuffler instance a credential is assigned to, mirroring
 * `protocol/wire/credentials.py`.
 *
 * A credential is `client_id (16 bytes) || HMAC-SHA256(issuer_key, "shuffledp/v2/credential" ||
 * client_id)`. The enrollment service and the shuffler hold the issuer key; a device holds only
 * its credential and shows it to the shuffler alone, inside the envelope's outer layer.
 */

import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { concatBytes, utf8ToBytes } from "@noble/hashes/utils.js";

import { InvalidParameter } from "./errors.js";
import { CREDENTIAL_BYTES } from "./messages.js";

export const CLIENT_ID_BYTES = 16;
export const CREDENTIAL_TAG_BYTES = 32;
export const ISSUER_KEY_BYTES = 32;

const CREDENTIAL_LABEL = utf8ToBytes("shuffledp/v2/credential");
const INSTANCE_LABEL = utf8ToBytes("shuffledp/v3/instance");

/** The client id a credential names (its first 16 bytes). */
export function clientIdOf(credential: Uint8Array): Uint8Array {
  if (!(credential instanceof Uint8Array) || credential.length !== CREDENTIAL_BYTES) {
    throw new InvalidParameter("credential", `must be the ${CREDENTIAL_BYTES}-byte credential issued at enrollment`);
  }
  return credential.slice(0, CLIENT_ID_BYTES);
}

/**
 * The credential of `clientId` under `issuerKey`: what the enrollment service hands a device.
 * Devices never call this (they do not hold the issuer key); tests and tools do.
 */
export function issueCredential(issuerKey: Uint8Array, clientId: Uint8Array): Uint8Array {
  if (!(issuerKey instanceof Uint8Array) || issuerKey.length !== ISSUER_KEY_BYTES) {
    throw new InvalidParameter("key", `must be ${ISSUER_KEY_BYTES} bytes`);
  }
  if (!(clientId instanceof Uint8Array) || clientId.length !== CLIENT_ID_BYTES) {
    throw new InvalidParameter("client_id", `must be ${CLIENT_ID_BYTES} bytes`);
  }
  return concatBytes(clientId, hmac(sha256, issuerKey, concatBytes(CREDENTIAL_LABEL, clientId)));
}

/**
 * The shuffler instance (`0 .. instances - 1`) that admits `clientId`'s envelopes in the round
 * whose spec has `specDigest`: `uint64_be(SHA-256("shuffledp/v3/instance" || spec_digest ||
 * client_id)[0:8]) mod instances` (0 when there is one instance). Fresh in every round, so the
 * instance index seen on the reports topic is no pseudonym across rounds.
 */
export function assignedInstance(clientId: Uint8Array, instances: number, specDigest: Uint8Array): number {
  if (!Number.isSafeInteger(instances) || instances < 1) {
    throw new InvalidParameter("instances", `must be a positive integer, got ${String(instances)}`);
  }
  if (instances === 1) {
    return 0;
  }
  const digest = sha256(concatBytes(INSTANCE_LABEL, specDigest, clientId));
  const head = new DataView(digest.buffer, digest.byteOffset, 8).getBigUint64(0, false);
  return Number(head % BigInt(instances));
}
