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
set -euo pipefail
cd "$(dirname "$0")/.."

TOTAL="${1:-1000000}"
if [ "$#" -gt 0 ]; then shift; fi
LIMIT_MS="${SHUFFLEDP_FUZZ_LIMIT_MS:-1000}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

tests="$(python3 -m pytest -q -p no:cacheprovider --collect-only tests/fuzz | grep -c '^tests/fuzz/.*::' || true)"
if [ "$tests" -lt 1 ]; then
  echo "fuzz.sh: no fuzz tests collected under tests/fuzz" >&2
  exit 1
fi
per_test=$(( (TOTAL + tests - 1) / tests ))
echo "fuzz.sh: ${tests} fuzz tests x ${per_test} examples = $(( tests * per_test )) cases" >&2

# The long run takes minutes per test: lift the suite's per-test timeout (pytest-timeout).
timeout_args=()
if python3 -c "import pytest_timeout" 2>/dev/null; then timeout_args=(--timeout=0); fi

report="$work/fuzz-report.json"
status=0
# Hypothesis keeps its own files (constants cache, patches of failing examples) in a
# scratch directory, not in the work tree.
SHUFFLEDP_FUZZ_EXAMPLES="$per_test" SHUFFLEDP_FUZZ_REPORT="$report" HYPOTHESIS_STORAGE_DIRECTORY="$work/hypothesis" \
  python3 -m pytest -q -p no:cacheprovider "${timeout_args[@]}" tests/fuzz "$@" || status=$?

if [ ! -s "$report" ]; then
  echo "fuzz.sh: no fuzz report written (pytest exit status $status)" >&2
  exit 1
fi

python3 - "$report" "$LIMIT_MS" "$status" <<'EOF'
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
