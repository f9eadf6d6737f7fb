/**
 * The device's round loop over MQTT (mqtt.js), mirroring `shuffledp/deploy/fleet.py`.
 *
 * A {@link DeviceSession} holds one broker connection (`mqtts://` over TCP with TLS in Node,
 * `wss://` MQTT over WebSocket with TLS in browsers and Node) with one client account, and
 * serves one session for one or more devices ({@link AnsweringDevice}, in practice the
 * package's `Client`): a phone is one device on its own connection; a gateway or a test
 * fleet may serve many over one.
 *
 * * **Specs.** It subscribes to the session's spec topic (retained). Each signed spec is
 *   verified against the pinned analyzer key before anything else happens; a round seen
 *   before (the retained spec again) is ignored. For a new round it subscribes to the round's
 *   receipts and outcome topics first, so no receipt is missed, then each device answers:
 *   `Client.answer` verifies the spec, randomizes, seals and charges the device's ledger
 *   before returning, so nothing leaves a device that its ledger has not paid for.
 * * **Publishing.** Envelopes go to the device's shuffler instance's reports topic with QoS 1,
 *   at most `window` publishes awaiting their acknowledgement at once.
 * * **Receipts.** An envelope is kept until a signed receipt names its nonce (admitted or
 *   refused). Without one, the *same bytes* are sent again once its wait is over
 *   (`retryInterval`, doubled per copy up to 8 times), if either a receipt has since named an
 *   envelope sent after it on the same instance (MQTT keeps one publisher's order, so it was
 *   lost) or no receipt at all came for `retryInterval` (the shuffler is away). At most
 *   `maxCopies` copies leave; the shuffler admits an exact copy once and names it again.
 *   Retransmission is driven by one timer, never a loop that spins.
 * * **Outcome.** A round ends for a device when its instance's signed, retained outcome
 *   arrives: every device that answered there settles it (`Client.settleOutcome`, which records
 *   it in the device's ledger: a failed round is a lost round, and stays charged). Without an
 *   outcome the session gives up `grace` after the round's deadline and reports the round as
 *   lost (no outcome).
 * * **Lost after release.** `released` is not final: the shuffler gives up a batch the analyzer
 *   never acknowledges (its ack timeout, 600 s after the round's deadline by default) and then
 *   signs `failed` (`not-acknowledged`) for the round, retained over `released`. So a round that
 *   ended with an instance's `released` keeps that instance's outcome subscription (the same one:
 *   nothing published meanwhile is missed) while it is *followed* (the `follow` option; receipts
 *   topics go at once). A later `failed` is verified like the first outcome, then settled by every
 *   device that answered there (the round is lost in its ledger, still charged) and recorded in
 *   the round's {@link DeviceRound} (no longer released); the subscription goes then. Outcomes are
 *   taken only forward, as `Client.settleOutcome` and the ledgers take them: a failed outcome is
 *   final, and a `released` relayed again after it changes nothing. Following costs one
 *   subscription and the answering devices' indices per round, and at most `maxFollowedRounds`
 *   rounds are followed at once (the one released first stops first).
 *
 * Every byte received is hostile. A message on a topic the session did not subscribe to, one
 * that does not decode, does not verify, or speaks of another session, round or instance is
 * refused and counted in {@link DeviceSession.badMessages} by reason; it never stops the loop
 * (a message on a round's topic after that round ended, a late receipt say, is ignored).
 * A spec is verified as it arrives, so junk and copies of a round already seen are dropped at
 * once and never wait behind a round being answered; a QoS 2 publish (the device subscribes at
 * QoS 1 only) is dropped unread; an ended round keeps only its record; {@link DeviceSession.close}
 * does not wait for acknowledgements the broker withholds.
 * A failure that is not a {@link ShuffleDPError} (a bug) is counted as `internal-error` and
 * reported through `onEvent`, never thrown from an event handler. Connection failures surface
 * as {@link TransportError}.
 *
 * This module imports no Node built-in, so it bundles for browsers; reading a CA file or a
 * password file from disk is `enrollmentFiles.ts`'s job.
 */

import { bytesToHex } from "@noble/hashes/utils.js";
import mqtt from "mqtt";
import type { IClientOptions, IStore, MqttClient } from "mqtt";

import type { BrokerAccount } from "../enrollment.js";
import { INTERNAL_ERROR, ShuffleDPError, TransportError } from "../wire/errors.js";
import type { AdmissionReceipts, RoundOutcome, RoundSpec } from "../wire/messages.js";
import { decodeVerified, verifiedSpec, type VerifiedSpec } from "../wire/onion.js";

/** What a device's answer to a round gives the transport (the `Client`'s `Answer`). */
export interface DeviceAnswer {
  spec: RoundSpec;
  /** The digest of the spec bytes answered. */
  digest: Uint8Array;
  envelopes: Uint8Array[];
  nonces: Uint8Array[];
  instance: number;
}

/** A device the session serves: the package's `Client` is one. */
export interface AnsweringDevice {
  /** Verifies, randomizes, seals and charges the ledger; throws a {@link ShuffleDPError} to decline. */
  answer(signedSpec: Uint8Array): Promise<DeviceAnswer>;
  /** Takes signed receipts naming this device's nonces (verifies them; throws if they do not). */
  settleReceipts(bytes: Uint8Array): unknown;
  /** Takes the signed round outcome (verifies it and records it in the ledger). */
  settleOutcome(bytes: Uint8Array): Promise<unknown>;
  /** The shuffler instance this device's envelopes of the round go to, if the device can say before answering. */
  instanceFor?(spec: RoundSpec, digest: Uint8Array): number;
}

