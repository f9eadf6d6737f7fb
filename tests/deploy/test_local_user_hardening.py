"""Hardening against another local account and the network (security review F3, F4, F7).

* F3: the key directory and ``public.json`` (the trust anchor: whoever writes it
  chooses the analyzer key the shuffler and devices accept) are refused when they are
  symbolic links, owned by another user, or writable by group or others; private key
  files also when owned by another user; a ``--password-file`` readable by others or
  owned by another user is refused.
* F4: ``--stats-file`` / ``--output`` are written through an unpredictable 0600
  temporary file, so a symbolic link planted at a guessable name redirects nothing.
* F7: a password is never sent in clear to a broker off this host unless
  ``--insecure-plaintext`` says so, and MQTT client ids carry 128 random bits, no pid.

The suite runs as root, who reads any file whatever its mode: modes and owners are set
with chmod/chown and the refusals checked, never inferred from a failed read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from shuffledp.cli import build_parser, main
from shuffledp.deploy.keys import (
    ANALYZER_KEY,
    CREDENTIALS_JSON,
    ISSUER_KEY,
    PUBLIC_JSON,
    SHUFFLER_KEY,
    KeyFileError,
    init_keys,
    load_deployment,
    load_public,
)
from shuffledp.cli.common import UsageError, mqtt_channel, read_password, write_json_atomic

#: An account that owns nothing here (tests run as root, who may chown to it).
OTHER_UID = 54321
ROLES = ("analyzer", "shuffler", "client", "enrollment")
#: The files each role reads (shuffledp/deploy/keys.py).
READS = {
    "analyzer": {ANALYZER_KEY, PUBLIC_JSON},
    "shuffler": {SHUFFLER_KEY, ISSUER_KEY, PUBLIC_JSON},
    "client": {CREDENTIALS_JSON, PUBLIC_JSON},
    "enrollment": {ISSUER_KEY, PUBLIC_JSON},
}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")


@pytest.fixture
def keys(tmp_path) -> Path:
    directory = tmp_path / "keys"
    init_keys(directory, clients=3)
    return directory


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --------------------------------------------------------------------------- F3: the key directory and public.json


def test_a_fresh_key_directory_loads_for_every_role_and_a_readable_public_json_is_fine(keys):
    assert mode_of(keys) == 0o700 and mode_of(keys / PUBLIC_JSON) == 0o644
    for role in ROLES:
        load_deployment(keys, role)
    os.chmod(keys, 0o755)  # others may read and enter the directory and read public.json: it is public
    for role in ROLES:
        load_deployment(keys, role)


@pytest.mark.parametrize("bad_mode", [0o664, 0o646, 0o666])
def test_a_public_json_others_can_write_is_refused_by_every_role(keys, bad_mode):
    os.chmod(keys / PUBLIC_JSON, bad_mode)
    for role in ROLES:
        with pytest.raises(KeyFileError, match=r"public\.json: writable by group or others.*chmod 644"):
            load_deployment(keys, role)
    with pytest.raises(KeyFileError, match=r"public\.json: writable"):
        load_public(keys)


@pytest.mark.parametrize("bad_mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_key_directory_others_can_write_is_refused_by_every_role(keys, bad_mode):
    os.chmod(keys, bad_mode)
    for role in ROLES:
        with pytest.raises(KeyFileError, match=rf"{re.escape(str(keys))}: key directory writable by group or others"
                                               rf".*chmod 700 {re.escape(str(keys))}"):
            load_deployment(keys, role)
    with pytest.raises(KeyFileError, match="chmod 700"):
        load_public(keys)


def test_a_public_json_symlink_is_not_followed(keys, tmp_path):
    """Another user's public.json (their analyzer signing key) behind a symbolic link is refused."""
    theirs = tmp_path / "theirs"
    init_keys(theirs)
    (keys / PUBLIC_JSON).unlink()
    (keys / PUBLIC_JSON).symlink_to(theirs / PUBLIC_JSON)
    for role in ROLES:
        with pytest.raises(KeyFileError, match=r"public\.json: is a symbolic link"):
            load_deployment(keys, role)


