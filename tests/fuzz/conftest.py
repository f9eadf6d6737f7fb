"""Session record of the fuzz suite: a one-line summary, and a JSON report for scripts/fuzz.sh.

At the end of a session that ran fuzz tests, prints (in pytest's terminal summary)
the cases run and the slowest single decode with its input size. If
``SHUFFLEDP_FUZZ_REPORT`` names a path, the same record is written there as JSON.
The tests never assert on wall-clock time; ``scripts/fuzz.sh`` checks the report.
"""

from __future__ import annotations

import json
import os

import pytest

import fuzz_stats

_SUMMARY: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def fuzz_session_record():
    yield fuzz_stats.RECORD
    record = fuzz_stats.RECORD
    _SUMMARY.append(fuzz_stats.summary_line())
    path = os.environ.get("SHUFFLEDP_FUZZ_REPORT")
    if path:
        report = {
            "cases": record["cases"],
            "cases_by_test": record["cases_by_test"],
            "examples_per_test": fuzz_stats.EXAMPLES,
            "tests": len(record["cases_by_test"]),
            "decodes": record["decodes"],
            "slowest_decode_ms": record["slowest_decode_s"] * 1000.0,
            "slowest_decode_bytes": record["slowest_decode_bytes"],
            "slowest_decoder": record["slowest_decoder"],
            "slowest_input_head_hex": record["slowest_input_head_hex"],
        }
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
            fh.write("\n")


def pytest_terminal_summary(terminalreporter):
    for line in _SUMMARY:
        terminalreporter.write_line(line)
