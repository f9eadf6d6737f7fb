"""A session served by the real Python services, answered by Python and JavaScript devices together.

``shuffledp shuffler serve`` and ``shuffledp analyzer run`` run as processes over a real
mosquitto (TLS, passwords, ACL, per-role limits). Half of the devices are the Python fleet
(``shuffledp clients run``, credentials 0 .. n-1); the other half are JavaScript devices on Node
(``js/test/support/device.mjs``: credentials n .. 2n-1, spread over four client accounts, one
connection each). Both rounds of the scalar mean (range, then mean) must be released with every
device's report, and the estimate must be within the analyzer's stated error of the true mean.
"""

from __future__ import annotations

import json

import pytest

from shuffledp.deploy.keys import init_keys

from .conftest import JS, _node
from .services import (
    CLI,
    broker_options,
    check_estimate,
    combined_true_mean,
    js_data,
    password_file,
    read_json,
    start,
    start_broker,
    tail,
)

pytestmark = pytest.mark.mqtt

PY_USERS = 120
JS_USERS = 120
JS_ACCOUNTS = ("js-1", "js-2", "js-3", "js-4")
#: Safety limits only: every wait below ends when its process exits.
PROCESS_TIMEOUT = 180
#: The session's local epsilon (split over its two rounds), and every device's ledger budget: large
#: enough that the randomizers' noise leaves the estimate a standard error small enough to mean something.
EPSILON0 = 4.0


@pytest.fixture(scope="module")
def broker():
    b = start_broker(JS_ACCOUNTS)
    yield b
    b.close()


def test_python_and_javascript_devices_answer_one_session_together(js_package, broker, tmp_path, processes):
    users = PY_USERS + JS_USERS
    keys = tmp_path / "keys"
    init_keys(keys, clients=users)
    data, js_true_mean = js_data(JS_USERS, seed=20261207)
    (tmp_path / "js-data.json").write_text(json.dumps(data))
    logs = {name: tmp_path / f"{name}.log" for name in ("shuffler", "python", "js", "analyzer")}

    def failure(message: str) -> str:
        return "\n".join([message, *(tail(log) for log in logs.values())])

    processes.append(start([*CLI, "shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                            "--spool", str(tmp_path / "spool.db")], logs["shuffler"]))
    python_fleet = start([*CLI, "clients", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "client"),
                          "--users", str(PY_USERS), "--budget", str(EPSILON0), "--retry-interval", "1", "--output", str(tmp_path / "python.json")],
                         logs["python"])
    processes.append(python_fleet)
    accounts = [f"--account={name}:{password_file(broker, tmp_path, name)}" for name in JS_ACCOUNTS]
    js_fleet = start([_node(), str(JS / "test" / "support" / "device.mjs"), "--keys", str(keys),
                      "--first", str(PY_USERS), "--count", str(JS_USERS),
                      "--broker", f"mqtts://{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file), *accounts,
                      "--data", str(tmp_path / "js-data.json"), "--budget", str(EPSILON0), "--retry-interval", "1000",
                      "--timeout", str(PROCESS_TIMEOUT), "--output", str(tmp_path / "js.json")],
                     logs["js"], cwd=JS)
    processes.append(js_fleet)
    analyzer = start([*CLI, "analyzer", "run", "--keys", str(keys), *broker_options(broker, tmp_path, "analyzer"),
                      "--users", str(users), "--epsilon0", str(EPSILON0), "--round-timeout", "90", "--json", "--output", str(tmp_path / "result.json")],
                     logs["analyzer"])
    processes.append(analyzer)

    assert analyzer.wait(PROCESS_TIMEOUT) == 0, failure("the analyzer failed")
    assert js_fleet.wait(60) == 0, failure("the JavaScript devices did not see both rounds released")
    assert python_fleet.wait(60) == 0, failure("the Python devices did not see both rounds released")

    result = read_json(tmp_path / "result.json")
    for r in result["rounds"]:
        # Every device's report is in the batch, none twice, none refused by the analyzer.
        assert r["reports"] == users and r["batch_sizes"] == [users], failure(f"round {r['round_id']}: {r}")
        assert r["rejected_reports"] == {} and r["rejected_batch_messages"] == {}

    js = read_json(tmp_path / "js.json")
    assert js["ok"] and js["connections"] == len(JS_ACCOUNTS) and js["devices_with_lost_rounds"] == 0
    js_rounds = [r for session in js["sessions"] for r in session["rounds"]]
    for round_id in (0, 1):
        mine = [r for r in js_rounds if r["roundId"] == round_id]
        assert len(mine) == len(JS_ACCOUNTS)
        assert sum(r["answered"] for r in mine) == JS_USERS and sum(r["admitted"] for r in mine) == JS_USERS
        assert all(r["refused"] == {} and r["declined"] == {} and r["outcomes"] == {"0": "released"} for r in mine)
    assert all(session["badMessages"] == {} for session in js["sessions"])

    python = read_json(tmp_path / "python.json")
    assert python["ok"] and [r["admitted"] for r in python["rounds"]] == [PY_USERS, PY_USERS]

    true_mean = combined_true_mean([(PY_USERS, python["true_mean"]), (JS_USERS, js_true_mean)])
    check_estimate(result, true_mean)
