"""The deployable services without a broker: key files, role separation, metrics endpoint, command
lines, and the fleet's retransmission and shutdown on the in-process channel.

The services over a real broker and as real processes are in tests/mqtt/test_services.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from parties import make_spec

from shuffledp.cli import build_parser, main
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet, cancel_and_wait
from shuffledp.deploy import keys as keys_module
from shuffledp.deploy.keys import (
    ANALYZER_KEY,
    CREDENTIALS_JSON,
    ISSUER_KEY,
    PUBLIC_JSON,
    SHUFFLER_KEY,
    AnalyzerSide,
    ClientSide,
    EnrollmentSide,
    KeyFileError,
    ShufflerSide,
    init_keys,
    load_deployment,
)
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, receipts_topic, spec_topic
from shuffledp.protocol.wire.credentials import CREDENTIAL_BYTES
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.cli.common import UsageError, parse_address
from shuffledp.shuffler.metrics import MetricsServer, render_metrics

# --------------------------------------------------------------------------- files opened, for real

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.path.basename(os.fsdecode(args[0])))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one records only inside opened_files()


class opened_files:
    """Names of the files this process opens inside the block (Python's "open" audit event)."""

    def __enter__(self) -> list[str]:
        global _OPENED
        _OPENED = []
        return _OPENED

    def __exit__(self, *exc) -> None:
        global _OPENED
        _OPENED = None


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("deployment") / "keys"
    assert main(["keys", "init", str(directory), "--users", "25"]) == 0
    return directory


# --------------------------------------------------------------------------- keys init


def test_keys_init_layout_and_permissions(keys_dir, capsys):
    assert sorted(p.name for p in keys_dir.iterdir()) == sorted(
        [ANALYZER_KEY, SHUFFLER_KEY, ISSUER_KEY, CREDENTIALS_JSON, PUBLIC_JSON]
    )
    assert mode(keys_dir) == 0o700
    for name, size in ((ANALYZER_KEY, 64), (SHUFFLER_KEY, 64), (ISSUER_KEY, 32)):
        assert mode(keys_dir / name) == 0o600 and (keys_dir / name).stat().st_size == size
    assert mode(keys_dir / CREDENTIALS_JSON) == 0o600
    assert mode(keys_dir / PUBLIC_JSON) == 0o644
    public = json.loads((keys_dir / PUBLIC_JSON).read_text())
    assert public["format"] == "shuffledp-keys/1"
    assert len(bytes.fromhex(public["session_id"])) == 16
    for party in ("analyzer", "shuffler"):
        assert {len(bytes.fromhex(v)) for v in public[party].values()} == {32}
    credentials = json.loads((keys_dir / CREDENTIALS_JSON).read_text())
    assert credentials["session_id"] == public["session_id"]
    assert len(credentials["credentials"]) == 25 and len(set(credentials["credentials"])) == 25
    assert not list(keys_dir.glob(".*"))  # no temporary file left behind

    # What each role loads matches public.json, and the credentials verify at the shuffler.
    analyzer = load_deployment(keys_dir, "analyzer")
    shuffler = load_deployment(keys_dir, "shuffler")
    clients = load_deployment(keys_dir, "client", clients=25)
    assert analyzer.analyzer_keys.signing_public.hex() == public["analyzer"]["signing_public"]
    assert shuffler.shuffler_keys.hpke_public.hex() == public["shuffler"]["hpke_public"]
    assert analyzer.shuffler_identity.signing_public == shuffler.shuffler_keys.signing_public
    assert shuffler.analyzer_signing_key == analyzer.analyzer_keys.signing_public
    assert {len(c) for c in clients.credentials} == {CREDENTIAL_BYTES}
    assert len({shuffler.issuer.verify(c) for c in clients.credentials}) == 25
    assert analyzer.session_id == shuffler.session_id == clients.session_id == bytes.fromhex(public["session_id"])


def test_keys_init_refuses_to_overwrite_unless_forced(tmp_path, capsys):
    directory = tmp_path / "keys"
    assert main(["keys", "init", str(directory), "--users", "3"]) == 0
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    capsys.readouterr()
    assert main(["keys", "init", str(directory), "--users", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shuffledp keys init: key-file:") and "--force" in err and "\n" not in err
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # untouched

    # One existing file is enough to refuse.
    other = tmp_path / "partial"
    other.mkdir()
    (other / ISSUER_KEY).write_bytes(b"x")
    with pytest.raises(KeyFileError, match="issuer.key"):
        init_keys(other)

    assert main(["keys", "init", str(directory), "--users", "5", "--force"]) == 0
    after = {p.name: p.read_bytes() for p in directory.iterdir()}
    assert set(after) == set(before)
    assert all(after[name] != before[name] for name in after)  # every key, the session and the credentials are new
    assert len(load_deployment(directory, "client").credentials) == 5
    assert mode(directory / ANALYZER_KEY) == 0o600


def test_keys_enroll_appends_credentials(tmp_path, capsys):
    directory = tmp_path / "keys"
    init_keys(directory, clients=2)
    first = load_deployment(directory, "client").credentials
    assert main(["keys", "enroll", str(directory), "--users", "3"]) == 0
    assert "now holds 5" in capsys.readouterr().out
    now = load_deployment(directory, "client").credentials
    assert now[:2] == first and len(set(now)) == 5
    issuer = load_deployment(directory, "shuffler").issuer
    assert all(issuer.verify(c) for c in now)
    assert mode(directory / CREDENTIALS_JSON) == 0o600
    with pytest.raises(KeyFileError, match="5 credential\\(s\\) enrolled, 7 needed.*keys enroll"):
        load_deployment(directory, "client", clients=7)


def test_the_credentials_document_size_is_exact():
    for count in (0, 1, 2, 7, 300):
        document = keys_module._credentials_document(os.urandom(16), [os.urandom(CREDENTIAL_BYTES)] * count)
        assert len(document) == keys_module._credentials_document_size(count)


def test_no_key_directory_is_given_more_credentials_than_a_party_loads(tmp_path, monkeypatch, capsys):
    """A party reads at most MAX_CREDENTIALS_BYTES of credentials.json; init and enroll refuse,
    before writing anything, a count whose file would be larger (here the limit is made small)."""
    monkeypatch.setattr(keys_module, "MAX_CREDENTIALS_BYTES", keys_module._credentials_document_size(5))
    assert keys_module.max_enrolled_credentials() == 5
    full = tmp_path / "full"
    init_keys(full, clients=5)
    assert len(load_deployment(full, "client").credentials) == 5  # exactly at the limit: it loads
    before = (full / CREDENTIALS_JSON).read_bytes()
    with pytest.raises(KeyFileError, match="6 credentials would not load.*at most 5 credentials"):
        keys_module.enroll(full, 1)
    assert (full / CREDENTIALS_JSON).read_bytes() == before
    assert main(["keys", "init", str(tmp_path / "over"), "--users", "6"]) == 2
    assert "at most 5 credentials per key directory" in capsys.readouterr().err
    assert not (tmp_path / "over").exists()


# --------------------------------------------------------------------------- role separation


ALLOWED = {
    "analyzer": {ANALYZER_KEY, PUBLIC_JSON},
    "shuffler": {SHUFFLER_KEY, ISSUER_KEY, PUBLIC_JSON},
    "client": {CREDENTIALS_JSON, PUBLIC_JSON},
    "enrollment": {ISSUER_KEY, PUBLIC_JSON},
}


@pytest.mark.parametrize("role", sorted(ALLOWED))
def test_each_role_opens_only_its_own_files(keys_dir, role):
    with opened_files() as opened:
        side = load_deployment(keys_dir, role)
    assert set(opened) == ALLOWED[role] | {keys_dir.name}  # the files, and the key directory they are opened in
    kinds = {"analyzer": AnalyzerSide, "shuffler": ShufflerSide, "client": ClientSide, "enrollment": EnrollmentSide}
    assert type(side) is kinds[role]


@pytest.mark.parametrize("role", ["analyzer", "shuffler", "client"])
def test_each_role_loads_with_the_other_roles_files_gone(keys_dir, tmp_path, role):
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    for name in ALLOWED[role]:
        (copy / name).write_bytes((keys_dir / name).read_bytes())
        os.chmod(copy / name, mode(keys_dir / name))
    side = load_deployment(copy, role)
    assert side.session_id == load_deployment(keys_dir, role).session_id


def test_the_analyzer_holds_no_shuffler_or_issuer_secret(keys_dir):
    side = load_deployment(keys_dir, "analyzer")
    assert set(vars(side)) == {"public", "analyzer_keys"}
    client = load_deployment(keys_dir, "client")
    assert set(vars(client)) == {"public", "credentials"}
    shuffler = load_deployment(keys_dir, "shuffler")
    assert set(vars(shuffler)) == {"public", "shuffler_keys", "issuer"}


def test_loaders_refuse_bad_files(keys_dir, tmp_path):
    def copy_of() -> Path:
        target = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        target.mkdir(mode=0o700)
        for p in keys_dir.iterdir():
            (target / p.name).write_bytes(p.read_bytes())
            os.chmod(target / p.name, mode(p))
        return target

    swapped = copy_of()
    a, s = (swapped / ANALYZER_KEY).read_bytes(), (swapped / SHUFFLER_KEY).read_bytes()
    (swapped / ANALYZER_KEY).write_bytes(s)
    (swapped / SHUFFLER_KEY).write_bytes(a)
    with pytest.raises(KeyFileError, match="analyzer.key: does not match"):
        load_deployment(swapped, "analyzer")
    with pytest.raises(KeyFileError, match="shuffler.key: does not match"):
        load_deployment(swapped, "shuffler")

    exposed = copy_of()
    os.chmod(exposed / SHUFFLER_KEY, 0o640)
    with pytest.raises(KeyFileError, match="readable by others.*chmod 600"):
        load_deployment(exposed, "shuffler")

    short = copy_of()
    (short / ISSUER_KEY).write_bytes(b"\0" * 31)
    with pytest.raises(KeyFileError, match="issuer.key: expected 32 bytes, found 31"):
        load_deployment(short, "shuffler")

    missing = copy_of()
    (missing / PUBLIC_JSON).unlink()
    with pytest.raises(KeyFileError, match="public.json: missing"):
        load_deployment(missing, "client")

    foreign = copy_of()
    other = tmp_path / "other"
    init_keys(other, clients=1)
    (foreign / CREDENTIALS_JSON).write_bytes((other / CREDENTIALS_JSON).read_bytes())
    with pytest.raises(KeyFileError, match="another session"):
        load_deployment(foreign, "client")

    with pytest.raises(KeyFileError, match="role"):
        load_deployment(keys_dir, "auditor")


# --------------------------------------------------------------------------- metrics

STATS = {
    "session_id": "00" * 16,
    "uptime_s": 12.5,
    "rounds": [
        {"round_id": 0, "outcome": "served", "admitted": 300, "forwarded": 300, "chunks": 1, "resumed": 120,
         "retransmitted": 4, "receipts_unsent": 0, "rejected": {"bad-credential": 2}},
        {"round_id": 1, "outcome": "batch-too-small", "admitted": 3, "forwarded": 0, "chunks": 0, "resumed": 0,
         "retransmitted": 0, "receipts_unsent": 1, "rejected": {}},
        {"round_id": 2, "outcome": "open", "admitted": 7, "forwarded": 0, "chunks": 0, "resumed": 0,
         "retransmitted": 0, "receipts_unsent": 0, "rejected": {"quota": 1}},
    ],
    "admitted_total": 310,
    "rejected_total": {"bad-credential": 2, "quota": 1},
    "rejected_announcements": {"bad-signature": 1},
    "rejected_acks": {},
    "acknowledged_batches": 1,
    "republished_batches": 2,
}


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_render_metrics_counts_everything_an_operator_reads():
    text = render_metrics(STATS, {"connected": True, "reconnects": 3, "republished": 1, "dropped": 0})
    got = samples(text)
    p = "shuffledp_shuffler_"
    assert got[p + "admitted_total"] == 310
    assert got[p + 'rejected_total{reason="bad-credential"}'] == 2 and got[p + 'rejected_total{reason="quota"}'] == 1
    assert got[p + 'rounds_total{outcome="released"}'] == 1
    assert got[p + 'rounds_total{outcome="served"}'] == 1
    assert got[p + 'rounds_total{outcome="failed"}'] == 1
    assert got[p + 'rounds_failed_total{reason="batch-too-small"}'] == 1
    assert got[p + "rounds_open"] == 1
    assert got[p + "acknowledged_batches_total"] == 1 and got[p + "republished_batches_total"] == 2
    assert got[p + "resumed_total"] == 120 and got[p + "retransmitted_total"] == 4
    assert got[p + "uptime_seconds"] == 12.5
    assert got[p + "mqtt_connected"] == 1 and got[p + "mqtt_reconnects_total"] == 3
    assert got[p + 'rejected_announcements_total{reason="bad-signature"}'] == 1
    # Each metric has one HELP and one TYPE line, before its samples.
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert text.endswith("\n")


async def _request(port: int, data: bytes, *, half_close: bool = True, read: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if half_close:
        writer.write_eof()
    response = await asyncio.wait_for(reader.read(), 5) if read else b""
    writer.close()
    return response


async def test_metrics_endpoint_serves_counters_and_survives_junk():
    server = MetricsServer(lambda: render_metrics(STATS), read_timeout=0.3, max_request_bytes=1024)
    port = await server.start()
    try:
        ok = await _request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = ok.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.0 200 OK") and b"text/plain; version=0.0.4" in head
        assert b"shuffledp_shuffler_admitted_total 310" in body
        assert int(next(h for h in head.split(b"\r\n") if h.startswith(b"Content-Length")).split(b":")[1]) == len(body)

        junk = {
            b"\x00\xff\x16\x03\x01 binary junk\r\n\r\n": b"400",             # e.g. a TLS ClientHello
            b"GET /metrics\r\n\r\n": b"400",                                 # no version
            b"GET /metrics HTTP/1.0\r\n" + b"X: y\r\n" * 300 + b"\r\n": b"400",  # head too large
            b"GET /" + b"a" * 5000 + b" HTTP/1.0\r\n\r\n": b"400",            # line over the limit
            b"POST /metrics HTTP/1.0\r\n\r\n": b"405",
            b"GET /secret HTTP/1.0\r\n\r\n": b"404",
            b"GET /metrics HTTP/1.0\r\n": b"400",                            # ends before the blank line
            "GET /métrics HTTP/1.0\r\n\r\n".encode(): b"400",                # not ASCII
            b"": b"400",                                                     # connect, close
        }
        for request, status in junk.items():
            response = await _request(port, request)
            assert response.startswith(b"HTTP/1.0 " + status) or (request == b"" and response in (b"", b"HTTP/1.0 400")), request[:40]
        slow = await _request(port, b"GET /met", half_close=False)  # never finishes its request line
        assert slow.startswith(b"HTTP/1.0 408")
        head_only = await _request(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert head_only.startswith(b"HTTP/1.0 200") and head_only.endswith(b"\r\n\r\n")
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # reset mid-request
        writer.write(b"GET /metr")
        writer.transport.abort()

        many = await asyncio.gather(*(_request(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n") for _ in range(20)))
        assert all(r.startswith(b"HTTP/1.0 200") for r in many)
        again = await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert b"shuffledp_shuffler_admitted_total 310" in again
        assert server.served == 23 and server.bad_requests >= len(junk) + 1
    finally:
        await server.close()


async def test_metrics_render_failure_is_a_500_not_a_crash():
    def broken() -> str:
        raise RuntimeError("boom")

    server = MetricsServer(broken)
    port = await server.start()
    try:
        assert (await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 500")
        assert (await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 500")
    finally:
        await server.close()


# --------------------------------------------------------------------------- command lines


def test_broker_addresses():
    assert parse_address("mqtt.example.org:8883", 1883) == ("mqtt.example.org", 8883)
    assert parse_address("10.0.0.1", 8883) == ("10.0.0.1", 8883)
    assert parse_address("[::1]:1884", 1883) == ("::1", 1884)
    assert parse_address("[::1]", 1883) == ("::1", 1883)
    assert parse_address("::1", 8883) == ("::1", 8883)  # a bare IPv6 address takes the default port
    for bad in ("", ":1883", "host:", "host:99999", "host:0", "host:x", "[::1", "[::1]x"):
        with pytest.raises(UsageError):
            parse_address(bad, 1883)


@pytest.mark.parametrize(
    "command, words",
    [
        (["keys", "init"], ["0600", "public.json", "--force"]),
        (["keys", "enroll"], ["issuer.key"]),
        (["shuffler", "serve"], ["kill -9", "SIGTERM", "Prometheus", "--spool", "--stats-file", "--metrics-port"]),
        (["analyzer", "run"], ["estimate", "exit status 1", "--protocol", "--min-batch", "--json"]),
        (["clients", "run"], ["credentials.json", "never issuer.key", "--users", "--seed"]),
        (["up"], ["mosquitto", "TLS", "ACL", "separate processes", "--users"]),
    ],
)
def test_every_command_explains_itself(command, words, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for word in words:
        assert word in text, word


def test_configuration_errors_are_one_line_and_status_2(keys_dir, tmp_path, capsys):
    status = main(["analyzer", "run", "--keys", str(tmp_path / "nowhere"), "--broker", "127.0.0.1:1", "--users", "10"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("shuffledp analyzer run: key-file:") and "public.json: missing" in err[-1]

    status = main(["clients", "run", "--keys", str(keys_dir), "--broker", "127.0.0.1:1", "--users", "26"])
    assert status == 2
    assert "25 credential(s) enrolled, 26 needed" in capsys.readouterr().err

    status = main(["shuffler", "serve", "--keys", str(keys_dir), "--broker", "127.0.0.1:1",
                   "--password-file", str(tmp_path / "missing"), "--spool", str(tmp_path / "s.db")])
    assert status == 2
    assert "--password-file: cannot read" in capsys.readouterr().err


def test_an_unreachable_broker_is_one_line_and_status_1(keys_dir, tmp_path, capsys):
    from shuffledp.deploy.broker import free_port

    status = main(["shuffler", "serve", "--keys", str(keys_dir), "--broker", f"127.0.0.1:{free_port()}",
                   "--spool", str(tmp_path / "s.db"), "--connect-retry", "0.3"])
    assert status == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("shuffledp shuffler serve: transport:") and "refused" in last and "tried for 0.3 s" in last


# --------------------------------------------------------------------------- the fleet, in process


def _fleet(deployment, channel, n: int, **options):
    clients = [deployment.client(np.array([1.0]), PrivacyLedger(1.0)) for _ in range(n)]
    return Fleet(channel, deployment.session_id, clients, SeededSource(1), **options), clients


async def test_fleet_sends_again_what_no_shuffler_received():
    deployment = Deployment()
    channel = InProcessChannel()
    fleet, clients = _fleet(deployment, channel, 30, retry_interval=0.2)
    spec = make_spec(round_id=0, min_batch=30, max_batch=30, deadline=time.time() + 30, deployment=deployment)
    signed = deployment.analyzer().sign_spec(spec)
    await channel.publish(spec_topic(spec.session_id), signed, retain=True)  # no shuffler listens yet
    serving = asyncio.create_task(fleet.serve(rounds=1))
    await asyncio.sleep(0.3)
    assert fleet.rounds[0].sent == 30 and fleet.rounds[0].admitted == 0  # all lost
    shuffler = deployment.shuffler(channel)
    shuffler_task = asyncio.create_task(shuffler.serve())
    await channel.publish(announce_topic(spec.session_id), signed, retain=True)
    try:
        (state,) = await asyncio.wait_for(serving, 10)
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
    assert state.admitted == 30 and state.retransmitted >= 30 and state.refused == {}
    assert state.outcomes == {0: "released"} and state.released
    assert shuffler.rounds[0].admitted == shuffler.rounds[0].forwarded == 30
    assert all(c.ledger.outcomes[(spec.session_id, 0)] == "released" for c in clients)


async def test_fleet_stops_promptly_while_messages_keep_arriving():
    """Regression: asyncio.wait_for on Python 3.11 swallowed the stop when a message arrived with it."""
    class StalledBroker(InProcessChannel):
        async def publish(self, topic, payload, *, retain=False):
            if topic.endswith("/reports"):
                await asyncio.Event().wait()  # never acknowledged
            await super().publish(topic, payload, retain=retain)

    for delay in (0.05, 0.1, 0.2, 0.3):
        deployment = Deployment()
        channel = StalledBroker()
        fleet, _ = _fleet(deployment, channel, 50, retry_interval=0.1, window=8)
        spec = make_spec(round_id=0, min_batch=50, deadline=time.time() + 30, deployment=deployment)
        await channel.publish(spec_topic(spec.session_id), deployment.analyzer().sign_spec(spec), retain=True)

        async def junk() -> None:
            while True:
                await channel.publish(receipts_topic(spec.session_id, 0), b"junk")
                await asyncio.sleep(0)

        noise = asyncio.create_task(junk())
        serving = asyncio.create_task(fleet.serve(rounds=2))
        await asyncio.sleep(delay)
        serving.cancel()  # once, as a signal handler would
        done, _ = await asyncio.wait({serving}, timeout=3)
        await cancel_and_wait([noise, serving])
        assert done, f"the fleet ignored its cancellation (after {delay} s)"
        assert fleet.bad_messages["receipts-malformed"] > 0
