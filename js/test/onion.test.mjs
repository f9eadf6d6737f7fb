// The onion layers, the spec digest and the signing rule against the reference's test vectors
// (tests/protocol/vectors/{sealing,onion,signing}.json), and a device refusing what does not verify.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ed25519 } from "@noble/curves/ed25519.js";

import { decodeMessage, encodeMessage } from "../dist/wire/messages.js";
import {
  decodeVerified,
  envelopeFormat,
  envelopeInfo,
  envelopesPerMessage,
  EnvelopeWrapper,
  packEnvelopes,
  specDigest,
  unpackEnvelopes,
  verifiedSpec,
} from "../dist/wire/onion.js";
import { decodePadded, encodePadded, paddedSize, sealedSize } from "../dist/wire/reportFormat.js";
import { openSealed, reportInfo, reportSealer, RoundSealer } from "../dist/wire/sealing.js";
import {
  signatureOffset,
  signingString,
  signSpecBytes,
  specSigningString,
  verifyEd25519,
  zeroedDigest,
} from "../dist/wire/signing.js";
import { assignedInstance, issueCredential } from "../dist/wire/credentials.js";
import { MemoryLedger } from "../dist/ledger/ledger.js";
import { Client } from "../dist/client/client.js";
import {
  BadSignature,
  MalformedMessage,
  MessageTooLarge,
  SealingError,
  UntrustedRound,
  InvalidParameter,
  WrongSize,
} from "../dist/wire/errors.js";
import {
  ANALYZER,
  OTHER,
  SHUFFLER,
  credentialOf,
  fromHex,
  hex,
  openEnvelope,
  roundSpec,
  signedMessage,
  signedSpec,
} from "./support/rounds.mjs";

const VECTORS = new URL("../../tests/protocol/vectors/", import.meta.url);
const load = (name) => JSON.parse(readFileSync(new URL(name, VECTORS), "utf8"));
const sealing = load("sealing.json");
const onion = load("onion.json");
const signing = load("signing.json");
const SESSION = fromHex(sealing.session_id_hex);
/** The vectors' shuffler signing seed (make_vectors.py: RFC 8032 section 7.1, test 2). */
const VECTOR_SHUFFLER_SEED = fromHex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb");

test("sealing.json: the report info, and the vector's sealed report opens to its padded plaintext", async () => {
  const digest = fromHex(sealing.spec_digest_hex);
  const info = reportInfo(SESSION, BigInt(sealing.round_id), digest);
  assert.equal(hex(info), sealing.info_hex);
  const sealed = fromHex(sealing.sealed_hex);
  const plaintext = await openSealed(fromHex(sealing.recipient_private_key_hex), info, sealed);
  assert.equal(hex(plaintext), sealing.plaintext_hex);
  assert.equal(plaintext.length, sealing.padded_size);
  assert.equal(paddedSize(0n, "hadamard-range"), sealing.padded_size);
  assert.equal(sealed.length, sealedSize(0n, "hadamard-range"));
  // The padded plaintext is the report's encoding, then zeros; re-encoding its values gives it back.
  const values = decodePadded(0n, "hadamard-range", plaintext);
  assert.equal(hex(encodeMessage({ type: "report", roundId: 0n, mechanism: "hadamard-range", values })), sealing.report_hex);
  assert.equal(hex(encodePadded(0n, "hadamard-range", values)), sealing.plaintext_hex);
});

test("sealing.json: the sealed report does not open under another round, session, spec or key, nor altered", async () => {
  const key = fromHex(sealing.recipient_private_key_hex);
  const digest = fromHex(sealing.spec_digest_hex);
  const sealed = fromHex(sealing.sealed_hex);
  const otherDigest = digest.slice();
  otherDigest[0] ^= 1;
  const wrongs = [
    [key, reportInfo(SESSION, 1n, digest), sealed],
    [key, reportInfo(new Uint8Array(16), 0n, digest), sealed],
    [key, reportInfo(SESSION, 0n, otherDigest), sealed],
    [fromHex(onion.recipient_private_key_hex), reportInfo(SESSION, 0n, digest), sealed],
    [key, envelopeInfo(SESSION, 0n, digest), sealed],
  ];
  for (const position of [0, 31, 32, 60, sealed.length - 1]) {
    const flipped = sealed.slice();
    flipped[position] ^= 0x01;
    wrongs.push([key, reportInfo(SESSION, 0n, digest), flipped]);
  }
  for (const [k, info, s] of wrongs) await assert.rejects(openSealed(k, info, s), SealingError);
});

