/**
 * Node only: a device's enrollment and broker account read from files, as the Python devices
 * read them (`shuffledp clients run --keys DIR --ca-file PEM --password-file FILE`).
 *
 * The key directory is the one `shuffledp keys init DIR` writes; a device reads `public.json`
 * and `credentials.json` only (never a private key, never `issuer.key`). As `keys.py` does,
 * files are opened without following symbolic links, and refused when another user (root
 * aside) owns them, when `public.json` (the trust anchor) or the directory is writable by group
 * or others, or when `credentials.json` or the password file is accessible to them.
 */

import { closeSync, constants, fstatSync, openSync, readSync } from "node:fs";
import { join } from "node:path";

import { type BrokerAccount, type DeviceEnrollment, EnrollmentError, deviceEnrollments } from "./enrollment.js";

/** Largest file read here (`keys.py`'s limit for `credentials.json`). */
const MAX_FILE_BYTES = 16 << 20;

function trustedOwner(uid: number): boolean {
  const self = typeof process.geteuid === "function" ? process.geteuid() : uid;
  return uid === self || uid === 0;
}

/**
 * The bytes of `path`, opened with `O_NOFOLLOW`; refuses a non-regular file, one owned by another
 * user (root aside), and one group or others may access (`secret`) or write (otherwise).
 */
export function readCheckedFile(path: string, secret: boolean, maxBytes = MAX_FILE_BYTES): Uint8Array {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ELOOP") {
      throw new EnrollmentError(`${path}: is a symbolic link; give the real file`);
    }
    throw new EnrollmentError(`${path}: cannot open (${code ?? (error as Error).message})`);
  }
  try {
    const info = fstatSync(fd);
    if (!info.isFile()) {
      throw new EnrollmentError(`${path}: not a regular file`);
    }
    if (!trustedOwner(info.uid)) {
      throw new EnrollmentError(`${path}: owned by uid ${info.uid}, not by this user or root`);
    }
    const mode = info.mode & 0o777;
    if (secret && mode & 0o077) {
      throw new EnrollmentError(`${path}: accessible by others (mode ${mode.toString(8)}); run chmod 600 ${path}`);
    }
    if (!secret && mode & 0o022) {
      throw new EnrollmentError(`${path}: writable by group or others (mode ${mode.toString(8)}); run chmod 644 ${path}`);
    }
    if (info.size > maxBytes) {
      throw new EnrollmentError(`${path}: larger than ${maxBytes} bytes`);
    }
    const buffer = new Uint8Array(info.size);
    let offset = 0;
    while (offset < buffer.length) {
      const read = readSync(fd, buffer, offset, buffer.length - offset, null);
      if (read === 0) {
        break;
      }
      offset += read;
    }
    return buffer.subarray(0, offset);
  } finally {
    closeSync(fd);
  }
}

function readText(path: string, secret: boolean): string {
  return new TextDecoder("utf-8", { fatal: true }).decode(readCheckedFile(path, secret));
}

function checkDirectory(directory: string): void {
  let fd: number;
  try {
    fd = openSync(directory, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ELOOP" || code === "ENOTDIR") {
      throw new EnrollmentError(`${directory}: not a directory (or a symbolic link); give the real key directory`);
    }
    throw new EnrollmentError(`${directory}: cannot open the key directory (${code ?? (error as Error).message})`);
  }
  try {
    const info = fstatSync(fd);
    if (!trustedOwner(info.uid)) {
      throw new EnrollmentError(`${directory}: owned by uid ${info.uid}, not by this user or root`);
    }
    if (info.mode & 0o022) {
      throw new EnrollmentError(`${directory}: writable by group or others, who could replace public.json; run chmod 700 ${directory}`);
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * Enrollments of devices `first .. first + count - 1` from the key directory `directory`
 * (`public.json` and `credentials.json`; see `enrollment.ts`).
 */
export function loadEnrollments(directory: string, first = 0, count?: number): DeviceEnrollment[] {
  checkDirectory(directory);
  const publicText = readText(join(directory, "public.json"), false);
  const credentialsText = readText(join(directory, "credentials.json"), true);
  return deviceEnrollments(publicText, credentialsText, first, count);
}

/** The first line of a password file (kept 0600), as the Python services' `--password-file` reads it. */
export function readPasswordFile(path: string): string {
  const line = readText(path, true).split(/\r?\n/, 1)[0] ?? "";
  if (line.length === 0) {
    throw new EnrollmentError(`${path}: empty password file`);
  }
  return line;
}

/** The PEM text of a CA certificate file (not secret; must not be writable by others). */
export function readCaFile(path: string): string {
  const text = readText(path, false);
  if (!text.includes("-----BEGIN CERTIFICATE-----")) {
    throw new EnrollmentError(`${path}: not a PEM certificate`);
  }
  return text;
}

/** A {@link BrokerAccount} from files: the broker URL, the username, its password file and the CA file. */
export function loadBrokerAccount(url: string, username: string, passwordFile: string, caFile?: string): BrokerAccount {
  const account: BrokerAccount = { url, username, password: readPasswordFile(passwordFile) };
  if (caFile !== undefined) {
    account.ca = readCaFile(caFile);
  }
  return account;
}
