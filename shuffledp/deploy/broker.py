"""Operator tooling for the MQTT broker the parties talk through (mosquitto).

This is not device code: it needs only the standard library, ``cryptography`` and
the mosquitto binaries (``mosquitto``, ``mosquitto_passwd``). It writes everything a
broker for shuffledp needs into one directory and can run it:

* an **ACL file** generated from :data:`shuffledp.protocol.transport.channel.TOPIC_ACCESS`, so
  the topic layout and who may use which topic cannot drift apart. Every user has
  exactly one role (``analyzer``, ``shuffler`` or ``client``); a role may have many
  users (e.g. one shared ``client`` username for a fleet, or one per device);
* a **password file** (hashed by ``mosquitto_passwd -U``, so no password ever appears
  on a command line) and a **credentials file** (JSON, mode 0600) holding the random
  passwords, for the operator to hand out;
* a **TLS** CA (self-signed) and a server certificate for the broker's names
  (``localhost`` and ``127.0.0.1`` always, more on request); private keys are 0600;
* a ``mosquitto.conf`` that refuses anonymous clients, enforces the ACL, speaks TLS
  1.2 or later on its main listener (a plaintext listener is added on loopback only
  when asked, and an MQTT-over-WebSocket listener with the same TLS certificate, for
  devices in web pages, when asked), and sizes packets and queues for batch chunks and
  load tests. Authentication, the ACL and the per-role limits are broker-wide
  (``per_listener_settings false``), so they bind every listener alike;
* **per-role limits** (:class:`RoleLimits`): a small mosquitto plugin
  (``broker_plugin/shuffledp_roles.c``, built here with the system C compiler and
  loaded by the config's ``plugin`` line) refuses, per role, publishes larger than the
  role's largest legitimate message (payload and MQTT 5 properties together), retained
  publishes on topics where the protocol does not retain (clients: none), more
  simultaneous connections per username than the role needs (clients: two), and for
  client accounts MQTT 5 and sessions kept after the connection closes (clean session
  off), so a client password can leave nothing queued behind. It also refuses a CONNECT whose MQTT
  client id a live connection of *another* username holds, so a client account
  cannot knock a service off by taking over its session (mosquitto itself closes
  whichever connection held the id); the same username may still take over its own
  client id. It can only refuse more than the password file and the ACL; without a
  compiler or the ``mosquitto-dev`` headers the broker runs without it and says so.

:class:`Broker` runs mosquitto as a subprocess on a free loopback port (sync and
async context manager), waits until it accepts connections, and can be stopped and
restarted on the same port, which the reconnection tests need.

mosquitto drops a publish the ACL forbids *silently* (MQTT 3.1.1 has no way to say
no; the publisher still gets its PUBACK) and never delivers a message to a
subscriber without read access. The ACL is a first fence, not the protocol's
security: every party still verifies signatures, sizes and rounds of everything it
receives.

Command line (writes a deployment directory, optionally runs the broker)::

    python -m shuffledp.deploy.broker DIR --bind 0.0.0.0 --port 8883 --name mqtt.example.org \\
        --client device-1 --client device-2 [--run | --background]

Besides the broker's files it writes ``DIR/USERNAME.pw`` (0600) for each account: the
password on one line, what a service's ``--password-file`` reads. ``--run`` runs
mosquitto in the foreground until interrupted; ``--background`` returns once it
accepts TLS connections and leaves it running (pid in ``DIR/mosquitto.pid``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as _dt
import hashlib
import ipaddress
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shuffledp.protocol.transport.channel import TOPIC_ACCESS

#: Largest MQTT packet the broker accepts (a batch chunk plus headers fits).
DEFAULT_MAX_PACKET_SIZE = 64 * 1024 * 1024
#: Messages mosquitto queues per client beyond those in flight (load tests send many).
DEFAULT_MAX_QUEUED_MESSAGES = 100_000
#: QoS 1 messages in flight from the broker to one client before it waits for PUBACKs.
DEFAULT_MAX_INFLIGHT_MESSAGES = 100
#: Bytes mosquitto holds for one client's session, in flight and queued (``max_queued_bytes``);
#: further messages to it are dropped. 128 batch chunks of the default size (about 2 MiB),
#: so an analyzer that lags holds a batch of some two million reports, while a client
#: account's connection that subscribes and never reads cannot grow the broker by more.
DEFAULT_MAX_QUEUED_BYTES = 256 * 1024 * 1024
#: How long mosquitto keeps a session whose connection closed (``persistent_client_expiration``).
#: Client accounts get none (:class:`RoleLimits`); this bounds the sessions a service account
#: may leave, whatever expiry it asked for.
PERSISTENT_CLIENT_EXPIRATION = "1h"

_USERNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_OWNER_ONLY = 0o600


class BrokerError(RuntimeError):
    """The broker could not be configured, started or stopped (the message says why)."""


def find_binary(name: str) -> str:
    """Path of a mosquitto binary: on ``PATH``, else in /usr/sbin or /usr/bin.

    Raises :class:`BrokerError` naming the Debian package when it is missing.
    """
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BrokerError(f"{name} is not installed (Debian: apt-get install mosquitto mosquitto-clients)")


def _write_private(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` readable and writable by its owner only (0600).

    The file is created with mode 0600 (never briefly wider) and re-chmodded if it
    already existed.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _OWNER_ONLY)
    try:
        os.fchmod(fd, _OWNER_ONLY)
        os.write(fd, raw)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- users


@dataclass(frozen=True)
class BrokerUser:
    """One broker account: a username, its single role and its (plaintext) password."""

    username: str
    role: str
    password: str


class BrokerUsers:
    """The accounts of a broker, each with one role of :data:`TOPIC_ACCESS`.

    A role may have any number of users; a username belongs to one role only.
    Passwords are random (``secrets.token_urlsafe(24)``, 192 bits) unless given.
    """

    def __init__(self) -> None:
        self._users: dict[str, BrokerUser] = {}

    @classmethod
    def default(cls, client_usernames: Iterable[str] = ("client",)) -> "BrokerUsers":
        """One ``analyzer`` and one ``shuffler`` user (named after their roles) and the
        given client usernames (default: one shared ``client`` account)."""
        users = cls()
        users.add("analyzer", "analyzer")
        users.add("shuffler", "shuffler")
        for name in client_usernames:
            users.add(name, "client")
        return users

    def add(self, username: str, role: str, password: str | None = None) -> BrokerUser:
        """Add an account; returns it. Raises ``ValueError`` for an unknown role, a
        username that is taken or not ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``, or a
        password with a newline."""
        if role not in TOPIC_ACCESS:
            raise ValueError(f"role: must be one of {sorted(TOPIC_ACCESS)}, got {role!r}")
        if not _USERNAME.match(username):
            raise ValueError(f"username: must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}, got {username!r}")
        if username in self._users:
            raise ValueError(f"username: {username!r} already exists")
        if password is None:
            password = secrets.token_urlsafe(24)
        if not password or "\n" in password or "\r" in password:
            raise ValueError("password: must be non-empty and on one line")
        user = BrokerUser(username, role, password)
        self._users[username] = user
        return user

    def __iter__(self):
        return iter(self._users.values())

    def __len__(self) -> int:
        return len(self._users)

    def get(self, username: str) -> BrokerUser:
        """The account ``username`` (``KeyError`` if there is none)."""
        return self._users[username]

    def for_role(self, role: str) -> list[BrokerUser]:
        """Every account of ``role``, in the order they were added."""
        return [u for u in self._users.values() if u.role == role]

    def acl_text(self) -> str:
        """The mosquitto ACL file: one ``user`` block per account with its role's
        ``topic write``/``topic read`` filters from :data:`TOPIC_ACCESS`.

        There are no topic lines before the first ``user`` line, so a client without
        a username (anonymous; refused anyway by ``allow_anonymous false``) may use
        no topic at all.
        """
        lines = [
            "# Generated by shuffledp.deploy.broker from shuffledp.protocol.transport.channel.TOPIC_ACCESS; do not edit.",
            "# mosquitto silently drops publishes to topics a user may not write,",
            "# and never delivers messages from topics a user may not read.",
        ]
        for user in self._users.values():
            lines.append("")
            lines.append(f"# role {user.role}")
            lines.append(f"user {user.username}")
            for access in ("write", "read"):
                for topic_filter in TOPIC_ACCESS[user.role].get(access, ()):
                    lines.append(f"topic {access} {topic_filter}")
        return "\n".join(lines) + "\n"

    def write_acl_file(self, path: Path | str) -> Path:
        """Write :meth:`acl_text` to ``path`` (mode 0600); returns the path."""
        path = Path(path)
        _write_private(path, self.acl_text())
        return path

    def write_password_file(self, path: Path | str, *, mosquitto_passwd: str | None = None) -> Path:
        """Write the hashed password file for mosquitto (mode 0600); returns the path.

        The plaintext ``user:password`` lines are written 0600 and hashed in place by
        ``mosquitto_passwd -U`` (PBKDF2-SHA512), so the passwords never appear in any
        process's arguments. Raises :class:`BrokerError` if hashing fails.
        """
        if not self._users:
            raise BrokerError("no broker users: add at least one before writing the password file")
        path = Path(path)
        _write_private(path, "".join(f"{u.username}:{u.password}\n" for u in self._users.values()))
        binary = mosquitto_passwd or find_binary("mosquitto_passwd")
        done = subprocess.run([binary, "-U", str(path)], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            path.unlink(missing_ok=True)
            raise BrokerError(f"mosquitto_passwd -U failed: {(done.stderr or done.stdout).strip()}")
        os.chmod(path, _OWNER_ONLY)
        return path

    def write_credentials(self, path: Path | str, **extra: object) -> Path:
        """Write the plaintext credentials for the operator as JSON (mode 0600).

        Layout: ``{"users": [{"username", "role", "password"}, ...], **extra}``
        (``extra`` carries e.g. host, port and CA file). Returns the path.
        """
        path = Path(path)
        doc = dict(extra)
        doc["users"] = [{"username": u.username, "role": u.role, "password": u.password} for u in self._users.values()]
        _write_private(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return path


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TlsFiles:
    """Paths of a generated CA certificate and the server's certificate and key."""

    ca_file: Path
    ca_key_file: Path
    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shuffledp"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def generate_tls(
    directory: Path | str,
    *,
    server_names: Sequence[str] = (),
    valid_days: int = 365,
) -> TlsFiles:
    """Create a self-signed CA and a server certificate it signs, in ``directory``.

    The server certificate's subject alternative names are ``localhost``,
    ``127.0.0.1`` and ``::1`` plus ``server_names`` (each an IP address or a DNS
    name). Keys are ECDSA P-256, written unencrypted with mode 0600; certificates are
    PEM (0644). The CA may only sign end-entity certificates (path length 0); the
    server certificate is for TLS server authentication only. Files: ``ca.crt``,
    ``ca.key``, ``server.crt``, ``server.key``.
    """
    directory = Path(directory)
    now = _dt.datetime.now(_dt.timezone.utc)
    not_before = now - _dt.timedelta(minutes=5)
    not_after = now + _dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("shuffledp broker CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for entry in ("localhost", "127.0.0.1", "::1", *server_names):
        if entry in seen:
            continue
        seen.add(entry)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            names.append(x509.DNSName(entry))
    server_key = ec.generate_private_key(ec.SECP256R1())
    common = next((n for n in server_names), "localhost")
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    files = TlsFiles(directory / "ca.crt", directory / "ca.key", directory / "server.crt", directory / "server.key")
    _write_private(files.ca_key_file, key_pem(ca_key))
    _write_private(files.key_file, key_pem(server_key))
    files.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return files


# --------------------------------------------------------------------------- per-role limits

#: The C source of the per-role limits plugin (package data).
ROLE_PLUGIN_SOURCE = Path(__file__).resolve().parent / "broker_plugin" / "shuffledp_roles.c"
#: How to get what building the plugin needs (printed when it cannot be built).
ROLE_PLUGIN_PACKAGES = "apt-get install mosquitto-dev libmosquitto-dev gcc"

#: The wire messages (codec tags) each role publishes: its payload limit is the largest
#: of their codec limits, so the broker never carries a message of a role that every
#: receiver's decoder would refuse unread (``codec.decode`` checks the limit first).
ROLE_MESSAGES: dict[str, tuple[str, ...]] = {
    "analyzer": ("signed-round-spec", "batch-ack"),
    "shuffler": ("signed-round-spec", "shuffled-batch", "admission-receipts", "round-outcome"),
    "client": ("envelope",),
}
#: Topics (suffixes of the role's write filters in TOPIC_ACCESS) the protocol publishes
#: with retain=True: the analyzer's announcement (``analyzer/coordinator.py``) and the
#: shuffler's relayed spec and round outcome (``shuffler/service.py``). Nothing else is
#: ever retained; in particular no client message is.
ROLE_RETAINED_SUFFIXES: dict[str, tuple[str, ...]] = {
    "analyzer": ("/announce",),
    "shuffler": ("/spec", "/outcome"),
    "client": (),
}
#: Simultaneous connections per username. A device needs one: ``MqttChannel`` reconnects
#: with the same MQTT client id, a takeover the plugin does not count twice. The second
#: is for a device *process* that restarts (new client id) while the broker still holds
#: its dead connection, which it notices only after 1.5 keepalives (90 s by default),
#: and for a subscriber beside a publisher. Service accounts get a few: several shuffler
#: instances, or an audit beside a service, share an account, never hundreds. Each
#: shuffler process holds two connections (the second reads only the analyzer's
#: announcements and acknowledgements, so that no client flood shares its queue: see
#: ``Shuffler``), hence twice the analyzer's. A fleet that shares one client username
#: needs its size here (``--client-connections``).
ROLE_CONNECTIONS: dict[str, int] = {"analyzer": 8, "shuffler": 16, "client": 2}
#: ``(mqtt5, persistent_sessions)`` per role (:class:`RoleLimits`). The parties all speak
#: MQTT 3.1.1 with clean sessions; client accounts, held by every device, are held to it.
ROLE_MQTT5_AND_SESSIONS: dict[str, tuple[bool, bool]] = {"analyzer": (True, True), "shuffler": (True, True), "client": (False, False)}


@dataclass(frozen=True)
class RoleLimits:
    """What the broker lets one role do beyond its ACL (0 means no limit).

    * ``max_payload``: largest PUBLISH, bytes: its payload plus its MQTT 5 properties
      (user properties, content type, correlation data, response topic, payload
      format: what the broker passes on to subscribers), counted as encoded in the
      packet. A larger publish is dropped (QoS 1 still gets its PUBACK, as for an ACL
      refusal), so a client account cannot park megabytes in the broker's memory or
      queues, beside its payload or in it.
    * ``max_connections``: simultaneous connections per username of the role; a
      further CONNECT with another client id is refused (not authorised). It bounds
      the live sessions, and so the queued messages, one stolen password can hold open.
    * ``retain``: topic filters on which the role may publish retained messages; a
      retained publish elsewhere is dropped. Retained messages live in the broker's
      memory until replaced and replay to every later subscription.
    * ``mqtt5``: whether the role may connect with MQTT 5; if not, such a CONNECT is
      refused (not authorised) and the role speaks MQTT 3.1.1 (or 3.1), which has no
      properties and no session expiry.
    * ``persistent_sessions``: whether the role may have the broker keep its session
      after the connection closes. If not, a CONNECT with clean session off is refused
      (not authorised), so the broker holds nothing for the role once its connections
      are gone, and ``max_connections`` bounds every session of the role, not only the
      live ones. MQTT 5 keeps a session also when the CONNECT sets a session expiry with
      clean start on, which the plugin cannot see: ``persistent_sessions=False`` needs
      ``mqtt5=False``.

    Client accounts (:func:`default_role_limits`) get neither: MQTT 3.1.1 with clean
    sessions, what both device clients use (``MqttChannel`` through aiomqtt's default,
    the JavaScript client's ``protocolVersion: 4, clean: true``); a device that lost its
    connection learns what it missed from the retained spec and outcome and by sending
    its envelope again until a receipt names it. The services' accounts keep both
    (operators' tools may use MQTT 5); their properties count toward their payload
    limits, and the broker drops a session left without a connection after
    :data:`PERSISTENT_CLIENT_EXPIRATION`. Every session, live or kept, holds at most
    ``max_queued_bytes`` (:data:`DEFAULT_MAX_QUEUED_BYTES`).

    Whatever the limits, the plugin refuses (not authorised) a CONNECT whose client id
    is held by a live connection of another username: mosquitto would otherwise close
    that connection (session takeover), letting any account knock any other off. A
    reconnect with the same client id and the same username still replaces the old
    connection, and counts as one connection.
    """

    max_payload: int
    max_connections: int
    retain: tuple[str, ...] = ()
    mqtt5: bool = True
    persistent_sessions: bool = True

    def __post_init__(self) -> None:
        if self.max_payload < 0 or self.max_connections < 0:
            raise ValueError("max_payload and max_connections must be >= 0 (0 = no limit)")
        if not self.persistent_sessions and self.mqtt5:
            raise ValueError("persistent_sessions=False needs mqtt5=False: an MQTT 5 session expiry is invisible to the plugin")
        for topic_filter in self.retain:
            if not topic_filter or "," in topic_filter or any(c.isspace() for c in topic_filter):
                raise ValueError(f"retain: bad topic filter {topic_filter!r}")


def default_role_limits(max_packet_size: int = DEFAULT_MAX_PACKET_SIZE) -> dict[str, RoleLimits]:
    """The limits of each role of :data:`TOPIC_ACCESS`, derived from the protocol.

    * payload: the largest codec limit (``codec.MESSAGE_TYPES``) of the messages the role
      publishes (:data:`ROLE_MESSAGES`), capped at ``max_packet_size``. For a client that
      is the envelope limit, 4096 bytes: the largest envelope any mechanism produces
      today is under 400 bytes (``onion.EnvelopeFormat(round_id, mechanism).size``) and a
      report at its own codec limit (256 bytes) would make one of about 520, so 4096
      leaves headroom for new mechanisms while refusing anything the shuffler's
      decoder would refuse. The analyzer's is the signed spec's (25 KiB); the
      shuffler's is a batch chunk's, so the broker-wide ``max_packet_size`` binds;
    * retain: only on the topics the protocol retains (:data:`ROLE_RETAINED_SUFFIXES`);
    * connections per username: :data:`ROLE_CONNECTIONS`;
    * MQTT 5 and persistent sessions: :data:`ROLE_MQTT5_AND_SESSIONS` (clients: neither).
    """
    from shuffledp.protocol.wire import codec  # not at import time: keep the operator tool light

    limits = {}
    for role, access in TOPIC_ACCESS.items():
        payload = max(codec.MESSAGE_TYPES[tag][1] for tag in ROLE_MESSAGES[role])
        retain = tuple(f for f in access.get("write", ()) if f.endswith(ROLE_RETAINED_SUFFIXES[role]))
        mqtt5, persistent = ROLE_MQTT5_AND_SESSIONS[role]
        limits[role] = RoleLimits(min(payload, max_packet_size), ROLE_CONNECTIONS[role], retain, mqtt5, persistent)
    return limits


def role_plugin_options(limits: Mapping[str, RoleLimits], roles_file: Path) -> list[str]:
    """The ``plugin_opt_*`` lines that hand ``limits`` and the users' roles to the plugin."""
    lines = [f"plugin_opt_roles_file {roles_file}"]
    for role, limit in limits.items():
        lines += [
            f"plugin_opt_{role}_max_payload {limit.max_payload}",
            f"plugin_opt_{role}_max_connections {limit.max_connections}",
            f"plugin_opt_{role}_retain {','.join(limit.retain) or '-'}",
            f"plugin_opt_{role}_mqtt5 {int(limit.mqtt5)}",
            f"plugin_opt_{role}_persistent_sessions {int(limit.persistent_sessions)}",
        ]
    return lines


def find_compiler() -> str | None:
    """The system C compiler: ``$CC`` if set, else ``cc`` or ``gcc`` on ``PATH``; None if none."""
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate:
            path = shutil.which(candidate)
            if path:
                return path
    return None


#: The bytes of the plugins built by this process, by source hash: a later broker (in any
#: directory, after the first one's was removed) gets a copy instead of another compiler run.
_built_plugins: dict[str, bytes] = {}


def build_role_plugin(directory: Path | str, *, source: Path = ROLE_PLUGIN_SOURCE) -> tuple[Path | None, str]:
    """Compile the per-role limits plugin into ``directory``: ``(path, "")`` or ``(None, why not)``.

    The file is ``shuffledp_roles-<sha256 of the source>.so`` (mode 0600), reused when it
    already exists, else written from what this process compiled before from the same
    source (kept in memory, never read back from another process's files). It needs a C
    compiler (:func:`find_compiler`) and the mosquitto plugin headers (Debian
    ``mosquitto-dev``); the broker binary provides the symbols the plugin calls when it
    loads it.
    """
    directory = Path(directory)
    try:
        code = source.read_bytes()
    except OSError as exc:
        return None, f"cannot read the plugin source {source} ({exc.strerror})"
    digest = hashlib.sha256(code).hexdigest()[:16]
    target = directory / f"shuffledp_roles-{digest}.so"
    if target.is_file():
        return target, ""
    built = _built_plugins.get(digest)
    partial = directory / f".{target.name}.{os.getpid()}.tmp"
    if built is not None:
        _write_private(partial, built)
    else:
        compiler = find_compiler()
        if compiler is None:
            return None, "no C compiler (cc or gcc) found"
        try:
            done = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(partial), str(source)],
                capture_output=True, text=True, timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"running {compiler} failed ({exc})"
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            output = (done.stderr or done.stdout).strip()
            if any(header in output for header in ("mosquitto_broker.h", "mosquitto_plugin.h", "mosquitto.h", "mqtt_protocol.h")):
                return None, "the mosquitto plugin headers are missing (Debian packages mosquitto-dev, libmosquitto-dev)"
            detail = output.splitlines()[-1] if output else f"exit status {done.returncode}"
            return None, f"compiling {source.name} with {compiler} failed: {detail}"
    os.chmod(partial, _OWNER_ONLY)
    _built_plugins[digest] = partial.read_bytes()
    os.replace(partial, target)
    return target, ""



