#!/usr/bin/env bash
# Installs the project with every extra into .venv and runs lint, import borders and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dashboard's browser tests drive Debian's Chromium (never a downloaded one); they skip if it cannot be had.
command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; } || echo "no chromium: browser tests will skip"
# The generated launch scripts are linted with Debian's ShellCheck (tests/executor/launch_lint.py).
command -v shellcheck >/dev/null || { apt-get update -q && apt-get install -y -q shellcheck; } \
  || echo "NO SHELLCHECK: the launch-script lint tests will SKIP (apt-get install shellcheck)"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch==2.13.0 is pinned in the `executor` extra so pip takes the local CPU build, not CUDA wheels.
python -m pip install -q -e '.[executor,dev]'
ruff check .
lint-imports
python -m pytest "$@"