test("sealing: a JS seal opens, is randomized, and a low-order key is refused typed", async () => {
  const digest = fromHex(sealing.spec_digest_hex);
  const sealer = await reportSealer(fromHex(sealing.recipient_public_key_hex), SESSION, 0n, digest);
  const payload = fromHex(sealing.plaintext_hex);
  const a = await sealer.seal(payload);
  const b = await sealer.seal(payload);
  assert.equal(a.length, payload.length + 48);
  assert.notEqual(hex(a.subarray(0, 32)), hex(b.subarray(0, 32))); // a fresh encapsulated key each time
  const info = reportInfo(SESSION, 0n, digest);
  assert.deepEqual(await openSealed(fromHex(sealing.recipient_private_key_hex), info, a), payload);
  const zero = await RoundSealer.create(new Uint8Array(32), info).catch((e) => e);
  const refused = zero instanceof Error ? zero : await zero.seal(payload).catch((e) => e);
  assert.ok(refused instanceof SealingError, String(refused));
  await assert.rejects(RoundSealer.create(new Uint8Array(31), info), InvalidParameter);
  assert.throws(() => reportInfo(SESSION, -1n, digest), InvalidParameter);
  assert.throws(() => reportInfo(SESSION, 1n << 63n, digest), InvalidParameter);
  assert.equal(hex(reportInfo(SESSION, 0x0102030405060708n, digest).subarray(19 + 16, 19 + 24)), "0102030405060708");
});

test("onion.json: the envelope info, sizes, credential, and the envelope opening to its admission", async () => {
  const digest = fromHex(onion.spec_digest_hex);
  assert.equal(hex(envelopeInfo(SESSION, 0n, digest)), onion.info_hex);
  const format = envelopeFormat(0n, onion.mechanism);
  assert.deepEqual(
    { sealed: format.sealedSize, admission: format.admissionSize, outer: format.outerSize, envelope: format.size },
    onion.sizes,
  );
  const envelopeBytes = fromHex(onion.envelope_hex);
  assert.equal(envelopeBytes.length, onion.sizes.envelope);
  const envelope = decodeMessage(envelopeBytes, "envelope");
  assert.equal(hex(encodeMessage(envelope)), onion.envelope_hex);
  assert.equal(envelope.outer.length, onion.sizes.outer);
  const admissionBytes = await openSealed(fromHex(onion.recipient_private_key_hex), fromHex(onion.info_hex), envelope.outer);
  assert.equal(hex(admissionBytes), onion.admission_hex);
  assert.equal(admissionBytes.length, onion.sizes.admission);
  const admission = decodeMessage(admissionBytes, "admission");
  assert.equal(hex(admission.credential), onion.credential_hex);
  assert.equal(hex(admission.nonce), onion.nonce_hex);
  assert.equal(hex(admission.sealed), onion.sealed_hex);
  assert.equal(hex(issueCredential(fromHex(onion.issuer_key_hex), fromHex(onion.client_id_hex))), onion.credential_hex);
  // The inner layer inside is sealing.json's.
  const plaintext = await openSealed(fromHex(sealing.recipient_private_key_hex), fromHex(sealing.info_hex), admission.sealed);
  assert.equal(hex(plaintext), sealing.plaintext_hex);
});

test("onion: a JS envelope has the round's one size whatever it carries, and opens with the vector's keys", async () => {
  const spec = decodeMessage(fromHex(signing.message_hex), "round-spec");
  const digest = specDigest(fromHex(signing.message_hex));
  const wrapper = await EnvelopeWrapper.create(spec, digest);
  const sealedA = new Uint8Array(onion.sizes.sealed).fill(0);
  const sealedB = new Uint8Array(onion.sizes.sealed).fill(0xff);
  const credential = fromHex(onion.credential_hex);
  const a = await wrapper.wrap(credential, sealedA);
  const b = await wrapper.wrap(credential, sealedB);
  assert.equal(a.envelope.length, onion.sizes.envelope);
  assert.equal(b.envelope.length, onion.sizes.envelope);
  assert.notEqual(hex(a.nonce), hex(b.nonce));
  const outer = decodeMessage(b.envelope, "envelope").outer;
  const admission = decodeMessage(await openSealed(fromHex(onion.recipient_private_key_hex), fromHex(onion.info_hex), outer), "admission");
  assert.deepEqual(admission.sealed, sealedB);
  assert.deepEqual(admission.nonce, b.nonce);
  await assert.rejects(wrapper.wrap(credential, new Uint8Array(onion.sizes.sealed - 1)), WrongSize);
  await assert.rejects(wrapper.wrap(credential.subarray(1), sealedA), InvalidParameter);
});

