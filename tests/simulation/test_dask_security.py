"""The Dask cluster the engine starts is private to the user who started it.

``dask_client(workers=N)`` (what ``shuffledp simulate --fast --dask-workers N`` runs) starts a
cluster that every other local user can reach over 127.0.0.1, so its privacy rests on mutual
TLS with credentials made for the run: these tests play such a user. With the run's
credentials every listener of the cluster answers (so the probe can succeed); without them
(plain TCP, TLS without a certificate, TLS with a certificate of another run) none does, and
a plain ``distributed.Client`` cannot run a task while a simulation is running. Every socket
the cluster listens on is on 127.0.0.1, and its HTTP servers serve no page (no dashboard, no
metrics). The secured cluster gives the local engine's result to the last bit.

An external scheduler is refused unless its address asks for TLS, or the caller says that
plaintext is accepted.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.error
import urllib.request

import pytest

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

import dask  # noqa: E402

from distributed.comm import connect  # noqa: E402

from shuffledp.protocol.errors import InvalidParameter, TransportError  # noqa: E402
from shuffledp.simulation.dask_engine import connect_scheduler, dask_client, run_dask  # noqa: E402
from shuffledp.simulation.engine import run_fast  # noqa: E402

from test_dask_engine import CASES, SEED, assert_identical  # noqa: E402


def _listening(process: psutil.Process) -> set[tuple[str, int]]:
    """``(host, port)`` of every TCP socket this process and its descendants listen on."""
    found = set()
    for proc in [process, *process.children(recursive=True)]:
        try:
            connections = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:  # pragma: no cover - a process that ended meanwhile
            continue
        found.update((c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN)
    return found


@pytest.fixture(scope="module")
def cluster():
    """The engine's own cluster of two worker processes, and the sockets it added to this process tree."""
    me = psutil.Process()
    before = _listening(me)
    with dask_client(workers=2) as client:
        client.wait_for_workers(2)
        yield client, _listening(me) - before


def _identity(client) -> dict:
    """The scheduler's account of the cluster, every worker included, fetched now.

    Not ``Client.scheduler_info()``: when its fetch fails (a comm timeout on a loaded machine) it
    returns its cached answer, and the client's periodic refresh of that cache carries no workers."""
    return client.sync(client.scheduler.identity, n_workers=-1)


def _endpoints(client) -> list[str]:
    """Every comm address of the cluster: the scheduler's, each worker's and each worker's nanny's."""
    info = _identity(client)
    workers = info["workers"]
    addresses = [client.scheduler.address, *workers, *(w["nanny"] for w in workers.values() if w.get("nanny"))]
    assert len(addresses) == 5  # scheduler, two workers, two nannies
    return addresses


def _host_port(address: str) -> str:
    return address.split("://", 1)[-1]


def _own_certificate() -> ssl.SSLContext:
    """A TLS client context with a certificate of the intruder's own making, that trusts any server."""
    mine = distributed.Security.temporary()
    context = mine.get_connection_args("client")["ssl_context"]
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _no_certificate() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _reaches(address: str, connection_args: dict) -> bool:
    """Whether a comm to ``address`` gets the server's identity back (it then also reaches the
    handlers that run code: ``run_function`` on the scheduler, ``run`` on a worker)."""
    try:
        comm = await connect(address, timeout="3s", **connection_args)
    except Exception:  # refused, closed during the handshake, or no TLS context for tls://
        return False
    try:
        await comm.write({"op": "identity", "reply": True})
        answer = await asyncio.wait_for(comm.read(), 5)
        return isinstance(answer, dict) and "type" in answer
    except Exception:
        return False
    finally:
        comm.abort()


def test_every_listener_answers_the_run_s_credentials_and_no_one_else(cluster):
    client, _ = cluster
    run_credentials = client.security.get_connection_args("client")
    for address in _endpoints(client):
        where = _host_port(address)
        assert asyncio.run(_reaches(address, run_credentials)), address  # the probe can succeed
        intruders = {
            "plain TCP": (f"tcp://{where}", {}),
            "TLS, no certificate": (f"tls://{where}", {"ssl_context": _no_certificate()}),
            "TLS, another run's certificate": (f"tls://{where}", {"ssl_context": _own_certificate()}),
            "TLS, no context": (f"tls://{where}", {}),
        }
        for name, (target, args) in intruders.items():
            assert not asyncio.run(_reaches(target, args)), f"{name} reached {address}"