/** Something the session did or refused, one line each (for logs and tests). */
export interface DeviceEvent {
  kind:
    | "connected"
    | "reconnecting"
    | "offline"
    | "transport-error"
    | "round-answered"
    | "retransmitted"
    | "round-ended"
    | "round-lost"
    | "follow-ended"
    | "refused-message"
    | "internal-error";
  roundId?: bigint;
  text: string;
}

/** What the session did in one round, and what the shuffler said of it (as `FleetRound`). */
export interface DeviceRound {
  roundId: bigint;
  mechanism: string;
  epsilon0: number;
  /** Envelopes published (first transmissions). */
  sent: number;
  /** Devices that declined to answer, by reason (budget, expired, untrusted-round, round-over, ...). */
  declined: Record<string, number>;
  /** Envelopes a signed receipt says were admitted (each counted once). */
  admitted: number;
  /** Envelopes a signed receipt says were refused, by reason. */
  refused: Record<string, number>;
  /** Copies sent again because no receipt came. */
  retransmitted: number;
  /** Envelopes without a receipt when the round ended for them. */
  unacknowledged: number;
  /** Publishes that failed (the envelope stayed pending and was sent again). */
  publishErrors: number;
  /**
   * Instance -> `"released"` or `"failed:<reason>"`, from signed outcomes; a released one turns
   * failed if the shuffler gives its batch up while the round is followed (`follow`).
   */
  outcomes: Record<number, string>;
  /** Instances the session's answering devices were assigned to. */
  instances: number[];
  /** Devices that answered. */
  answered: number;
  /** Whether the session gave up waiting for an outcome (deadline + grace passed). */
  gaveUp: boolean;
}

/** Whether every instance the session's devices used released its batch. */
export function roundReleased(round: DeviceRound): boolean {
  return round.instances.length > 0 && round.instances.every((i) => round.outcomes[i] === "released");
}

/** Options of a {@link DeviceSession}. Times are milliseconds. */
export interface DeviceSessionOptions {
  /** The broker URL and client account (see {@link BrokerAccount}). */
  broker: BrokerAccount;
  /** The session to serve (`public.json`'s `session_id`). */
  sessionId: Uint8Array;
  /** The analyzer's pinned Ed25519 key (`public.json`); every device pins the same. */
  analyzerSigningKey: Uint8Array;
  /** The devices served over this connection (at least one). */
  devices: AnsweringDevice[];
  /** {@link DeviceSession.serve} resolves once this many rounds have ended (default: only on close). */
  rounds?: number;
  /** Wait before a first copy is sent again (default 2000 ms; doubled per copy up to 8 times). */
  retryInterval?: number;
  /** Most copies of one envelope sent, the first included (default 8). */
  maxCopies?: number;
  /** How long after a round's deadline the session waits for its outcome (default 10000 ms). */
  grace?: number;
  /** Most publishes awaiting their acknowledgement at once (default 64). */
  window?: number;
  /**
   * How long a round whose outcome was `released` stays followed, for a `failed` outcome the
   * shuffler may sign later (see the module's description); it stops early once the round failed.
   *
   * * Without `rounds` (a long-lived session, a web page): `follow` ms after the round's release;
   *   default `Infinity`, as long as the session is open (the device cannot know the shuffler's
   *   ack timeout, and a page that stops listening earlier would miss a loss).
   * * With `rounds` (a process or test serving so many rounds, {@link runDevice}): every released
   *   round is followed while the session serves, and for `follow` ms after its last round ended;
   *   {@link DeviceSession.serve} resolves only once no round is followed. Default 0: stop with the
   *   last round, as `shuffledp clients run` does without `--follow`. The shuffler's ack timeout
   *   runs from a round's deadline, so to learn of every loss, cover it.
   */
  follow?: number;
  /**
   * Most released rounds followed at once (default {@link MAX_FOLLOWED_ROUNDS}): past it, the
   * round released first stops being followed. What bounds a long-lived session's memory.
   */
  maxFollowedRounds?: number;
  /** Longest wait for the first connection (default 15000 ms). */
  connectTimeout?: number;
  /** MQTT client id (default `shuffledp-client-` and 128 random bits: never guessable). */
  clientId?: string;
  /** Wall clock in seconds since the epoch, as round deadlines are (default `Date.now() / 1000`). */
  clock?: () => number;
  /** Receives one {@link DeviceEvent} per notable event. */
  onEvent?: (event: DeviceEvent) => void;
}

/** Default of `maxFollowedRounds`: most rounds a {@link DeviceSession} follows at once after their release. */
export const MAX_FOLLOWED_ROUNDS = 64;

/** Counters and rounds of a finished session. */
export interface DeviceSessionResult {
  rounds: DeviceRound[];
  badMessages: Record<string, number>;
  reconnects: number;
}

const TOPIC_ROOT = "shuffledp";
/** MQTT CONNACK codes that mean the broker refused who we are (3.1.1: 4, 5; MQTT 5: 0x86, 0x87). */
const REFUSED_IDENTITY = new Set([4, 5, 0x86, 0x87]);

/**
 * mqtt.js's store of received QoS 2 publishes, which keeps none. mqtt.js holds each QoS 2 publish
 * until the broker's PUBREL; a hostile broker that never sends one would have the device hold up
 * to 65,535 payloads of its choosing. The device subscribes at QoS 1 only, so no honest broker
 * sends QoS 2: such a publish is acknowledged and dropped, unread (a later PUBREL finds nothing
 * and is completed).
 */
class NoQos2Store {
  put(_packet: unknown, cb?: () => void): this {
    cb?.();
    return this;
  }

  get(_packet: unknown, cb?: (error?: Error) => void): this {
    cb?.(new Error("missing packet"));
    return this;
  }

  del(_packet: unknown, cb?: (error?: Error) => void): this {
    cb?.(new Error("missing packet"));
    return this;
  }