test("packing: k envelopes back to back, split as the shuffler splits them", () => {
  const size = onion.sizes.envelope;
  const envelopes = Array.from({ length: 12 }, (_, i) => new Uint8Array(size).fill(i));
  assert.equal(envelopesPerMessage(size, 4096), 11);
  assert.equal(envelopesPerMessage(10, 1 << 20), 64);
  const packed = packEnvelopes(envelopes, 11);
  assert.deepEqual(packed.map((m) => m.length), [11 * size, size]);
  assert.deepEqual(unpackEnvelopes(packed[0], size), envelopes.slice(0, 11));
  assert.deepEqual(unpackEnvelopes(packed[1], size), [envelopes[11]]);
  assert.deepEqual(unpackEnvelopes(new Uint8Array(size + 1), size).length, 1); // not k E: one (bad) envelope
  assert.throws(() => unpackEnvelopes(new Uint8Array(65 * size), size), MessageTooLarge);
  assert.throws(() => packEnvelopes([envelopes[0], new Uint8Array(size + 1)], 2), InvalidParameter);
  assert.throws(() => packEnvelopes(envelopes, 65), InvalidParameter);
});

test("signing.json: the spec's digest, signed string and signature", () => {
  const message = fromHex(signing.message_hex);
  const seed = fromHex(signing.private_seed_hex);
  assert.equal(hex(ed25519.getPublicKey(seed)), signing.public_key_hex);
  assert.equal(hex(specDigest(message)), signing.spec_digest_hex);
  assert.equal(hex(specSigningString(message)), signing.spec_signed_string_hex);
  assert.equal(hex(signSpecBytes(seed, message)), signing.signature_hex); // Ed25519 is deterministic
  verifyEd25519(fromHex(signing.public_key_hex), fromHex(signing.spec_signed_string_hex), fromHex(signing.signature_hex), "round spec");
  const signed = encodeMessage({ type: "signed-round-spec", specBytes: message, signature: fromHex(signing.signature_hex) });
  const { spec, digest, specBytes } = verifiedSpec(signed, fromHex(signing.public_key_hex));
  assert.equal(hex(digest), signing.spec_digest_hex);
  assert.deepEqual(specBytes, message);
  assert.equal(spec.params.mechanism, "hadamard-range");
  assert.equal(new TextDecoder().decode(fromHex(signing.spec_signed_string_hex).subarray(0, 30)), "shuffledp/v3/signed/round-spec");
});

for (const vector of signing.signed_messages) {
  test(`signing.json: ${vector.name}: zeroed in place, digest, signed string, signature`, () => {
    const message = fromHex(vector.message_hex);
    const signature = fromHex(vector.signature_hex);
    const at = signatureOffset(message, signature);
    assert.notEqual(at, undefined);
    const zeroed = message.slice();
    zeroed.fill(0, at, at + 64);
    assert.equal(hex(zeroed), vector.zeroed_hex);
    assert.equal(hex(zeroedDigest(message, at)), vector.digest_hex);
    assert.equal(hex(signingString(vector.type, fromHex(vector.digest_hex))), vector.signed_string_hex);
    verifyEd25519(fromHex(vector.public_key_hex), fromHex(vector.signed_string_hex), signature, vector.type);
    const decoded = decodeVerified(message, vector.type, fromHex(vector.public_key_hex));
    assert.equal(hex(encodeMessage(decoded)), vector.message_hex);
    // Re-signing the decoded message in JS gives the vector's bytes (Ed25519 is deterministic).
    const seed = vector.type === "batch-ack" ? fromHex(signing.private_seed_hex) : VECTOR_SHUFFLER_SEED;
    assert.equal(hex(ed25519.getPublicKey(seed)), vector.public_key_hex);
    assert.equal(hex(signedMessage(decoded, seed)), vector.message_hex);
    // The signature covers its type: the same bytes do not verify as another type's string.
    const other = vector.type === "round-outcome" ? "admission-receipts" : "round-outcome";
    assert.throws(() => verifyEd25519(fromHex(vector.public_key_hex), signingString(other, fromHex(vector.digest_hex)), signature, other), BadSignature);
    // Any flipped byte of the message fails (a decoding error, or the signature).
    for (const position of [0, at - 1, at, at + 63, message.length - 1]) {
      const flipped = message.slice();
      flipped[position] ^= 0x01;
      assert.throws(() => decodeVerified(flipped, vector.type, fromHex(vector.public_key_hex)), (e) => e instanceof BadSignature || e instanceof MalformedMessage);
    }
    assert.throws(() => decodeVerified(message, vector.type, OTHER.signingPublic), BadSignature);
  });
}

