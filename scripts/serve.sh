#!/usr/bin/env bash
# Installs the service (no torch) into .venv and starts it on http://127.0.0.1:8000 with embedded SQLite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# A regular install, not an editable one: the service only runs the code (scripts/test.sh installs
# editable for development). Editable installs of this flat layout print setuptools' import-path notice.
python -m pip install -q .
exec fsdp-planner serve --host 127.0.0.1 --port 8000 "$@"
