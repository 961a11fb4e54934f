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
if [ "$#" -gt 0 ]; then
  exec python -m pytest "$@"  # a selection of one's own runs as given
fi
# The whole suite as two pytest processes side by side, about equal halves: the torch.distributed
# tests (each a torchrun of CPU ranks) and everything else, each in its usual order. The second's
# output follows the first's; either failing fails the run.
distributed_log=$(mktemp)
trap 'rm -f "$distributed_log"' EXIT
python -m pytest -m distributed >"$distributed_log" 2>&1 &
distributed_pid=$!
rest=0
python -m pytest -m "not distributed" || rest=$?
distributed=0
wait "$distributed_pid" || distributed=$?
echo "==================== the torch.distributed tests (pytest -m distributed) ===================="
cat "$distributed_log"
echo "tests: exit $rest (pytest -m 'not distributed'), exit $distributed (pytest -m distributed)"
[ "$rest" -eq 0 ] && [ "$distributed" -eq 0 ]
