"""Key files of one deployment: ``shuffledp keys init DIR`` writes them; each service loads only its own.

Layout of ``DIR`` (format ``shuffledp-keys/1``; raw bytes, no PEM, no passphrase)::

    DIR/                        0700
      analyzer.key              0600  64 bytes: X25519 private key (32, raw) || Ed25519 private seed (32, raw)
      shuffler.key              0600  64 bytes: the shuffler's keys, same layout
      issuer.key                0600  32 bytes: the credential issuer's HMAC-SHA256 key
      public.json               0644  what every party reads and devices pin (below)
      credentials.json          0600  the enrolled devices' credentials (below)

``public.json``::

    {"format": "shuffledp-keys/1",
     "session_id": "<32 hex>",
     "analyzer": {"signing_public": "<64 hex>", "hpke_public": "<64 hex>"},
     "shuffler": {"hpke_public": "<64 hex>", "signing_public": "<64 hex>"}}

``credentials.json``::

    {"format": "shuffledp-credentials/1",
     "session_id": "<32 hex>",
     "credentials": ["<96 hex: client id (16 bytes) || tag (32 bytes)>", ...]}

One list rather than one file per device: creating thousands of small files takes
seconds, and one file is replaced atomically (all credentials or none). Device ``i``
of a simulated fleet uses entry ``i``.

Devices pin ``analyzer.signing_public`` (specs must carry its signature) and
``shuffler.signing_public`` (a spec naming another shuffler is refused). The
analyzer's HPKE key is listed for the operator only: clients seal to the key in the
signed spec. ``session_id`` is the one session the deployment's services run.

Who loads what (:func:`load_deployment`), and nothing else:

* ``analyzer``: ``analyzer.key`` and ``public.json`` (never ``issuer.key``,
  ``shuffler.key`` or a credential);
* ``shuffler``: ``shuffler.key``, ``issuer.key`` (it verifies credentials) and
  ``public.json``;
* ``client``: ``public.json`` and ``credentials.json`` (a device cannot mint
  credentials: it never reads ``issuer.key``);
* ``enrollment``: ``issuer.key``, ``public.json`` and ``credentials.json``
  (``shuffledp keys enroll`` issues more credentials).

Guarantees:

* every private file is created with mode 0600 (never briefly wider: created with
  that mode, written and fsynced under a temporary name in the same directory, then
  renamed into place, so a reader never sees a half-written file); the directory
  is 0700;
* :func:`init_keys` refuses to overwrite any existing key file, ``public.json`` or
  ``credentials.json`` unless ``force=True`` (which replaces them all: credentials
  issued under the old issuer key would be refused anyway);
* ``public.json`` is written last, so a directory with ``public.json`` is complete;
* loaders refuse (:class:`KeyFileError`, one line naming the file and the fix) a
  missing file, a file of the wrong length, a private key file group- or
  world-accessible (like ssh), private keys whose public halves disagree with
  ``public.json`` (e.g. ``analyzer.key`` and ``shuffler.key`` swapped, or files from
  two deployments), and a ``credentials.json`` of another session;
* ``public.json`` is the trust anchor (whoever writes it chooses the analyzer key the
  shuffler and devices accept), so loaders open the key directory with
  ``O_DIRECTORY | O_NOFOLLOW`` and every file relative to it with ``O_NOFOLLOW``, and
  refuse a directory or file that is a symbolic link, owned by another user than the
  effective one (root aside), or writable by group or others (``public.json`` may be
  world-readable; the private files must not be accessible to anyone else at all).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shuffledp.analyzer.coordinator import ShufflerIdentity
from shuffledp.protocol.wire.credentials import CREDENTIAL_BYTES, ISSUER_KEY_BYTES, CredentialIssuer
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.ed25519_keys import weak_ed25519_key
from shuffledp.protocol.wire.messages import SESSION_ID_BYTES
from shuffledp.protocol.wire.onion import ShufflerKeys
from shuffledp.protocol.wire.sealing import AnalyzerKeys

FORMAT = "shuffledp-keys/1"
ANALYZER_KEY = "analyzer.key"
SHUFFLER_KEY = "shuffler.key"
ISSUER_KEY = "issuer.key"
PUBLIC_JSON = "public.json"
CREDENTIALS_JSON = "credentials.json"
CREDENTIALS_FORMAT = "shuffledp-credentials/1"
#: Bytes of analyzer.key and shuffler.key: X25519 private (32) || Ed25519 seed (32).
PARTY_KEY_BYTES = 64
ROLES = ("analyzer", "shuffler", "client", "enrollment")

_PRIVATE_MODE = 0o600
_DIR_MODE = 0o700


class KeyFileError(ShuffleDPError):
    """A key directory or file that cannot be used (the message names the file and why)."""

    reason = "key-file"


@dataclass(frozen=True)
class PublicInfo:
    """The contents of ``public.json``: the session and the public keys devices pin."""

    session_id: bytes
    analyzer_signing_public: bytes
    analyzer_hpke_public: bytes
    shuffler: ShufflerIdentity

    def as_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "session_id": self.session_id.hex(),
            "analyzer": {"signing_public": self.analyzer_signing_public.hex(), "hpke_public": self.analyzer_hpke_public.hex()},
            "shuffler": {"hpke_public": self.shuffler.hpke_public.hex(), "signing_public": self.shuffler.signing_public.hex()},
        }


@dataclass(frozen=True)
class AnalyzerSide:
    """What the analyzer holds: its own keys, the session, and the shuffler's public identity."""

    public: PublicInfo
    analyzer_keys: AnalyzerKeys

    @property
    def session_id(self) -> bytes:
        return self.public.session_id

    @property
    def shuffler_identity(self) -> ShufflerIdentity:
        return self.public.shuffler


