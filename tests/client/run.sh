#!/usr/bin/env bash
# The official-client suite: queen-mq (PyPI, installed unchanged) against a real queen node.
# Creates or reuses tests/client/.venv, installs the pinned requirements, runs pytest.
# The queen binary comes from QUEEN_BIN (default: <repo>/target/debug/queen; build it with
# `cargo build -p queen`). Exit code = pytest's (124 if the whole run overran its bound).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

# shellcheck source=../venv.sh
. "$here/../venv.sh"
ensure_venv "$here"

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
