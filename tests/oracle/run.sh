#!/usr/bin/env bash
# Token counts of the module against each vendor's own tokenizer (PyPI
# packages, pinned in requirements.txt), in a venv of their own in target/.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=target/oracle-venv
if [ ! -x "$VENV/bin/pytest" ] || ! cmp -s tests/oracle/requirements.txt "$VENV/.requirements"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r tests/oracle/requirements.txt
  cp tests/oracle/requirements.txt "$VENV/.requirements"
fi
exec "$VENV/bin/pytest" -q -s tests/oracle "$@"