# --------------------------------------------------------------------------- config


def mosquitto_conf(
    *,
    host: str,
    port: int,
    tls: TlsFiles,
    password_file: Path,
    acl_file: Path,
    plaintext_port: int | None = None,
    websocket_port: int | None = None,
    persistence_dir: Path | None = None,
    run_as: str | None = None,
    max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
    max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES,
    max_inflight_messages: int = DEFAULT_MAX_INFLIGHT_MESSAGES,
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    role_plugin: Path | None = None,
    role_limits: Mapping[str, RoleLimits] | None = None,
    roles_file: Path | None = None,
) -> str:
    """The text of a mosquitto 2.x configuration for shuffledp.

    Guarantees: anonymous clients are refused; every user is checked against the
    password file and the ACL; the main listener (``host:port``) speaks only TLS 1.2
    or later with the given server certificate (clients are not asked for one); a
    plaintext listener exists only if ``plaintext_port`` is given, and then binds
    127.0.0.1 only. With ``websocket_port`` a second listener on ``host`` speaks MQTT
    over WebSocket over TLS 1.2 or later (``wss://``) with the same certificate, for
    devices in web pages; mosquitto 2.0 cannot run a WebSocket listener alone, so it
    always sits beside the main one. ``per_listener_settings false`` makes the password
    file, the ACL and the plugin apply to every listener alike. Messages live in memory only unless ``persistence_dir`` is set.
    With ``role_plugin`` (from :func:`build_role_plugin`) the broker loads it with
    ``role_limits`` and the ``roles_file`` (``username role`` lines): each role's
    payload, retain, connection, protocol and session limits (:class:`RoleLimits`)
    apply on top of the password file and the ACL. Whatever the plugin, every client
    session holds at most ``max_queued_bytes`` (0: no limit) of messages in flight and
    queued, and a session left without a connection is dropped after
    :data:`PERSISTENT_CLIENT_EXPIRATION`.
    """
    lines = [
        "# Generated by shuffledp.deploy.broker; regenerate rather than edit.",
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {password_file}",
        f"acl_file {acl_file}",
    ]
    if role_plugin is not None:
        if role_limits is None or roles_file is None:
            raise ValueError("role_plugin needs role_limits and roles_file")
        # mosquitto 2.0 asks this plugin first; it only ever refuses (or defers to the
        # password file and the ACL file), so it narrows what they allow.
        lines += ["", "# Per-role limits (shuffledp.deploy.broker.RoleLimits).", f"plugin {role_plugin}"]
        lines += role_plugin_options(role_limits, roles_file)
        lines.append("")
    if run_as:
        # Only used when started as root: mosquitto would otherwise switch to the
        # 'mosquitto' user, which cannot read the 0600 files written here.
        lines.append(f"user {run_as}")
    if persistence_dir is None:
        lines.append("persistence false")
    else:
        lines += ["persistence true", f"persistence_location {str(persistence_dir).rstrip('/')}/"]
    lines += [
        f"max_packet_size {max_packet_size}",
        f"max_queued_messages {max_queued_messages}",
        f"max_queued_bytes {max_queued_bytes}",
        f"persistent_client_expiration {PERSISTENT_CLIENT_EXPIRATION}",
        f"max_inflight_messages {max_inflight_messages}",
        "set_tcp_nodelay true",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        "",
        f"listener {port} {host}",
        "protocol mqtt",
        f"cafile {tls.ca_file}",
        f"certfile {tls.cert_file}",
        f"keyfile {tls.key_file}",
        "require_certificate false",
        "tls_version tlsv1.2",
    ]
    if websocket_port is not None:
        lines += [
            "",
            "# MQTT over WebSocket over TLS (wss://), for devices in web pages (asked for explicitly).",
            f"listener {websocket_port} {host}",
            "protocol websockets",
            f"cafile {tls.ca_file}",
            f"certfile {tls.cert_file}",
            f"keyfile {tls.key_file}",
            "require_certificate false",
            "tls_version tlsv1.2",
        ]
    if plaintext_port is not None:
        lines += ["", "# Plaintext, loopback only (asked for explicitly).", f"listener {plaintext_port} 127.0.0.1", "protocol mqtt"]
    return "\n".join(lines) + "\n"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it; it may be taken later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _accepts(host: str, port: int, context: ssl.SSLContext | None, timeout: float = 0.5) -> bool:
    """Whether ``host:port`` accepts a TCP connection (and, with ``context``, completes
    a TLS handshake that verifies against it)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            if context is not None:
                with context.wrap_socket(raw, server_hostname=host):
                    pass
        return True
    except OSError:  # ssl.SSLError and socket timeouts included
        return False


def _reap(process: subprocess.Popen) -> None:
    """Kill ``process`` if it still runs (safety net for a Broker never stopped)."""
    if process.poll() is None:
        process.kill()
        process.wait()


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


#: ``prctl(2)`` option asking Linux to signal a process when its parent dies.
_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child receive
    ``sig`` when the process that started it dies (even by SIGKILL), or ``None``
    where this is unavailable (not Linux, or no ``prctl`` in the C library).

    libc is resolved here, in the parent, so the child only makes the system call
    between ``fork`` and ``exec``. If the parent is already gone by then, the child
    signals itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


# --------------------------------------------------------------------------- broker


class BrokerTier:
    """What every broker tier the deployment runs shares, whatever its server: the accounts
    (``users``), where parties connect, and a lifetime bound to ``with`` / ``async with``.

    A subclass sets ``users``, ``host``, ``directory`` and ``_owns_directory`` and provides
    :meth:`start` (returning itself) and :meth:`stop`; :meth:`close` stops it and removes a
    directory it made. :class:`Broker` is one mosquitto; ``shuffledp.deploy.nats_cluster``'s
    ``NatsCluster`` is a cluster of NATS servers.
    """

    users: "BrokerUsers"
    host: str
    directory: Path
    _owns_directory: bool

    def start(self):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def credentials(self, role: str) -> tuple[str, str]:
        """``(username, password)`` of the first account of ``role`` (``KeyError`` if none)."""
        users = self.users.for_role(role)
        if not users:
            raise KeyError(f"no broker user has role {role!r}")
        return users[0].username, users[0].password

    def _account(self, role_or_username: str) -> tuple[str, str]:
        """The account named ``role_or_username``, else the first account of that role."""
        try:
            user = self.users.get(role_or_username)
        except KeyError:
            return self.credentials(role_or_username)
        return user.username, user.password

    def _connect_host(self) -> str:
        """Where a party connects to reach a listener bound to ``host`` (a wildcard: loopback)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)

    def close(self) -> None:
        """Stop and, if the directory was a temporary one made here, remove it."""
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self):
        try:
            return await asyncio.to_thread(self.start)
        except BaseException:
            await asyncio.to_thread(self.close)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.close)


