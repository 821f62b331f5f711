#!/usr/bin/env bash
# Token counts of the module against each vendor's own tokenizer (PyPI
# packages, pinned in requirements.txt), in a venv of their own:
# target/oracle-venv (python3 -m venv; python3-venv installed with apt-get
# when that fails and we are root).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=target/oracle-venv
if [ ! -x "$VENV/bin/pytest" ] || ! cmp -s tests/oracle/requirements.txt "$VENV/.requirements"; then
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"
      python3 -m venv "$VENV"
    else
      echo "tests/oracle/run.sh: please install python3-venv" >&2
      exit 1
    fi
  fi
  "$VENV/bin/pip" install -q -r tests/oracle/requirements.txt
  cp tests/oracle/requirements.txt "$VENV/.requirements"
fi
exec "$VENV/bin/pytest" -q -s tests/oracle "$@"
