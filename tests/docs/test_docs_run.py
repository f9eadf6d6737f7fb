"""Every command and code block of README.md and examples/README.md runs as written.

The markdown is parsed: every ```sh block is split into commands (one per line, a
trailing backslash continues it; a block with background jobs, ``cmd &``, is one
script run as a whole), every ```python block is one program. Each command runs
through bash exactly as printed, in a fresh temporary directory of its own that holds
only a link to each checkout folder a command reads, and writes nothing in (:data:`DOC_INPUTS`:
``python examples/x.py``), so whatever a command writes (``out.png``, ``result.json``,
``deploy/``, ``keys/``: :func:`doc_outputs`) lands there and never in the checkout, and
whatever a reader's own runs left in the checkout is not seen
(``test_the_doc_tests_leave_the_readme_outputs_of_a_checkout_alone``); with this
interpreter's ``bin/`` first on PATH and ``SHUFFLEDP_SIZE_CAP`` set, so the
documented sizes shrink while commands and flags stay as a reader types them
(``shuffledp/size_cap.py``). Each has a timeout: a renamed flag, a hanging walkthrough
or a broken example fails here.

Where each command runs (:func:`classify`):

* here: every command that needs no broker, and every python block;
* ``tests/mqtt/test_docs_run_mqtt.py``: the commands that need mosquitto (``shuffledp
  up``, ``--broker``, the services walkthrough);
* ``tests/docs/test_examples.py`` / ``tests/mqtt/test_examples_mqtt.py``: the lines of
  examples/README.md, which also check what each example prints;
* nowhere: the short list :data:`NOT_RUN`, each with its reason and a check that does run.

A command matching none of the not-run rules is run, so the docs cannot gain a command
that no test executes; a not-run rule that matches no command fails as stale.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "examples/README.md")
#: ``SHUFFLEDP_SIZE_CAP`` for every documented command: users, lists of n and m, steps.
SIZE_CAP = 2000
#: Seconds one command may take (at the capped size) before it counts as hanging.
COMMAND_TIMEOUT = 150.0
#: Seconds a whole script block (the services walkthrough) may take.
SCRIPT_TIMEOUT = 240.0
SHELL_LANGUAGES = ("sh", "bash", "shell")
#: Example scripts that start a broker (run by tests/mqtt/test_examples_mqtt.py).
BROKER_EXAMPLES = ("mqtt_session.py", "audit_deployment.py")
#: Modules a device install (``pip install shuffledp``) does not have: python blocks run without them.
NOT_ON_A_DEVICE = ("scipy", "aiomqtt", "paho", "matplotlib", "dp_accounting", "tqdm")


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class DocCommand:
    """One shell command (or a script block) of a markdown file, as printed."""

    doc: str
    line: int
    section: str
    text: str
    script: bool = False
    #: ``pip install ...`` that preceded the command with ``&&`` (checked, not run), or "".
    installs: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def code(self) -> str:
        """The command without its trailing comment (for classifying, never for running)."""
        return strip_comment(self.text)


@dataclass(frozen=True)
class DocBlock:
    doc: str
    line: int
    section: str
    language: str
    text: str


def strip_comment(text: str) -> str:
    """``text`` without shell comments (a ``#`` at a word start outside quotes), lines re-joined."""
    out = []
    for line in text.splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1].isspace()):
                line = line[:i]
                break
        out.append(line.rstrip())
    return "\n".join(out).strip()


def doc_blocks(doc: str) -> list[DocBlock]:
    """The fenced code blocks of ``doc`` with their language and the heading they sit under."""
    blocks: list[DocBlock] = []
    section = ""
    fence: tuple[int, str, list[str]] | None = None
    for number, line in enumerate((ROOT / doc).read_text(encoding="utf-8").splitlines(), start=1):
        if fence is None:
            if line.startswith("```"):
                fence = (number, line[3:].strip(), [])
            elif line.startswith("#"):
                section = line.lstrip("#").strip()
        elif line.startswith("```"):
            start, language, lines = fence
            blocks.append(DocBlock(doc, start, section, language, "\n".join(lines) + "\n"))
            fence = None
        else:
            fence[2].append(line)
    assert fence is None, f"{doc}: code block at line {fence[0]} is never closed"
    return blocks


