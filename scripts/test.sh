#!/usr/bin/env bash
# The whole test suite, MQTT tests against a real mosquitto broker included.
# Installs what it needs first: the mosquitto broker (Debian package) and the
# project with its test extras. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  echo "installing mosquitto (Debian package) ..." >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e ".[test]"
exec python3 -m pytest -q -p no:cacheprovider "$@"
