#!/usr/bin/env bash
# The dashboard's browser test: Selenium (PyPI, pinned in requirements.txt) drives Debian's
# headless Chromium (apt-get install chromium chromium-driver) against nodes the caller started.
# Creates or reuses tests/browser/.venv, installs the pinned requirements, then
#   run.sh --script dashboard.py OPEN_URL JWT_URL TOKEN EXPECT_JSON SHOTS_DIR FULL_URL
# (tests/blackbox/dashboard.rs starts the nodes and calls it). The whole run is bounded
# (QUEEN_BROWSER_LIMIT seconds, 110 by default; exit 124 when it overran).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

# shellcheck source=../venv.sh
. "$here/../venv.sh"
ensure_venv "$here"

# `run.sh --install` only makes the venv (CI does it once, outside the test's time bound).
if [ "${1:-}" = "--install" ]; then
  exit 0
fi
if [ "${1:-}" != "--script" ] || [ $# -lt 2 ]; then
  echo "usage: $0 --script dashboard.py ARGS..." >&2
  exit 2
fi
shift
script="$1"
shift
exec timeout --kill-after=10 "${QUEEN_BROWSER_LIMIT:-110}" "$venv/bin/python" "$here/$script" "$@"
