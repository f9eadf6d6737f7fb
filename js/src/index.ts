/**
 * `@shuffledp/client`: the shuffledp device client for web pages and Node.
 *
 * This entry point runs anywhere Web Crypto does (current browsers, Node >= 20, workers): it
 * imports no Node built-in. It holds the device {@link Client}, the privacy ledgers kept in
 * memory and in IndexedDB, the platform random source, the wire-format-3 message codec, the
 * typed errors, the randomizers' dispatch, the onion-envelope helpers and the enrollment
 * parsers. Other entry points of the package:
 *
 * - `@shuffledp/client/node`: everything here, plus the ledger kept in a file and the readers of
 *   key, password and CA files (Node only);
 * - `@shuffledp/client/mqtt`: the round loop over MQTT (`mqtts://` in Node, `wss://` in browsers
 *   and Node);
 * - `@shuffledp/client/testing`: a seeded random source and the parties' halves of the protocol
 *   (issuing credentials, signing specs, opening sealed payloads), for tests only.
 *
 * @module
 */

// ------------------------------------------------------------------------------ the device

export { Client, SentRound, type Answer, type ClientOptions } from "./client/client.js";

// ------------------------------------------------------------------------------ privacy ledgers

export {
  CorruptLedger,
  LEDGER_STATE_VERSION,
  MemoryLedger,
  SUM_TOLERANCE,
  chargeRound,
  checkRound,
  copyLedgerState,
  lostRoundsOf,
  newLedgerState,
  parseLedgerState,
  roundKey,
  sameBudget,
  withOutcome,
  type LedgerBudget,
  type LedgerState,
  type PrivacyLedger,
  type RoundRef,
} from "./ledger/ledger.js";
export {
  IndexedDbLedger,
  LEDGER_STORE,
  type IndexedDbLedgerOptions,
  type PersistentStorage,
} from "./ledger/indexedDbLedger.js";

// ------------------------------------------------------------------------------ randomness

export { SystemSource, type RandomSource } from "./random/source.js";

// ------------------------------------------------------------------------------ messages (wire format 3)

export {
  WIRE_VERSION,
  CREDENTIAL_BYTES,
  NONCE_BYTES,
  SESSION_ID_BYTES,
  SPEC_DIGEST_BYTES,
  MAX_MESSAGE_BYTES,
  MESSAGE_LIMITS,
  decodeMessage,
  decodeRoundSpec,
  encodeMessage,
  hasLocalGuarantee,
  isTypedError,
  messagesPerUserOf,
  minReports,
  valuesPerReport,
  type Admission,
  type AdmissionReceipts,
  type BatchAck,
  type CoordinateTreeParams,
  type DecodeOptions,
  type Envelope,
  type HadamardRangeParams,
  type LocalVectorParams,
  type Mechanism,
  type MechanismParams,
  type Message,
  type MessageOf,
  type MessageType,
  type ModularSumParams,
  type ProjectedMeanParams,
  type Report,
  type RoundOutcome,
  type RoundSpec,
  type ShiftedNormParams,
  type ShiftedVectorSumParams,
  type ShuffledBatch,
  type SignedRoundSpec,
  type VectorMeanParams,
  type VectorRangeParams,
  type VectorSumParams,
} from "./wire/messages.js";

// ------------------------------------------------------------------------------ errors

export {
  BadCredential,
  BadPadding,
  BadSignature,
  BatchTooSmall,
  BudgetExceeded,
  DuplicateReport,
  INTERNAL_ERROR,
  InvalidParameter,
  MalformedMessage,
  MessageTooLarge,
  QuotaExceeded,
  RateLimited,
  ReplayedReport,
  RoundExpired,
  RoundFull,
  SealingError,
  ShuffleDPError,
  TooLarge,
  TransportError,
  UnknownRound,
  Unsealable,
  UnsupportedVersion,
  UntrustedRound,
  ValueOutOfRange,
  WrongInstance,
  WrongSize,
} from "./wire/errors.js";

// ------------------------------------------------------------------------------ randomizers

export {
  checkReportValues,
  randomizeChecked,
  randomizeRound,
  reportRanges,
  type ValueRange,
} from "./mechanisms/index.js";

// ------------------------------------------------------------------------------ onion envelopes and signatures

export {
  EnvelopeWrapper,
  decodeVerified,
  envelopeFormat,
  envelopesPerMessage,
  packEnvelopes,
  specDigest,
  verifiedSpec,
  type EnvelopeFormat,
  type SignedType,
  type VerifiedSpec,
  type WrappedEnvelope,
} from "./wire/onion.js";
export { RoundSealer, reportSealer } from "./wire/sealing.js";
export { HPKE_OVERHEAD, paddedSize, sealedSize } from "./wire/reportFormat.js";
export { assignedInstance, clientIdOf } from "./wire/credentials.js";

// ------------------------------------------------------------------------------ enrollment

export {
  CREDENTIALS_FORMAT,
  EnrollmentError,
  PUBLIC_FORMAT,
  deviceEnrollments,
  hexBytes,
  parseCredentials,
  parsePublicInfo,
  type BrokerAccount,
  type DeviceEnrollment,
  type PublicInfo,
} from "./enrollment.js";