  createStream(): never {
    throw new TransportError("the store of received QoS 2 publishes holds none to replay");
  }

  close(cb?: () => void): void {
    cb?.();
  }
}

interface Pending {
  envelope: Uint8Array;
  topic: string;
  instance: number;
  device: number;
  seq: number;
  sentAt: number;
  copies: number;
}

interface RoundState {
  spec: RoundSpec;
  specDigest: Uint8Array;
  record: DeviceRound;
  topics: Map<string, { kind: "receipts" | "outcome"; instance: number }>;
  pending: Map<string, Pending>;
  /** device index -> instance, for devices that answered. */
  answeredBy: Map<number, number>;
  answering: boolean;
  ended: boolean;
  /** Ended, and followed: `followedInstances` released, and a later `failed` may still come. */
  following: boolean;
  followedInstances: Set<number>;
  /** When (`Date.now()`) the round ended with a release. */
  releasedAt: number;
  /** Outcome settlements of the round's devices, one after the other (each device sees them in order). */
  settling: Promise<void>;
  /** instance -> its verified outcome message, for a device whose answer completes after it came. */
  outcomeBytes: Map<number, Uint8Array>;
  lastReceipt: number;
  newestReceipted: Map<number, number>;
  order: number;
}

function hex(bytes: Uint8Array): string {
  return bytesToHex(bytes);
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

function increment(counter: Record<string, number>, key: string, by = 1): void {
  counter[key] = (counter[key] ?? 0) + by;
}

function reasonOf(error: unknown): string {
  return error instanceof ShuffleDPError ? error.reason : INTERNAL_ERROR;
}

function randomClientId(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return `shuffledp-client-${hex(bytes)}`;
}

function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare);
}

/** The payload as mqtt.js wants it: a Buffer where one exists (Node), else the bytes themselves. */
function payloadOf(bytes: Uint8Array): Uint8Array {
  const BufferClass = (globalThis as { Buffer?: { from(a: ArrayBufferLike, o: number, l: number): Uint8Array } }).Buffer;
  return BufferClass ? BufferClass.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) : bytes;
}

/** Topic of the session's signed specs (retained). */
export function specTopic(sessionId: Uint8Array): string {
  return `${TOPIC_ROOT}/${hex(sessionId)}/spec`;
}

/** Topic a device publishes its envelopes of a round to, for its shuffler instance. */
export function reportsTopic(sessionId: Uint8Array, roundId: bigint, instance: number): string {
  return `${TOPIC_ROOT}/${hex(sessionId)}/${roundId}/${instance}/reports`;
}

/** Topic of a round's signed admission receipts for one shuffler instance. */
export function receiptsTopic(sessionId: Uint8Array, roundId: bigint, instance: number): string {
  return `${TOPIC_ROOT}/${hex(sessionId)}/${roundId}/${instance}/receipts`;
}

/** Topic of a round's signed outcome for one shuffler instance (retained). */
export function outcomeTopic(sessionId: Uint8Array, roundId: bigint, instance: number): string {
  return `${TOPIC_ROOT}/${hex(sessionId)}/${roundId}/${instance}/outcome`;
}

/** A one-permit-per-publish window of at most `size` publishes in flight. */
class Window {
  private free: number;
  private readonly waiting: Array<() => void> = [];

  constructor(size: number) {
    this.free = size;
  }

  async acquire(): Promise<void> {
    if (this.free > 0) {
      this.free -= 1;
      return;
    }
    await new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  release(): void {
    const next = this.waiting.shift();
    if (next) {
      next();
    } else {
      this.free += 1;
    }
  }
}

/**
 * One broker connection serving one session for `devices` (see the module's description).
 * Open it with {@link DeviceSession.open}, run rounds with {@link DeviceSession.serve}, end it
 * with {@link DeviceSession.close}; or do all three with {@link runDevice}.
 */
export class DeviceSession {
  /** Messages refused, by reason (e.g. `spec-bad-signature`, `receipts-other-round`, `unexpected-topic`). */
  readonly badMessages: Record<string, number> = {};
  /** Successful re-connections after the first. */
  reconnects = 0;

  private readonly options: Required<Omit<DeviceSessionOptions, "rounds" | "onEvent" | "clientId">> &
    Pick<DeviceSessionOptions, "rounds" | "onEvent">;
  /** Rounds still open: their spec, pending envelopes and routes. */
  private readonly rounds = new Map<bigint, RoundState>();
  /** Rounds that ended: only their record is kept (a long-lived session sees rounds without end). */
  private readonly endedRecords = new Map<bigint, DeviceRound>();
  /** Ended rounds still followed for a later `failed` outcome, released first first (at most `maxFollowedRounds`). */
  private readonly followed = new Map<bigint, RoundState>();
  /** When (`Date.now()`) the session's `rounds` rounds had all ended. */
  private servedAt: number | undefined;
  private closing = false;
  private readonly topicIndex = new Map<string, RoundState>();
  private readonly specs: string;
  private readonly window: Window;
  private client: MqttClient | undefined;
  private specChain: Promise<void> = Promise.resolve();
  /** Rounds whose spec waits in {@link specChain}: a copy arriving meanwhile is dropped. */
  private readonly queuedRounds = new Set<bigint>();
  private ticker: ReturnType<typeof setInterval> | undefined;
  private endedRounds = 0;
  private closed = false;
  private finish: (() => void) | undefined;
  private readonly finished: Promise<void>;

