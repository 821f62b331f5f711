#!/usr/bin/env bash
# Token counts of the module against each vendor's own tokenizer (PyPI
# packages, pinned in requirements.txt), in a venv of their own:
# target/oracle-venv (python3 -m venv; python3-venv installed with apt-get
# when that fails and we are root). test_tool_call_templates.py checks the
# tool calls of META against the vendors' chat templates and renderers; its
# gpt-oss case reads o200k_base.tiktoken from $TIKTOKEN_ENCODINGS_BASE or the
# tiktoken-rs crate in the cargo registry (skipped when neither has it).
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
