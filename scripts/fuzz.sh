#!/usr/bin/env bash
# The long fuzz run: tests/fuzz with about 10^6 Hypothesis examples in total.
#
#   scripts/fuzz.sh [TOTAL] [extra pytest args...]
#
# TOTAL (default 1000000) is spread evenly over the fuzz tests (SHUFFLEDP_FUZZ_EXAMPLES
# = TOTAL / number of tests). Prints the suite's summary (cases run, slowest single
# decode and its input size) and exits 1 if any test fails or if the slowest decode
# took more than 1 second. Runs are derandomized: the same tree fuzzes the same inputs.
# The regular test suite runs the same tests at a small default count (>= 10,000 in all).
#
# Python: $PYTHON if set, else python3 on the PATH. It needs the `test` extra (pytest,
# hypothesis, pytest-timeout): without it the script says what is missing and how to
# install it (exit status 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
python="${PYTHON:-python3}"

# What the fuzz tests import: the installed project (shuffledp.protocol is found only through an
# install; the checkout's folder alone does not map it), its core dependencies, the test tools.
missing="$("$python" -c '
import importlib.util as u
def found(m):
    try:
        return u.find_spec(m) is not None
    except ImportError:
        return False
print(" ".join(m for m in ("pytest", "hypothesis", "pytest_asyncio", "numpy", "cbor2", "cryptography", "shuffledp.protocol") if not found(m)))')" \
  || { echo "fuzz.sh: cannot run $python" >&2; exit 2; }
if [ -n "$missing" ]; then
  echo "fuzz.sh: $python lacks ${missing// /, } (the fuzz tests need the project installed with its 'test' extra); install them with:" >&2
  echo "  $python -m pip install -e '$root[test]'" >&2
  exit 2
fi

TOTAL="${1:-1000000}"
if [ "$#" -gt 0 ]; then shift; fi
LIMIT_MS="${SHUFFLEDP_FUZZ_LIMIT_MS:-1000}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

collect_status=0
"$python" -m pytest -q -p no:cacheprovider --collect-only tests/fuzz >"$work/collect.txt" 2>&1 || collect_status=$?
tests="$(grep -c '^tests/fuzz/.*::' "$work/collect.txt" || true)"
if [ "$collect_status" != 0 ] || [ "$tests" -lt 1 ]; then
  tail -n 20 "$work/collect.txt" >&2
  echo "fuzz.sh: pytest could not collect the fuzz tests under tests/fuzz (exit status $collect_status, $tests collected): see above" >&2
  exit 1
fi
per_test=$(( (TOTAL + tests - 1) / tests ))
echo "fuzz.sh: ${tests} fuzz tests x ${per_test} examples = $(( tests * per_test )) cases" >&2

# The long run takes minutes per test: lift the suite's per-test timeout (pytest-timeout).
timeout_args=()
if "$python" -c "import pytest_timeout" 2>/dev/null; then timeout_args=(--timeout=0); fi

report="$work/fuzz-report.json"
status=0
# Hypothesis keeps its own files (constants cache, patches of failing examples) in a
# scratch directory, not in the work tree.
SHUFFLEDP_FUZZ_EXAMPLES="$per_test" SHUFFLEDP_FUZZ_REPORT="$report" HYPOTHESIS_STORAGE_DIRECTORY="$work/hypothesis" \
  "$python" -m pytest -q -p no:cacheprovider "${timeout_args[@]}" tests/fuzz "$@" || status=$?

if [ ! -s "$report" ]; then
  echo "fuzz.sh: no fuzz report written (pytest exit status $status)" >&2
  exit 1
fi

"$python" - "$report" "$LIMIT_MS" "$status" <<'EOF'
import json
import sys

path, limit_ms, status = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with open(path, encoding="utf-8") as fh:
    r = json.load(fh)
print(
    f"fuzz summary: {r['cases']} cases over {r['tests']} tests ({r['examples_per_test']} per test), "
    f"{r['decodes']} timed decodes; slowest decode {r['slowest_decode_ms']:.3f} ms "
    f"({r['slowest_decoder']}, {r['slowest_decode_bytes']}-byte input, starts {r['slowest_input_head_hex'][:32]})"
)
failed = False
if status != 0:
    print(f"FAIL: pytest exited with status {status}")
    failed = True
if r["slowest_decode_ms"] > limit_ms:
    print(f"FAIL: the slowest decode took {r['slowest_decode_ms']:.1f} ms, over the limit of {limit_ms:.0f} ms")
    failed = True
sys.exit(1 if failed else 0)
EOF
