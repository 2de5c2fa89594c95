#!/usr/bin/env bash
# The S3 sink's soak on three nodes (issue 6): moto as the S3 server, eight queues, a writer on
# every node, a kill -9 or SIGTERM of a queue owner every minute, then `queen lake verify` and
# DuckDB / pyarrow reading the lake back. Not part of CI; takes --minutes (default 10) plus a
# minute or two.
#
#   bench/soak.sh                          # 10 minutes
#   bench/soak.sh --minutes 2 --every-secs 30
#
# Flags go to queen-soak (tests/src/bin/queen-soak.rs); run it with --help-like bad flags to
# see them all.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p queen -p queen-tests --bin queen --bin queen-soak
bash tests/lake/ensure-venv.sh >/dev/null
target="${CARGO_TARGET_DIR:-target}"
exec "$target/release/queen-soak" --bin "$target/release/queen" "$@"
