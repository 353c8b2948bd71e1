#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to generated text: installs what is missing, builds, and runs
# `tandem run` on the default model ($TANDEM_MODEL, else ../shared/models/stories260K.gguf).
# Arguments are passed to `tandem run` (default: a short story prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
if [ $# -eq 0 ]; then
  set -- -p "Once upon a time" -n 64
fi
exec ./build/tandem run "$@"
