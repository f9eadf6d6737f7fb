#!/usr/bin/env bash
# The whole test suite, MQTT tests against a real mosquitto broker included, in a
# virtual environment built afresh on every run, so that a green run means a fresh
# machine passes too. What it does:
#   1. installs the mosquitto broker and nats-server (Debian packages) if the machine lacks them;
#   2. deletes and re-creates the environment (.venv-test/, or $SHUFFLEDP_TEST_VENV)
#      and installs the project with its test extras at the exact versions of
#      requirements/test.lock (made by scripts/lock.sh);
#   3. installs the JavaScript client's npm packages from js/package-lock.json (npm ci),
#      compiles it, and installs Debian's chromium for its browser tests if missing;
#   4. runs pytest with one process per core plus one (pytest-xdist, unless -n is given),
#      BLAS pinned to one thread per process, and beside it the JavaScript client's own
#      tests (Node's test runner) and the type check (tests/layout/test_types.py: mypy over
#      the package), whose results follow pytest's.
#
# Options (the rest goes to pytest):
#   --latest   ignore the lock: the newest versions that pyproject.toml allows
#              (how to check that the project still works with today's releases)
#   --reuse    keep an existing environment instead of rebuilding it (faster local
#              re-runs; never what CI does)
set -euo pipefail
cd "$(dirname "$0")/.."

latest=0
reuse=0
pytest_args=()
# One pytest process per core plus one (pytest-xdist), unless -n is given: many tests wait on a
# broker, a browser or a subprocess, and the extra process keeps the cores busy meanwhile. Idle
# processes take queued tests from busy ones (work stealing).
workers="-n $(( $(nproc 2>/dev/null || echo 1) + 1 )) --dist worksteal"
for arg in "$@"; do
  case "$arg" in
    --latest) latest=1 ;;
    --reuse) reuse=1 ;;
    -n|-n*|--numprocesses*) workers=""; pytest_args+=("$arg") ;;
    *) pytest_args+=("$arg") ;;
  esac
done

if { ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; } || [ ! -f /usr/include/mosquitto_plugin.h ] \
   || [ ! -f /usr/include/mosquitto.h ] || ! command -v gcc >/dev/null 2>&1; then
  echo "installing mosquitto and what its per-role limits plugin builds with (Debian packages) ..." >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto mosquitto-dev libmosquitto-dev gcc libc6-dev >/dev/null
fi
# The clustered broker tier's tests (tests/mqtt/test_nats_cluster.py) run three NATS servers.
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  echo "installing nats-server (Debian package) for the clustered broker tests ..." >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nats-server >/dev/null
fi

# The JavaScript device client (js/, npm package @shuffledp/client): Node >= 20 and npm
# from the machine, its packages from the committed lock (npm ci), compiled with tsc;
# its browser tests drive Debian's chromium with playwright-core.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "Node.js >= 20 and npm are needed for the JavaScript client's tests (see js/README.md)" >&2
  exit 2
fi
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
  echo "Node.js >= 20 is needed for the JavaScript client's tests; this is $(node --version)" >&2
  exit 2
fi
if { [ ! -x /usr/bin/chromium ] || ! command -v certutil >/dev/null 2>&1; } && [ "${SHUFFLEDP_SKIP_BROWSER:-0}" != 1 ]; then
  # certutil (libnss3-tools) puts the test broker's CA into the browser's own trust store.
  echo "installing chromium and certutil for the browser tests (Debian packages) ..." >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium libnss3-tools >/dev/null
fi
# npm ci and tsc run beside the Python environment's installation (below): one waits mostly on
# the disk, the other on a core.
echo "installing the JavaScript client's packages from js/package-lock.json (npm ci) and compiling it" >&2
js_build_log="$(mktemp)"
(cd js && npm ci --no-audit --no-fund --loglevel=error && npx tsc -p tsconfig.json) >"$js_build_log" 2>&1 &
js_build_pid=$!

venv="${SHUFFLEDP_TEST_VENV:-.venv-test}"
python="${PYTHON:-python3}"
if [ "$reuse" = 1 ] && [ -x "$venv/bin/python" ]; then
  echo "reusing the test environment $venv" >&2
else
  echo "creating a fresh virtual environment in $venv ($("$python" --version))" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # --no-compile: the suite keeps its bytecode under PYTHONPYCACHEPREFIX (below), where Python
  # looks instead of the packages' own __pycache__ folders, so what pip would compile is never read.
  "$venv/bin/python" -m pip install -q --upgrade pip
  if [ "$latest" = 1 ]; then
    echo "installing the newest versions pyproject.toml allows (no lock)" >&2
    "$venv/bin/python" -m pip install -q --no-compile --upgrade --upgrade-strategy eager -e ".[test]"
  else
    echo "installing the locked versions of requirements/test.lock" >&2
    "$venv/bin/python" -m pip install -q --no-compile -c requirements/test.lock -e ".[test]"
  fi
  "$venv/bin/python" -m pip list --format=freeze >&2
fi
if ! wait "$js_build_pid"; then
  cat "$js_build_log" >&2
  echo "the JavaScript client did not install or compile (above)" >&2
  exit 1
fi
cat "$js_build_log" >&2
rm -f "$js_build_log"

# One BLAS thread per process: the suite runs a process per core and more, and
# threaded BLAS in each slowed the accounting tests many times over.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Compiled bytecode is kept (in the environment's folder, not the checkout): the suite starts
# hundreds of Python processes, and a machine set never to write bytecode made each of them
# compile the project's modules anew.
unset PYTHONDONTWRITEBYTECODE
case "$venv" in /*) venv_dir="$venv" ;; *) venv_dir="$PWD/$venv" ;; esac
export PYTHONPYCACHEPREFIX="$venv_dir/pycache"
export PATH="$venv_dir/bin:$PATH"
status=0
# The JavaScript client's own tests (Node's test runner, which mostly waits on its clients) and the
# type check (mypy over the package, about 14 CPU-seconds from a cold cache) run beside the Python
# suite, which also runs the JavaScript client against the Python parties (tests/js/) and skips
# the type check; their output follows the suite's.
types_test=tests/layout/test_types.py
types_log="$venv_dir/typecheck.log"
node_log="$venv_dir/node-tests.log"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$types_test" >"$types_log" 2>&1 &
types_pid=$!
(cd js && node --test --test-reporter=tap test/*.test.mjs) >"$node_log" 2>&1 &
node_pid=$!
# shellcheck disable=SC2086  # $workers is two words or none
"$venv/bin/python" -m pytest -q -p no:cacheprovider $workers --deselect "$types_test" "${pytest_args[@]}" || status=$?
if wait "$node_pid"; then
  echo "JavaScript client's own tests (node --test): $(grep -E '^# (pass|fail) ' "$node_log" | tr '\n' ' ')" >&2
else
  status=1
  cat "$node_log" >&2
fi
if wait "$types_pid"; then
  echo "type check (tests/layout/test_types.py): $(tail -n 1 "$types_log")" >&2
else
  status=1
  cat "$types_log" >&2
fi
exit "$status"