def block_commands(block: DocBlock) -> list[DocCommand]:
    """The commands of one shell block: one per line (backslash continues), or the whole block
    as one script if any line puts a job in the background."""
    commands: list[DocCommand] = []
    pending: list[str] = []
    start = 0
    for offset, line in enumerate(block.text.splitlines()):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = block.line + 1 + offset
        pending.append(line)
        if line.rstrip().endswith("\\"):
            continue
        commands.append(DocCommand(block.doc, start, block.section, "\n".join(pending)))
        pending = []
    assert not pending, f"{block.doc}:{block.line}: the block ends inside a continued line"
    if any(re.search(r"\s&(\s|$)", c.code) for c in commands):
        return [DocCommand(block.doc, commands[0].line, block.section, block.text, script=True)]
    return commands


def doc_commands(docs: tuple[str, ...] = DOCS) -> list[DocCommand]:
    """Every shell command of the docs, in order."""
    commands: list[DocCommand] = []
    for doc in docs:
        for block in doc_blocks(doc):
            if block.language in SHELL_LANGUAGES:
                commands += block_commands(block)
    return commands


def python_blocks(docs: tuple[str, ...] = DOCS) -> list[DocBlock]:
    return [b for doc in docs for b in doc_blocks(doc) if b.language == "python"]


# --------------------------------------------------------------------------- what is not run


