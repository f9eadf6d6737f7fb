#!/usr/bin/env bash
# Measures the two installs the README names, each in a new virtual environment at the
# locked versions: the device install (`pip install .`: numpy, cbor2, cryptography) and
# the full install (`pip install ".[all]"`). Prints each one's packages and its size on
# disk without pip and setuptools (which every environment has).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for spec in "device:." "full:.[all]"; do
  name="${spec%%:*}"; target="${spec#*:}"
  python3 -m venv "$work/$name"
  "$work/$name/bin/python" -m pip install -q --disable-pip-version-check -c requirements/test.lock "$target" >/dev/null
  site="$("$work/$name/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  size="$(du -sm --exclude='pip' --exclude='pip-*' --exclude='setuptools' --exclude='setuptools-*' \
          --exclude='_distutils_hack' --exclude='distutils-precedence.pth' "$site" | cut -f1)"
  packages="$("$work/$name/bin/python" -m pip list --format=freeze --exclude pip --exclude setuptools | tr '\n' ' ')"
  echo "$name install: $size MB in $(echo "$packages" | wc -w) packages: $packages"
done
