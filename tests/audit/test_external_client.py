"""``shuffledp audit --client CMD``: the local audit on another implementation's reports.

The JavaScript client passes it; a client that claims Hadamard range's eps0 but keeps the
true bit with probability 0.99 fails it; a command that cannot start, fails or breaks the
protocol ends the audit with one typed line (exit status 2), never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import struct
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from shuffledp.audit.external import (
    ExternalClient,
    ExternalClientError,
    audit_external,
    audit_spec,
    two_sample_chi_square,
)
from shuffledp.cli import main
from shuffledp.protocol.wire.messages import HadamardRangeParams

PYTHON = sys.executable

#: A correct external client in Python (the built-in randomizer behind the protocol, seeded),
#: with a planted fault for hadamard-range when ``WRONG`` is True: the bit agrees with the true
#: bin's Hadamard entry with probability 0.99, i.e. eps = ln 99 = 4.6 whatever eps0 it claims.
CLIENT = textwrap.dedent('''
    import json, struct, sys
    import numpy as np
    from shuffledp.client.mechanisms import randomize_round
    from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
    from shuffledp.protocol.mechanisms.randomness import SeededSource
    from shuffledp.protocol.wire import codec
    from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec

    WRONG = {wrong}
    source = SeededSource(5)
    rng = np.random.default_rng(6)
    out = sys.stdout.buffer
    for line in sys.stdin:
        request = json.loads(line)
        spec = codec.decode(bytes.fromhex(request["spec"]), RoundSpec)
        x = np.asarray(request["input"], dtype=np.float64)
        n = request["count"]
        params = spec.params
        if WRONG and isinstance(params, HadamardRangeParams):
            v = min(max(int((float(x) - params.low) // (2 * params.tau)), 0), params.num_bins - 1)
            rows = rng.integers(0, params.padded_bins, n)
            truth = hadamard_entry(rows, v)
            bits = np.where(rng.random(n) < 0.99, truth, -truth)
            reports = np.stack([rows, bits], axis=1)[:, None, :].astype(np.int64)
        else:
            data = np.ascontiguousarray(np.broadcast_to(x, (n,) + x.shape))
            reports = randomize_round(params, spec.epsilon0, spec.delta0, data, source)
        out.write(b"SDPR" + struct.pack("<III", *reports.shape) + reports.astype("<i8").tobytes())
        out.flush()
''')


def write_client(tmp_path, name: str, body: str) -> str:
    script = tmp_path / name
    script.write_text(body)
    return f"{PYTHON} {script}"


# --------------------------------------------------------------------------
# The JavaScript client passes
# --------------------------------------------------------------------------


def test_the_javascript_client_passes_the_audit(js_package):
    """Every round-mechanism row at 5,000 runs per input and row, from the package's randomizers
    with the seeded word stream (the same sampling code as SystemSource; reproducible). At
    confidence 1 - 1e-3 family-wise a correct implementation fails some row with probability at
    most 1e-3, and the law tests (family-wise 1e-3) call some row 'differs' with probability at
    most 1e-3 (up to the chi-square approximation)."""
    command = f"node {js_package / 'dist' / 'cli' / 'randomize.js'} --seed 1"
    audit = audit_external(command, trials=5000, seed=3, confidence=1 - 1e-3, law_alpha=1e-3)
    assert audit.passed, [(r.mechanism, r.epsilon0, r.epsilon_lb, r.epsilon_param) for r in audit.results]
    assert len(audit.results) == 29  # 7 round-mechanism rows at 4 epsilons, plus the Gaussian stress claim
    assert {r.source for r in audit.results} == {"external"}
    assert not [(law.mechanism, law.epsilon0, law.pvalue) for law in audit.laws if law.differs]
    # the audit has power on these rows: the tight randomized-response rows come close to the claim
    tight = [r for r in audit.results if r.mechanism == "hadamard-range" and r.epsilon0 >= 1]
    assert all(r.epsilon_lb > 0.5 * r.epsilon0 for r in tight)


def test_the_javascript_client_with_the_system_source_passes(js_package):
    """The device's source (the platform CSPRNG, so not reproducible): two rows at confidence
    1 - 1e-4 family-wise, so this test fails on a correct client with probability at most 1e-4."""
    command = f"node {js_package / 'dist' / 'cli' / 'randomize.js'}"
    audit = audit_external(command, trials=5000, epsilons=(1.0,), gaussian_stress=(), confidence=1 - 1e-4,
                           mechanisms=("hadamard-range", "projected-mean-laplace"))
    assert audit.passed and len(audit.results) == 2


# --------------------------------------------------------------------------
# A wrong client fails
# --------------------------------------------------------------------------


def test_a_client_that_keeps_the_true_bit_too_often_fails(tmp_path, capsys):
    command = write_client(tmp_path, "wrong.py", CLIENT.format(wrong=True))
    assert main(["audit", "--quick", "--client", command, "--json", "-q"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["passed"] and result["implementation"].endswith(command)
    violated = {(r["mechanism"], r["epsilon0"]) for r in result["local"] if r["verdict"] == "VIOLATED"}
    # The planted keep probability 0.99 is eps = ln 99 = 4.6; at 10^4 runs per input the bound
    # clears eps0 = 0.5, 1 and 2 by far (about 4 at eps0 = 2); only hadamard-range has the fault.
    assert {("hadamard-range", e) for e in (0.5, 1.0, 2.0)} <= violated
    assert {m for m, _ in violated} == {"hadamard-range"}
    # keep probability 0.99 against 0.62-0.88: the (row, bit) law differs by far (p ~ 0 in double precision)
    differs = {(r["mechanism"], r["epsilon0"]) for r in result["local"] if r["law"]["differs"]}
    assert {("hadamard-range", e) for e in (0.5, 1.0, 2.0)} <= differs


def test_the_same_client_without_the_fault_passes(tmp_path, capsys):
    """The control: the same script without the fault. Seeded, so reproducible; over seeds a
    correct client fails the audit (family-wise 5 %) with probability at most 0.05."""
    command = write_client(tmp_path, "right.py", CLIENT.format(wrong=False))
    assert main(["audit", "--quick", "--client", command, "-q"]) == 0
    text = capsys.readouterr().out
    assert "PASSED" in text and f"implementation audited: external client: {command}" in text
    assert "VIOLATED" not in text


# --------------------------------------------------------------------------
# A broken command: one typed line, exit status 2
# --------------------------------------------------------------------------

HEADER = "import sys, struct\nsys.stdin.readline()\nout = sys.stdout.buffer\n"
BROKEN = {
    "garbage": (HEADER + "out.write(b'HELLO, WORLD' * 4); out.flush()\n", "malformed answer"),
    "exit-status": ("import sys\nsys.stdin.readline()\nprint('boom', file=sys.stderr)\nsys.exit(3)\n",
                    "exited with status 3"),
    "short": (HEADER + "out.write(b'SDPR' + struct.pack('<III', 10000, 1, 2) + bytes(100)); out.flush()\n",
              "closed its output after"),
    "wrong-shape": (HEADER + "out.write(b'SDPR' + struct.pack('<III', 3, 1, 2)); out.flush()\n", "shape 3 x 1 x 2"),
    "out-of-range": (HEADER + "out.write(b'SDPR' + struct.pack('<III', 10000, 1, 2) + struct.pack('<qq', 0, 5) * 10000)\n"
                     "out.flush()\n", "outside the report range"),
    "refusal": (HEADER + "text = b'invalid-parameter: no such mechanism'\n"
                "out.write(b'SDPE' + struct.pack('<I', len(text)) + text); out.flush()\n", "no such mechanism"),
    "huge-refusal": (HEADER + "out.write(b'SDPE' + struct.pack('<I', 2**31)); out.flush()\n", "malformed refusal"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_client_gives_one_typed_line(tmp_path, capsys, kind):
    body, expected = BROKEN[kind]
    command = write_client(tmp_path, f"{kind}.py", body)
    assert main(["audit", "--quick", "--client", command, "-q"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shuffledp audit: external-client: "), captured.err
    assert expected in lines[0] and "Traceback" not in captured.err and captured.out == ""


def test_the_javascript_client_refuses_a_bad_request_and_goes_on(js_package):
    """randomize.js answers a line it cannot take with a refusal frame and serves the next one."""
    import subprocess

    from shuffledp.protocol.wire import codec

    spec = audit_spec(HadamardRangeParams(0.0, 1.0, 1.0 / 16.0), 1.0, 0.0)
    good = json.dumps({"spec": codec.canonical_encode(spec).hex(), "input": 0.3, "count": 3})
    bad_spec = json.dumps({"spec": "ff00", "input": 0.3, "count": 3})
    lines = "\n".join(["not json", bad_spec, good.replace('"count": 3', '"count": 0'), good]) + "\n"
    out = subprocess.run(["node", str(js_package / "dist" / "cli" / "randomize.js"), "--seed", "1"], input=lines.encode(),
                         capture_output=True, timeout=60, check=True).stdout
    reasons = []
    for _ in range(3):
        assert out[:4] == b"SDPE"
        (length,) = struct.unpack("<I", out[4:8])
        reasons.append(out[8 : 8 + length].decode())
        out = out[8 + length :]
    assert reasons[0].startswith("malformed") and reasons[2].startswith("malformed") and "count" in reasons[2]
    assert reasons[1].split(":")[0] in ("malformed", "unsupported-version", "too-large")
    assert out[:4] == b"SDPR" and struct.unpack("<III", out[4:16]) == (3, 1, 2) and len(out) == 16 + 3 * 2 * 8
    rows_bits = np.frombuffer(out[16:], dtype="<i8").reshape(3, 2)
    assert np.all((rows_bits[:, 0] >= 0) & (rows_bits[:, 0] < 8)) and set(rows_bits[:, 1]) <= {-1, 1}


def test_a_missing_command_gives_one_typed_line(tmp_path, capsys):
    assert main(["audit", "--client", str(tmp_path / "no-such-randomizer"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "external-client: cannot start" in err and "Traceback" not in err
    assert main(["audit", "--client", "", "-q"]) == 2
    assert "invalid parameter client" in capsys.readouterr().err


def test_client_goes_with_the_local_part_only(capsys):
    assert main(["audit", "--client", "true", "--part", "shuffled", "-q"]) == 2
    assert "--part" in capsys.readouterr().err


def test_a_silent_command_times_out(tmp_path):
    """A command that reads the request and never answers: the read gives up after the timeout."""
    command = write_client(tmp_path, "silent.py", "import sys, time\nsys.stdin.readline()\ntime.sleep(60)\n")
    spec = audit_spec(HadamardRangeParams(0.0, 1.0, 1.0 / 16.0), 1.0, 0.0)
    with ExternalClient(command, timeout=0.3) as client:
        with pytest.raises(ExternalClientError, match="sent nothing for 0.3 s"):
            client.randomize(spec, 0.5, 10)


# --------------------------------------------------------------------------
# The law-equality test
# --------------------------------------------------------------------------


def test_law_equality_statistic_accepts_one_law_and_rejects_another():
    """Two samples of one law: p >= 1e-3 (a false failure has probability 1e-3, up to the
    chi-square approximation; seeded, so reproducible). A shift by 0.2 standard deviations at
    20,000 runs per sample: the binned statistic's noncentrality is about (n/2) 0.2^2 = 400
    (near-full information in 50 quantile bins) on 49 degrees of freedom, so it lands near 450
    with a spread of about sqrt(2 (49 + 800)) = 41; even 4 spreads below, p is below 1e-30."""
    from scipy.stats import chi2

    rng = np.random.default_rng(11)
    a = np.round(rng.normal(0.0, 300.0, (20000, 1, 1))).astype(np.int64)
    b = np.round(rng.normal(0.0, 300.0, (20000, 1, 1))).astype(np.int64)
    c = np.round(rng.normal(60.0, 300.0, (20000, 1, 1))).astype(np.int64)
    statistic, dof = two_sample_chi_square(a, b)
    assert dof == 49 and chi2.sf(statistic, dof) >= 1e-3
    statistic, dof = two_sample_chi_square(a, c)
    assert chi2.sf(statistic, dof) < 1e-9
    # categorical reports (row, bit): the 16 joint values are the categories
    def reports():
        return np.stack([rng.integers(0, 8, 20000), rng.choice([-1, 1], 20000)], axis=1)

    statistic, dof = two_sample_chi_square(reports(), reports())
    assert dof == 15 and chi2.sf(statistic, dof) >= 1e-3


def _blocked_signals(native_id: int) -> int:
    """The signal mask of one thread of this process (Linux: ``SigBlk`` of /proc/self/task/ID/status)."""
    with open(f"/proc/self/task/{native_id}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads thread signal masks from Linux's /proc")
def test_the_stderr_reader_thread_never_takes_ctrl_c_from_the_main_thread(tmp_path):
    """A signal sent to the process (Ctrl-C, SIGTERM) goes to any thread that does not block it.
    Taken by the thread that drains the command's stderr, it would not wake the main thread's
    wait on the command's output, and Ctrl-C would do nothing for up to the whole timeout
    (120 s by default). So that thread blocks both; the main thread blocks neither."""
    command = write_client(tmp_path, "silent.py", "import sys, time\nsys.stdin.readline()\ntime.sleep(60)\n")
    before = {thread.native_id for thread in threading.enumerate()}
    with ExternalClient(command, timeout=5.0):
        started = [thread for thread in threading.enumerate() if thread.native_id not in before]
        assert len(started) == 1
        wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
        assert _blocked_signals(started[0].native_id) & wanted == wanted
        assert _blocked_signals(threading.main_thread().native_id) & wanted == 0


def _as_from_a_terminal() -> None:
    """In the child before exec: Ctrl-C unblocked and at its default, as a shell starts a command.
    A test worker's mask and dispositions are inherited across exec: in a run under load the
    audit's main thread kept polling (its faulthandler stacks) and never saw the signal, as with
    SIGINT blocked or ignored in the worker that started it."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_client_audit_is_one_line_and_status_130(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the audit waits on
    its client: one line on stderr, exit status 130, no traceback, and the client's process ended."""
    started = tmp_path / "started"
    client = tmp_path / "slow_client.py"
    client.write_text(
        "import pathlib, sys, time\n"
        "sys.stdin.readline()\n"
        f"pathlib.Path({str(started)!r}).write_text('asked')\n"
        "time.sleep(3600)\n"
    )
    # PYTHONFAULTHANDLER: should the audit ever ignore the signal, SIGABRT below prints where it waits
    proc = subprocess.Popen([sys.executable, "-m", "shuffledp.cli", "audit", "--quick", "--client", f"{sys.executable} {client}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONFAULTHANDLER="1"), preexec_fn=_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120  # a safety limit only: the wait ends when the client is asked
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the audit never asked its client"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)
            raise AssertionError("the audit ignored Ctrl-C for 60 s; where it waited:\n" + proc.communicate()[1]) from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if " runs (" not in line]
    assert proc.returncode == 130 and lines == ["shuffledp audit: interrupted"] and "Traceback" not in err, err
