#!/usr/bin/env bash
# Runs the cluster tests: three `tandem serve` replicas behind HAProxy (scripts/serve-cluster.sh), driven by
# node's test runner with its own fetch (no packages). Usage: run.sh TANDEM_BINARY SHARED_DIR. Exits 77
# (skipped, with a message) when HAProxy is not installed; fails when anything else is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
shared="${2:?usage: run.sh TANDEM_BINARY SHARED_DIR}"
fail() {
  echo "cluster tests: $*" >&2
  exit 1
}
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  echo "cluster tests: SKIPPED: haproxy is not installed (scripts/install-deps.sh installs it where it can)" >&2
  exit 77
fi
command -v node >/dev/null 2>&1 || fail "node is not installed (run scripts/install-deps.sh)"
[ -x "$bin" ] || fail "the tandem binary '$bin' is missing: build it first"
[ -f "$shared/models/stories260K.gguf" ] || fail "test model missing: $shared/models/stories260K.gguf"
bin="$(realpath "$bin")"
shared="$(realpath "$shared")"
cd "$here"
TANDEM_BIN="$bin" TANDEM_SHARED="$shared" exec node --test --test-concurrency=1 ./*.test.mjs
