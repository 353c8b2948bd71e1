#!/usr/bin/env bash
# Cross-builds Tandem (the CLI and the kernel tests) for 64-bit ARM Linux, warnings as errors as natively, and
# runs the kernel tests that need no thread pool under qemu-user with a CPU that has the dot-product
# extension, so both NEON kernel sets (with and without sdot) are checked against the scalar reference. Installs Debian's cross compiler,
# qemu-user and the arm64 -dev packages (multiarch) when missing; needs root (or sudo) only then. Build folder:
# build-arm64.
#
#   scripts/check-arm64.sh [--skip-if-unavailable]
#
# --skip-if-unavailable: when the cross tools cannot be installed (no root, no arm64 package lists), say so and
# exit 0 instead of failing (the test script runs it this way); a build or test failure still fails.
set -euo pipefail
cd "$(dirname "$0")/.."

skip_if_unavailable=0
[ "${1:-}" = "--skip-if-unavailable" ] && skip_if_unavailable=1
unavailable() {
  echo "check-arm64: $1" >&2
  if [ $skip_if_unavailable -eq 1 ]; then
    echo "check-arm64: skipped (the 64-bit ARM cross build was not checked)" >&2
    exit 0
  fi
  exit 1
}
if [ "$(uname -m)" = aarch64 ]; then
  echo "check-arm64: this machine is 64-bit ARM; the native build and tests cover it" >&2
  exit 0
fi

packages=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libpcre2-dev:arm64 libcpp-httplib-dev:arm64
  libgtest-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "check-arm64: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 ||
      unavailable "missing packages (${missing[*]}) and not root; install them with apt-get as root"
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  added_arch=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $sudo dpkg --add-architecture arm64 || unavailable "could not add the arm64 architecture to dpkg"
    added_arch=1
  fi
  if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
    # Leave the machine's package setup as it was (a package source without arm64 lists would otherwise
    # fail every later apt-get update).
    [ $added_arch -eq 1 ] && $sudo dpkg --remove-architecture arm64 && $sudo apt-get update -qq || true
    unavailable "could not install ${missing[*]}"
  fi
fi

cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTANDEM_BENCH=OFF \
  >/dev/null
ninja -C build-arm64 tandem tests/test_kernels tests/test_attention_kernels

# Tests that start no threads: qemu-user cannot be relied on to run threads on every host (seen: a new
# thread never starting).
single_threaded='Kernels.UnpackAndActivationQuantizationAreBitIdenticalOnEveryTarget'
single_threaded+=':Kernels.CodesSitAtTheirDocumentedPositions:Kernels.KQuantUnpackIsBitIdenticalOnRandomBlocks'
single_threaded+=':Kernels.DotRowsMatchScalarAndDoNotDependOnTheWindow'
single_threaded+=':Kernels.ActivationQuantizationEdgeCasesAreBitIdenticalOnEveryTarget'
single_threaded+=':Kernels.AttentionPrimitivesMatchScalarOnEveryHighwayTarget'
single_threaded+=':Kernels.GroupedAttentionPrimitivesEqualSeparateCalls:Kernels.SiluMulMatchesTheScalarFormula'
single_threaded+=':Kernels.SoftmaxMatchesTheFormulaOnEveryHighwayTarget:Kernels.DotProbeSumsEqualTheReference'
single_threaded+=':Kernels.RmsNormMatchesTheFormula:Kernels.F32ToF16MatchesTheScalarConversionOnEveryHighwayTarget'
single_threaded+=':Kernels.DimMajorScoresMatchTheReferenceOnEveryHighwayTarget'
single_threaded+=':Kernels.FloatTilesKeepEachOutputsBitsOnEveryHighwayTarget'
single_threaded+=':Kernels.DirectKernelsAreBitIdenticalToUnpackAndDot:Kernels.QuantizedMatmulRowsKeepTheirBitsInEveryWindow'
qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max)
"${qemu[@]}" build-arm64/tests/test_kernels --gtest_list_tests >/dev/null ||
  unavailable "qemu-aarch64 cannot run the arm64 test binary"
for binary in test_kernels test_attention_kernels; do
  timeout 600 "${qemu[@]}" "build-arm64/tests/$binary" --gtest_filter="$single_threaded" --gtest_brief=1
done
echo "check-arm64: the 64-bit ARM build and its single-threaded kernel tests passed" >&2