test("signing: signatures are checked strictly (RFC 8032: a non-canonical S is refused)", () => {
  const vector = signing.signed_messages[0];
  const signature = fromHex(vector.signature_hex);
  // S + L, with L the group order: the same point equation holds, but S is not reduced.
  const L = 2n ** 252n + 27742317777372353535851937790883648493n;
  let s = 0n;
  for (let i = 63; i >= 32; i--) s = (s << 8n) | BigInt(signature[i]);
  s += L;
  const malleable = signature.slice();
  for (let i = 32; i < 64; i++) {
    malleable[i] = Number(s & 0xffn);
    s >>= 8n;
  }
  assert.equal(s, 0n); // S + L still fits 256 bits
  assert.throws(() => verifyEd25519(fromHex(vector.public_key_hex), fromHex(vector.signed_string_hex), malleable, "t"), BadSignature);
});

test("credentials: the assigned instance follows SHA-256 of the label, the spec digest and the client id", () => {
  const digest = fromHex(signing.spec_digest_hex);
  const clientId = fromHex(onion.client_id_hex);
  assert.equal(assignedInstance(clientId, 1, digest), 0);
  const counts = new Array(4).fill(0);
  for (let i = 0; i < 400; i++) counts[assignedInstance(Uint8Array.of(i & 0xff, i >> 8, ...new Uint8Array(14)), 4, digest)]++;
  // 400 ids over 4 instances: each count is Binomial(400, 1/4), mean 100, sd 8.7; P(any < 50) < 1e-8.
  for (const count of counts) assert.ok(count > 50, String(counts));
  assert.throws(() => assignedInstance(clientId, 0, digest), InvalidParameter);
});

// A device refusing what does not verify.

function device(overrides = {}) {
  const ledger = new MemoryLedger({ epsilonBudget: 10, deltaBudget: 1e-3 });
  const client = new Client({
    localData: 1.5,
    analyzerSigningKey: ANALYZER.signingPublic,
    credential: credentialOf(0xc1),
    ledger,
    shufflerSigningKey: SHUFFLER.signingPublic,
    shufflerKey: SHUFFLER.hpkePublic,
    clock: () => 1_800_000_000,
    ...overrides,
  });
  return { client, ledger };
}

test("a device refuses a spec signed by another key, and a bit-flipped spec, charging nothing", async () => {
  const { client, ledger } = device();
  const spec = roundSpec();
  await assert.rejects(client.answer(signedSpec(spec, OTHER.signingSeed)), BadSignature);
  const good = signedSpec(spec);
  const specBytes = encodeMessage(spec);
  const start = good.length - specBytes.length; // keys in order t, v, signature, spec_bytes: the spec comes last
  assert.equal(hex(good.subarray(start, start + specBytes.length)), hex(specBytes));
  for (const offset of [0, 10, specBytes.length - 1]) {
    const flipped = good.slice();
    flipped[start + offset] ^= 0x01;
    await assert.rejects(client.answer(flipped), BadSignature);
  }
  const flippedSignature = good.slice();
  const at = signatureOffset(good, decodeMessage(good, "signed-round-spec").signature);
  flippedSignature[at + 10] ^= 0x01;
  await assert.rejects(client.answer(flippedSignature), BadSignature);
  assert.equal((await ledger.snapshot()).spentEpsilon, 0);
  const answer = await client.answer(good);
  assert.equal(answer.envelopes.length, 1);
});

