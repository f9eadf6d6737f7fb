/**
 * The typed error hierarchy of the device client, mirroring `protocol/errors.py`.
 *
 * Every error raised on purpose is a {@link ShuffleDPError} carrying a `reason`, the same
 * string as the Python class's `reason` attribute, so a caller can count refusals by reason
 * and tell a bug (any other exception) from a refused input.
 */

/** Base of every error the client raises on purpose. */
export class ShuffleDPError extends Error {
  /** The refusal's class, equal to the Python `reason` of the same error. */
  readonly reason: string;

  constructor(message: string, reason = "error") {
    super(message);
    this.reason = reason;
    this.name = new.target.name;
  }
}

/** A parameter out of its domain; the message names the parameter and the rule. */
export class InvalidParameter extends ShuffleDPError {
  /** The parameter's name. */
  readonly parameter: string;

  constructor(name: string, problem: string) {
    super(`${name}: ${problem}`, "invalid-parameter");
    this.parameter = name;
  }
}

/** Bytes that do not decode to a valid message (bad CBOR, schema, size or version). */
export class MalformedMessage extends ShuffleDPError {
  constructor(message: string, reason = "malformed") {
    super(message, reason);
  }
}

/** A message of a wire-format version this build does not speak. */
export class UnsupportedVersion extends MalformedMessage {
  constructor(message: string) {
    super(message, "unsupported-version");
  }
}

/** A message over the codec's hard size limit. */
export class MessageTooLarge extends MalformedMessage {
  constructor(message: string) {
    super(message, "too-large");
  }
}

/** Short name of {@link MessageTooLarge}. */
export { MessageTooLarge as TooLarge };

/** A report value that no honest randomizer of the round can produce. */
export class ValueOutOfRange extends MalformedMessage {
  constructor(message: string) {
    super(message, "out-of-range");
  }
}

/** A sealed payload or report plaintext that is not the round's fixed size. */
export class WrongSize extends MalformedMessage {
  constructor(message: string) {
    super(message, "wrong-size");
  }
}

/** A report plaintext whose bytes after the report are not all zero. */
export class BadPadding extends MalformedMessage {
  constructor(message: string) {
    super(message, "bad-padding");
  }
}

/** The same sealed report seen twice in one round. */
export class DuplicateReport extends ShuffleDPError {
  constructor(message: string) {
    super(message, "duplicate");
  }
}

/** A sealed payload that failed to open: tampered, or sealed for another session, round or spec. */
export class SealingError extends ShuffleDPError {
  constructor(message: string) {
    super(message, "unsealable");
  }
}

/** Short name of {@link SealingError}. */
export { SealingError as Unsealable };

/** A signature that does not verify (a round spec, or a shuffler-signed message). */
export class BadSignature extends ShuffleDPError {
  constructor(message: string) {
    super(message, "bad-signature");
  }
}

/** A credential whose tag does not verify. */
export class BadCredential extends ShuffleDPError {
  constructor(message: string) {
    super(message, "bad-credential");
  }
}

/** A message about a round that is not the one expected. */
export class UnknownRound extends ShuffleDPError {
  constructor(message: string) {
    super(message, "unknown-round");
  }
}

/** A report whose nonce was already admitted. */
export class ReplayedReport extends ShuffleDPError {
  constructor(message: string) {
    super(message, "replay");
  }
}

/** More reports for a round than the round allows. */
export class QuotaExceeded extends ShuffleDPError {
  constructor(message: string, reason = "quota") {
    super(message, reason);
  }
}

/** The round already holds its maximum batch. */
export class RoundFull extends QuotaExceeded {
  constructor(message: string) {
    super(message, "round-full");
  }
}

/** A round that would overspend the device's local privacy budget. */
export class BudgetExceeded extends ShuffleDPError {
  constructor(message: string) {
    super(message, "budget");
  }
}

/** A round closed at its deadline with fewer reports than its minimum batch. */
export class BatchTooSmall extends ShuffleDPError {
  constructor(message: string) {
    super(message, "batch-too-small");
  }
}

/** A channel that could not connect or lost its connection. */
export class TransportError extends ShuffleDPError {
  constructor(message: string) {
    super(message, "transport");
  }
}

/** A credential that keeps sending refused envelopes in one round. */
export class RateLimited extends ShuffleDPError {
  constructor(message: string) {
    super(message, "rate-limited");
  }
}

/** An envelope from a credential assigned to another shuffler instance of the round. */
export class WrongInstance extends ShuffleDPError {
  constructor(message: string) {
    super(message, "wrong-instance");
  }
}

/** A round whose deadline has passed. */
export class RoundExpired extends ShuffleDPError {
  constructor(message: string) {
    super(message, "expired");
  }
}

/** A spec naming a shuffler other than the pinned one, or promising too small a crowd. */
export class UntrustedRound extends ShuffleDPError {
  constructor(message: string) {
    super(message, "untrusted-round");
  }
}

/** Reason counted for an exception that is not a {@link ShuffleDPError}: a bug, never an input class. */
export const INTERNAL_ERROR = "internal-error";
