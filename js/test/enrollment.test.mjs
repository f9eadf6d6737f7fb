// Enrollment documents (public.json, credentials.json of `shuffledp keys init`) and their files.
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { deviceEnrollments, EnrollmentError, parseCredentials, parsePublicInfo } from "../dist/enrollment.js";
import { loadBrokerAccount, loadEnrollments, readPasswordFile } from "../dist/enrollmentFiles.js";

const hexOf = (byte, size) => byte.toString(16).padStart(2, "0").repeat(size);

function publicDoc() {
  return {
    format: "shuffledp-keys/1",
    session_id: hexOf(1, 16),
    analyzer: { signing_public: hexOf(2, 32), hpke_public: hexOf(3, 32) },
    shuffler: { hpke_public: hexOf(4, 32), signing_public: hexOf(5, 32) },
  };
}

function credentialsDoc(count, session = hexOf(1, 16)) {
  return {
    format: "shuffledp-credentials/1",
    session_id: session,
    credentials: Array.from({ length: count }, (_, i) => hexOf(i + 16, 48)),
  };
}

describe("public.json", () => {
  it("gives the session and the four public keys, from the document or its text", () => {
    for (const input of [publicDoc(), JSON.stringify(publicDoc())]) {
      const info = parsePublicInfo(input);
      assert.deepEqual(info.sessionId, new Uint8Array(16).fill(1));
      assert.deepEqual(info.analyzerSigningKey, new Uint8Array(32).fill(2));
      assert.deepEqual(info.analyzerHpkeKey, new Uint8Array(32).fill(3));
      assert.deepEqual(info.shufflerKey, new Uint8Array(32).fill(4));
      assert.deepEqual(info.shufflerSigningKey, new Uint8Array(32).fill(5));
    }
  });

  it("refuses anything that is not exactly such a file, naming the field", () => {
    const broken = [
      [{ ...publicDoc(), format: "shuffledp-keys/2" }, /not a shuffledp-keys\/1 file/],
      [{ ...publicDoc(), session_id: hexOf(1, 15) }, /session_id: must be 16 bytes in hex/],
      [{ ...publicDoc(), analyzer: { hpke_public: hexOf(3, 32) } }, /analyzer\.signing_public: missing/],
      [{ ...publicDoc(), shuffler: { hpke_public: "zz".repeat(32), signing_public: hexOf(5, 32) } }, /shuffler\.hpke_public/],
      [{ ...publicDoc(), shuffler: { hpke_public: 7, signing_public: hexOf(5, 32) } }, /shuffler\.hpke_public/],
      ["{not json", /not JSON/],
      [null, /not a shuffledp-keys\/1 file/],
      [[publicDoc()], /not a shuffledp-keys\/1 file/],
    ];
    for (const [doc, message] of broken) {
      assert.throws(() => parsePublicInfo(doc), (error) => error instanceof EnrollmentError && message.test(error.message));
    }
  });
});

describe("credentials.json", () => {
  const info = parsePublicInfo(publicDoc());

  it("gives the credentials of public.json's session", () => {
    const credentials = parseCredentials(credentialsDoc(3), info);
    assert.equal(credentials.length, 3);
    assert.deepEqual(credentials[2], new Uint8Array(48).fill(18));
  });

  it("refuses another session's credentials, a bad entry, another format", () => {
    assert.throws(() => parseCredentials(credentialsDoc(1, hexOf(9, 16)), info), /another session/);
    const bad = credentialsDoc(2);
    bad.credentials[1] = hexOf(1, 47);
    assert.throws(() => parseCredentials(bad, info), /credential 1: must be 48 bytes in hex/);
    assert.throws(() => parseCredentials({ ...credentialsDoc(1), credentials: "x" }, info), EnrollmentError);
    assert.throws(() => parseCredentials({ ...credentialsDoc(1), format: "other" }, info), EnrollmentError);
  });

  it("hands devices disjoint slices, and says how to enroll more when too few", () => {
    const devices = deviceEnrollments(publicDoc(), credentialsDoc(5), 2, 3);
    assert.deepEqual(
      devices.map((d) => d.credential[0]),
      [18, 19, 20],
    );
    assert.deepEqual(devices[0].analyzerSigningKey, new Uint8Array(32).fill(2));
    assert.equal(deviceEnrollments(publicDoc(), credentialsDoc(5), 4).length, 1);
    assert.throws(() => deviceEnrollments(publicDoc(), credentialsDoc(5), 3, 3), /shuffledp keys enroll DIR --users 1/);
    assert.throws(() => deviceEnrollments(publicDoc(), credentialsDoc(5), -1), /first/);
  });
});

describe("enrollment files (Node)", () => {
  const root = mkdtempSync(join(tmpdir(), "shuffledp-enrollment-"));
  after(() => rmSync(root, { recursive: true, force: true }));

  function keyDirectory(name, { credentialsMode = 0o600, publicMode = 0o644, dirMode = 0o700 } = {}) {
    const dir = join(root, name);
    mkdirSync(dir);
    writeFileSync(join(dir, "public.json"), JSON.stringify(publicDoc()));
    writeFileSync(join(dir, "credentials.json"), JSON.stringify(credentialsDoc(4)));
    // chmod after writing: the umask does not decide the modes under test.
    chmodSync(join(dir, "public.json"), publicMode);
    chmodSync(join(dir, "credentials.json"), credentialsMode);
    chmodSync(dir, dirMode);
    return dir;
  }

  it("reads a key directory laid out as `shuffledp keys init` writes it", () => {
    const devices = loadEnrollments(keyDirectory("good"), 1, 2);
    assert.equal(devices.length, 2);
    assert.deepEqual(devices[0].credential, new Uint8Array(48).fill(17));
  });

  it("refuses credentials others can read, a public.json others can write, a writable directory, a symlink", () => {
    assert.throws(() => loadEnrollments(keyDirectory("open-credentials", { credentialsMode: 0o644 })), /chmod 600/);
    assert.throws(() => loadEnrollments(keyDirectory("open-public", { publicMode: 0o666 })), /chmod 644/);
    assert.throws(() => loadEnrollments(keyDirectory("open-directory", { dirMode: 0o777 })), /chmod 700/);
    const real = keyDirectory("real");
    const link = join(root, "link");
    symlinkSync(real, link);
    assert.throws(() => loadEnrollments(link), /symbolic link/);
    assert.throws(() => loadEnrollments(join(root, "missing")), EnrollmentError);
  });

  it("reads a password file's first line and refuses one others can read", () => {
    const secret = join(root, "client.pw");
    writeFileSync(secret, "s3cret\nignored\n", { mode: 0o600 });
    chmodSync(secret, 0o600);
    assert.equal(readPasswordFile(secret), "s3cret");
    const account = loadBrokerAccount("mqtts://127.0.0.1:8883", "client", secret);
    assert.deepEqual(account, { url: "mqtts://127.0.0.1:8883", username: "client", password: "s3cret" });
    chmodSync(secret, 0o640);
    assert.throws(() => readPasswordFile(secret), /chmod 600/);
  });
});