def test_a_private_key_symlink_is_not_followed(keys, tmp_path):
    elsewhere = tmp_path / "elsewhere.key"
    shutil.move(keys / ISSUER_KEY, elsewhere)
    (keys / ISSUER_KEY).symlink_to(elsewhere)
    with pytest.raises(KeyFileError, match=r"issuer\.key: is a symbolic link"):
        load_deployment(keys, "shuffler")


def test_a_key_directory_reached_through_a_symlink_is_refused(keys, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(keys)
    for role in ROLES:
        with pytest.raises(KeyFileError, match=rf"{re.escape(str(link))}: key directory is a symbolic link"):
            load_deployment(link, role)
    with pytest.raises(KeyFileError, match="symbolic link"):
        load_deployment(str(link) + "/", "client")  # a trailing slash does not make the link followed


@needs_root
def test_a_key_directory_owned_by_another_user_is_refused(keys):
    os.chown(keys, OTHER_UID, OTHER_UID)  # mode stays 0700: only its owner (not us) can change it
    for role in ROLES:
        with pytest.raises(KeyFileError, match=rf"owned by uid {OTHER_UID}, not by this user"):
            load_deployment(keys, role)


@needs_root
@pytest.mark.parametrize("name", [PUBLIC_JSON, ANALYZER_KEY, SHUFFLER_KEY, ISSUER_KEY, CREDENTIALS_JSON])
def test_a_key_file_owned_by_another_user_is_refused(keys, name):
    before = mode_of(keys / name)
    os.chown(keys / name, OTHER_UID, OTHER_UID)
    os.chmod(keys / name, before)  # same mode as ever: only the owner differs
    for role in ROLES:
        if name in READS[role]:
            with pytest.raises(KeyFileError, match=rf"{re.escape(name)}: owned by uid {OTHER_UID}"):
                load_deployment(keys, role)
        else:
            load_deployment(keys, role)  # a role never reads another role's files, so never refuses them


def test_a_private_file_others_can_write_but_not_read_is_refused(keys):
    os.chmod(keys / ANALYZER_KEY, 0o622)
    with pytest.raises(KeyFileError, match=r"analyzer\.key: private key accessible by others.*chmod 600"):
        load_deployment(keys, "analyzer")


def test_the_services_refuse_a_writable_public_json_in_one_line_with_status_2(keys, capsys):
    os.chmod(keys / PUBLIC_JSON, 0o666)
    status = main(["clients", "run", "--keys", str(keys), "--broker", "127.0.0.1:1", "--users", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("shuffledp clients run: key-file:") and "public.json: writable by group or others" in err[-1]


# --------------------------------------------------------------------------- F3: the password file


def _password_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "client.pw"
    path.write_text("s3cret\n")
    os.chmod(path, mode)
    return path


def test_a_private_password_file_is_read(tmp_path):
    assert read_password(_password_file(tmp_path, 0o600)) == "s3cret"
    assert read_password(_password_file(tmp_path, 0o400)) == "s3cret"


@pytest.mark.parametrize("bad_mode", [0o640, 0o604, 0o620, 0o644])
def test_a_password_file_others_can_access_is_refused(tmp_path, bad_mode):
    path = _password_file(tmp_path, bad_mode)
    with pytest.raises(UsageError, match=rf"--password-file: .*accessible by others \(mode {bad_mode:04o}\); run chmod 600"):
        read_password(path)


@needs_root
def test_a_password_file_owned_by_another_user_is_refused(tmp_path):
    path = _password_file(tmp_path, 0o600)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(UsageError, match=rf"--password-file: .*owned by uid {OTHER_UID}"):
        read_password(path)


def test_the_services_refuse_an_exposed_password_file_in_one_line_with_status_2(keys, tmp_path, capsys):
    path = _password_file(tmp_path, 0o644)
    status = main(["clients", "run", "--keys", str(keys), "--broker", "127.0.0.1:1", "--users", "3",
                   "--username", "client", "--password-file", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("shuffledp clients run: --password-file:") and "chmod 600" in err[-1]


# --------------------------------------------------------------------------- F4: the stats and results files


def test_writing_the_stats_file_does_not_follow_a_symlink_planted_at_the_old_temporary_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's file\n")
    target = tmp_path / "stats.json"
    planted = tmp_path / f".{target.name}.tmp-{os.getpid()}"  # the name the writer used to pick
    planted.symlink_to(victim)

    write_json_atomic(target, {"admitted_total": 7})

    assert victim.read_text() == "the victim's file\n"
    assert not target.is_symlink() and stat.S_ISREG(os.lstat(target).st_mode)
    assert json.loads(target.read_text()) == {"admitted_total": 7}
    assert mode_of(target) == 0o600
    assert planted.is_symlink() and os.readlink(planted) == str(victim)  # left alone, not written through
    leftovers = {p.name for p in tmp_path.iterdir()} - {"victim.txt", "stats.json", planted.name}
    assert not leftovers


def test_the_results_file_replaces_the_old_one_and_is_0600(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old\n")
    os.chmod(target, 0o666)
    write_json_atomic(target, {"estimate": 0.5})
    assert json.loads(target.read_text()) == {"estimate": 0.5}
    assert mode_of(target) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "stats.json"
    target.write_text('{"old": 1}\n')
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert target.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]


# --------------------------------------------------------------------------- F7: plaintext passwords, client ids


def _args(tmp_path: Path, broker: str, *extra: str):
    password = _password_file(tmp_path, 0o600)
    return build_parser().parse_args(["clients", "run", "--keys", str(tmp_path / "keys"), "--broker", broker,
                                      "--users", "3", "--username", "client", "--password-file", str(password), *extra])


@pytest.mark.parametrize("broker", ["192.0.2.10", "192.0.2.10:1883", "broker.example.com:1883", "[2001:db8::1]:1883",
                                    "localhost.example.com", "0.0.0.0:1883"])
def test_a_password_is_not_sent_in_clear_off_this_host(tmp_path, broker):
    with pytest.raises(UsageError, match=r"--password-file without --ca-file would send the password in clear.*"
                                         r"--ca-file.*--insecure-plaintext"):
        mqtt_channel(_args(tmp_path, broker), "client")


@pytest.mark.parametrize("broker", ["127.0.0.1:1883", "127.8.9.10", "localhost:1883", "LOCALHOST", "[::1]:1883"])
def test_a_password_may_go_in_clear_to_the_loopback(tmp_path, broker):
    channel = mqtt_channel(_args(tmp_path, broker), "client")
    assert channel.tls_ca_file is None


def test_insecure_plaintext_or_tls_allow_a_remote_broker(tmp_path):
    assert mqtt_channel(_args(tmp_path, "192.0.2.10:1883", "--insecure-plaintext"), "client").tls_ca_file is None
    ca = tmp_path / "ca.crt"
    ca.write_text("not parsed until connect\n")
    assert mqtt_channel(_args(tmp_path, "192.0.2.10", "--ca-file", str(ca)), "client").tls_ca_file == str(ca)
    # Without a password nothing secret would cross in clear: no refusal.
    args = build_parser().parse_args(["clients", "run", "--keys", str(tmp_path), "--broker", "192.0.2.10", "--users", "3"])
    mqtt_channel(args, "client")


@pytest.mark.parametrize("command", [["shuffler", "serve", "--spool", "s.db"], ["analyzer", "run", "--users", "3"],
                                     ["clients", "run", "--users", "3"]])
def test_every_service_has_insecure_plaintext_in_its_broker_options(command, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command[:2], "--help"])
    assert exited.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--insecure-plaintext" in help_text and "unencrypted" in help_text


def test_the_cli_refuses_a_plaintext_password_to_a_remote_broker_in_one_line_with_status_2(keys, tmp_path, capsys):
    password = _password_file(tmp_path, 0o600)
    status = main(["clients", "run", "--keys", str(keys), "--broker", "broker.invalid:1883", "--users", "3",
                   "--username", "client", "--password-file", str(password)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("shuffledp clients run: --password-file without --ca-file") and "--insecure-plaintext" in err[-1]


@pytest.mark.parametrize("role", ["analyzer", "shuffler", "client"])
def test_client_ids_are_unguessable_and_carry_no_pid(tmp_path, role):
    ids = {mqtt_channel(_args(tmp_path, "127.0.0.1"), role).identifier for _ in range(50)}
    assert len(ids) == 50
    for identifier in ids:
        assert re.fullmatch(rf"shuffledp-{role}-[0-9a-f]{{32}}", identifier), identifier
        assert f"-{os.getpid()}-" not in identifier
