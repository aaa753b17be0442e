#!/usr/bin/env bash
# Installs tenure into .venv and runs `tenure demo` on the embedded SQLite store.
# Usage: bash scripts/demo.sh [--instances N] [--seconds S] [--url URL]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/tenure demo "$@"
