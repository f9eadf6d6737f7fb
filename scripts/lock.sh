#!/usr/bin/env bash
# Re-make requirements/test.lock: the exact versions scripts/test.sh installs.
# Run it after changing a dependency in pyproject.toml, or to move the lock to
# today's releases (then run scripts/test.sh and commit both together).
# Uses uv's pip-compatible resolver; the lock is a plain pip constraints file.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
uv pip compile pyproject.toml --extra test --python-version 3.11 \
  --no-header --annotation-style line --upgrade -o requirements/test.lock