@dataclass(frozen=True)
class ShufflerSide:
    """What the shuffler holds: its keys, the issuer key (to verify credentials), the analyzer's signing key."""

    public: PublicInfo
    shuffler_keys: ShufflerKeys
    issuer: CredentialIssuer

    @property
    def session_id(self) -> bytes:
        return self.public.session_id

    @property
    def analyzer_signing_key(self) -> bytes:
        return self.public.analyzer_signing_public


@dataclass(frozen=True)
class ClientSide:
    """What devices hold: the public information they pin, and their enrolled credentials."""

    public: PublicInfo
    credentials: tuple[bytes, ...]

    @property
    def session_id(self) -> bytes:
        return self.public.session_id


@dataclass(frozen=True)
class EnrollmentSide:
    """What the enrollment service holds: the issuer key and the public information."""

    public: PublicInfo
    issuer: CredentialIssuer


RoleKeys = AnalyzerSide | ShufflerSide | ClientSide | EnrollmentSide


# --------------------------------------------------------------------------- writing


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode``: a temporary file made with that mode and fsynced, then a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _sync_directory(directory: Path) -> None:
    """Make the renames in ``directory`` durable (fsync of the directory itself)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _party_key_bytes(hpke: X25519PrivateKey, signing: Ed25519PrivateKey) -> bytes:
    return hpke.private_bytes_raw() + signing.private_bytes_raw()


def _credentials_document(session_id: bytes, credentials: list[bytes]) -> bytes:
    doc = {"format": CREDENTIALS_FORMAT, "session_id": session_id.hex(), "credentials": [c.hex() for c in credentials]}
    return (json.dumps(doc, indent=1) + "\n").encode()


def _credentials_document_size(count: int) -> int:
    """The exact size in bytes of :func:`_credentials_document` with ``count`` credentials.

    ``"credentials": []`` becomes ``[`` then, per credential, a newline, two spaces of indent,
    the quoted hex and a comma (:data:`CREDENTIAL_LINE_BYTES`), then ``\n ]`` with the last comma
    dropped: the empty document plus ``1 + count * CREDENTIAL_LINE_BYTES``."""
    empty = len(_credentials_document(bytes(SESSION_ID_BYTES), []))
    return empty if count == 0 else empty + 1 + count * CREDENTIAL_LINE_BYTES


#: Bytes one credential adds to ``credentials.json`` (see :func:`_credentials_document_size`).
CREDENTIAL_LINE_BYTES = 1 + 2 + (2 * CREDENTIAL_BYTES + 2) + 1


def max_enrolled_credentials() -> int:
    """The most credentials one key directory can hold: ``credentials.json`` is read up to
    :data:`MAX_CREDENTIALS_BYTES` (a party refuses a larger file), so issuing more would leave a
    deployment no party can load."""
    return (MAX_CREDENTIALS_BYTES - _credentials_document_size(0) - 1) // CREDENTIAL_LINE_BYTES


def _refuse_past_the_credentials_limit(directory: Path, total: int) -> None:
    limit = max_enrolled_credentials()
    if total > limit:
        raise KeyFileError(
            f"{directory / CREDENTIALS_JSON}: {total:,} credentials would not load (a party reads at most "
            f"{MAX_CREDENTIALS_BYTES >> 20} MiB of it: at most {limit:,} credentials per key directory)"
        )


def init_keys(directory: Path | str, *, clients: int = 0, force: bool = False) -> PublicInfo:
    """Generate a deployment's keys, a session id and ``clients`` credentials into ``directory``.

    Refuses (:class:`KeyFileError`) if any key file, ``public.json`` or
    ``credentials.json`` already exists there, unless ``force``, which replaces them
    all. Returns the public information written to ``public.json``.
    """
    if not isinstance(clients, int) or isinstance(clients, bool) or clients < 0:
        raise KeyFileError(f"clients: must be a non-negative integer, got {clients!r}")
    directory = Path(directory)
    _refuse_past_the_credentials_limit(directory, clients)
    names = (ANALYZER_KEY, SHUFFLER_KEY, ISSUER_KEY, CREDENTIALS_JSON, PUBLIC_JSON)
    existing = [n for n in names if (directory / n).exists()]
    if existing and not force:
        raise KeyFileError(f"{directory} already holds keys ({', '.join(existing)}); pass --force to replace them all")
    directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    os.chmod(directory, _DIR_MODE)
    (directory / PUBLIC_JSON).unlink(missing_ok=True)  # written last: its presence marks a complete directory

    analyzer = AnalyzerKeys.generate()
    shuffler = ShufflerKeys.generate()
    issuer = CredentialIssuer.generate()
    session_id = os.urandom(SESSION_ID_BYTES)
    _write_atomic(directory / ANALYZER_KEY, _party_key_bytes(analyzer.hpke_private, analyzer.signing_private), _PRIVATE_MODE)
    _write_atomic(directory / SHUFFLER_KEY, _party_key_bytes(shuffler.hpke_private, shuffler.signing_private), _PRIVATE_MODE)
    _write_atomic(directory / ISSUER_KEY, issuer.key, _PRIVATE_MODE)
    credentials = issuer.issue_many(clients)
    _write_atomic(directory / CREDENTIALS_JSON, _credentials_document(session_id, credentials), _PRIVATE_MODE)
    public = PublicInfo(
        session_id=session_id,
        analyzer_signing_public=analyzer.signing_public,
        analyzer_hpke_public=analyzer.hpke_public,
        shuffler=ShufflerIdentity(shuffler.hpke_public, shuffler.signing_public),
    )
    _write_atomic(directory / PUBLIC_JSON, (json.dumps(public.as_json(), indent=2) + "\n").encode(), 0o644)
    _sync_directory(directory)
    return public


def enroll(directory: Path | str, count: int) -> int:
    """Issue ``count`` more credentials with ``issuer.key``, appended to ``credentials.json``; the new total.

    This is the enrollment service's job: it reads ``issuer.key``, ``public.json``
    and ``credentials.json`` only, and replaces ``credentials.json`` atomically.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise KeyFileError(f"count: must be a positive integer, got {count!r}")
    directory = Path(directory)
    side = load_enrollment(directory)
    enrolled = list(_read_credentials(directory, side.public))
    _refuse_past_the_credentials_limit(directory, len(enrolled) + count)
    credentials = enrolled + side.issuer.issue_many(count)
    _write_atomic(directory / CREDENTIALS_JSON, _credentials_document(side.public.session_id, credentials), _PRIVATE_MODE)
    _sync_directory(directory)
    return len(credentials)


