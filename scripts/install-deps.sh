#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem needs to build and test, skipping those already present.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libhwy-dev          # Highway: portable SIMD with runtime dispatch
  nlohmann-json3-dev  # JSON for the CLI, tests and server
  libcli11-dev        # command-line parsing
  libpcre2-dev        # Unicode regexes for BPE pre-tokenizers
  libcpp-httplib-dev  # HTTP for tandem serve
  libgtest-dev        # unit tests
  libbenchmark-dev    # microbenchmarks
  clang libclang-rt-14-dev  # libFuzzer for the GGUF loader fuzz target
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The server's end-to-end tests drive it with the openai npm client. Judged by the commands, since Node.js
# may come from another package source that already bundles npm.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "error: missing packages (${missing[*]}) and not root; install them with apt-get as root" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
