#!/usr/bin/env bash
# Installs the service (no torch) into .venv and starts it on http://127.0.0.1:8000 with embedded SQLite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e .
exec fsdp-planner serve --host 127.0.0.1 --port 8000 "$@"
