#!/usr/bin/env bash
# Creates or reuses the Python venv of the lake tests (moto S3 server, DuckDB + httpfs, pyarrow,
# boto3, zstandard) and prints the path of its python on stdout (everything else goes to stderr).
#
#   venv: ${QUEEN_LAKE_VENV:-<repo>/target/lake-venv}   (under target/: git ignores it,
#         `cargo clean` removes it)
#
# Idempotent: it (re)installs tests/lake/requirements.txt only when the requirements changed
# since the last install or an import check fails. A lock (flock on <venv>.lock) makes parallel
# callers (several test binaries at once) wait for one install instead of racing.
# On a fresh Debian machine without python3-venv it installs python3 + python3-venv with apt-get
# when run as root, like .ci/run does for the official-client suite.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${QUEEN_LAKE_VENV:-$root/target/lake-venv}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
imports='import moto, flask, flask_cors, boto3, duckdb, duckdb_extension_httpfs, pytz, pyarrow, pyarrow.dataset, pyarrow.parquet, pyarrow.fs, zstandard'

ready() {
  [ -x "$venv/bin/python" ] && [ -x "$venv/bin/moto_server" ] \
    && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ] \
    && "$venv/bin/python" -c "$imports" >/dev/null 2>&1
}

# Fast path without the lock: nothing to do.
if ready; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
if ! flock -w 1200 9; then
  echo "ensure-venv: could not take $venv.lock within 1200 s" >&2
  exit 1
fi

# Another caller may have finished the install while we waited for the lock.
if ready; then
  echo "$venv/bin/python"
  exit 0
fi

started=$(date +%s)
echo "ensure-venv: preparing $venv" >&2

# python3 with a working venv module (Debian ships ensurepip in python3-venv, a separate package).
probe="$(mktemp -d)"
if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -m venv "$probe/venv" >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "ensure-venv: installing python3 and python3-venv with apt-get" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
  fi
fi
rm -rf "$probe"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "ensure-venv: $python is missing and could not be installed" >&2
  exit 1
fi

# A venv left half made (no pip: created while python3-venv was missing) is made again.
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" >&2
fi
rm -f "$stamp"
timeout 900 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --timeout 60 --retries 3 -r "$req" >&2
if ! "$venv/bin/python" -c "$imports" >&2; then
  echo "ensure-venv: the venv at $venv still fails its import check after the install" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "ensure-venv: ready in $(( $(date +%s) - started )) s" >&2
echo "$venv/bin/python"
