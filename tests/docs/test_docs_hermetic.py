"""The doc tests leave the checkout alone: each command runs in a folder of its own.

A reader who ran the README's commands has its outputs in the checkout (``out.png``,
``result.json``, ``deploy/`` from ``shuffledp up --dir deploy``, ...). The doc tests must
neither see them (``up --dir deploy`` refuses a directory holding an earlier session's keys)
nor write over them. Here a checkout is made of links to the real one's folders with every
README output planted in it, a representative pair of documented commands (a ``--plot`` and an
``--output``, both written to the names planted) runs against it as the doc tests run them, and
the planted bytes must be unchanged afterwards; so must the real checkout's untracked files of
those names (``git status``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_docs_run import DOC_INPUTS, ROOT, commands_of, doc_outputs, run_doc_command, workdir  # noqa: E402

#: The documented commands run against the planted checkout: cheap at the suite's size cap, and
#: each writes a file the README names (matched against the command as printed).
REPRESENTATIVE = (r"shuffledp simulate --fast .*--plot out\.png", r"shuffledp vector .*--output result\.json")


def plant_outputs(checkout: Path) -> dict[str, str]:
    """A checkout linking every entry of the real one but the README outputs, which are planted as files
    (names with a suffix) or directories holding a file, with random bytes; their digests by path."""
    checkout.mkdir()
    outputs = doc_outputs()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in outputs:
            (checkout / entry.name).symlink_to(entry)
    digests = {}
    for name in sorted(outputs):
        path = checkout / name if Path(name).suffix else checkout / name / "planted.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(os.urandom(256))
        digests[str(path.relative_to(checkout))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def digests_of(checkout: Path, paths) -> dict[str, str | None]:
    return {p: hashlib.sha256((checkout / p).read_bytes()).hexdigest() if (checkout / p).is_file() else None for p in paths}


def untracked_outputs() -> set[str]:
    """The real checkout's changed or untracked paths with a README output's name in them (other work
    may change other files of the checkout meanwhile)."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    outputs = doc_outputs()
    return {line for line in done.stdout.splitlines() if outputs & set(Path(line[3:].strip('"')).parts)}


def test_a_work_folder_holds_only_the_inputs_it_reads(tmp_path):
    checkout = tmp_path / "checkout"
    plant_outputs(checkout)
    work = workdir(tmp_path, checkout)
    assert sorted(p.name for p in work.iterdir()) == sorted(DOC_INPUTS)
    assert all((work / name).resolve() == (checkout / name).resolve() for name in DOC_INPUTS)
    assert {"out.png", "result.json", "deploy", "keys", "broker"} <= doc_outputs()  # the parser finds them


def test_the_doc_tests_leave_the_readme_outputs_of_a_checkout_alone(tmp_path):
    commands = [c for c in commands_of("here") if any(re.fullmatch(p + ".*", c.code, re.DOTALL) for p in REPRESENTATIVE)]
    assert len(commands) == len(REPRESENTATIVE), [c.text for c in commands]
    in_git = (ROOT / ".git").exists()
    before = untracked_outputs() if in_git else set()
    checkout = tmp_path / "checkout"
    planted = plant_outputs(checkout)
    for index, command in enumerate(commands):
        run = tmp_path / f"run{index}"
        run.mkdir()
        run_doc_command(command, run, root=checkout)  # exit 0 and its named output written (in its work folder)
    assert digests_of(checkout, planted) == planted, "a doc test wrote into the checkout it ran against"
    if in_git:
        assert untracked_outputs() <= before, "a doc test wrote a README output into the real checkout"
