"""The real Python services, run as processes, for rounds that JavaScript devices take part in.

A broker (:class:`shuffledp.deploy.broker.Broker`: TLS, passwords, ACL, per-role limits;
optionally its WebSocket listener), ``shuffledp shuffler serve``, ``shuffledp analyzer run``
and ``shuffledp clients run`` as subprocesses, as ``tests/mqtt/test_services.py`` runs them.
Every wait here is for a process to exit (event-driven), with a generous safety timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shuffledp.deploy.broker import Broker, BrokerError, BrokerUsers, find_binary
from shuffledp.simulation.population import Population, local_means

CLI = [sys.executable, "-m", "shuffledp.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
#: The data model of ``shuffledp clients run``'s defaults (``cli/common.py::add_scalar_mean_options``).
POPULATION = Population("gaussian", 1.7, 1.0, 20.0, 50)


def start_broker(js_accounts: tuple[str, ...], *, websocket: bool = False) -> Broker:
    """A broker with the three roles' default accounts plus one client account per JavaScript connection
    (the default per-role limits: a client username may hold 2 connections)."""
    try:
        find_binary("mosquitto")
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    broker = Broker(users=BrokerUsers.default(("client", *js_accounts)), websocket=websocket)
    broker.start()
    return broker


def password_file(broker: Broker, directory: Path, username: str) -> Path:
    """A 0600 file holding ``username``'s password (what ``--password-file`` reads)."""
    path = directory / f"{username}.password"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{broker.users.get(username).password}\n")
    return path


def broker_options(broker: Broker, directory: Path, role: str) -> list[str]:
    """The command-line broker options of the first account of ``role`` (TCP listener, TLS)."""
    username = broker.users.for_role(role)[0].username
    return ["--broker", f"{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file),
            "--username", username, "--password-file", str(password_file(broker, directory, username))]


def start(command: list[str], log: Path, *, cwd: Path | None = None) -> subprocess.Popen:
    """A process with stdout and stderr appended to ``log``."""
    out = open(log, "ab")
    try:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV, cwd=cwd)
    finally:
        out.close()


def js_data(count: int, seed: int) -> tuple[list[float], float]:
    """Local means of ``count`` users of :data:`POPULATION` (one float each, as ``clients run`` gives its
    devices) and the exact mean of all their samples."""
    means, true_mean = local_means(POPULATION, count, seed)
    return [float(x) for x in means], true_mean


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return f"--- {path.name}: none ---"


def combined_true_mean(parts: list[tuple[int, float]]) -> float:
    """The mean of all samples of several fleets, from (users, true mean) of each (every user has m samples)."""
    users = sum(n for n, _ in parts)
    return float(np.sum([n * mean for n, mean in parts]) / users)


def check_estimate(result: dict, true_mean: float) -> None:
    """The analyzer's estimate is within the protocol's stated error of the true mean.

    ``analyzer run`` states its error as the standard error of the estimate (the empirical
    standard deviation of the decoded reports over sqrt(n), ``decoders.mean_from_reports``).
    The decoded reports are unbiased for the users' local means inside the announced range
    (which holds every local mean except with probability gamma = 0.01, the radius' failure
    probability), and the standard error counts the data's spread on top of the randomizer's,
    so it over-states the estimate's error about the users' mean. With n >= 100 the estimate is
    close to normal: |estimate - true mean| > 4 standard errors has probability about 6e-5.
    """
    error = abs(result["estimate"] - true_mean)
    assert error <= 4 * result["standard_error"], (
        f"estimate {result['estimate']:.6f}, true mean {true_mean:.6f}: error {error:.6f} is more than 4 standard "
        f"errors ({result['standard_error']:.6f})")
