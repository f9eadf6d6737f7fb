"""JavaScript devices in a real browser answer a session of the real Python services over ``wss://``.

Headless Chromium (Debian's ``/usr/bin/chromium``, driven by playwright-core from
``js/test/support/browser_run.mjs``) opens ``js/test/browser/page.ts``, bundled here with esbuild
and served over HTTPS from 127.0.0.1. The page runs 120 devices, each with its own IndexedDB
ledger, over four client accounts (one MQTT-over-WebSocket-over-TLS connection each) to the
broker's WebSocket listener; ``shuffledp shuffler serve`` and ``shuffledp analyzer run`` serve
the session as processes. Both rounds must be released with every device's report, and the
estimate must be within the analyzer's stated error of the true mean.

Trust is real: the browser is not told to ignore certificate errors. The test CA that signed
the broker's (and the page server's) certificate is added to an NSS database in a fresh HOME
(``$HOME/.pki/nssdb``, where Chromium on Linux reads user-trusted CAs), with ``certutil``
(Debian ``libnss3-tools``).

Needs ``/usr/bin/chromium`` and ``certutil`` (``scripts/test.sh`` installs Debian's chromium and
libnss3-tools); without them the test fails, unless SHUFFLEDP_SKIP_BROWSER=1 makes it skip.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from shuffledp.deploy.keys import init_keys

from .conftest import JS, _node
from .services import CLI, broker_options, check_estimate, js_data, read_json, start, start_broker, tail

pytestmark = pytest.mark.mqtt

CHROMIUM = Path("/usr/bin/chromium")
USERS = 120
ACCOUNTS = ("web-1", "web-2", "web-3", "web-4")
EPSILON0 = 4.0
#: Safety limits only: every wait ends when its process exits or the page reports.
PAGE_TIMEOUT = 150
PROCESS_TIMEOUT = 200


def _require(path: str | None, what: str) -> str:
    if path is None or not os.access(path, os.X_OK):
        if os.environ.get("SHUFFLEDP_SKIP_BROWSER") == "1":
            pytest.skip(f"{what} is missing and SHUFFLEDP_SKIP_BROWSER=1")
        pytest.fail(f"{what} is needed for the browser test (Debian: apt-get install chromium libnss3-tools); "
                    "or set SHUFFLEDP_SKIP_BROWSER=1")
    return path


@pytest.fixture
def broker():
    b = start_broker(ACCOUNTS, websocket=True)
    yield b
    b.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def https_site(tmp_path, broker):
    """An HTTPS server on 127.0.0.1 for a folder, with the broker's CA-signed certificate; yields (folder, url)."""
    site = tmp_path / "site"
    site.mkdir()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(broker.directory / "server.crt", broker.directory / "server.key")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="https-site", daemon=True)
    thread.start()
    try:
        yield site, f"https://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def trust_ca_in_nss(home: Path, ca_file: Path) -> None:
    """A fresh NSS database in ``home/.pki/nssdb`` trusting ``ca_file`` for TLS servers (what Chromium reads)."""
    certutil = _require(shutil.which("certutil"), "certutil")
    nssdb = home / ".pki" / "nssdb"
    nssdb.mkdir(parents=True)
    subprocess.run([certutil, "-N", "-d", f"sql:{nssdb}", "--empty-password"], check=True, capture_output=True, timeout=60)
    subprocess.run([certutil, "-A", "-d", f"sql:{nssdb}", "-n", "shuffledp test CA", "-t", "C,,", "-i", str(ca_file)],
                   check=True, capture_output=True, timeout=60)


