/**
 * Fixed-size report plaintexts (`docs/wire-format.md`, "Padding"; mirrors
 * `protocol/wire/report_format.py`).
 *
 * A CBOR integer takes 1 to 9 bytes, so an unpadded sealed report would leak something about
 * its value through its length. Every report plaintext of a round is therefore its
 * deterministic encoding followed by zero bytes up to
 *
 *     size(round_id, mechanism) = len(encode(report{round_id, mechanism, values = [-2^62] * k}))
 *
 * (each of the mechanism's k values at its widest, 9 bytes), which depends only on the round
 * id and the mechanism. Every sealed payload of a round is `size + 48` bytes.
 */

import { readCborItem } from "./cbor.js";
import { BadPadding, MalformedMessage, WrongSize } from "./errors.js";
import { type Mechanism, type Report, VALUE_LIMIT, encodeMessage, messageFromBody, valuesPerReport } from "./messages.js";

/** Bytes HPKE adds to a plaintext: the X25519 encapsulated key (32) and the AEAD tag (16). */
export const HPKE_OVERHEAD = 48;

/** The length every report plaintext of the round is padded to. */
export function paddedSize(roundId: bigint, mechanism: Mechanism): number {
  const width = valuesPerReport(mechanism);
  const widest: Report = { type: "report", roundId, mechanism, values: new Array<bigint>(width).fill(-VALUE_LIMIT) };
  return encodeMessage(widest).length;
}

/** The length of every sealed payload of the round: {@link paddedSize} + {@link HPKE_OVERHEAD}. */
export function sealedSize(roundId: bigint, mechanism: Mechanism): number {
  return paddedSize(roundId, mechanism) + HPKE_OVERHEAD;
}

/**
 * The padded plaintext of the round's report of `values`: its deterministic encoding followed
 * by zeros up to {@link paddedSize}. Values the report cannot hold (wrong count, outside
 * `[-2^62, 2^62)`) raise {@link InvalidParameter} from the encoder.
 */
export function encodePadded(roundId: bigint, mechanism: Mechanism, values: bigint[]): Uint8Array {
  const encoded = encodeMessage({ type: "report", roundId, mechanism, values });
  const size = paddedSize(roundId, mechanism);
  if (encoded.length > size) throw new WrongSize(`report of ${encoded.length} bytes exceeds the round's ${size}`);
  const out = new Uint8Array(size);
  out.set(encoded);
  return out;
}

/**
 * The values of a padded report plaintext of this round, or a typed error: {@link WrongSize}
 * for any length but the round's, {@link MalformedMessage} for bytes that are not one strict
 * report of this round and mechanism, {@link BadPadding} for non-zero bytes after the report.
 * Value ranges beyond the format's `|v| < 2^62` are the mechanism's to check.
 */
export function decodePadded(roundId: bigint, mechanism: Mechanism, plaintext: Uint8Array): bigint[] {
  if (!(plaintext instanceof Uint8Array)) throw new MalformedMessage("expected bytes");
  const size = paddedSize(roundId, mechanism);
  if (plaintext.length !== size) throw new WrongSize(`report plaintext of ${plaintext.length} bytes, expected ${size}`);
  const { value, end } = readCborItem(plaintext);
  const report = messageFromBody(value, "report", end) as Report;
  if (report.roundId !== roundId || report.mechanism !== mechanism) {
    throw new MalformedMessage("not a report of this round's layout");
  }
  for (let i = end; i < plaintext.length; i++) {
    if (plaintext[i] !== 0) throw new BadPadding("report padding must be zero bytes");
  }
  return report.values;
}
