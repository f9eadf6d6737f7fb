// Test support (no tests here): a hostile MQTT 3.1.1 broker on loopback, in-process. It accepts one
// device connection, answers CONNECT, and lets a test see every SUBSCRIBE, UNSUBSCRIBE and PUBLISH the device
// sends, withhold SUBACKs, and deliver any payload on any topic: what a broker that is the attacker
// can do. Packets are framed with mqtt-packet, the codec mqtt.js itself uses.
import { createServer } from "node:net";
import mqttPacket from "mqtt-packet";

export class FakeBroker {
  /** `holdSubacks(topics)` decides whether the SUBACK of a SUBSCRIBE of `topics` is withheld. */
  constructor({ holdSubacks = () => false } = {}) {
    this.holdSubacks = holdSubacks;
    this.subscriptions = [];
    this.unsubscriptions = []; // topics the device unsubscribed from, in order
    this.published = []; // { topic, payload } the device sent
    this.waiters = [];
    this.socket = undefined;
    this.nextId = 1;
    this.server = createServer((socket) => this.accept(socket));
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return `mqtt://127.0.0.1:${this.server.address().port}`;
  }

  accept(socket) {
    this.socket = socket;
    const parser = mqttPacket.parser({ protocolVersion: 4 });
    parser.on("packet", (packet) => this.take(packet));
    socket.on("data", (data) => parser.parse(data));
    socket.on("error", () => {});
  }

  send(packet) {
    this.socket.write(mqttPacket.generate(packet, { protocolVersion: 4 }));
  }

  take(packet) {
    switch (packet.cmd) {
      case "connect":
        this.send({ cmd: "connack", returnCode: 0, sessionPresent: false });
        break;
      case "subscribe": {
        const topics = packet.subscriptions.map((s) => s.topic);
        this.subscriptions.push(...topics);
        if (!this.holdSubacks(topics)) {
          this.send({ cmd: "suback", messageId: packet.messageId, granted: topics.map(() => 1) });
        }
        break;
      }
      case "unsubscribe":
        this.unsubscriptions.push(...packet.unsubscriptions);
        this.send({ cmd: "unsuback", messageId: packet.messageId });
        break;
      case "publish":
        this.published.push({ topic: packet.topic, payload: new Uint8Array(packet.payload) });
        if (packet.qos === 1) this.send({ cmd: "puback", messageId: packet.messageId });
        break;
      case "pingreq":
        this.send({ cmd: "pingresp" });
        break;
      default:
        break;
    }
    for (const waiter of [...this.waiters]) waiter();
  }

  /** Delivers `payload` to the device on `topic` (QoS 0), as if someone had published it. */
  deliver(topic, payload) {
    this.send({ cmd: "publish", topic, payload: Buffer.from(payload), qos: 0, retain: false, dup: false });
  }

  /** Delivers `payload` at QoS 2 with `messageId` and never releases it (no PUBREL follows the device's PUBREC). */
  deliverUnreleased(topic, payload, messageId) {
    this.send({ cmd: "publish", topic, payload: Buffer.from(payload), qos: 2, messageId, retain: false, dup: false });
  }

  /** Resolves once `predicate()` holds (checked after every packet from the device and every 10 ms). */
  until(predicate, what = "the awaited state", limitMs = 10_000) {
    return new Promise((resolve, reject) => {
      const started = Date.now();
      const check = () => {
        if (predicate()) {
          this.waiters = this.waiters.filter((w) => w !== check);
          clearInterval(timer);
          resolve();
        } else if (Date.now() - started > limitMs) {
          this.waiters = this.waiters.filter((w) => w !== check);
          clearInterval(timer);
          reject(new Error(`timed out waiting for ${what}`));
        }
      };
      const timer = setInterval(check, 10);
      this.waiters.push(check);
      check();
    });
  }

  async close() {
    this.socket?.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }
}