class Broker(BrokerTier):
    """A mosquitto broker configured for shuffledp, run as a subprocess.

    ``Broker(directory)`` writes users, passwords, TLS material and the config into
    ``directory`` (a new private temporary directory, removed by :meth:`close`, if
    none is given). :meth:`start` runs mosquitto and returns once its listeners
    accept TCP connections; :meth:`stop` ends it (SIGTERM, then SIGKILL after
    ``timeout``); :meth:`restart` starts it again **on the same ports** with the same
    files. Use as ``with Broker() as b:`` or ``async with Broker() as b:`` (the async
    form runs the blocking start and stop in a worker thread).

    Passwords and certificates are made once per instance (on the first start or
    by :meth:`write_files`) and therefore survive restarts.

    With ``die_with_parent=True`` (Linux) mosquitto receives SIGTERM when the thread
    that started it ends, e.g. when its process is killed with SIGKILL, so a broker
    never outlives the program that owns it.

    ``role_limits``: True (default) enforces :func:`default_role_limits` through the
    plugin, a mapping enforces those limits, False runs without the plugin. If the
    plugin cannot be built (no C compiler or no ``mosquitto-dev`` headers) the broker
    runs without it and prints one line saying so; :attr:`role_limits_on` tells
    which, and ``credentials.json`` records it (``role_limits``).

    ``websocket``: True adds an MQTT-over-WebSocket listener with TLS on a free port
    (a port number: on that port) for devices in web pages, at :attr:`websocket_url`
    (also in ``credentials.json``). The same accounts, ACL and per-role limits apply
    on it as on the main listener. Off by default.
    """

    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        users: BrokerUsers | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        plaintext: bool = False,
        websocket: bool | int = False,
        server_names: Sequence[str] = (),
        persistence_dir: Path | str | None = None,
        run_as: str | None = None,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES,
        max_inflight_messages: int = DEFAULT_MAX_INFLIGHT_MESSAGES,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        startup_timeout: float = 10.0,
        mosquitto: str | None = None,
        die_with_parent: bool = False,
        role_limits: Mapping[str, RoleLimits] | bool = True,
    ) -> None:
        self._owns_directory = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="shuffledp-broker-") if directory is None else directory)
        self.users = users if users is not None else BrokerUsers.default()
        if not self.users:
            raise ValueError("users: the broker needs at least one user")
        self.host = host
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port(self._connect_host())
        self.plaintext_port: int | None = free_port() if plaintext else None
        #: Port of the MQTT-over-WebSocket TLS listener (``wss://host:port/``), None when off.
        self._fixed_websocket_port = not isinstance(websocket, bool)
        if isinstance(websocket, bool):
            self.websocket_port: int | None = free_port(self._connect_host()) if websocket else None
        elif 0 < websocket < 65536:
            self.websocket_port = websocket
        else:
            raise ValueError(f"websocket: a port in 1..65535, True or False, got {websocket!r}")
        self.server_names = tuple(server_names)
        self.persistence_dir = Path(persistence_dir) if persistence_dir is not None else None
        self.run_as = run_as if run_as is not None else _current_user()
        self.max_packet_size = max_packet_size
        self.max_queued_messages = max_queued_messages
        self.max_inflight_messages = max_inflight_messages
        self.max_queued_bytes = max_queued_bytes
        self.startup_timeout = startup_timeout
        self._mosquitto = mosquitto
        self.die_with_parent = die_with_parent
        self._process: subprocess.Popen | None = None
        self._tls: TlsFiles | None = None
        self._reaper: weakref.finalize | None = None
        self.starts = 0
        #: The limits asked for (None: no plugin asked for).
        self.role_limits: dict[str, RoleLimits] | None
        if role_limits is True:
            self.role_limits = default_role_limits(max_packet_size)
        elif role_limits is False:
            self.role_limits = None
        else:
            self.role_limits = dict(role_limits)
            unknown = set(self.role_limits) - set(TOPIC_ACCESS)
            if unknown:
                raise ValueError(f"role_limits: unknown roles {sorted(unknown)}")
        self._role_plugin: Path | None = None
        #: Why the per-role limits are off ('' when they are on).
        self.role_limits_off_reason = "" if self.role_limits is not None else "turned off (role_limits=False)"

    # -- files

    @property
    def conf_file(self) -> Path:
        return self.directory / "mosquitto.conf"

    @property
    def log_file(self) -> Path:
        """mosquitto's stderr (its log), appended to across restarts."""
        return self.directory / "mosquitto.log"

    @property
    def credentials_file(self) -> Path:
        """The 0600 JSON file with every user's plaintext password (for the operator)."""
        return self.directory / "credentials.json"

    @property
    def acl_file(self) -> Path:
        return self.directory / "acl"

    @property
    def password_file(self) -> Path:
        return self.directory / "passwd"

    @property
    def websocket_url(self) -> str | None:
        """``wss://HOST:PORT/`` of the WebSocket listener (None when there is none)."""
        if self.websocket_port is None:
            return None
        host = self._connect_host()
        return f"wss://{f'[{host}]' if ':' in host else host}:{self.websocket_port}/"

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients verify the broker against (``tls_ca_file``)."""
        return self.directory / "ca.crt"

    @property
    def roles_file(self) -> Path:
        """``username role`` lines, for the per-role limits plugin."""
        return self.directory / "roles"

    @property
    def role_limits_on(self) -> bool:
        """Whether the written config loads the per-role limits plugin."""
        return self._role_plugin is not None

    def role_limits_status(self) -> dict[str, object]:
        """``{"on": bool, "reason": why off, "limits": {role: {...}}}`` (what ``credentials.json`` records)."""
        limits = {
            role: {"max_payload": limit.max_payload, "max_connections": limit.max_connections, "retain": list(limit.retain),
                   "mqtt5": limit.mqtt5, "persistent_sessions": limit.persistent_sessions}
            for role, limit in (self.role_limits or {}).items()
        }
        return {"on": self.role_limits_on, "reason": self.role_limits_off_reason, "limits": limits if self.role_limits_on else {}}

    def _prepare_role_plugin(self) -> None:
        """Build the plugin once (if asked for); say so once if it cannot be built."""
        if self.role_limits is None or self._role_plugin is not None or self.role_limits_off_reason:
            return
        plugin, reason = build_role_plugin(self.directory)
        if plugin is None:
            self.role_limits_off_reason = reason
            print(f"shuffledp.deploy.broker: per-role broker limits are OFF ({reason}); "
                  f"to turn them on: {ROLE_PLUGIN_PACKAGES}", file=sys.stderr)
            return
        self._role_plugin = plugin

    def write_files(self) -> None:
        """Write the files mosquitto needs into :attr:`directory`.

        TLS material, ACL and password file are made once per :class:`Broker` (so
        certificates and passwords survive restarts); the config and the
        credentials file are rewritten every time (they name the current ports).
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._tls is None:
            tls = generate_tls(self.directory, server_names=self.server_names)
            self.users.write_acl_file(self.acl_file)
            self.users.write_password_file(self.password_file)
            _write_private(self.roles_file, "".join(f"{u.username} {u.role}\n" for u in self.users))
            self._tls = tls
        self._prepare_role_plugin()
        if self.persistence_dir is not None:
            self.persistence_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        extra: dict[str, object] = {}
        if self.websocket_port is not None:
            extra["websocket_url"] = self.websocket_url
        self.users.write_credentials(
            self.credentials_file, host=self._connect_host(), port=self.port, ca_file=str(self._tls.ca_file),
            role_limits=self.role_limits_status(), **extra,
        )
        _write_private(
            self.conf_file,
            mosquitto_conf(
                host=self.host,
                port=self.port,
                tls=self._tls,
                password_file=self.password_file,
                acl_file=self.acl_file,
                plaintext_port=self.plaintext_port,
                websocket_port=self.websocket_port,
                persistence_dir=self.persistence_dir,
                run_as=self.run_as,
                max_packet_size=self.max_packet_size,
                max_queued_messages=self.max_queued_messages,
                max_inflight_messages=self.max_inflight_messages,
                max_queued_bytes=self.max_queued_bytes,
                role_plugin=self._role_plugin,
                role_limits=self.role_limits,
                roles_file=self.roles_file,
            ),
        )

    # -- accounts

    def channel_options(self, role_or_username: str) -> dict[str, object]:
        """Keyword arguments for ``MqttChannel(broker.host, broker.port, **...)``: the
        username and password of an account (by username, else the first of a role)
        and the CA file."""
        username, password = self._account(role_or_username)
        return {"username": username, "password": password, "tls_ca_file": str(self.ca_file)}

    # -- process

    @property
    def running(self) -> bool:
        """Whether the mosquitto process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of mosquitto's log ('' if there is none yet)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> "Broker":
        """Start mosquitto and wait until every listener accepts TCP connections.

        If the OS-chosen port was taken in the meantime (and no port was given), a
        new one is tried, up to three times. Raises :class:`BrokerError` with the tail
        of mosquitto's log if it exits or does not listen within ``startup_timeout``.
        """
        if self.running:
            return self
        attempts = 1 if self._fixed_port or self.starts else 3
        for attempt in range(attempts):
            self.write_files()
            try:
                self._launch()
                self.starts += 1
                return self
            except BrokerError as exc:
                if attempt + 1 == attempts or "in use" not in str(exc).lower():
                    raise
                # The port went to someone else between free_port() and bind: rewrite the config.
                self.port = free_port(self._connect_host())
                if self.plaintext_port is not None:
                    self.plaintext_port = free_port()
                if self.websocket_port is not None and not self._fixed_websocket_port:
                    self.websocket_port = free_port(self._connect_host())
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        binary = self._mosquitto or find_binary("mosquitto")
        log = open(self.log_file, "ab")
        try:
            self._process = subprocess.Popen(
                [binary, "-c", str(self.conf_file)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=parent_death_signal() if self.die_with_parent else None,
            )
        finally:
            log.close()
        # Never leave an orphan broker behind: killed when this object is collected
        # or the interpreter exits, unless stopped before.
        self._reaper = weakref.finalize(self, _reap, self._process)
        # The TLS listener counts as up once a handshake verifies against *our* CA, so
        # another program listening on the port cannot pass for the broker.
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        endpoints: list[tuple[str, int, ssl.SSLContext | None]] = [(self._connect_host(), self.port, tls)]
        if self.websocket_port is not None:  # TLS first, then the WebSocket upgrade: the handshake proves it is ours
            endpoints.append((self._connect_host(), self.websocket_port, tls))
        if self.plaintext_port is not None:
            endpoints.append(("127.0.0.1", self.plaintext_port, None))
        deadline = time.monotonic() + self.startup_timeout
        for host, port, context in endpoints:
            endpoint = (host, port)
            while True:
                if _accepts(host, port, context):
                    break
                if self._process.poll() is not None:
                    code = self._process.returncode
                    self._process = None
                    self._detach_reaper()
                    raise BrokerError(
                        f"mosquitto exited with status {code} before listening on {endpoint[0]}:{endpoint[1]}; "
                        f"log {self.log_file}:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(
                        f"mosquitto did not listen on {endpoint[0]}:{endpoint[1]} within {self.startup_timeout} s; "
                        f"log {self.log_file}:\n{self.log_tail()}"
                    )
                time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop mosquitto (SIGTERM; SIGKILL if it has not exited after ``timeout`` s).

        Its clients see their connections close. Idempotent."""
        process, self._process = self._process, None
        self._detach_reaper()
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """End mosquitto abruptly (SIGKILL), as a crash would. Idempotent."""
        process, self._process = self._process, None
        self._detach_reaper()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def _detach_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None

    def restart(self) -> None:
        """Stop if running, then start again on the same host and ports."""
        self.stop()
        self.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Broker({self.host}:{self.port}, {state}, directory={str(self.directory)!r})"


