#!/usr/bin/env bash
# Runs the chat page's browser tests: node's test runner starts `tandem serve` and drives the page at `/` in
# headless Chromium through playwright-core. Usage: run.sh TANDEM_BINARY SHARED_DIR. Builds nothing; installs
# the pinned npm package (npm ci) when it is missing.
# Skips (exit 77) with a message where no Chromium is installed (scripts/install-deps.sh installs Debian's
# `chromium` where it can; TANDEM_CHROMIUM=PATH names another build). Fails when anything else is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
shared="${2:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
fail() {
  echo "browser tests: $*" >&2
  exit 1
}
browser="${TANDEM_CHROMIUM:-}"
if [ -z "$browser" ]; then
  for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
      browser="$(command -v "$name")"
      break
    fi
  done
fi
if [ -z "$browser" ]; then
  echo "browser tests skipped: no Chromium found (apt-get install chromium, or set TANDEM_CHROMIUM=PATH)" >&2
  exit 77
fi
[ -x "$browser" ] || fail "TANDEM_CHROMIUM='$browser' is not an executable"
command -v node >/dev/null 2>&1 || fail "node is not installed (run scripts/install-deps.sh, or apt-get install nodejs npm)"
[ -x "$bin" ] || fail "the tandem binary '$bin' is missing: build it first"
[ -f "$shared/models/stories260K.gguf" ] || fail "test model missing: $shared/models/stories260K.gguf"
if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  command -v npm >/dev/null 2>&1 || fail "npm is not installed and tests/browser/node_modules is missing (apt-get install npm)"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) ||
    fail "npm ci failed: the playwright-core package pinned in tests/browser/package-lock.json could not be installed"
fi
cd "$here"
TANDEM_BIN="$bin" TANDEM_SHARED="$shared" TANDEM_CHROMIUM="$browser" exec node --test --test-concurrency=1 ./*.test.mjs
