"""The deployable services as real processes over a real broker (TLS, passwords, ACL): no mocks.

* ``shuffledp up`` runs a whole deployment end to end;
* a shuffler killed with SIGKILL in the middle of a round and restarted on the same
  spool completes the round: the analyzer gets one batch holding every client's
  report exactly once (the fleet re-sends what the dead shuffler never receipted;
  the restarted one resumes the spooled envelopes and counts exact copies once);
  its metrics endpoint serves the counters and survives junk;
* a round below ``min_batch`` makes ``analyzer run`` exit 1 with one line, and a
  session that already ran is refused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shuffledp.audit.claim import claim_report, load_session
from shuffledp.deploy.keys import init_keys, load_public
from shuffledp.protocol.wire.onion import verified_spec

pytestmark = pytest.mark.mqtt

CLI = [sys.executable, "-m", "shuffledp.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def broker_options(broker, tmp_path: Path, role: str) -> list[str]:
    """The command-line options of one broker account (password in a 0600 file)."""
    options = broker.channel_options(role)
    secret = tmp_path / f"{role}.password"
    if not secret.exists():
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{options['password']}\n")
    return ["--broker", f"{broker.host}:{broker.port}", "--ca-file", str(options["tls_ca_file"]),
            "--username", str(options["username"]), "--password-file", str(secret)]


def start(args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    try:
        return subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
    finally:
        out.close()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def http(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def processes():
    """Processes a test starts; any still running at the end are killed (by their own pid)."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_up_runs_a_whole_deployment_and_prints_the_estimate(tmp_path):
    directory = tmp_path / "up"
    done = subprocess.run([*CLI, "up", "--users", "300", "--dir", str(directory)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "Traceback" not in out
    assert re.search(r"^\[up\] broker: mosquitto pid \d+ on 127\.0\.0\.1:\d+ \(TLS", out, re.M)
    for party in ("shuffler", "clients", "analyzer"):
        assert re.search(rf"^\[up\] {party}: pid \d+$", out, re.M)
    estimate = re.search(r"^\[up\] estimate (-?\d+\.\d+) \(standard error [\d.]+, n = 300\); true mean", out, re.M)
    assert estimate, out[-3000:]
    assert "[up] done in" in out and "analyzer exit 0, clients exit 0, shuffler exit 0" in out
    result = json.loads((directory / "result.json").read_text())
    assert [r["reports"] for r in result["rounds"]] == [300, 300]
    assert float(estimate.group(1)) == pytest.approx(result["estimate"], abs=1e-6)
    # Each round records the spec it announced, signed: it verifies under the keys directory's analyzer
    # key (not the key the file names), and the claim audit recomputes the published central epsilon.
    public = load_public(directory / "keys")
    assert result["analyzer_signing_key"] == public.analyzer_signing_public.hex()
    for r in result["rounds"]:
        spec = verified_spec(bytes.fromhex(r["signed_spec"]), public.analyzer_signing_public)
        assert (spec.round_id, spec.mechanism, spec.epsilon0, spec.min_batch) == (r["round_id"], r["mechanism"], r["epsilon0"], r["min_batch"])
        assert spec.session_id == public.session_id
    session = load_session(directory / "result.json", public.analyzer_signing_public)
    claim = claim_report(session, public.analyzer_signing_public, result["central"]["delta"], lower_rounds=None,
                         session_id=public.session_id)
    assert claim["passed"] and claim["analyzer_claim"]["covers"] is True
    assert claim["session"]["epsilon"] == pytest.approx(result["central"]["epsilon"], rel=1e-9)
    stats = json.loads((directory / "shuffler-stats.json").read_text())
    assert stats["acknowledged_batches"] == 2 and stats["admitted_total"] == 600
    for secret in (directory / "secrets").iterdir():
        assert secret.stat().st_mode & 0o077 == 0


def test_shuffler_killed_mid_round_resumes_from_its_spool(broker, tmp_path, processes):
    users = 200
    keys = tmp_path / "keys"
    init_keys(keys, clients=users)
    spool, stats_file = tmp_path / "spool.db", tmp_path / "stats.json"
    shuffler_args = ["shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                     "--spool", str(spool), "--stats-file", str(stats_file), "--stats-interval", "0.05",
                     "--metrics-port", "0"]
    first_log, second_log = tmp_path / "shuffler-1.log", tmp_path / "shuffler-2.log"
    shuffler = start(shuffler_args, first_log)
    processes.append(shuffler)
    fleet = start(["clients", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "client"),
                   "--users", str(users), "--rate", "100", "--retry-interval", "0.5", "--seed", "7",
                   "--output", str(tmp_path / "clients.json")], tmp_path / "clients.log")
    processes.append(fleet)
    analyzer = start(["analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                      "--users", str(users), "--round-timeout", "60", "--json",
                      "--output", str(tmp_path / "result.json")], tmp_path / "analyzer.log")
    processes.append(analyzer)

    def round0_admitted() -> int:
        stats = read_json(stats_file)
        rounds = stats["rounds"] if stats else []
        return rounds[0]["admitted"] if rounds and rounds[0]["round_id"] == 0 else 0

    seen = wait_for(lambda: round0_admitted() >= 40, 30, "round 0 to be under way")
    assert seen and round0_admitted() < users, "the round finished before the kill"
    os.kill(shuffler.pid, signal.SIGKILL)  # mid-round: some envelopes spooled, more on their way
    assert shuffler.wait(10) == -signal.SIGKILL
    time.sleep(0.5)  # envelopes published now reach no one: the fleet must send them again

    shuffler = start(shuffler_args, second_log)
    processes.append(shuffler)
    assert analyzer.wait(60) == 0, (tmp_path / "analyzer.log").read_text()[-3000:]
    result = read_json(tmp_path / "result.json")
    round0, round1 = result["rounds"]
    # One batch per round, every client's report in it exactly once: nothing lost, nothing doubled.
    assert round0["reports"] == users and round0["batch_sizes"] == [users]
    assert round0["rejected_reports"] == {}  # the analyzer's own duplicate check found no copy
    assert round1["reports"] == users and round1["rejected_reports"] == {}

    assert fleet.wait(30) == 0, (tmp_path / "clients.log").read_text()[-3000:]
    clients = read_json(tmp_path / "clients.json")
    fleet_round0 = clients["rounds"][0]
    assert fleet_round0["admitted"] == users and fleet_round0["refused"] == {}
    assert fleet_round0["retransmitted"] > 0  # the ones the dead shuffler never receipted
    assert fleet_round0["outcomes"] == {"0": "released"}

    restarted_log = second_log.read_text()
    port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", restarted_log).group(1))
    assert re.search(r"1 open round\(s\) to resume", restarted_log)
    stats = wait_for(lambda: (s := read_json(stats_file)) and s["acknowledged_batches"] == 2 and s, 10, "both acks")
    resumed = stats["rounds"][0]
    assert resumed["round_id"] == 0 and resumed["resumed"] >= 40
    assert resumed["admitted"] == resumed["forwarded"] == users and resumed["rejected"] == {}
    assert resumed["outcome"] == "served"
    assert re.search(rf"round 0 open: {resumed['resumed']} envelope\(s\) resumed from the spool", restarted_log)
    assert re.search(rf"round 0 released: {users} admitted \({resumed['resumed']} resumed from the spool", restarted_log)

    # The metrics endpoint of the live shuffler: the counters, and junk changes nothing.
    metrics = http(port, b"GET /metrics HTTP/1.0\r\n\r\n").decode()
    assert metrics.startswith("HTTP/1.0 200 OK")
    assert f"shuffledp_shuffler_admitted_total {2 * users}" in metrics
    assert f"shuffledp_shuffler_resumed_total {resumed['resumed']}" in metrics
    assert 'shuffledp_shuffler_rounds_total{outcome="served"} 2' in metrics
    assert "shuffledp_shuffler_acknowledged_batches_total 2" in metrics
    assert "shuffledp_shuffler_mqtt_connected 1" in metrics
    for junk in (b"\x16\x03\x01\x02\x00junk", b"GET / HTTP/1.0\r\n\r\n", b"DELETE /metrics HTTP/1.0\r\n\r\n",
                 b"GET " + b"/" * 20000 + b" HTTP/1.0\r\n\r\n", os.urandom(4096)):
        assert http(port, junk).startswith(b"HTTP/1.0 4")
    assert "shuffledp_shuffler_admitted_total" in http(port, b"GET /metrics HTTP/1.0\r\n\r\n").decode()

    # The spool agrees: both rounds served, and no sealed report kept after its ack.
    db = sqlite3.connect(spool)
    try:
        assert db.execute("SELECT round_id, state FROM rounds ORDER BY round_id").fetchall() == [(0, "served"), (1, "served")]
        assert db.execute("SELECT COUNT(*) FROM admitted").fetchone() == (0,)
    finally:
        db.close()

    shuffler.send_signal(signal.SIGTERM)
    assert shuffler.wait(10) == 0
    final = read_json(stats_file)
    assert final["acknowledged_batches"] == 2 and final["admitted_total"] == 2 * users
    assert "stopped; final stats in" in second_log.read_text()
    assert "Traceback" not in first_log.read_text() + second_log.read_text()


def test_a_failed_round_is_one_line_and_a_session_runs_once(broker, tmp_path, processes):
    keys = tmp_path / "keys"
    init_keys(keys, clients=10)
    stats_file = tmp_path / "stats.json"
    shuffler = start(["shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                      "--spool", str(tmp_path / "spool.db"), "--stats-file", str(stats_file)], tmp_path / "shuffler.log")
    processes.append(shuffler)
    fleet = start(["clients", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "client"), "--users", "10"],
                  tmp_path / "clients.log")
    processes.append(fleet)
    analyzer = [*CLI, "analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                "--users", "20", "--round-timeout", "2", "--grace", "2"]
    done = subprocess.run(analyzer, capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shuffledp analyzer run: batch-too-small: round 0: the shuffler reports the round failed")
    assert "Traceback" not in done.stderr and done.stdout == ""

    again = subprocess.run(analyzer, capture_output=True, text=True, timeout=60, env=ENV)
    assert again.returncode == 2
    assert re.search(r"session [0-9a-f]{32} already ran .*keys init .*--force", again.stderr.strip().splitlines()[-1])

    for process in (fleet, shuffler):
        process.send_signal(signal.SIGTERM)
    assert fleet.wait(10) == 1  # stopped before its 2 rounds were released
    assert shuffler.wait(10) == 0
    stats = read_json(stats_file)
    assert [(r["round_id"], r["outcome"], r["admitted"]) for r in stats["rounds"]] == [(0, "batch-too-small", 10)]
    assert "round 0 failed (batch-too-small): 10 admitted" in (tmp_path / "shuffler.log").read_text()
