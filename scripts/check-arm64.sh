#!/usr/bin/env bash
# Cross-builds Tandem for 64-bit ARM Linux (warnings are errors, as natively) and runs the kernel tests that
# need no thread pool under qemu-user with a CPU that has the dot-product extension, so the NEON kernels are
# checked against the scalar reference. Installs Debian's cross compiler, qemu-user and the arm64 -dev
# packages (multiarch) when missing; needs root (or sudo) only then. Build folder: build-arm64.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libpcre2-dev:arm64 libcpp-httplib-dev:arm64
  libgtest-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "error: missing packages (${missing[*]}) and not root; install them with apt-get as root" >&2
      exit 1
    }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTANDEM_BENCH=OFF \
  >/dev/null
ninja -C build-arm64

# Tests that start no threads: qemu-user cannot be relied on to run threads on every host (seen: a new
# thread never starting).
single_threaded='Kernels.UnpackAndActivationQuantizationAreBitIdenticalOnEveryTarget'
single_threaded+=':Kernels.CodesSitAtTheirDocumentedPositions:Kernels.KQuantUnpackIsBitIdenticalOnRandomBlocks'
single_threaded+=':Kernels.DotRowsMatchScalarAndDoNotDependOnTheWindow'
single_threaded+=':Kernels.ActivationQuantizationEdgeCasesAreBitIdenticalOnEveryTarget'
single_threaded+=':Kernels.AttentionPrimitivesMatchScalarOnEveryHighwayTarget'
single_threaded+=':Kernels.GroupedAttentionPrimitivesEqualSeparateCalls:Kernels.SiluMulMatchesTheScalarFormula'
single_threaded+=':Kernels.SoftmaxMatchesTheFormulaOnEveryHighwayTarget'
qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max)
targets=$("${qemu[@]}" build-arm64/tests/test_kernels --gtest_filter='-*' --gtest_list_tests >/dev/null && echo ok)
[ "$targets" = ok ] || { echo "error: qemu-aarch64 cannot run the arm64 test binary" >&2; exit 1; }
timeout 600 "${qemu[@]}" build-arm64/tests/test_kernels --gtest_filter="$single_threaded"