# --------------------------------------------------------------------------- loading


#: Largest credentials.json read (about 160,000 credentials).
MAX_CREDENTIALS_BYTES = 16 << 20


def _trusted_owner(uid: int) -> bool:
    """Whether a key directory or file owned by ``uid`` can be trusted: ours, or root's (who can do anything anyway)."""
    return uid in (os.geteuid(), 0)


def _owner_error(path: Path, uid: int, fix: str) -> KeyFileError:
    return KeyFileError(f"{path}: owned by uid {uid}, not by this user (uid {os.geteuid()}) or root; {fix}")


def _open_directory(directory: Path) -> int:
    """An fd of the key directory (``O_DIRECTORY | O_NOFOLLOW``); refuses a symbolic link, a
    directory owned by another user, or one that group or others can write (they could swap
    ``public.json``, the trust anchor, for their own)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KeyFileError(
            f"{directory / PUBLIC_JSON}: missing (no directory {directory}: create it with `shuffledp keys init {directory}`)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(directory)):
            raise KeyFileError(f"{directory}: key directory is a symbolic link; give the real directory") from None
        if exc.errno == errno.ENOTDIR:
            raise KeyFileError(f"{directory}: not a directory") from None
        raise KeyFileError(f"{directory}: cannot open the key directory ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not _trusted_owner(info.st_uid):
            raise _owner_error(directory, info.st_uid, f"only its owner may hold keys there (chown to this user, then chmod 700 {directory})")
        if info.st_mode & 0o022:
            raise KeyFileError(
                f"{directory}: key directory writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}), "
                f"who could replace {PUBLIC_JSON}; run chmod 700 {directory}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _key_directory(directory: Path) -> Iterator[int]:
    """The checked directory fd of :func:`_open_directory`, closed on exit: every file of one load is opened
    relative to it, so all come from the same directory even if its path is changed meanwhile."""
    fd = _open_directory(directory)
    try:
        yield fd
    finally:
        os.close(fd)


def _read(dir_fd: int, path: Path, size: int | None, *, private: bool) -> bytes:
    """The ``size`` bytes (any size up to 16 MiB if None) of the file ``path.name`` of the key directory ``dir_fd``
    (from :func:`_key_directory`; ``path`` names it in messages), opened without following a symbolic link.

    Refuses a missing, wrong-sized or non-regular file, one owned by another user (root aside), and one
    group or others can access if ``private`` (a key or the credentials) or write if not (``public.json``:
    anyone may read it, but whoever can write it chooses the keys every party trusts).
    """
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: missing (create the directory with `shuffledp keys init`)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KeyFileError(f"{path}: is a symbolic link; key files must be regular files in the key directory") from None
        raise KeyFileError(f"{path}: cannot open ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if not _trusted_owner(info.st_uid):
            raise _owner_error(path, info.st_uid, f"recreate it as this user (chown it, then chmod {600 if private else 644} {path})")
        if private and mode & 0o077:
            exposure = "readable by others" if mode & 0o044 else "accessible by others"
            raise KeyFileError(f"{path}: private key {exposure} (mode {mode:04o}); run chmod 600 {path}")
        if not private and mode & 0o022:
            raise KeyFileError(
                f"{path}: writable by group or others (mode {mode:04o}), who could swap in their own keys; run chmod 644 {path}"
            )
        limit = (size if size is not None else MAX_CREDENTIALS_BYTES) + 1
        chunks = []
        while limit > 0:
            chunk = os.read(fd, limit)
            if not chunk:
                break
            chunks.append(chunk)
            limit -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if size is None:
        if len(data) > MAX_CREDENTIALS_BYTES:
            raise KeyFileError(f"{path}: larger than {MAX_CREDENTIALS_BYTES} bytes")
    elif len(data) != size:
        raise KeyFileError(f"{path}: expected {size} bytes, found {'more' if len(data) > size else len(data)}")
    return data


def _hex_field(doc: dict, path: Path, *keys: str, size: int) -> bytes:
    value: object = doc
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise KeyFileError(f"{path}: missing field {'.'.join(keys)}")
        value = value[key]
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) != size:
        raise KeyFileError(f"{path}: field {'.'.join(keys)} must be {size} bytes in hex")
    return raw


def _signing_field(doc: dict, path: Path, party: str) -> bytes:
    """``party``'s Ed25519 public key, refused if it is a key anyone could sign under
    (a small-order point or a non-canonical encoding: :func:`weak_ed25519_key`)."""
    raw = _hex_field(doc, path, party, "signing_public", size=32)
    problem = weak_ed25519_key(raw)
    if problem is not None:
        raise KeyFileError(f"{path}: field {party}.signing_public is {problem}")
    return raw


def load_public(directory: Path | str) -> PublicInfo:
    """Read and check ``public.json`` (format, session id and the four public keys).

    Refuses (:class:`KeyFileError`) a key directory or ``public.json`` that is a symbolic
    link, owned by another user (root aside) or writable by group or others.
    """
    directory = Path(directory)
    with _key_directory(directory) as dir_fd:
        return _load_public(dir_fd, directory)


def _load_public(dir_fd: int, directory: Path) -> PublicInfo:
    path = directory / PUBLIC_JSON
    raw = _read(dir_fd, path, None, private=False)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{path}: cannot read ({exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise KeyFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise KeyFileError(f"{path}: not a {FORMAT} file")
    return PublicInfo(
        session_id=_hex_field(doc, path, "session_id", size=SESSION_ID_BYTES),
        analyzer_signing_public=_signing_field(doc, path, "analyzer"),
        analyzer_hpke_public=_hex_field(doc, path, "analyzer", "hpke_public", size=32),
        shuffler=ShufflerIdentity(
            _hex_field(doc, path, "shuffler", "hpke_public", size=32),
            _signing_field(doc, path, "shuffler"),
        ),
    )


def _party_keys(dir_fd: int, path: Path) -> tuple[X25519PrivateKey, Ed25519PrivateKey]:
    raw = _read(dir_fd, path, PARTY_KEY_BYTES, private=True)
    try:
        return X25519PrivateKey.from_private_bytes(raw[:32]), Ed25519PrivateKey.from_private_bytes(raw[32:])
    except ValueError as exc:
        raise KeyFileError(f"{path}: not a key ({exc})") from None


def load_analyzer(directory: Path | str) -> AnalyzerSide:
    """The analyzer's keys and the public information; reads ``analyzer.key`` and ``public.json`` only."""
    directory = Path(directory)
    with _key_directory(directory) as dir_fd:
        public = _load_public(dir_fd, directory)
        keys = AnalyzerKeys(*_party_keys(dir_fd, directory / ANALYZER_KEY))
    if (keys.hpke_public, keys.signing_public) != (public.analyzer_hpke_public, public.analyzer_signing_public):
        raise KeyFileError(f"{directory / ANALYZER_KEY}: does not match the analyzer keys in {PUBLIC_JSON}")
    return AnalyzerSide(public, keys)