# --------------------------------------------------------------------------- CLI


def _with_client_connections(count: int) -> dict[str, RoleLimits]:
    """The default role limits with ``count`` connections per client username."""
    if count < 1:
        raise SystemExit("python -m shuffledp.deploy.broker: --client-connections must be >= 1")
    limits = default_role_limits()
    limits["client"] = dataclasses.replace(limits["client"], max_connections=count)
    return limits


def main(argv: Sequence[str] | None = None) -> int:
    """Write a broker deployment directory (and optionally run mosquitto in the foreground)."""
    parser = argparse.ArgumentParser(
        prog="python -m shuffledp.deploy.broker",
        description="Write a mosquitto deployment for shuffledp: ACL from TOPIC_ACCESS, hashed passwords, "
        "TLS CA and server certificate, mosquitto.conf, and credentials.json (0600) for the operator.",
    )
    parser.add_argument("directory", type=Path, help="where to write the files (created 0700)")
    parser.add_argument("--bind", default="127.0.0.1", help="listener address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8883, help="TLS listener port (default 8883)")
    parser.add_argument("--name", action="append", default=[], help="extra DNS name or IP for the server certificate")
    parser.add_argument("--client", action="append", default=[], help="a client username (repeat; default: one shared 'client')")
    parser.add_argument("--plaintext", action="store_true", help="also listen in plaintext on a loopback port")
    parser.add_argument("--websocket-port", type=int, default=None, metavar="PORT",
                        help="also listen for MQTT over WebSocket with TLS (wss://) on PORT, for devices in web pages "
                        "(same accounts, ACL and limits)")
    parser.add_argument("--persistence-dir", type=Path, default=None, help="persist retained messages and sessions there")
    parser.add_argument("--client-connections", type=int, default=ROLE_CONNECTIONS["client"], metavar="N",
                        help="simultaneous connections per client username (default %(default)s; "
                        "a fleet sharing one username needs its size)")
    parser.add_argument("--no-role-limits", action="store_true",
                        help="do not build and load the per-role limits plugin (retain, payload size, connections per user)")
    parser.add_argument("--run", action="store_true", help="run the broker until interrupted")
    parser.add_argument("--background", action="store_true",
                        help="start the broker and return once it accepts TLS connections, leaving it running "
                        "(its pid in DIR/mosquitto.pid: stop it with kill)")
    args = parser.parse_args(argv)
    if args.run and args.background:
        parser.error("--run and --background exclude each other")
    broker = Broker(
        args.directory,
        users=BrokerUsers.default(args.client or ("client",)),
        host=args.bind,
        port=args.port,
        plaintext=args.plaintext,
        websocket=args.websocket_port if args.websocket_port is not None else False,
        server_names=args.name,
        persistence_dir=args.persistence_dir,
        role_limits=False if args.no_role_limits else _with_client_connections(args.client_connections),
    )
    broker.write_files()
    # One password file per account (0600), for the services' --password-file.
    for user in broker.users:
        _write_private(broker.directory / f"{user.username}.pw", f"{user.password}\n")
    names = ", ".join(f"{u.username}.pw" for u in broker.users)
    print(f"wrote {broker.directory}: mosquitto.conf, acl, passwd, ca.crt, server.crt/key, credentials.json, {names}")
    if broker.role_limits_on:
        summary = "; ".join(
            f"{role}: payload <= {limit.max_payload} B, {limit.max_connections or 'any'} connection(s) per user, "
            f"retain {'on ' + ', '.join(limit.retain) if limit.retain else 'never'}"
            f"{'' if limit.mqtt5 else ', MQTT 3.1.1 only'}{'' if limit.persistent_sessions else ', clean sessions only'}"
            for role, limit in (broker.role_limits or {}).items()
        )
        print(f"per-role limits ON ({summary})")
    else:
        print(f"per-role limits OFF: {broker.role_limits_off_reason}")
    if not (args.run or args.background):
        print(f"run: mosquitto -c {broker.conf_file}")
        return 0
    if args.background:
        try:
            broker.start()
        except BrokerError as exc:
            print(f"python -m shuffledp.deploy.broker: {exc}", file=sys.stderr)
            return 1
        broker._detach_reaper()  # mosquitto outlives this process
        pid_file = broker.directory / "mosquitto.pid"
        pid_file.write_text(f"{broker.pid}\n")
        print(f"mosquitto listening on {broker.host}:{broker.port} (TLS), pid {broker.pid}; log {broker.log_file}; "
              f"stop it: kill $(cat {pid_file})")
        return 0
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # stop mosquitto on SIGTERM too
    broker.start()
    print(f"mosquitto listening on {broker.host}:{broker.port} (TLS); log {broker.log_file}; Ctrl-C stops it")
    try:
        while broker.running:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
