#!/usr/bin/env bash
# Installs tenure into .venv (Python 3.11+; no root needed) and runs
# `tenure demo` on the embedded SQLite store.
# Usage: bash scripts/demo.sh [--instances N] [--seconds S] [--url URL]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh -e .
exec .venv/bin/tenure demo "$@"