def load_shuffler(directory: Path | str) -> ShufflerSide:
    """The shuffler's keys, the issuer and the public information; reads ``shuffler.key``, ``issuer.key``, ``public.json``."""
    directory = Path(directory)
    with _key_directory(directory) as dir_fd:
        public = _load_public(dir_fd, directory)
        keys = ShufflerKeys(*_party_keys(dir_fd, directory / SHUFFLER_KEY))
        if (keys.hpke_public, keys.signing_public) != (public.shuffler.hpke_public, public.shuffler.signing_public):
            raise KeyFileError(f"{directory / SHUFFLER_KEY}: does not match the shuffler keys in {PUBLIC_JSON}")
        issuer = CredentialIssuer(_read(dir_fd, directory / ISSUER_KEY, ISSUER_KEY_BYTES, private=True))
    return ShufflerSide(public, keys, issuer)


def _read_credentials(directory: Path, public: PublicInfo, dir_fd: int | None = None) -> tuple[bytes, ...]:
    """The credentials of ``credentials.json`` (checked against ``public``'s session), read relative to
    ``dir_fd`` (a :func:`_key_directory` fd of ``directory``; opened and checked here if None)."""
    if dir_fd is None:
        with _key_directory(directory) as own_fd:
            return _read_credentials(directory, public, own_fd)
    path = directory / CREDENTIALS_JSON
    raw = _read(dir_fd, path, None, private=True)
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise KeyFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != CREDENTIALS_FORMAT or not isinstance(doc.get("credentials"), list):
        raise KeyFileError(f"{path}: not a {CREDENTIALS_FORMAT} file")
    if _hex_field(doc, path, "session_id", size=SESSION_ID_BYTES) != public.session_id:
        raise KeyFileError(f"{path}: credentials of another session than {PUBLIC_JSON}'s")
    credentials = []
    for index, entry in enumerate(doc["credentials"]):
        try:
            credential = bytes.fromhex(entry) if isinstance(entry, str) else b""
        except ValueError:
            credential = b""
        if len(credential) != CREDENTIAL_BYTES:
            raise KeyFileError(f"{path}: credential {index} is not {CREDENTIAL_BYTES} bytes in hex")
        credentials.append(credential)
    return tuple(credentials)


