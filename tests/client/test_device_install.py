"""The device install, built for real: a fresh virtual environment with the core package only.

A device installs numpy, cbor2 and cryptography (and what those need) and nothing else;
``import shuffledp.client`` and ``examples/embed_client.py`` work there, and a command
that needs an extra says which one in a single line instead of a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What the core install may hold: the three device dependencies, what they need, and
#: the installer itself.
DEVICE_PACKAGES = {"shuffledp", "numpy", "cbor2", "cryptography", "cffi", "pycparser", "pip", "setuptools"}


def _pip(env_dir: Path, *args: str) -> list[str]:
    """This interpreter's pip working on the device environment (``pip --python``): the environment
    needs no pip of its own, so it is created without one (ensurepip cost seconds per run)."""
    return [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), *args]


@pytest.fixture(scope="module")
def device_env(tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("device") / "venv"
    venv.create(env_dir, with_pip=False)
    subprocess.run(
        _pip(env_dir, "install", "-q", "--disable-pip-version-check", "--no-compile",
             "-c", str(ROOT / "requirements" / "test.lock"), "-e", str(ROOT)),
        check=True, capture_output=True, text=True, timeout=240,
    )
    return env_dir


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, env=env, cwd=env_dir.parent)


def test_device_install_holds_only_the_device_dependencies(device_env):
    out = _run(device_env, *_pip(device_env, "list", "--format=freeze", "--disable-pip-version-check"))
    names = {line.split("==")[0].split(" ")[0].lower() for line in out.stdout.split()}
    assert names, out.stderr
    assert names <= DEVICE_PACKAGES, f"the device install pulled in {sorted(names - DEVICE_PACKAGES)}"
    assert {"numpy", "cbor2", "cryptography", "shuffledp"} <= names


def test_client_and_embed_example_work_on_the_device_install(device_env):
    python = str(device_env / "bin" / "python")
    imported = _run(device_env, python, "-c", "import shuffledp.client, shuffledp.protocol.wire.sealing; print('ok')")
    assert imported.returncode == 0 and imported.stdout.strip() == "ok", imported.stderr
    example = _run(device_env, python, str(ROOT / "examples" / "embed_client.py"))
    assert example.returncode == 0, example.stderr
    assert "analyzer opened" in example.stdout


@pytest.mark.parametrize("command, extra", [
    (["simulate"], "analysis"),
    (["account", "--epsilon0", "1", "--users", "1000"], "analysis"),
    (["up", "--users", "10"], "analysis,mqtt"),  # both named, though analysis is the first missing
    (["shuffler", "serve", "--keys", "k", "--broker", "127.0.0.1:1", "--spool", "s.db"], "mqtt"),
])
def test_a_command_missing_its_extra_says_which_in_one_line(device_env, command, extra):
    out = _run(device_env, str(device_env / "bin" / "shuffledp"), *command)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for name in extra.split(","):
        assert f"'{name}'" in lines[0], lines[0]
    # the install line for this copy (an editable install of the clone), runnable as printed
    assert f"pip install -e '{ROOT}[{extra}]'" in lines[0], lines[0]
    assert "Traceback" not in out.stderr


def test_keys_run_on_the_device_install(device_env, tmp_path):
    out = _run(device_env, str(device_env / "bin" / "shuffledp"), "keys", "init", str(tmp_path / "keys"), "--users", "2")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "keys" / "public.json").exists()
