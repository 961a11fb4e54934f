#!/usr/bin/env bash
# Installs the project with every extra into .venv and runs lint, import borders and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dashboard's browser tests drive Debian's Chromium (never a downloaded one); they skip if it cannot be had.
# The generated launch scripts are linted with Debian's ShellCheck (tests/executor/launch_lint.py).
# What is missing is installed in the background while pip installs the project (the two downloads overlap),
# after one apt-get update; each package on its own, so one that cannot be had leaves the other installed.
apt_packages=()
command -v chromium >/dev/null || apt_packages+=(chromium)
command -v shellcheck >/dev/null || apt_packages+=(shellcheck)
apt_log=$(mktemp)
trap 'rm -f "$apt_log"' EXIT
apt_pid=
if [ "${#apt_packages[@]}" -gt 0 ]; then
  { apt-get update -q && for package in "${apt_packages[@]}"; do apt-get install -y -q "$package"; done; } \
    >"$apt_log" 2>&1 &
  apt_pid=$!
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch==2.13.0 is pinned in the `executor` extra so pip takes the local CPU build, not CUDA wheels.
python -m pip install -q -e '.[executor,dev]'
ruff check .
lint-imports
if [ -n "$apt_pid" ]; then
  wait "$apt_pid" || true
  cat "$apt_log"
fi
rm -f "$apt_log"
command -v chromium >/dev/null || echo "no chromium: browser tests will skip"
command -v shellcheck >/dev/null || echo "NO SHELLCHECK: the launch-script lint tests will SKIP (apt-get install shellcheck)"
if [ "$#" -gt 0 ]; then
  exec python -m pytest "$@"  # a selection of one's own runs as given
fi
# The whole suite as two pytest processes side by side, about equal halves: the torch.distributed
# tests (each a torchrun of CPU ranks) then the planner's other tests, and everything else but those,
# each in its usual order. tests/planner (CPU-bound, about 3.5 min alone on 2 cores) runs after the
# distributed tests because that half used to end minutes before the other, leaving a core idle.
# The first half's output follows the second's; any failing fails the run. Each lists its slowest
# tests at its end (--durations), so a CI log says where the time went.
distributed_log=$(mktemp)
trap 'rm -f "$distributed_log"' EXIT
{
  distributed=0
  python -m pytest -m distributed --durations=25 || distributed=$?
  planner=0
  python -m pytest -m "not distributed" tests/planner --durations=10 || planner=$?
  echo "exit $distributed (pytest -m distributed), exit $planner (pytest -m 'not distributed' tests/planner)"
  [ "$distributed" -eq 0 ] && [ "$planner" -eq 0 ]
} >"$distributed_log" 2>&1 &
distributed_pid=$!
rest=0
python -m pytest -m "not distributed" --ignore=tests/planner --durations=25 || rest=$?
first_half=0
wait "$distributed_pid" || first_half=$?
echo "==== the torch.distributed tests, then tests/planner (pytest -m distributed; -m 'not distributed' tests/planner) ===="
cat "$distributed_log"
echo "tests: exit $rest (pytest -m 'not distributed' --ignore=tests/planner), exit $first_half (the half above)"
[ "$rest" -eq 0 ] && [ "$first_half" -eq 0 ]
