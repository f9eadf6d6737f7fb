"""shuffledp.deploy.broker: the files it writes and the broker it runs."""

from __future__ import annotations

import json
import socket
import ssl
import stat
import warnings

import pytest

from shuffledp.deploy.broker import Broker, BrokerError, BrokerUsers, mosquitto_conf
from shuffledp.protocol.transport.channel import TOPIC_ACCESS

pytestmark = pytest.mark.mqtt


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def acl_blocks(text: str) -> dict[str, list[str]]:
    """user -> its topic lines, parsed back from an ACL file."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("user "):
            current = line.split(" ", 1)[1]
            blocks[current] = []
        elif line.startswith("topic "):
            assert current is not None, "a topic line before any user line would apply to anonymous clients"
            blocks[current].append(line)
    return blocks


def test_acl_is_generated_from_topic_access_for_every_user():
    users = BrokerUsers.default(["device-1", "device-2"])
    users.add("shuffler-b", "shuffler")
    blocks = acl_blocks(users.acl_text())
    assert set(blocks) == {"analyzer", "shuffler", "shuffler-b", "device-1", "device-2"}
    for user in users:
        expected = [f"topic {access} {f}" for access in ("write", "read") for f in TOPIC_ACCESS[user.role][access]]
        assert blocks[user.username] == expected
    assert users.for_role("client") == [users.get("device-1"), users.get("device-2")]


def test_users_are_validated_and_passwords_random():
    users = BrokerUsers()
    a, b = users.add("a", "client"), users.add("b", "client")
    assert a.password != b.password and len(a.password) >= 32
    with pytest.raises(ValueError, match="role"):
        users.add("c", "admin")
    with pytest.raises(ValueError, match="already exists"):
        users.add("a", "analyzer")
    for bad in ("", "with space", "colon:name", "new\nline", "-dash-first", "x" * 65):
        with pytest.raises(ValueError, match="username"):
            users.add(bad, "client")
    with pytest.raises(ValueError, match="password"):
        users.add("d", "client", password="two\nlines")


def test_files_are_private_and_config_is_locked_down(tmp_path):
    broker = Broker(tmp_path / "b", users=BrokerUsers.default(["device-1"]))
    broker.write_files()
    d = broker.directory
    assert mode(d) == 0o700
    for name in ("passwd", "acl", "credentials.json", "ca.key", "server.key", "mosquitto.conf"):
        assert mode(d / name) == 0o600, name
    # Passwords are hashed in the password file, in plaintext only in credentials.json.
    creds = json.loads(broker.credentials_file.read_text())
    passwd = (d / "passwd").read_text()
    assert {u["username"] for u in creds["users"]} == {"analyzer", "shuffler", "device-1"}
    assert creds["port"] == broker.port and creds["ca_file"] == str(broker.ca_file)
    for user in creds["users"]:
        assert user["password"] not in passwd
        assert f"{user['username']}:$7$" in passwd  # PBKDF2-SHA512
    conf = broker.conf_file.read_text().splitlines()
    for line in ("allow_anonymous false", "persistence false", "require_certificate false", "tls_version tlsv1.2",
                 f"listener {broker.port} 127.0.0.1", f"password_file {d / 'passwd'}", f"acl_file {d / 'acl'}",
                 "max_packet_size 67108864", "max_queued_messages 100000"):
        assert line in conf
    assert sum(line.startswith("listener ") for line in conf) == 1  # no plaintext listener unless asked
    assert broker.credentials("client") == ("device-1", creds["users"][2]["password"])


def test_plaintext_listener_only_when_asked_and_only_on_loopback(tmp_path):
    broker = Broker(tmp_path, plaintext=True, host="0.0.0.0")
    broker.write_files()
    conf = broker.conf_file.read_text().splitlines()
    listeners = [line for line in conf if line.startswith("listener ")]
    assert listeners == [f"listener {broker.port} 0.0.0.0", f"listener {broker.plaintext_port} 127.0.0.1"]
    # The plaintext listener's block has no TLS lines; the TLS one has them.
    text = broker.conf_file.read_text()
    assert "cafile" not in text.split(listeners[1])[1]


def test_persistence_dir_option(tmp_path):
    text = Broker(tmp_path / "b", persistence_dir=tmp_path / "p")
    text.write_files()
    conf = text.conf_file.read_text()
    assert "persistence true" in conf and f"persistence_location {tmp_path / 'p'}/" in conf


def test_server_certificate_verifies_for_loopback_names_with_tls12_or_later(broker):
    context = ssl.create_default_context(cafile=str(broker.ca_file))
    for name in ("127.0.0.1", "localhost"):
        with socket.create_connection((broker.host, broker.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with socket.create_connection((broker.host, broker.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname="example.org")
    # A TLS 1.1 client (which this side allows: security level 0) is refused by the broker.
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(str(broker.ca_file))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old.set_ciphers("DEFAULT:@SECLEVEL=0")
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot speak TLS 1.1 at all")
    with socket.create_connection((broker.host, broker.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION|unsupported protocol"):
            old.wrap_socket(raw, server_hostname="127.0.0.1")


def test_extra_server_names_are_in_the_certificate(tmp_path):
    from cryptography import x509

    broker = Broker(tmp_path, server_names=["mqtt.example.org", "10.1.2.3"])
    broker.write_files()
    cert = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "mqtt.example.org"} <= set(san.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "10.1.2.3"} <= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_start_failure_is_a_clear_error_with_the_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = Broker(tmp_path, port=port)
        with pytest.raises(BrokerError, match=r"(?s)mosquitto exited with status \d+ .*in use"):
            broker.start()
        assert not broker.running


def test_stop_restart_keep_port_and_credentials(fresh_broker):
    port, ca, creds = fresh_broker.port, fresh_broker.ca_file.read_bytes(), fresh_broker.credentials("analyzer")
    first_pid = fresh_broker.pid
    fresh_broker.stop()
    assert not fresh_broker.running
    with pytest.raises(OSError):
        socket.create_connection((fresh_broker.host, port), timeout=1).close()
    fresh_broker.restart()
    assert fresh_broker.running and fresh_broker.pid != first_pid
    assert fresh_broker.port == port and fresh_broker.ca_file.read_bytes() == ca
    assert fresh_broker.credentials("analyzer") == creds
    socket.create_connection((fresh_broker.host, port), timeout=1).close()


async def test_async_context_manager_removes_its_temporary_directory():
    async with Broker() as b:
        directory = b.directory
        assert b.running and directory.exists()
    assert not b.running and not directory.exists()


def test_conf_function_is_pure():
    from shuffledp.deploy.broker import TlsFiles
    from pathlib import Path

    tls = TlsFiles(Path("/x/ca.crt"), Path("/x/ca.key"), Path("/x/s.crt"), Path("/x/s.key"))
    text = mosquitto_conf(host="127.0.0.1", port=1, tls=tls, password_file=Path("/x/p"), acl_file=Path("/x/a"))
    assert text == mosquitto_conf(host="127.0.0.1", port=1, tls=tls, password_file=Path("/x/p"), acl_file=Path("/x/a"))
    assert "user " not in text  # run_as only when given


def test_command_line_writes_a_deployment(tmp_path, capsys):
    from shuffledp.deploy.broker import main

    assert main([str(tmp_path / "d"), "--bind", "0.0.0.0", "--port", "8883", "--client", "dev-1", "--client", "dev-2"]) == 0
    assert "mosquitto -c" in capsys.readouterr().out
    conf = (tmp_path / "d" / "mosquitto.conf").read_text()
    assert "listener 8883 0.0.0.0" in conf and "allow_anonymous false" in conf
    users = json.loads((tmp_path / "d" / "credentials.json").read_text())["users"]
    assert [(u["username"], u["role"]) for u in users] == [
        ("analyzer", "analyzer"), ("shuffler", "shuffler"), ("dev-1", "client"), ("dev-2", "client")
    ]
