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
  clang-format        # the formatting check in .ci/run
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The server's end-to-end tests drive it with the openai npm client. Judged by the commands, since Node.js
# may come from another package source that already bundles npm.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The chat page's browser test drives Debian's Chromium headless. Optional: where it cannot be installed (no
# package for this architecture, no root) that test skips with a message and nothing else needs it.
optional=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || optional+=(chromium)
# HAProxy for scripts/serve-cluster.sh and its test, optional in the same way: that test skips without it.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || optional+=(haproxy)
# NumPy for the independent reference of the hybrid (attention + Mamba) model's test, optional likewise.
dpkg-query -W -f='${Status}' python3-numpy 2>/dev/null | grep -q "install ok installed" || optional+=(python3-numpy)
if [ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  elif [ ${#missing[@]} -ne 0 ]; then
    echo "error: missing packages (${missing[*]}) and not root; install them with apt-get as root" >&2
    exit 1
  else
    echo "note: ${optional[*]} not installed and this is not root: the browser and cluster tests may skip" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -ne 0 ]; then
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
elif ! $sudo apt-get update -qq; then
  echo "note: apt-get update failed; ${optional[*]} not installed: the browser and cluster tests may skip" >&2
  exit 0
fi
# One at a time, so that a package missing for this architecture does not keep the other out.
for p in "${optional[@]}"; do
  echo "installing (optional): $p" >&2
  $sudo apt-get install -y -qq --no-install-recommends "$p" ||
    echo "note: $p could not be installed: the test that needs it will skip" >&2
done
