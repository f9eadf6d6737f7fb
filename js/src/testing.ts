/**
 * `@shuffledp/client/testing`: helpers for tests, never for a device in use.
 *
 * - {@link SeededSource}: a deterministic random source (`secure = false`, not cryptographic),
 *   to make a randomizer's output reproducible in a unit test. A {@link Client} given one still
 *   seals and charges as usual, but its reports protect nothing: never ship it.
 * - The other parties' halves of the protocol, so a test can play them without the Python
 *   services: issuing a credential (the enrollment service), signing a round spec (the
 *   analyzer) or a message (the shuffler), opening a sealed payload (the analyzer's inner layer,
 *   the shuffler's outer layer) and decoding a padded report.
 *
 * Works in browsers and Node (no Node built-in).
 *
 * @module
 */

export { SeededSource } from "./random/source.js";
export { issueCredential } from "./wire/credentials.js";
export { signEncodedAt, signSpecBytes, signatureOffset } from "./wire/signing.js";
export { openSealed, reportInfo } from "./wire/sealing.js";
export { envelopeInfo, unpackEnvelopes } from "./wire/onion.js";
export { decodePadded, encodePadded } from "./wire/reportFormat.js";