def load_clients(directory: Path | str, count: int | None = None) -> ClientSide:
    """``public.json`` and the first ``count`` credentials of ``credentials.json`` (all if None).

    Raises :class:`KeyFileError` if fewer than ``count`` credentials are enrolled.
    """
    directory = Path(directory)
    with _key_directory(directory) as dir_fd:
        public = _load_public(dir_fd, directory)
        credentials = _read_credentials(directory, public, dir_fd)
    if count is not None:
        if count > len(credentials):
            raise KeyFileError(
                f"{directory / CREDENTIALS_JSON}: {len(credentials)} credential(s) enrolled, {count} needed "
                f"(issue more with `shuffledp keys enroll {directory} --users {count - len(credentials)}`)"
            )
        credentials = credentials[:count]
    return ClientSide(public, credentials)


def load_enrollment(directory: Path | str) -> EnrollmentSide:
    """The issuer key and the public information; reads ``issuer.key`` and ``public.json`` only."""
    directory = Path(directory)
    with _key_directory(directory) as dir_fd:
        public = _load_public(dir_fd, directory)
        issuer = CredentialIssuer(_read(dir_fd, directory / ISSUER_KEY, ISSUER_KEY_BYTES, private=True))
    return EnrollmentSide(public, issuer)


def load_deployment(directory: Path | str, role: str, *, clients: int | None = None) -> RoleKeys:
    """What ``role`` may hold of the deployment in ``directory``, and nothing more (see the module docstring).

    ``clients`` (role ``client`` only) loads the first that many credentials.
    """
    if role == "analyzer":
        return load_analyzer(directory)
    if role == "shuffler":
        return load_shuffler(directory)
    if role == "client":
        return load_clients(directory, clients)
    if role == "enrollment":
        return load_enrollment(directory)
    raise KeyFileError(f"role: must be one of {ROLES}, got {role!r}")


__all__ = [
    "AnalyzerSide",
    "ClientSide",
    "EnrollmentSide",
    "KeyFileError",
    "PublicInfo",
    "ShufflerSide",
    "enroll",
    "init_keys",
    "load_deployment",
    "load_public",
]
