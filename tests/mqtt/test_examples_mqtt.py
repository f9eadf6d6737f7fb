"""The MQTT examples run as examples/README.md shows them: a session with the real services,
and the audit of a session (see tests/docs/test_examples.py for the others)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
from test_docs_run import SIZE_CAP, commands_of, run_doc_command, workdir  # noqa: E402

pytestmark = pytest.mark.mqtt


def example_script(command) -> str:
    return re.match(r"python examples/(\w+\.py)", command.code).group(1)


def session_directory(out: str) -> Path:
    """The deployment directory the example says it made (a new one under TMPDIR, kept)."""
    match = re.search(r"^(?:deployment directory|running a session in) (\S+)", out, re.MULTILINE)
    assert match, f"the example did not say where its session is:\n{out}"
    return Path(match.group(1))


def check_mqtt_session(out: str, cwd: Path) -> None:
    directory = session_directory(out)
    result = json.loads((directory / "result.json").read_text())
    users = min(2000, SIZE_CAP)
    assert result["reports"] == users and [r["batch_sizes"] for r in result["rounds"]] == [[users], [users]]
    assert "central privacy after shuffling" in out and f"kept {directory}" in out, out
    assert (directory / "keys" / "public.json").is_file() and (directory / "spool" / "shuffler.db").is_file()


def check_audit_deployment(out: str, cwd: Path) -> None:
    directory = session_directory(out)
    assert (directory / "result.json").is_file()
    assert f"audit of {directory}: PASSED" in out and "shuffledp audit (claim): PASSED" in out, out
    assert "shuffler mechanics" in out, out


CHECKS = {"mqtt_session.py": check_mqtt_session, "audit_deployment.py": check_audit_deployment}


@pytest.mark.parametrize("command", commands_of("examples-mqtt"), ids=lambda c: example_script(c))
def test_mqtt_example_runs_as_documented(command, tmp_path, mosquitto):
    check = CHECKS.get(example_script(command))
    assert check is not None, f"examples/README.md runs {example_script(command)}: add a check of its output here"
    cwd = workdir(tmp_path)
    done = run_doc_command(command, tmp_path, cwd)
    check(done.stdout, cwd)