test("a device refuses a spec naming another shuffler key, either one, charging nothing", async () => {
  const { client, ledger } = device();
  await assert.rejects(client.answer(signedSpec(roundSpec({ shufflerSigningKey: OTHER.signingPublic }))), UntrustedRound);
  await assert.rejects(client.answer(signedSpec(roundSpec({ shufflerKey: OTHER.hpkePublic }))), UntrustedRound);
  assert.equal((await ledger.snapshot()).answered.length, 0);
  // Pinning one key without the other is refused at construction.
  assert.throws(() => device({ shufflerKey: undefined }), InvalidParameter);
  assert.throws(() => device({ shufflerSigningKey: undefined }), InvalidParameter);
});

test("a device refuses forged receipts and outcomes, and keeps its ledger as it was", async () => {
  const { client, ledger } = device();
  const spec = roundSpec();
  const answer = await client.answer(signedSpec(spec));
  const common = { sessionId: spec.sessionId, roundId: spec.roundId, specDigest: answer.digest };
  const receipts = { type: "admission-receipts", ...common, admitted: answer.nonces, refused: [], reasons: [] };
  const outcome = { type: "round-outcome", ...common, outcome: "failed", reason: "batch-too-small", admitted: 0, batchId: new Uint8Array(16), instance: 0 };
  assert.throws(() => client.settleReceipts(signedMessage(receipts, OTHER.signingSeed)), BadSignature);
  assert.throws(() => client.settleReceipts(signedMessage(receipts, ANALYZER.signingSeed)), BadSignature);
  await assert.rejects(client.settleOutcome(signedMessage(outcome, OTHER.signingSeed)), BadSignature);
  // A genuine signature on altered bytes fails too.
  const genuine = signedMessage(outcome);
  const altered = genuine.slice();
  altered[genuine.length - 10] ^= 0x01; // inside the spec digest, the last field: another spec's word
  await assert.rejects(client.settleOutcome(altered), (e) => e.reason === "unknown-round");
  const reason = genuine.slice();
  reason[hex(genuine).indexOf(hex(new TextEncoder().encode("batch-too-small"))) / 2] ^= 0x01;
  await assert.rejects(client.settleOutcome(reason), BadSignature);
  assert.equal(client.sentRound(spec.sessionId, spec.roundId).admitted, 0);
  assert.equal(await ledger.outcomeOf(spec.sessionId, spec.roundId), undefined);
  // The genuine ones are taken.
  assert.equal(client.settleReceipts(signedMessage(receipts)).admitted, 1);
  assert.equal((await client.settleOutcome(genuine)).outcome, "failed:batch-too-small");
  assert.equal(await ledger.outcomeOf(spec.sessionId, spec.roundId), "failed:batch-too-small");
});

test("a JS device's envelope opens with the shuffler's and the analyzer's keys", async () => {
  const { client } = device();
  const spec = roundSpec();
  const answer = await client.answer(signedSpec(spec));
  const opened = await openEnvelope(answer.envelopes[0], spec);
  assert.deepEqual(opened.admission.nonce, answer.nonces[0]);
  assert.deepEqual(opened.admission.credential, credentialOf(0xc1));
  assert.equal(opened.values.length, 2);
  assert.equal(answer.envelopes[0].length, envelopeFormat(0n, "hadamard-range").size);
});

test("the native (WebCrypto) and the portable X25519 KEMs seal and open each other's payloads", async () => {
  const { portableOrNativeSuite, hpkeSuite } = await import("../dist/wire/sealing.js");
  const native = portableOrNativeSuite(true);
  const portable = portableOrNativeSuite(false);
  const info = new TextEncoder().encode("shuffledp/v3/report cross-check");
  const plaintext = new Uint8Array(74).map((_, i) => i);
  for (const [sealer, opener] of [[native, portable], [portable, native]]) {
    const keys = await opener.kem.generateKeyPair();
    const raw = await opener.kem.serializePublicKey(keys.publicKey);
    const recipient = await sealer.kem.deserializePublicKey(raw);
    const sealed = await sealer.seal({ recipientPublicKey: recipient, info }, plaintext);
    const opened = new Uint8Array(await opener.open({ recipientKey: keys, enc: sealed.enc, info }, sealed.ct));
    assert.deepEqual(opened, plaintext);
  }
  // Node >= 20 has WebCrypto X25519, so the device path uses it.
  const { DhkemX25519HkdfSha256: NativeKem } = await import("@hpke/core");
  const { DhkemX25519HkdfSha256: PortableKem } = await import("@hpke/dhkem-x25519");
  assert.ok(native.kem instanceof NativeKem && portable.kem instanceof PortableKem);
  assert.ok((await hpkeSuite()).kem instanceof NativeKem);
});
