// The MQTT round loop's topics and its refusals before any round (no broker needed).
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, it } from "node:test";

import { DeviceSession, outcomeTopic, receiptsTopic, reportsTopic, roundReleased, specTopic } from "../dist/transport/mqtt.js";
import { TransportError } from "../dist/wire/errors.js";

const session = Uint8Array.from({ length: 16 }, (_, i) => i);
const hex = "000102030405060708090a0b0c0d0e0f";
const device = { answer: async () => ({}), settleReceipts: () => {}, settleOutcome: async () => {} };

function options(overrides = {}) {
  return {
    broker: { url: "mqtts://127.0.0.1:1", username: "client", password: "x" },
    sessionId: session,
    analyzerSigningKey: new Uint8Array(32).fill(7), // a usable Ed25519 key (all zeros is a small-order point)
    devices: [device],
    connectTimeout: 500,
    ...overrides,
  };
}

describe("topics", () => {
  it("are those of docs/wire-format.md (protocol/transport/channel.py)", () => {
    assert.equal(specTopic(session), `shuffledp/${hex}/spec`);
    assert.equal(reportsTopic(session, 7n, 2), `shuffledp/${hex}/7/2/reports`);
    assert.equal(receiptsTopic(session, 7n, 0), `shuffledp/${hex}/7/0/receipts`);
    assert.equal(outcomeTopic(session, 9223372036854775807n, 63), `shuffledp/${hex}/9223372036854775807/63/outcome`);
  });
});

describe("roundReleased", () => {
  it("holds only when every instance the devices used released", () => {
    assert.equal(roundReleased({ instances: [0, 1], outcomes: { 0: "released", 1: "released" } }), true);
    assert.equal(roundReleased({ instances: [0, 1], outcomes: { 0: "released" } }), false);
    assert.equal(roundReleased({ instances: [0], outcomes: { 0: "failed:batch-too-small" } }), false);
    assert.equal(roundReleased({ instances: [], outcomes: {} }), false);
  });
});

describe("DeviceSession.open refuses", () => {
  it("a session without devices, a bad session id, a bad retry interval", async () => {
    await assert.rejects(DeviceSession.open(options({ devices: [] })), TransportError);
    await assert.rejects(DeviceSession.open(options({ sessionId: new Uint8Array(15) })), TransportError);
    await assert.rejects(DeviceSession.open(options({ retryInterval: 0 })), TransportError);
  });

  it("a URL that is not one, another scheme, and plaintext to another host", async () => {
    await assert.rejects(DeviceSession.open(options({ broker: { url: "not a url", username: "u", password: "p" } })), /not a URL/);
    await assert.rejects(
      DeviceSession.open(options({ broker: { url: "http://127.0.0.1:1", username: "u", password: "p" } })),
      /must be mqtts:\/\/, wss:\/\//,
    );
    await assert.rejects(
      DeviceSession.open(options({ broker: { url: "mqtt://192.0.2.1:1883", username: "u", password: "p" } })),
      (error) => error instanceof TransportError && /in clear/.test(error.message),
    );
  });

  it("with a TransportError when nothing answers within connectTimeout", async () => {
    const server = createServer();
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address();
    await new Promise((resolve) => server.close(resolve)); // the port is now closed
    const started = Date.now();
    await assert.rejects(
      DeviceSession.open(options({ broker: { url: `mqtts://127.0.0.1:${port}`, username: "u", password: "p" } })),
      (error) => error instanceof TransportError && /no connection/.test(error.message),
    );
    assert.ok(Date.now() - started < 5000);
  });
});