def test_a_plain_client_cannot_run_a_task_while_a_simulation_runs(cluster):
    """An intruder's ``distributed.Client`` tries the scheduler from inside the run's progress
    callback (the run is on the cluster then); the run still gives the local engine's result."""
    client, _ = cluster
    where = _host_port(client.scheduler.address)
    name, protocol, data = CASES[0]
    outcomes: list[object] = []

    def intrude(stage: str, users: int) -> None:
        if outcomes:
            return
        try:
            with distributed.Client(f"tcp://{where}", timeout="2s") as intruder:
                outcomes.append(intruder.submit(os.getpid).result(timeout=5))  # code run on the cluster
        except Exception as exc:
            outcomes.append(exc)

    run = run_dask(protocol, data, client, SEED, intrude)
    assert len(outcomes) == 1 and isinstance(outcomes[0], OSError), f"the intruder ran a task, or failed otherwise: {outcomes}"
    assert_identical(run.result, run_fast(protocol, data, SEED).result)


def test_every_socket_of_the_cluster_is_on_loopback_and_no_page_is_served(cluster):
    client, added = cluster
    assert added, "the cluster listens somewhere"
    assert all(host == "127.0.0.1" for host, _ in added), added
    for address in _endpoints(client):
        assert address.startswith("tls://127.0.0.1:"), address
        host, port = _host_port(address).rsplit(":", 1)
        assert (host, int(port)) in added
    info = _identity(client)
    http_ports = [info["services"].get("dashboard")] + [w["services"].get("dashboard") for w in info["workers"].values()]
    assert all(http_ports) and len(http_ports) == 3  # Dask starts one HTTP server per scheduler and worker
    for port in http_ports:
        assert ("127.0.0.1", port) in added
        for path in ("/", "/status", "/info/main/workers.html", "/json/identity.json", "/health", "/metrics",
                     "/statics/css/base.css", "/proxy/8786/127.0.0.1/"):
            with pytest.raises(urllib.error.HTTPError) as page:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).close()
            assert page.value.code == 404, (port, path)


@pytest.mark.parametrize("address", ["tcp://10.0.0.1:8786", "127.0.0.1:8786", "ws://scheduler.example:8786",
                                     "tcp://127.0.0.1:8786"])
def test_a_plaintext_scheduler_address_is_refused_before_any_connection(address):
    with pytest.raises(InvalidParameter, match="dask-insecure-plaintext") as refused:
        with dask_client(address):
            pass
    assert "\n" not in str(refused.value)


def test_a_plaintext_scheduler_is_tried_only_when_accepted_and_tls_needs_credentials():
    with pytest.raises(TransportError, match="no Dask scheduler answered") as failed:
        connect_scheduler("tcp://127.0.0.1:1", allow_plaintext=True, timeout="1s")
    assert "\n" not in str(failed.value)
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        with pytest.raises(InvalidParameter, match="distributed.comm.tls") as refused:
            with dask_client("tls://127.0.0.1:1"):
                pass
    assert "\n" not in str(refused.value)


def test_a_tls_scheduler_is_reached_with_the_certificates_named_in_dask_s_configuration(cluster, tmp_path):
    """The documented way to a secured external cluster: the CA, certificate and key files in
    Dask's configuration, and a tls:// address (here, the private cluster's own credentials)."""
    client, _ = cluster
    files = {}
    for key, pem in (("ca-file", client.security.tls_ca_file), ("client.cert", client.security.tls_client_cert),
                     ("client.key", client.security.tls_client_key)):
        files[key] = tmp_path / key
        files[key].touch(mode=0o600)
        files[key].write_text(pem)
    settings = {f"distributed.comm.tls.{k}": str(v) for k, v in files.items()}
    with dask.config.set(settings), dask_client(client.scheduler.address) as remote:
        assert remote.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        assert remote.security.require_encryption


def test_the_cli_refuses_a_plaintext_scheduler_in_one_line_and_names_the_flag(capsys):
    from shuffledp.cli import main

    assert main(["simulate", "--fast", "-n", "100", "-q", "--dask-scheduler", "tcp://10.0.0.1:8786"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--dask-insecure-plaintext" in err, err
    assert main(["vector", "--fast", "-n", "100", "-d", "4", "-q", "--dask-scheduler", "scheduler.example:8786"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--dask-insecure-plaintext" in err, err
