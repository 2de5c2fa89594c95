# Sourced by tests/client/run.sh and tests/browser/run.sh: `ensure_venv DIR` creates or reuses
# DIR/.venv (with $PYTHON, python3 by default) and installs DIR/requirements.txt into it when the
# file changed since the last install (its sha256 is kept in the venv). Sets `venv`.
ensure_venv() {
  local dir="$1"
  local python="${PYTHON:-python3}"
  venv="$dir/.venv"
  local stamp="$venv/.requirements.sha256"
  local want
  want="$(sha256sum "$dir/requirements.txt" | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --timeout 60 --retries 3 -r "$dir/requirements.txt"
    echo "$want" > "$stamp"
  fi
}
