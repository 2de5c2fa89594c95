#!/usr/bin/env bash
# The official-client suite: queen-mq (PyPI, installed unchanged) against a real queen node.
# Creates or reuses tests/client/.venv, installs the pinned requirements, runs pytest.
# The queen binary comes from QUEEN_BIN (default: <repo>/target/debug/queen; build it with
# `cargo build -p queen`). Exit code = pytest's (124 if the whole run overran its bound).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

python="${PYTHON:-python3}"
venv="$here/.venv"
stamp="$venv/.requirements.sha256"
want="$(sha256sum requirements.txt | cut -d' ' -f1)"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --timeout 60 --retries 3 -r requirements.txt
  echo "$want" > "$stamp"
fi

# `run.sh --script FILE ARGS...` runs one of this folder's scripts with the client installed
# (against nodes the caller started) instead of the suite.
if [ "${1:-}" = "--script" ]; then
  shift
  script="$1"
  shift
  exec timeout --kill-after=30 "${QUEEN_CLIENT_SUITE_LIMIT:-300}" "$venv/bin/python" "$here/$script" "$@"
fi

export QUEEN_BIN="${QUEEN_BIN:-$(cd "$here/../.." && pwd)/target/debug/queen}"
if [ ! -x "$QUEEN_BIN" ]; then
  echo "queen binary not found at $QUEEN_BIN: run \`cargo build -p queen\` first or set QUEEN_BIN" >&2
  exit 2
fi

# Each test bounds its own waits (asyncio.wait_for, bounded pops and consumes); this bounds
# the whole run on top of that.
set +e
timeout --kill-after=30 "${QUEEN_CLIENT_SUITE_LIMIT:-900}" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test_official_client.py
rc=$?
set -e
exit $rc
