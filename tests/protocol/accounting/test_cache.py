"""The accountant's on-disk cache: answers are reused across calls and processes, only for the same
question and the same accountant source, never at the cost of an error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shuffledp.protocol.accounting import SessionAccountant, hadamard_response_guarantee, laplace_mean_guarantee, shuffled_round
from shuffledp.protocol.accounting import cache
from shuffledp.protocol.accounting.shuffle_round import _shuffled_round


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "accounting.sqlite"
    monkeypatch.setenv(cache.ENV, str(path))
    return path


def counting(answer):
    calls = []

    def compute():
        calls.append(1)
        return answer

    return compute, calls


def test_an_answer_is_computed_once_then_read(cache_file):
    compute, calls = counting({"epsilon": 0.123456789012345678})
    assert cache.cached("k", {"n": 10, "delta": 1e-6}, compute) == {"epsilon": 0.123456789012345678}
    assert cache.cached("k", {"n": 10, "delta": 1e-6}, compute) == {"epsilon": 0.123456789012345678}
    assert len(calls) == 1 and cache_file.exists()
    cache.cached("k", {"n": 11, "delta": 1e-6}, compute)  # another question
    cache.cached("other", {"n": 10, "delta": 1e-6}, compute)  # another kind
    assert len(calls) == 3


def test_a_changed_accountant_source_never_reads_old_answers(cache_file, monkeypatch):
    compute, calls = counting({"epsilon": 1.0})
    cache.cached("k", {"n": 10}, compute)
    monkeypatch.setattr(cache, "source_digest", lambda: "a different accountant")
    cache.cached("k", {"n": 10}, compute)
    assert len(calls) == 2


def test_off_and_an_unusable_path_compute_without_error(tmp_path, monkeypatch):
    compute, calls = counting({"epsilon": 2.0})
    monkeypatch.setenv(cache.ENV, "off")
    assert cache.cache_path() is None
    cache.cached("k", {"n": 1}, compute)
    cache.cached("k", {"n": 1}, compute)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cache.ENV, str(blocker / "accounting.sqlite"))  # its parent is a file
    assert cache.cached("k", {"n": 1}, compute) == {"epsilon": 2.0}
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is not sqlite" * 100)
    monkeypatch.setenv(cache.ENV, str(corrupt))
    assert cache.cached("k", {"n": 1}, compute) == {"epsilon": 2.0}
    assert len(calls) == 4


def test_shuffled_round_and_sessions_through_the_cache_equal_the_computation(cache_file):
    local = hadamard_response_guarantee(1.0, 16)
    direct = _shuffled_round(local, 1000, 1e-6)
    first, second = shuffled_round(local, 1000, 1e-6), shuffled_round(local, 1000, 1e-6)
    assert first == direct == second  # bit-for-bit, candidates included
    session = SessionAccountant()
    session.add_round(local, 1000)
    session.add_round(laplace_mean_guarantee(1.0), 1000, count=3)
    assert session.epsilon_breakdown(1e-6) == session._epsilon_breakdown(1e-6) == session.epsilon_breakdown(1e-6)


def test_another_process_reads_what_this_one_stored(cache_file):
    compute, calls = counting({"epsilon": 0.5})
    cache.cached("shared", {"n": 7}, compute)
    code = ("from shuffledp.protocol.accounting import cache\n"
            "print(cache.cached('shared', {'n': 7}, lambda: {'epsilon': -1.0})['epsilon'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0.5"
