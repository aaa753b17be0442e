#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
# Usage: bash scripts/test.sh [pytest arguments]
#
# Needs: Python 3.11+ (PYTHON=... picks one), and root or sudo to install the
# Debian packages of the servers the tests start throwaway instances of (only
# those missing: redis-server redis-sentinel postgresql pgbouncer etcd-server
# etcd-client mariadb-server chromium chromium-driver, without their recommended
# packages).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-sentinel >/dev/null || missing+=(redis-sentinel)
# PostgreSQL's initdb/postgres live in /usr/lib/postgresql/N/bin, off PATH.
command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    || missing+=(postgresql)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
# The web page's end-to-end test drives Debian's headless Chromium.
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || {
            echo "the tests need these Debian packages: ${missing[*]}; run as root or install sudo" >&2
            exit 1
        }
        SUDO="sudo"
    fi
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

source scripts/venv.sh -e . --group test

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# The suite fails, rather than skips, a test whose browser or server is missing.
export TENURE_REQUIRE_ALL=1
exec .venv/bin/pytest "$@"
