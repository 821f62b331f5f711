#!/usr/bin/env bash
# Runs the tests of the redis-mem Python package (python/tests: clients,
# agent middleware, LangGraph nodes, summarizer service, migration, examples,
# reply streams and the SSE example in a headless Chromium)
# against real redis-server processes with the module, which the tests start
# and stop themselves on free loopback ports.
#
#   python/run_tests.sh [pytest args...]
#
# Runs ruff and mypy --strict on the package first (both from the test extra).
# Creates the venv target/venv (python3 -m venv; installs python3-venv with
# apt-get when that fails and we are root), installs the package from python/
# into it with its test extra (`pip install ./python[test]`, as a user would:
# not editable) whenever its sources changed, then runs pytest -q.
# Env: PYTHON (default python3), REDIS_MEM_VENV (default <repo>/target/venv),
# REDIS_MEM_MODULE (default <repo>/target/release/libredis_mem.so),
# REDIS_SERVER / REDIS_CLI (default: redis-server / redis-cli on PATH).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="${REDIS_MEM_VENV:-$REPO/target/venv}"
PY="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive

is_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
    if is_root && command -v apt-get >/dev/null 2>&1; then
        echo "run_tests.sh: apt-get install $*" >&2
        # Wait for a concurrent apt-get (make test builds servers beside us).
        apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
        RUNLEVEL=1 apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
    else
        echo "run_tests.sh: please install: $*" >&2
        return 1
    fi
}

if ! command -v "$PY" >/dev/null 2>&1; then
    apt_install python3
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    if ! "$PY" -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        # Debian ships venv/ensurepip separately (python3-venv).
        apt_install python3-venv
        "$PY" -m venv "$VENV"
    fi
fi

# Install the package (and its test extra) when its sources changed since
# the last install.
STAMP="$VENV/.redis-mem-package"
WANT="$(cd "$HERE" && find pyproject.toml README.md redis_mem -type f -not -path '*/__pycache__/*' -print0 \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "run_tests.sh: pip install $HERE[test] into $VENV" >&2
    rm -rf "$HERE/build" "$HERE"/*.egg-info
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$HERE[test]"
    rm -rf "$HERE/build" "$HERE"/*.egg-info
    printf '%s' "$WANT" > "$STAMP"
fi

if [ -z "${REDIS_SERVER:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
    apt_install redis-server
fi

# The SSE example's browser test (tests/test_sse_browser.py) drives Debian's
# headless Chromium through its chromedriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    apt_install chromium chromium-driver || echo "run_tests.sh: without them tests/test_sse_browser.py fails" >&2
fi

MODULE="${REDIS_MEM_MODULE:-$REPO/target/release/libredis_mem.so}"
if [ ! -f "$MODULE" ] && [ -z "${REDIS_MEM_MODULE:-}" ]; then
    echo "run_tests.sh: $MODULE missing, building it" >&2
    (cd "$REPO" && cargo build --release)
fi
export REDIS_MEM_MODULE="$MODULE"

# The package's own checks first: ruff, and mypy --strict (config in
# pyproject.toml), on the sources; then which redis-py the suite runs on.
"$VENV/bin/ruff" check --no-cache "$HERE/redis_mem"
(cd "$HERE" && "$VENV/bin/mypy" --cache-dir "$VENV/.mypy_cache")
"$VENV/bin/python" -c 'import redis, langchain_core; print(f"run_tests.sh: redis-py {redis.__version__}, langchain-core {langchain_core.__version__}")' >&2

# From tests/ so that `import redis_mem` is the installed package, not the
# source tree beside it.
cd "$HERE/tests"
export PYTHONDONTWRITEBYTECODE=1
exec "$VENV/bin/python" -m pytest -q -c "$HERE/pyproject.toml" --rootdir "$HERE" "$@"