  private constructor(options: DeviceSessionOptions) {
    if (!Array.isArray(options.devices) || options.devices.length === 0) {
      throw new TransportError("a device session needs at least one device");
    }
    if (!(options.sessionId instanceof Uint8Array) || options.sessionId.length !== 16) {
      throw new TransportError("sessionId must be 16 bytes");
    }
    if (!(options.analyzerSigningKey instanceof Uint8Array) || options.analyzerSigningKey.length !== 32) {
      throw new TransportError("analyzerSigningKey must be the analyzer's 32-byte Ed25519 key");
    }
    const positive = (value: number | undefined, fallback: number, name: string): number => {
      const chosen = value ?? fallback;
      if (!Number.isFinite(chosen) || chosen <= 0) {
        throw new TransportError(`${name} must be a positive number, got ${String(value)}`);
      }
      return chosen;
    };
    this.options = {
      broker: options.broker,
      sessionId: options.sessionId,
      analyzerSigningKey: options.analyzerSigningKey,
      devices: options.devices,
      rounds: options.rounds,
      retryInterval: positive(options.retryInterval, 2000, "retryInterval"),
      maxCopies: Math.floor(positive(options.maxCopies, 8, "maxCopies")),
      grace: options.grace === undefined ? 10_000 : Math.max(0, options.grace),
      follow: DeviceSession.followOption(options),
      maxFollowedRounds: Math.floor(positive(options.maxFollowedRounds, MAX_FOLLOWED_ROUNDS, "maxFollowedRounds")),
      window: Math.floor(positive(options.window, 64, "window")),
      connectTimeout: positive(options.connectTimeout, 15_000, "connectTimeout"),
      clock: options.clock ?? (() => Date.now() / 1000),
      onEvent: options.onEvent,
    };
    this.clientId = options.clientId ?? randomClientId();
    this.specs = specTopic(options.sessionId);
    this.window = new Window(this.options.window);
    this.finished = new Promise<void>((resolve) => {
      this.finish = resolve;
    });
  }

  /** The MQTT client id of the connection. */
  readonly clientId: string;

  private static followOption(options: DeviceSessionOptions): number {
    const follow = options.follow ?? (options.rounds === undefined ? Infinity : 0);
    if (typeof follow !== "number" || Number.isNaN(follow) || follow < 0) {
      throw new TransportError(`follow must be a number of milliseconds >= 0 (or Infinity), got ${String(options.follow)}`);
    }
    return follow;
  }

  /**
   * Connects to the broker, subscribes to the session's spec topic and starts answering.
   * Rejects with {@link TransportError} if the broker refuses the account (`not authorised`),
   * the TLS certificate does not verify, or no connection comes within `connectTimeout`.
   */
  static async open(options: DeviceSessionOptions): Promise<DeviceSession> {
    const session = new DeviceSession(options);
    await session.connect();
    return session;
  }

  private event(kind: DeviceEvent["kind"], text: string, roundId?: bigint): void {
    const onEvent = this.options.onEvent;
    if (!onEvent) {
      return;
    }
    try {
      onEvent(roundId === undefined ? { kind, text } : { kind, text, roundId });
    } catch {
      // a listener's failure is the listener's: the loop goes on
    }
  }

  private refuse(reason: string, text: string, roundId?: bigint): void {
    increment(this.badMessages, reason);
    this.event("refused-message", `${reason}: ${text}`, roundId);
  }

  private bug(where: string, error: unknown): void {
    increment(this.badMessages, INTERNAL_ERROR);
    this.event("internal-error", `${where}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
  }

  private connectOptions(url: URL): IClientOptions {
    const { broker } = this.options;
    const secure = url.protocol === "mqtts:" || url.protocol === "wss:";
    if (!secure && !isLoopback(url.hostname)) {
      throw new TransportError(
        `${url.protocol}// to ${url.hostname} would send the password and every message in clear; use mqtts:// or wss://`,
      );
    }
    const options: IClientOptions = {
      clientId: this.clientId,
      username: broker.username,
      password: broker.password,
      protocolVersion: 4,
      clean: true,
      keepalive: 60,
      reconnectPeriod: 1000,
      connectTimeout: this.options.connectTimeout,
      resubscribe: true,
      rejectUnauthorized: true,
      // Every subscription is QoS 1, so a QoS 2 publish is the broker's own doing: it is never
      // kept (see NoQos2Store) and so never delivered.
      incomingStore: new NoQos2Store() as unknown as IStore,
    };
    if (broker.ca !== undefined) {
      options.ca = typeof broker.ca === "string" ? broker.ca : (payloadOf(broker.ca) as never);
    }
    return options;
  }