def bundle_page(site: Path) -> None:
    """``js/test/browser/page.ts`` bundled by esbuild (ESM, for browsers) into ``site``, with its HTML."""
    esbuild = JS / "node_modules" / ".bin" / "esbuild"
    done = subprocess.run([str(esbuild), "test/browser/page.ts", "--bundle", "--format=esm", "--platform=browser",
                           f"--outfile={site / 'page.js'}", "--log-level=warning"],
                          cwd=JS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shutil.copy(JS / "test" / "browser" / "index.html", site / "index.html")
    assert "node:" not in (site / "page.js").read_text()  # nothing Node-only reached the browser bundle


def test_a_browser_page_runs_a_hundred_devices_over_wss_into_the_python_services(
    js_package, broker, https_site, tmp_path, processes
):
    _require(str(CHROMIUM), str(CHROMIUM))
    site, url = https_site
    keys = tmp_path / "keys"
    init_keys(keys, clients=USERS)
    data, true_mean = js_data(USERS, seed=20261208)
    bundle_page(site)
    (site / "config.json").write_text(json.dumps({
        "public": json.loads((keys / "public.json").read_text()),
        "credentials": json.loads((keys / "credentials.json").read_text()),
        "first": 0, "count": USERS, "data": data, "budget": EPSILON0, "rounds": 2, "retryInterval": 1000,
        "broker": broker.websocket_url,
        "accounts": [{"username": name, "password": broker.users.get(name).password} for name in ACCOUNTS],
    }))
    home = tmp_path / "home"
    trust_ca_in_nss(home, broker.ca_file)

    logs = {name: tmp_path / f"{name}.log" for name in ("shuffler", "analyzer")}
    processes.append(start([*CLI, "shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                            "--spool", str(tmp_path / "spool.db")], logs["shuffler"]))
    browser = subprocess.Popen(
        [_node(), str(JS / "test" / "support" / "browser_run.mjs"), "--url", url, "--home", str(home),
         "--profile", str(tmp_path / "profile"), "--timeout", str(PAGE_TIMEOUT), "--chromium", str(CHROMIUM)],
        cwd=JS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    processes.append(browser)
    analyzer = start([*CLI, "analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                      "--users", str(USERS), "--epsilon0", str(EPSILON0), "--round-timeout", "120", "--json",
                      "--output", str(tmp_path / "result.json")], logs["analyzer"])
    processes.append(analyzer)

    out, err = browser.communicate(timeout=PROCESS_TIMEOUT)
    report = json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else {"result": None, "log": []}
    page_log = "\n".join(report.get("log", []))
    print(page_log)  # shown with the test's output (pytest -rP), and on failure below

    def failure(message: str) -> str:
        return "\n".join([message, "--- browser log ---", page_log, report.get("error", ""), err.decode(errors="replace")[-3000:],
                          *(tail(log) for log in logs.values())])

    assert browser.returncode == 0, failure("the page did not finish")
    result_page = report["result"]
    assert result_page["ok"], failure("the page's devices did not see both rounds released")
    assert analyzer.wait(PROCESS_TIMEOUT) == 0, failure("the analyzer failed")

    assert result_page["ledgers"] == USERS and result_page["devicesWithLostRounds"] == 0
    sessions = result_page["sessions"]
    assert len(sessions) == len(ACCOUNTS) and all(s["badMessages"] == {} for s in sessions), failure("refused messages")
    for round_id in (0, 1):
        mine = [r for s in sessions for r in s["rounds"] if r["roundId"] == round_id]
        assert sum(r["answered"] for r in mine) == USERS and sum(r["admitted"] for r in mine) == USERS, failure(str(mine))
    result = read_json(tmp_path / "result.json")
    for r in result["rounds"]:
        # >= 100 reports, all from the browser's devices: the only devices of the session.
        assert r["reports"] == USERS >= 100 and r["batch_sizes"] == [USERS], failure(str(r))
        assert r["rejected_reports"] == {} and r["rejected_batch_messages"] == {}
    check_estimate(result, true_mean)


def test_without_the_ca_in_its_store_the_browser_refuses_the_test_servers(js_package, broker, https_site, tmp_path):
    """The control of the trust set-up above: the same page, a HOME whose NSS store lacks the test CA."""
    _require(str(CHROMIUM), str(CHROMIUM))
    site, url = https_site
    (site / "index.html").write_text("<!doctype html><title>t</title><link rel='icon' href='data:,'>")
    home = tmp_path / "untrusting-home"
    home.mkdir()
    done = subprocess.run(
        [_node(), str(JS / "test" / "support" / "browser_run.mjs"), "--url", url, "--home", str(home),
         "--profile", str(tmp_path / "profile"), "--timeout", "20", "--chromium", str(CHROMIUM)],
        cwd=JS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "ERR_CERT_AUTHORITY_INVALID" in report["error"], report
