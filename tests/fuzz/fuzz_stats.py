"""Shared settings and the run record of the fuzz suite (cases run, slowest single decode).

``SHUFFLEDP_FUZZ_EXAMPLES`` is the number of Hypothesis examples *per fuzz test*.
The default, 1,000 for each of the 13 fuzz tests, runs 13,000 examples in all (the
suite promises at least 10,000) in about 40 seconds on a 2-core machine. (With 10
tests the default was 1,500 each; the onion, signing and batch-delivery tests do
real HPKE and Ed25519 work in every example, and 1,500 each would take about a
minute.) ``scripts/fuzz.sh`` sets the per-test count so the total is about 10^6.
Runs are derandomized (reproducible in CI) and keep no example database.
"""

from __future__ import annotations

import gc
import os
import time

from hypothesis import HealthCheck, settings

#: Examples per fuzz test at the default setting (times the 13 fuzz tests: 13,000 >= 10,000).
DEFAULT_EXAMPLES_PER_TEST = 1000


def examples_per_test() -> int:
    value = os.environ.get("SHUFFLEDP_FUZZ_EXAMPLES", "").strip()
    return int(value) if value else DEFAULT_EXAMPLES_PER_TEST


EXAMPLES = examples_per_test()

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.filter_too_much],
)

#: What the session summary reports. ``slowest_*`` is the slowest single call to a decoder.
RECORD = {
    "cases": 0,
    "cases_by_test": {},
    "decodes": 0,
    "slowest_decode_s": 0.0,
    "slowest_decode_bytes": 0,
    "slowest_decoder": "",
    "slowest_input_head_hex": "",
}


def count_case(test: str) -> None:
    """Count one executed Hypothesis example of ``test``."""
    RECORD["cases"] += 1
    RECORD["cases_by_test"][test] = RECORD["cases_by_test"].get(test, 0) + 1


def _clock(decoder, data, args, kwargs):
    """One timed call with the cyclic GC paused (a collection of the test's own garbage is not decode time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    start = time.perf_counter()
    try:
        return decoder(data, *args, **kwargs), None, time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - re-raised by timed()
        return None, exc, time.perf_counter() - start
    finally:
        if was_enabled:
            gc.enable()


def timed(name: str, decoder, data, *args, **kwargs):
    """``decoder(data, *args, **kwargs)``, recording its wall time if it is the slowest so far.

    ``decoder`` must be a pure function of its arguments: a call slower than the
    record so far is timed twice more and its fastest time kept, so one scheduler
    hiccup does not count as a slow decode. Exceptions pass through unchanged (the
    time of a refusal counts too).
    """
    result, error, elapsed = _clock(decoder, data, args, kwargs)
    RECORD["decodes"] += 1
    if elapsed > RECORD["slowest_decode_s"]:
        for _ in range(2):
            elapsed = min(elapsed, _clock(decoder, data, args, kwargs)[2])
        if elapsed > RECORD["slowest_decode_s"]:
            RECORD["slowest_decode_s"] = elapsed
            RECORD["slowest_decode_bytes"] = len(data) if hasattr(data, "__len__") else -1
            RECORD["slowest_decoder"] = name
            RECORD["slowest_input_head_hex"] = bytes(data[:64]).hex() if isinstance(data, (bytes, bytearray)) else ""
    if error is not None:
        raise error
    return result


def summary_line() -> str:
    return (
        f"shuffledp fuzz: {RECORD['cases']} cases over {len(RECORD['cases_by_test'])} tests "
        f"({EXAMPLES} examples per test), {RECORD['decodes']} timed decodes; slowest decode "
        f"{RECORD['slowest_decode_s'] * 1000:.3f} ms ({RECORD['slowest_decoder']}, "
        f"{RECORD['slowest_decode_bytes']}-byte input)"
    )