  private async connect(): Promise<void> {
    let url: URL;
    try {
      url = new URL(this.options.broker.url);
    } catch {
      throw new TransportError(`broker url: not a URL: ${String(this.options.broker.url)}`);
    }
    if (!["mqtts:", "wss:", "mqtt:", "ws:"].includes(url.protocol)) {
      throw new TransportError(`broker url: must be mqtts://, wss:// (or plaintext on loopback), got ${url.protocol}`);
    }
    const client = mqtt.connect(this.options.broker.url, this.connectOptions(url));
    this.client = client;
    let connectedOnce = false;
    client.on("message", (topic: string, payload: Uint8Array) => {
      try {
        this.onMessage(topic, new Uint8Array(payload));
      } catch (error) {
        this.bug("message handler", error);
      }
    });
    client.on("reconnect", () => this.event("reconnecting", "reconnecting to the broker"));
    client.on("offline", () => this.event("offline", "the broker connection is down"));
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        fail(new TransportError(`no connection to ${url.host} within ${this.options.connectTimeout} ms`));
      }, this.options.connectTimeout);
      const fail = (error: TransportError) => {
        clearTimeout(timer);
        client.end(true);
        reject(error);
      };
      client.on("error", (error: Error & { code?: number | string }) => {
        if (!connectedOnce) {
          if (typeof error.code === "number" && REFUSED_IDENTITY.has(error.code)) {
            fail(new TransportError(`not authorised (the broker refused the credentials: ${error.message})`));
          } else if (/certificate|self.signed|CERT_|unable to verify/i.test(`${error.message} ${String(error.code)}`)) {
            fail(new TransportError(`TLS certificate verification failed: ${error.message}`));
          } else {
            this.event("transport-error", error.message);
          }
          return;
        }
        this.event("transport-error", error.message);
      });
      client.on("connect", () => {
        if (connectedOnce) {
          this.reconnects += 1;
          this.event("connected", `reconnected to ${url.host}`);
          return;
        }
        connectedOnce = true;
        clearTimeout(timer);
        this.event("connected", `connected to ${url.host} as ${this.options.broker.username}`);
        resolve();
      });
    });
    const granted = await this.subscribe([this.specs]);
    if (!granted) {
      await this.close();
      throw new TransportError(`the broker refused the subscription to ${this.specs}`);
    }
    this.ticker = setInterval(() => this.tick(), Math.min(500, this.options.retryInterval / 2));
  }

  private async subscribe(topics: string[]): Promise<boolean> {
    const client = this.client;
    if (!client || this.closed) {
      return false;
    }
    try {
      const granted = await client.subscribeAsync(topics, { qos: 1 });
      return granted.every((g) => g.qos !== 128);
    } catch (error) {
      this.event("transport-error", `subscribe: ${(error as Error).message}`);
      return false;
    }
  }

  private async unsubscribe(topics: string[]): Promise<void> {
    const client = this.client;
    if (!client || this.closed || topics.length === 0) {
      return;
    }
    try {
      await client.unsubscribeAsync(topics);
    } catch {
      // the connection went away: nothing to unsubscribe from
    }
  }

  private onMessage(topic: string, payload: Uint8Array): void {
    if (topic === this.specs) {
      // Checked on arrival, before anything waits: junk, and copies of a spec already taken or
      // queued, are dropped at once, so what waits behind a round being answered (or behind a
      // subscription the broker never acknowledges) is at most one spec per genuine new round.
      const verified = this.acceptSpec(payload);
      if (verified === undefined) {
        return;
      }
      this.queuedRounds.add(verified.spec.roundId);
      this.specChain = this.specChain
        .then(() => this.takeSpec(payload, verified))
        .catch((error) => this.bug("spec", error))
        .finally(() => this.queuedRounds.delete(verified.spec.roundId));
      return;
    }
    const state = this.topicIndex.get(topic);
    const route = state?.topics.get(topic);
    if (!state || !route) {
      this.refuse("unexpected-topic", `a message on ${topic}`);
      return;
    }
    if (state.ended) {
      if (state.following && route.kind === "outcome" && state.followedInstances.has(route.instance)) {
        // A released round followed: the shuffler may still give its batch up.
        this.takeOutcome(state, route.instance, payload).catch((error) => this.bug("outcome", error));
      }
      return; // a late receipt or the retained outcome again, before the unsubscription took effect
    }
    if (route.kind === "receipts") {
      this.takeReceipts(state, route.instance, payload);
    } else {
      this.takeOutcome(state, route.instance, payload).catch((error) => this.bug("outcome", error));
    }
  }

  /**
   * The verified spec of a spec-topic message that opens a round not yet seen nor queued, or
   * undefined (refused and counted, or a copy of a round already taken: ignored).
   */
  private acceptSpec(data: Uint8Array): VerifiedSpec | undefined {
    if (this.closed) {
      return undefined;
    }
    let verified: VerifiedSpec;
    try {
      verified = verifiedSpec(data, this.options.analyzerSigningKey);
    } catch (error) {
      this.refuse(`spec-${reasonOf(error)}`, (error as Error).message);
      return undefined;
    }
    const { spec } = verified;
    if (!sameBytes(spec.sessionId, this.options.sessionId)) {
      this.refuse("spec-other-session", `a spec of session ${hex(spec.sessionId)}`);
      return undefined;
    }
    if (this.rounds.has(spec.roundId) || this.endedRecords.has(spec.roundId) || this.queuedRounds.has(spec.roundId)) {
      return undefined; // the retained spec again, or re-published by a restarted shuffler
    }
    return verified;
  }

  private async takeSpec(data: Uint8Array, { spec, digest }: VerifiedSpec): Promise<void> {
    if (this.closed || this.rounds.has(spec.roundId) || this.endedRecords.has(spec.roundId)) {
      return;
    }
    const record: DeviceRound = {
      roundId: spec.roundId,
      mechanism: spec.params.mechanism,
      epsilon0: spec.epsilon0,
      sent: 0,
      declined: {},
      admitted: 0,
      refused: {},
      retransmitted: 0,
      unacknowledged: 0,
      publishErrors: 0,
      outcomes: {},
      instances: [],
      answered: 0,
      gaveUp: false,
    };
    const state: RoundState = {
      spec,
      specDigest: digest,
      record,
      topics: new Map(),
      pending: new Map(),
      answeredBy: new Map(),
      answering: true,
      ended: false,
      following: false,
      followedInstances: new Set(),
      releasedAt: 0,
      settling: Promise.resolve(),
      outcomeBytes: new Map(),
      lastReceipt: this.now(),
      newestReceipted: new Map(),
      order: 0,
    };
    this.rounds.set(spec.roundId, state);
    for (let instance = 0; instance < spec.shufflerInstances; instance++) {
      state.topics.set(receiptsTopic(spec.sessionId, spec.roundId, instance), { kind: "receipts", instance });
      state.topics.set(outcomeTopic(spec.sessionId, spec.roundId, instance), { kind: "outcome", instance });
    }
    for (const topic of state.topics.keys()) {
      this.topicIndex.set(topic, state);
    }
    if (!(await this.subscribe([...state.topics.keys()]))) {
      // Without receipts and outcomes the devices could not settle: answer nothing, charge nothing.
      record.declined["transport"] = this.options.devices.length;
      this.endRound(state, "not subscribed to the round's receipts and outcome");
      return;
    }
    await this.answerAll(data, state);
  }

  /** Whether `device` would answer on an instance that already published its outcome (all if it cannot say). */
  private roundOver(device: AnsweringDevice, state: RoundState): boolean {
    const ended = Object.keys(state.record.outcomes).length;
    if (ended === 0) {
      return false;
    }
    if (typeof device.instanceFor !== "function" || ended === state.spec.shufflerInstances) {
      return true;
    }
    return state.record.outcomes[device.instanceFor(state.spec, state.specDigest)] !== undefined;
  }

  private async answerAll(data: Uint8Array, state: RoundState): Promise<void> {
    const { record, spec } = state;
    const instances = new Set<number>();
    for (const [index, device] of this.options.devices.entries()) {
      if (this.closed || state.ended) {
        break;
      }
      if (this.roundOver(device, state)) {
        // Its instance already published its outcome: a late device does not spend its budget.
        increment(record.declined, "round-over");
        continue;
      }
      let answer: DeviceAnswer;
      try {
        answer = await device.answer(data);
      } catch (error) {
        const reason = reasonOf(error);
        if (reason === INTERNAL_ERROR) {
          this.bug(`device ${index} answering round ${spec.roundId}`, error);
        }
        increment(record.declined, reason);
        continue;
      }
      record.answered += 1;
      instances.add(answer.instance);
      state.answeredBy.set(index, answer.instance);
      const over = state.outcomeBytes.get(answer.instance);
      if (over !== undefined) {
        // The outcome came while this device was answering: it is charged, but nothing is sent.
        record.unacknowledged += answer.envelopes.length;
        await this.settleDevices(state, [index], over);
        continue;
      }
      const topic = reportsTopic(spec.sessionId, spec.roundId, answer.instance);
      answer.envelopes.forEach((envelope, i) => {
        const nonce = answer.nonces[i];
        if (nonce === undefined) {
          return;
        }
        const pending: Pending = {
          envelope,
          topic,
          instance: answer.instance,
          device: index,
          seq: state.order++,
          sentAt: this.now(),
          copies: 1,
        };
        state.pending.set(hex(nonce), pending);
        record.sent += 1;
        void this.publish(state, pending);
      });
    }
    record.instances = [...instances].sort((a, b) => a - b);
    state.answering = false;
    const declined = Object.entries(record.declined)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    this.event(
      "round-answered",
      `round ${spec.roundId} (${record.mechanism}, eps0 ${record.epsilon0}): ${record.answered} device(s) answered, ` +
        `${record.sent} envelope(s) sent${declined ? `, declined: ${declined}` : ""}`,
      spec.roundId,
    );
    if (record.answered === 0) {
      this.endRound(state, "no device answered");
    } else {
      this.maybeEnd(state);
    }
  }

  private async publish(state: RoundState, pending: Pending): Promise<void> {
    await this.window.acquire();
    try {
      const client = this.client;
      if (!client || this.closed || state.ended) {
        return;
      }
      await client.publishAsync(pending.topic, payloadOf(pending.envelope) as never, { qos: 1 });
    } catch (error) {
      state.record.publishErrors += 1;
      this.event("transport-error", `publish to ${pending.topic}: ${(error as Error).message}`, state.spec.roundId);
    } finally {
      this.window.release();
    }
  }

  private takeReceipts(state: RoundState, instance: number, data: Uint8Array): void {
    const { spec, record } = state;
    let receipts: AdmissionReceipts;
    try {
      receipts = decodeVerified(data, "admission-receipts", spec.shufflerSigningKey);
    } catch (error) {
      this.refuse(`receipts-${reasonOf(error)}`, (error as Error).message, spec.roundId);
      return;
    }
    if (!sameBytes(receipts.sessionId, spec.sessionId) || receipts.roundId !== spec.roundId) {
      this.refuse("receipts-other-round", `receipts of round ${receipts.roundId}`, spec.roundId);
      return;
    }
    if (!sameBytes(receipts.specDigest, state.specDigest)) {
      this.refuse("receipts-other-spec", "receipts of another spec", spec.roundId);
      return;
    }
    // The devices named settle the receipts themselves (each checks them against its own round).
    const named: Array<[string, string]> = [];
    receipts.admitted.forEach((nonce) => named.push([hex(nonce), "admitted"]));
    receipts.refused.forEach((nonce, i) => named.push([hex(nonce), receipts.reasons[i] ?? "refused"]));
    const devices = new Set<number>();
    for (const [key] of named) {
      const pending = state.pending.get(key);
      if (pending !== undefined && pending.instance === instance) {
        devices.add(pending.device);
      }
    }
    const settled = new Set<number>();
    for (const index of devices) {
      try {
        this.options.devices[index]?.settleReceipts(data);
        settled.add(index);
      } catch (error) {
        this.refuse(`receipts-${reasonOf(error)}`, `device ${index}: ${(error as Error).message}`, spec.roundId);
      }
    }
    for (const [key, status] of named) {
      const pending = state.pending.get(key);
      if (pending === undefined || !settled.has(pending.device)) {
        continue;
      }
      state.pending.delete(key);
      if (status === "admitted") {
        record.admitted += 1;
      } else {
        increment(record.refused, status);
      }
      const newest = state.newestReceipted.get(pending.instance) ?? -1;
      state.newestReceipted.set(pending.instance, Math.max(newest, pending.seq));
    }
    if (settled.size > 0) {
      state.lastReceipt = this.now();
    }
  }

  private async takeOutcome(state: RoundState, instance: number, data: Uint8Array): Promise<void> {
    const { spec, record } = state;
    let outcome: RoundOutcome;
    try {
      outcome = decodeVerified(data, "round-outcome", spec.shufflerSigningKey);
    } catch (error) {
      this.refuse(`outcome-${reasonOf(error)}`, (error as Error).message, spec.roundId);
      return;
    }
    if (!sameBytes(outcome.sessionId, spec.sessionId) || outcome.roundId !== spec.roundId || outcome.instance !== instance) {
      this.refuse("outcome-other-round", `outcome of round ${outcome.roundId} instance ${outcome.instance}`, spec.roundId);
      return;
    }
    if (!sameBytes(outcome.specDigest, state.specDigest)) {
      this.refuse("outcome-other-spec", "outcome of another spec", spec.roundId);
      return;
    }
    const result = outcome.outcome === "released" ? "released" : `failed:${outcome.reason}`;
    const previous = record.outcomes[instance];
    if (previous !== undefined && (previous.startsWith("failed:") || result === "released")) {
      return; // only forward: the retained outcome again, or an older one replayed (a failed round stays failed)
    }
    const devices = [...state.answeredBy].filter(([, i]) => i === instance).map(([index]) => index);
    // Verified above, for this round's spec: the instance's round is over. Record it before the
    // devices settle (each verifies it again), so a copy arriving meanwhile is not settled twice.
    record.outcomes[instance] = result;
    if (!state.ended) {
      state.outcomeBytes.set(instance, data);
    }
    await this.settleDevices(state, devices, data);
    if (previous !== undefined) {
      this.event(
        "round-lost",
        `round ${spec.roundId}: instance ${instance}: released, then ${result} (the shuffler gave the batch up); ` +
          `${devices.length} device(s) recorded the round as lost, still charged`,
        spec.roundId,
      );
    }
    if (state.ended) {
      if (state.following && [...state.followedInstances].every((i) => record.outcomes[i] !== "released")) {
        this.unfollow(state, "");
      }
      return;
    }
    for (const [key, pending] of state.pending) {
      if (pending.instance === instance) {
        state.pending.delete(key);
        record.unacknowledged += 1;
      }
    }
    this.maybeEnd(state);
  }

  /** The devices `indices` settle the signed outcome `data`, after the round's earlier settlements. */
  private settleDevices(state: RoundState, indices: number[], data: Uint8Array): Promise<void> {
    const roundId = state.spec.roundId;
    const settled = state.settling.then(async () => {
      for (const index of indices) {
        try {
          await this.options.devices[index]?.settleOutcome(data);
        } catch (error) {
          // A ledger that cannot record it (storage trouble) is the device's: the round still ended.
          this.refuse(`outcome-${reasonOf(error)}`, `device ${index}: ${(error as Error).message}`, roundId);
        }
      }
    });
    state.settling = settled;
    return settled;
  }

  private maybeEnd(state: RoundState): void {
    const { record } = state;
    if (!state.answering && record.instances.length > 0 && record.instances.every((i) => record.outcomes[i] !== undefined)) {
      this.endRound(state, "");
    }
  }

  private endRound(state: RoundState, why: string): void {
    if (state.ended) {
      return;
    }
    state.ended = true;
    const { record } = state;
    record.unacknowledged += state.pending.size;
    state.pending.clear();
    // Keep only the record: the spec, the outcomes' bytes and the devices' instances go, but for
    // a round followed: its spec and which devices answered on an instance that released.
    this.rounds.delete(record.roundId);
    this.endedRecords.set(record.roundId, record);
    state.outcomeBytes.clear();
    state.newestReceipted.clear();
    const released = this.closing ? [] : record.instances.filter((i) => record.outcomes[i] === "released");
    for (const [index, instance] of [...state.answeredBy]) {
      if (!released.includes(instance)) {
        state.answeredBy.delete(index);
      }
    }
    const outcomes = record.instances.map((i) => `instance ${i}: ${record.outcomes[i] ?? "no outcome"}`).join(", ");
    const refused = Object.entries(record.refused)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    this.event(
      "round-ended",
      `round ${record.roundId}: ${outcomes || why}; ${record.admitted} admitted, refused ${refused || "none"}, ` +
        `${record.retransmitted} retransmitted, ${record.unacknowledged} unacknowledged${why && outcomes ? ` (${why})` : ""}`,
      record.roundId,
    );
    const followedTopics = new Set(released.map((i) => outcomeTopic(state.spec.sessionId, record.roundId, i)));
    this.dropTopics(state, [...state.topics.keys()].filter((topic) => !followedTopics.has(topic)));
    if (released.length > 0) {
      state.following = true;
      state.followedInstances = new Set(released);
      state.releasedAt = this.now();
      this.followed.set(record.roundId, state);
      for (const oldest of [...this.followed.values()]) {
        if (this.followed.size <= this.options.maxFollowedRounds) {
          break;
        }
        this.unfollow(oldest, `more than ${this.options.maxFollowedRounds} rounds followed`);
      }
    }
    this.endedRounds += 1;
    if (this.options.rounds !== undefined && this.endedRounds >= this.options.rounds && this.servedAt === undefined) {
      this.servedAt = this.now();
    }
    this.expireFollowed(this.now());
    this.maybeFinish();
  }

  /**
   * Unsubscribes from `topics` of a round. Routing entries stay until the unsubscription took
   * effect, so a late message on these topics is "unexpected" only after it.
   */
  private dropTopics(state: RoundState, topics: string[]): void {
    void this.unsubscribe(topics).then(() => {
      for (const topic of topics) {
        state.topics.delete(topic);
        if (this.topicIndex.get(topic) === state) {
          this.topicIndex.delete(topic);
        }
      }
    });
  }

  /** When a followed round stops being followed (see the `follow` option). */
  private followEnd(state: RoundState): number {
    const { follow, rounds } = this.options;
    if (rounds === undefined) {
      return state.releasedAt + follow;
    }
    return this.servedAt === undefined ? Infinity : Math.max(this.servedAt, state.releasedAt) + follow;
  }

  private expireFollowed(now: number): void {
    for (const state of [...this.followed.values()]) {
      if (now >= this.followEnd(state)) {
        this.unfollow(state, "follow period over");
      }
    }
  }

  /**
   * Stops following a round (it failed, its follow period is over, or the session closes): drops
   * its outcome subscription and all it still held but its record. `why` empty: it failed.
   */
  private unfollow(state: RoundState, why: string): void {
    if (!state.following) {
      return;
    }
    state.following = false;
    this.followed.delete(state.record.roundId);
    const stillReleased = [...state.followedInstances].filter((i) => state.record.outcomes[i] === "released");
    state.followedInstances.clear();
    state.answeredBy.clear();
    this.dropTopics(state, [...state.topics.keys()]);
    if (why && !this.closing) {
      this.event(
        "follow-ended",
        `round ${state.record.roundId}: stopped following the outcome of instance(s) ${stillReleased.join(", ")} ` +
          `(${why}): released as far as the devices know`,
        state.record.roundId,
      );
    }
    this.maybeFinish();
  }

  /** Ends {@link serve} once `rounds` rounds ended and none is followed any more (or the session closed). */
  private maybeFinish(): void {
    if (this.closed || (this.options.rounds !== undefined && this.endedRounds >= this.options.rounds && this.followed.size === 0)) {
      this.finish?.();
    }
  }

  private now(): number {
    return Date.now();
  }

  /** The timer: gives up rounds past deadline + grace, and sends again what seems lost. */
  private tick(): void {
    try {
      const now = this.now();
      const wall = this.options.clock();
      for (const state of this.rounds.values()) {
        if (state.ended) {
          continue;
        }
        if (wall > state.spec.deadline + this.options.grace / 1000) {
          state.record.gaveUp = true;
          this.endRound(state, "gave up: no outcome by the deadline and grace");
          continue;
        }
        this.retransmit(state, now);
      }
      this.expireFollowed(now);
    } catch (error) {
      this.bug("timer", error);
    }
  }

  private retransmit(state: RoundState, now: number): void {
    const { retryInterval, maxCopies } = this.options;
    const quiet = now - state.lastReceipt >= retryInterval;
    let again = 0;
    for (const pending of state.pending.values()) {
      if (pending.copies >= maxCopies) {
        continue;
      }
      const wait = retryInterval * Math.min(2 ** (pending.copies - 1), 8);
      const overtaken = pending.seq < (state.newestReceipted.get(pending.instance) ?? -1);
      if (now - pending.sentAt < wait || !(quiet || overtaken)) {
        continue;
      }
      pending.sentAt = now;
      pending.seq = state.order++;
      pending.copies += 1;
      state.record.retransmitted += 1;
      again += 1;
      void this.publish(state, pending); // the same bytes as the first copy
    }
    if (again > 0) {
      this.event(
        "retransmitted",
        `round ${state.spec.roundId}: sent ${again} envelope(s) again (no receipt ${quiet ? "for a while" : "while later ones had one"})`,
        state.spec.roundId,
      );
    }
  }

  /**
   * Resolves with every round seen once `rounds` rounds have ended (outcome or give-up) and no
   * released round is followed any more (see `follow`), or when the session is closed. Never
   * rejects: refusals are counted, transport trouble is reported through `onEvent` while mqtt.js
   * reconnects.
   */
  async serve(): Promise<DeviceRound[]> {
    await this.finished;
    await this.specChain;
    return this.roundRecords();
  }

  /** The rounds seen so far, in round order. */
  roundRecords(): DeviceRound[] {
    return [...this.endedRecords.values(), ...[...this.rounds.values()].map((s) => s.record)].sort((a, b) =>
      a.roundId < b.roundId ? -1 : 1,
    );
  }

  /** Counters and rounds (see {@link DeviceSessionResult}). */
  result(): DeviceSessionResult {
    return { rounds: this.roundRecords(), badMessages: { ...this.badMessages }, reconnects: this.reconnects };
  }

  /**
   * Stops answering, ends every open round as it stands, stops following released rounds and
   * closes the connection. Idempotent.
   */
  async close(): Promise<void> {
    if (this.closed) {
      return;
    }
    this.closing = true;
    if (this.ticker !== undefined) {
      clearInterval(this.ticker);
      this.ticker = undefined;
    }
    for (const state of this.rounds.values()) {
      this.endRound(state, "session closed");
    }
    this.closed = true;
    for (const state of [...this.followed.values()]) {
      this.unfollow(state, "session closed");
    }
    this.finish?.();
    const client = this.client;
    if (client) {
      // Forced: a graceful end waits for every acknowledgement still owed, and a broker that
      // withholds one (a SUBACK, a PUBACK) would keep it waiting for ever. Every round has ended
      // above, so nothing in flight is still wanted.
      try {
        await client.endAsync(true);
      } catch {
        // the connection is gone either way
      }
    }
  }
}

/**
 * Opens a {@link DeviceSession}, serves `options.rounds` rounds (required here), closes it, and
 * returns what happened. A released round is followed while the rounds are served and `follow`
 * ms after the last one ended (default 0): give `follow` to learn of a batch the shuffler gives
 * up later. Rejects only with a {@link TransportError} of the first connection.
 */
export async function runDevice(options: DeviceSessionOptions & { rounds: number }): Promise<DeviceSessionResult> {
  const session = await DeviceSession.open(options);
  try {
    await session.serve();
  } finally {
    await session.close();
  }
  return session.result();
}
