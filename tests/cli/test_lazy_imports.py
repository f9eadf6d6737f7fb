"""A command imports only what it runs, and the accountant loads when the accounting starts.

Each check runs in a fresh interpreter, where ``sys.modules`` shows exactly what was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from shuffledp.cli import COMMAND_MODULES, build_parser


def _fresh(code: str) -> object:
    """The JSON a fresh interpreter prints running ``code``."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_command_imports_only_its_own_module():
    loaded = _fresh("""
        import json, sys
        from shuffledp.cli import build_parser
        args = build_parser(["keys", "init", "DIR"]).parse_args(["keys", "init", "DIR"])
        print(json.dumps([m for m in sys.modules if m.startswith("shuffledp.cli.")]))
    """)
    commands = [m for m in loaded if m in COMMAND_MODULES]
    assert commands == ["shuffledp.cli.keys"], loaded
    assert "shuffledp.simulation" not in loaded


def test_help_and_unknown_words_still_see_every_command():
    for argv in ((), ("--help",), ("no-such-command",)):
        parser = build_parser(argv)
        choices = next(a for a in parser._actions if a.dest == "command").choices
        assert {name.rpartition(".")[2] for name in COMMAND_MODULES} <= set(choices)


_ACCOUNTED_RUN = """
    import json, sys, threading
    import shuffledp.simulation.scalar as scalar
    from shuffledp.simulation import SimulationConfig, run_simulation
    from shuffledp.simulation.population import Population

    during = []
    real = scalar.run_messages

    def spy(*args, **kwargs):
        during.append(threading.active_count())
        result = real(*args, **kwargs)
        during.append("dp_accounting" in sys.modules)
        return result

    scalar.run_messages = spy
    before = threading.active_count()
    result = run_simulation(SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 5), 300, 1.0, path="messages", seed=1))
    print(json.dumps({"threads_before": before, "threads_during": during[0], "accountant_during": during[1],
                      "accountant_after": "dp_accounting" in sys.modules, "epsilon": result.central["epsilon"]}))
"""


def test_the_accountant_loads_when_the_accounting_starts_not_during_the_protocol(tmp_path, monkeypatch):
    monkeypatch.setenv("SHUFFLEDP_ACCOUNTING_CACHE", str(tmp_path / "accounting.sqlite"))
    first = _fresh(_ACCOUNTED_RUN)  # an empty cache: the answer is computed
    assert first["threads_during"] == first["threads_before"]  # no import thread beside the protocol
    assert first["accountant_during"] is False
    assert first["accountant_after"] is True and 0 < first["epsilon"] < 1.0
    again = _fresh(_ACCOUNTED_RUN)  # the same question: answered from the cache, the accountant never loaded
    assert again["accountant_after"] is False
    assert again["epsilon"] == first["epsilon"]
