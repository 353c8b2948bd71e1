#!/usr/bin/env bash
# Runs the server's end-to-end tests: node's test runner drives `tandem serve` (started on free loopback
# ports) through the official openai client. Usage: run.sh TANDEM_BINARY SHARED_DIR. Builds nothing; installs
# the pinned npm packages (npm ci) when they are missing. Fails, never skips, when something is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
shared="${2:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
fail() {
  echo "server tests: $*" >&2
  exit 1
}
command -v node >/dev/null 2>&1 || fail "node is not installed (run scripts/install-deps.sh, or apt-get install nodejs npm)"
[ -x "$bin" ] || fail "the tandem binary '$bin' is missing: build it first"
[ -f "$shared/models/stories260K.gguf" ] || fail "test model missing: $shared/models/stories260K.gguf"
if [ ! -f "$here/node_modules/openai/package.json" ] || [ ! -f "$here/node_modules/ajv/package.json" ]; then
  command -v npm >/dev/null 2>&1 || fail "npm is not installed and tests/server/node_modules is missing (apt-get install npm)"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) ||
    fail "npm ci failed: the packages pinned in tests/server/package-lock.json could not be installed"
fi
cd "$here"
TANDEM_BIN="$bin" TANDEM_SHARED="$shared" exec node --test --test-concurrency=1 ./*.test.mjs
