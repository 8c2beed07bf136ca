#!/usr/bin/env bash
# Build the Kiln web UI into frontend/dist/ (Django serves it at "/").
#
# Usage: frontend/build.sh [--force]     (run from anywhere)
#
# Steps, each skipped when it has nothing to do so that a second run takes well under a second:
#   1. frontend/.nodeenv: a nodeenv that reuses the system node when it is >= 18.
#      When there is no usable system node, create it with a prebuilt download instead:
#          .venv/bin/python -m nodeenv --prebuilt --node=20.19.0 frontend/.nodeenv
#      (set KILN_NODEENV_ARGS="--prebuilt --node=20.19.0" to make this script do that).
#   2. npm ci from package-lock.json (npm install when there is no lock file yet);
#      skipped when node_modules is newer than package-lock.json.
#   3. npm run build (type check + vite build); skipped when dist/index.html is newer than
#      every source file, unless --force.
set -euo pipefail

FRONTEND_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$FRONTEND_DIR")"
NODEENV_DIR="$FRONTEND_DIR/.nodeenv"
PYTHON="${KILN_PYTHON:-$REPO_DIR/.venv/bin/python}"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[frontend] %s\n' "$*"; }

system_node_major() {
  command -v node >/dev/null 2>&1 || { echo 0; return; }
  node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
}

# 1. nodeenv
if [[ ! -f "$NODEENV_DIR/bin/activate" ]]; then
  if [[ -n "${KILN_NODEENV_ARGS:-}" ]]; then
    # shellcheck disable=SC2086  # the variable holds several arguments on purpose
    "$PYTHON" -m nodeenv $KILN_NODEENV_ARGS "$NODEENV_DIR"
  elif (( $(system_node_major) >= 18 )); then
    log "creating $NODEENV_DIR on the system node $(node --version)"
    "$PYTHON" -m nodeenv --node=system "$NODEENV_DIR"
  else
    echo "frontend/build.sh: no system node >= 18 found." >&2
    echo "  Install Node 20, or run with KILN_NODEENV_ARGS=\"--prebuilt --node=20.19.0\"." >&2
    exit 1
  fi
fi
# The activate script reads unset variables, which `set -u` would reject.
set +u
# shellcheck disable=SC1091
source "$NODEENV_DIR/bin/activate"
set -u

cd "$FRONTEND_DIR"

# 2. dependencies
if [[ ! -f package-lock.json ]]; then
  log "no package-lock.json: npm install"
  npm install --no-audit --no-fund
  touch node_modules
elif [[ ! -d node_modules || package-lock.json -nt node_modules ]]; then
  log "npm ci"
  npm ci --no-audit --no-fund
  # npm ci does not always bump the directory's mtime; the skip test above relies on it.
  touch node_modules
else
  log "node_modules is up to date"
fi

# 3. build
needs_build() {
  (( FORCE )) && return 0
  [[ -f dist/index.html ]] || return 0
  [[ -n "$(find src index.html vite.config.ts tsconfig.json package.json package-lock.json \
            -newer dist/index.html -print -quit 2>/dev/null)" ]]
}
if needs_build; then
  log "npm run build"
  npm run build
else
  log "dist/ is up to date"
fi
