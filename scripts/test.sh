#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (ctest). Needs ../shared beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
if [ ! -d ../shared ]; then
  echo "error: the test data folder ../shared (models, goldens, vocabularies) is missing beside this checkout" >&2
  exit 1
fi
cd build
ctest --output-on-failure -j 2 "$@"