def _project_extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _requirement_name(requirement: str) -> tuple[str, list[str]]:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, requirement
    return match.group(1), [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_distributions(extras: list[str]) -> set[str]:
    """The distributions ``pip install shuffledp[extras]`` installs directly (self-references expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    names: set[str] = set()
    todo, seen = list(extras), set()
    for requirement in project["dependencies"]:
        names.add(_normal(_requirement_name(requirement)[0]))
    while todo:
        extra = todo.pop()
        assert extra in optional, f"pyproject.toml has no extra {extra!r}"
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional[extra]:
            name, more = _requirement_name(requirement)
            if _normal(name) == "shuffledp":
                todo += more
            else:
                names.add(_normal(name))
    return names


def check_pip_install(command: DocCommand) -> None:
    """A ``pip install`` line is not run; what it installs must be installed here (the project
    and its extras) or be declared by one of the project's extras (anything else)."""
    code = command.code.split("&&")[0]
    words = shlex.split(code)
    assert words[:2] == ["pip", "install"], code
    targets = [w for w in words[2:] if not w.startswith("-")]
    assert targets, f"{code}: installs nothing"
    declared = {_normal(_requirement_name(r)[0]) for rs in _project_extras().values() for r in rs}
    for target in targets:
        if target == "." or target.startswith(".[") or _normal(_requirement_name(target)[0]) == "shuffledp":
            extras = _requirement_name("shuffledp" + target[1:])[1] if target.startswith(".") else _requirement_name(target)[1]
            missing = []
            for name in sorted(_project_distributions(extras)):
                try:
                    metadata.distribution(name)
                except metadata.PackageNotFoundError:
                    missing.append(name)
            assert not missing, f"{code}: {', '.join(missing)} not installed in this environment"
            assert metadata.distribution("shuffledp").metadata["Name"] == "shuffledp"
        else:
            assert _normal(_requirement_name(target)[0]) in declared, f"{code}: {target} is in no extra of pyproject.toml"


def check_test_script(command: DocCommand) -> None:
    words = shlex.split(command.code)
    script = ROOT / words[0]
    assert script.is_file() and os.access(script, os.X_OK), f"{words[0]} is not an executable file"
    text = script.read_text()
    for option in words[1:]:
        assert re.search(rf"^\s*{re.escape(option)}\)", text, re.MULTILINE), f"{words[0]} has no option {option}"


def check_executable(command: DocCommand) -> None:
    script = ROOT / shlex.split(command.code)[0]
    assert script.is_file() and os.access(script, os.X_OK), f"{script} is not an executable file"


def check_benchmark(command: DocCommand) -> None:
    """The benchmark script exists, and the quick-mode benchmark test runs it."""
    name = re.search(r"benchmarks/(\w+\.py)", command.code).group(1)
    assert (ROOT / "benchmarks" / name).is_file(), f"benchmarks/{name} does not exist"
    quick = ROOT / "tests" / "docs" / "test_benchmarks_quick.py"
    assert quick.is_file(), "tests/docs/test_benchmarks_quick.py (which runs the benchmarks in --quick mode) is missing"
    text = quick.read_text()
    assert name in text or name[:-3] in text or "glob(" in text, f"tests/docs/test_benchmarks_quick.py does not run {name}"
    if command.code.startswith("pip install"):
        check_pip_install(command)


def check_api_docs(command: DocCommand) -> None:
    """The build script exists and tests/docs/test_api_docs.py builds the reference with it."""
    assert (ROOT / "scripts" / "api_docs.sh").is_file(), "scripts/api_docs.sh does not exist"
    test = ROOT / "tests" / "docs" / "test_api_docs.py"
    assert test.is_file() and "api_docs.sh" in test.read_text(), "tests/docs/test_api_docs.py does not build the reference"
    if command.code.startswith("pip install"):
        check_pip_install(command)


def build_js() -> None:
    """The JavaScript client built as the documented ``(cd js && npm ci && npm run build)`` builds it:
    its packages from the committed lock file, its TypeScript compiled to ``js/dist/``
    (``tests/js/conftest.py``; ``scripts/test.sh`` does it before the suite starts)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.js.conftest import build_js_package  # skips where SHUFFLEDP_SKIP_JS=1 and there is no node

    build_js_package()


def check_js_build(command: DocCommand) -> None:
    """The JavaScript client's install and build: its lock file is committed, its build script is tsc,
    and the build it makes is here (made now if missing or older than a source)."""
    package = json.loads((ROOT / "js" / "package.json").read_text())
    assert package["scripts"]["build"].startswith("tsc "), package["scripts"]
    lock = json.loads((ROOT / "js" / "package-lock.json").read_text())
    assert lock["name"] == package["name"] and lock["version"] == package["version"], "js/package-lock.json is stale"
    build_js()
    for entry in package["exports"].values():
        assert (ROOT / "js" / entry["default"]).is_file(), f"js/{entry['default']} is not built"


def needs_js(command: DocCommand) -> bool:
    """Whether ``command`` runs the JavaScript client (which must be built first)."""
    return bool(re.search(r"\bjs_device\.py\b|\bnode js/", command.code))


@dataclass(frozen=True)
class NotRun:
    pattern: str  # matched against the command without its comment
    reason: str
    check: Callable[[DocCommand], None]


#: The commands no test runs, each with why, and the check that runs instead.
NOT_RUN = (
    NotRun(r"pip install [^&]+$",
           "installs packages; this environment must already have them (checked)", check_pip_install),
    NotRun(r"scripts/test\.sh\b", "the test suite itself, which runs this test (its options are checked)", check_test_script),
    NotRun(r"scripts/fuzz\.sh\b", "about 10^6 fuzz cases, hours; the suite runs tests/fuzz at 10^4", check_executable),
    NotRun(r"(pip install [^&]+ && )?python benchmarks/\w+\.py",
           "a full benchmark run; tests/docs/test_benchmarks_quick.py runs each benchmark in --quick mode", check_benchmark),
    NotRun(r"(pip install [^&]+ && )?scripts/api_docs\.sh\b", "the API reference build, which tests/docs/test_api_docs.py runs and checks", check_api_docs),
    NotRun(r"\(cd js && npm ci && npm run build\)",
           "installs the JavaScript client's packages and compiles it; the lock file and the build are checked "
           "(scripts/test.sh builds it, tests/js/conftest.py where it is missing)", check_js_build),
)

#: ``pip install ARGS && REST``: the install is checked, not run; REST is classified (and run) on its own.
PIP_PREFIX = re.compile(r"^pip install (?P<args>[^&]+?)\s*&&\s*(?P<rest>.+)$", re.DOTALL)


def _matches(rule: NotRun, command: DocCommand) -> bool:
    return re.fullmatch(f"(?:{rule.pattern}).*", command.code, re.DOTALL) is not None


def not_run_rule(command: DocCommand) -> NotRun | None:
    for rule in NOT_RUN:
        if _matches(rule, command):
            return rule
    return None


def split_pip_prefix(command: DocCommand) -> DocCommand:
    """``pip install X && rest`` as the command ``rest`` (same place in the docs); others unchanged."""
    match = PIP_PREFIX.match(command.code)
    if not match or not_run_rule(command):
        return command
    rest = match.group("rest")
    comment = command.text[len(command.code):] if command.text.startswith(command.code) else ""
    return DocCommand(command.doc, command.line, command.section, rest + comment, command.script,
                      installs=f"pip install {match.group('args')}")


def needs_broker(command: DocCommand) -> bool:
    code = command.code
    return bool(re.search(r"\bshuffledp up\b|--broker\b|shuffledp\.broker\b", code))


def classify(command: DocCommand) -> str:
    """Where ``command`` runs: ``here``, ``mqtt``, ``examples``, ``examples-mqtt``, or ``not-run``."""
    if not_run_rule(command):
        return "not-run"
    command = split_pip_prefix(command)
    if command.doc == "examples/README.md" and re.match(r"python examples/\w+\.py", command.code):
        script = re.match(r"python examples/(\w+\.py)", command.code).group(1)
        return "examples-mqtt" if script in BROKER_EXAMPLES else "examples"
    return "mqtt" if needs_broker(command) else "here"


def commands_of(kind: str) -> list[DocCommand]:
    return [split_pip_prefix(c) for c in doc_commands() if classify(c) == kind]


# --------------------------------------------------------------------------- running


def doc_env(cwd: Path, size_cap: int = SIZE_CAP) -> dict[str, str]:
    """The environment of a reader who installed the project: its bin/ first on PATH; sizes capped;
    temporary directories (``shuffledp up``, the examples' default directories) beside ``cwd``."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SHUFFLEDP_SIZE_CAP"] = str(size_cap)
    temporary = cwd.parent / "tmp"
    temporary.mkdir(exist_ok=True)
    env["TMPDIR"] = str(temporary)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: The checkout folders a documented command reads (``python examples/x.py``; the examples find the
#: rest of the checkout from their own resolved path): the only entries a work folder links.
DOC_INPUTS = ("examples",)
#: Options whose value a command writes (a file, or a directory it fills).
OUTPUT_OPTIONS = ("--plot", "--output", "--out", "--stats-file", "--dir", "--spool")
#: What the examples write into the current directory without naming it on their command line.
EXAMPLE_OUTPUTS = ("simulate_and_plot.png",)


def doc_outputs(docs: tuple[str, ...] = DOCS) -> set[str]:
    """The top-level names the documented commands write in their current directory: every value of
    an :data:`OUTPUT_OPTIONS` option, the directories ``keys init`` and ``python -m
    shuffledp.deploy.broker`` make, and :data:`EXAMPLE_OUTPUTS`."""
    names = set(EXAMPLE_OUTPUTS)
    for command in doc_commands(docs):
        for line in command.code.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line)
            except ValueError:  # a line of a script that continues a quote: not an output
                continue
            for i, word in enumerate(words[:-1]):
                value = words[i + 1]
                made = word in OUTPUT_OPTIONS or words[max(0, i - 1):i + 1] in (["keys", "init"], ["-m", "shuffledp.deploy.broker"])
                if made and not value.startswith(("-", "$")):
                    names.add(Path(value).parts[0])
    return names


def workdir(tmp_path: Path, root: Path = ROOT) -> Path:
    """A fresh directory of a command's own, holding only a link to each of ``root``'s :data:`DOC_INPUTS`:
    what the command writes stays in it, and what earlier runs left in ``root`` is not there."""
    work = tmp_path / "work"
    work.mkdir()
    for name in DOC_INPUTS:
        (work / name).symlink_to(root / name, target_is_directory=True)
    return work


def run_shell(text: str, cwd: Path, *, timeout: float = COMMAND_TIMEOUT, script: bool = False) -> subprocess.CompletedProcess:
    """Run ``text`` with bash in its own process group; when bash exits or times out, whatever it
    left running is killed. A script runs with ``set -e``: its first failing command ends it.
    Output goes to files, so a process left behind cannot hold the test up by holding a pipe."""
    body = f"set -e\n{text}" if script else text
    out_path, err_path = cwd.parent / "stdout.txt", cwd.parent / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        process = subprocess.Popen(["bash", "-c", body], cwd=cwd, env=doc_env(cwd), stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=err, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(process)
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if timed_out:
        pytest.fail(f"timed out after {timeout:g} s: {text}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(text, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to every process still in the command's process group; SIGKILL to what is left
    after ``grace`` seconds (a service given SIGTERM first stops its own children)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # nothing left
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            process.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def check_result(command: DocCommand, done: subprocess.CompletedProcess, cwd: Path) -> None:
    """Exit status 0; every file a ``--plot``/``--output``/``--out``/``--stats-file`` names was
    written; ``--json`` prints JSON; an audit says it passed."""
    output = f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{command.id}: exit status {done.returncode}: {command.text}\n{output}"
    words = shlex.split(strip_comment(command.text).replace("\\\n", " "))
    for flag, value in zip(words, words[1:]):
        if flag in ("--plot", "--output", "--out", "--stats-file"):
            assert (cwd / value).is_file() and (cwd / value).stat().st_size > 0, f"{command.id}: {value} not written\n{output}"
    if not command.script and words[:1] == ["shuffledp"] and "--json" in words:
        json.loads(done.stdout)
    if not command.script and words[:2] == ["shuffledp", "audit"]:
        passed = json.loads(done.stdout)["passed"] is True if "--json" in words else "PASSED" in done.stdout
        assert passed, f"{command.id}: the audit did not pass\n{output}"


def run_doc_command(command: DocCommand, tmp_path: Path, cwd: Path | None = None,
                    root: Path = ROOT) -> subprocess.CompletedProcess:
    """Run one documented command as written (in ``cwd``, else a new :func:`workdir` of ``root``) and
    check its result."""
    if command.installs:  # `pip install X && command`: X must be installed already
        check_pip_install(DocCommand(command.doc, command.line, command.section, command.installs))
    if needs_js(command):
        build_js()
    cwd = cwd if cwd is not None else workdir(tmp_path, root)
    done = run_shell(command.text, cwd, timeout=SCRIPT_TIMEOUT if command.script else COMMAND_TIMEOUT,
                     script=command.script)
    check_result(command, done, cwd)
    return done


# --------------------------------------------------------------------------- the tests


def test_the_docs_have_commands_and_every_one_is_run_or_listed():
    commands = doc_commands()
    assert len(commands) >= 30, f"only {len(commands)} commands parsed from {DOCS}"
    kinds = {c.id: classify(c) for c in commands}
    assert set(kinds.values()) <= {"here", "mqtt", "examples", "examples-mqtt", "not-run"}
    for kind in ("here", "mqtt", "examples", "examples-mqtt", "not-run"):
        assert kind in kinds.values(), f"no documented command is of kind {kind!r}: is the parser broken?"
    # A command reading a checkout folder finds it in its work folder only if DOC_INPUTS lists it.
    outputs = doc_outputs()
    for command in commands:
        if kinds[command.id] == "not-run":
            continue
        for word in re.findall(r"[\w.-]+/[\w./-]*", command.code):
            top = word.split("/")[0]
            if (ROOT / top).is_dir() and not top.startswith(".") and top not in outputs:
                assert top in DOC_INPUTS, f"{command.id} reads {word}: add {top!r} to DOC_INPUTS"
    # A not-run rule no command matches is stale: remove it rather than keep an excuse around.
    for rule in NOT_RUN:
        assert any(_matches(rule, c) for c in commands), f"stale rule {rule.pattern}"
    # Every fenced block is shell or python: a block in any other language would go unrun.
    for doc in DOCS:
        for block in doc_blocks(doc):
            assert block.language in SHELL_LANGUAGES + ("python",), (
                f"{doc}:{block.line}: a ```{block.language} block: tests/docs/test_docs_run.py runs sh and python blocks only")


@pytest.mark.parametrize("command", [c for c in doc_commands() if classify(c) == "not-run"], ids=lambda c: c.id)
def test_not_run_command_checks(command):
    not_run_rule(command).check(command)


@pytest.mark.parametrize("command", commands_of("here"), ids=lambda c: c.id)
def test_command_runs_as_written(command, tmp_path):
    """Exit status 0, every named output file written, JSON that parses, audits that pass
    (``check_result``, called by ``run_doc_command``)."""
    done = run_doc_command(command, tmp_path)
    assert done.returncode == 0


#: What the docs leave to the reader in their python blocks (a device's enrollment and a
#: round to answer), made by a real in-process deployment; the block runs after it.
PYTHON_PREAMBLE = '''
import time as _time

import numpy as _np

from shuffledp.deploy.deployment import Deployment as _Deployment
from shuffledp.protocol.wire.messages import HadamardRangeParams as _Params, RoundSpec as _RoundSpec

_deployment = _Deployment()
_analyzer = _deployment.analyzer()
_spec = _RoundSpec(
    session_id=_deployment.session_id, round_id=0, params=_Params(-20.0, 20.0, 0.8), epsilon0=0.5,
    analyzer_key=_analyzer.keys.hpke_public, shuffler_key=_deployment.shuffler_keys.hpke_public,
    shuffler_signing_key=_deployment.shuffler_keys.signing_public, min_batch=1, deadline=_time.time() + 60,
)
my_samples = _np.array([1.2, 2.1, 1.9])
PINNED_ED25519_KEY = _deployment.analyzer_signing_key
PINNED_SHUFFLER_KEY = _deployment.shuffler_keys.signing_public
PINNED_SHUFFLER_SEALING_KEY = _deployment.shuffler_keys.hpke_public
CREDENTIAL_FROM_ENROLLMENT = _deployment.enroll()
signed_round_spec_bytes = _analyzer.sign_spec(_spec)
'''

#: After the block: what it made is checked against the deployment (the shuffler admits each
#: envelope under the device's credential; the analyzer opens the report; the topic is the round's).
PYTHON_EPILOGUE = '''
from shuffledp.protocol.transport.channel import reports_topic as _reports_topic
from shuffledp.protocol.wire.onion import EnvelopeOpener as _Opener

if "envelopes" in globals():
    assert envelopes, "no envelope"
    for _envelope in envelopes:
        _admission = _Opener(_deployment.shuffler_keys.hpke_private, _spec).open(_envelope)
        assert _admission.credential == CREDENTIAL_FROM_ENROLLMENT
        assert _analyzer.open_payloads([_admission.sealed], _spec).size == 1, "the analyzer did not open the report"
if "topic" in globals():
    assert topic == _reports_topic(_spec.session_id, 0, 0) == f"shuffledp/{_spec.session_id.hex()}/0/0/reports", topic
print("python block checked")
'''

#: Run first: the modules a device install lacks cannot be imported.
DEVICE_ONLY = f'''
import importlib.abc, sys
class _NotOnADevice(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_ON_A_DEVICE!r}:
            raise ModuleNotFoundError(f"{{name}} is not installed on a device", name=name)
        return None
sys.meta_path.insert(0, _NotOnADevice())
'''


#: Sections whose python blocks say they need the ``analysis`` extra: they run with this environment's packages.
FULL_INSTALL_SECTIONS = ("Quickstart in Python",)


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: f"{b.doc}:{b.line}")
def test_python_block_runs_on_a_device_install(block, tmp_path):
    """Each python block runs after the preamble, without scipy, MQTT, plots or tqdm (the device install),
    except in the sections of :data:`FULL_INSTALL_SECTIONS` (which say they need more)."""
    device_only = "" if block.section in FULL_INSTALL_SECTIONS else DEVICE_ONLY
    program = device_only + PYTHON_PREAMBLE + "\n# ---- the block\n" + block.text + "\n# ----\n" + PYTHON_EPILOGUE
    cwd = workdir(tmp_path)
    done = subprocess.run([sys.executable, "-c", program], cwd=cwd, env=doc_env(cwd), capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)
    assert done.returncode == 0 and "python block checked" in done.stdout, (
        f"{block.doc}:{block.line}: the python block failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


# --------------------------------------------------------------------------- the size cap itself


def test_size_cap_caps_the_size_arguments_and_says_so(monkeypatch, capsys):
    from shuffledp.cli import build_parser
    from shuffledp.size_cap import apply_size_cap

    parse = build_parser().parse_args
    monkeypatch.setenv("SHUFFLEDP_SIZE_CAP", "500")
    args = parse(["vector", "-d", "8", "-n", "1000000", "--sweep", "100,1000,1e5"])
    assert apply_size_cap(args) and (args.users, args.sweep, args.dim) == (500, "100,500", 8)
    assert capsys.readouterr().err.count("SHUFFLEDP_SIZE_CAP=500") == 1
    args = parse(["distribution", "-k", "64", "-m", "1,10,1000,10000"])
    apply_size_cap(args)
    assert (args.users, args.samples, args.symbols) == (500, "1,10,500", 64)
    args = parse(["simulate", "--seeds", "4000", "-n", "400"])
    apply_size_cap(args)
    assert (args.seeds, args.users) == (500, 400)
    args = parse(["audit"])
    apply_size_cap(args)
    assert args.quick is True
    capsys.readouterr()
    args = parse(["account", "--epsilon0", "1", "--users", "100000"])  # analytic: nothing to cap
    assert apply_size_cap(args) == [] and args.users == 100000 and capsys.readouterr().err == ""
    monkeypatch.delenv("SHUFFLEDP_SIZE_CAP")
    args = parse(["up"])
    assert apply_size_cap(args) == [] and args.users > 500
    monkeypatch.setenv("SHUFFLEDP_SIZE_CAP", "0")
    with pytest.raises(SystemExit) as exit_:
        apply_size_cap(parse(["up"]))
    assert exit_.value.code == 2


def test_the_command_line_applies_the_size_cap(tmp_path):
    env = {**os.environ, "SHUFFLEDP_SIZE_CAP": "1000"}
    done = subprocess.run([sys.executable, "-m", "shuffledp.cli", "simulate", "--fast", "-n", "100000", "--json", "-q"],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["config"]["n"] == 1000
    assert "SHUFFLEDP_SIZE_CAP=1000: --users 100000 -> 1000" in done.stderr
