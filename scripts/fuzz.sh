#!/usr/bin/env bash
# Builds the GGUF fuzz target with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, then fuzzes it
# for SECONDS (default 600): every input goes through the reader, and every input that parses through model
# loading and tokenizer construction too. Exits non-zero when the fuzzer finds a crash, leak, timeout or
# out-of-memory input; that input is saved under the build folder's artifacts/ for replay
# (build-fuzz/fuzz_gguf ARTIFACT). Independent of the CMake build: it compiles the sources it needs itself.
#
# Needs clang++ with libFuzzer and the PCRE2 development files (the tokenizer's pre-tokenizers use it); on
# Debian 12: apt-get install clang libclang-rt-14-dev libpcre2-dev
# Environment: TANDEM_FUZZ_DIR (build folder, default build-fuzz in the checkout), CXX_FUZZ (default clang++),
# TANDEM_FUZZ_MAX_LEN (largest input, default 65536).
set -euo pipefail

seconds=${1:-600}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${TANDEM_FUZZ_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++}
max_len=${TANDEM_FUZZ_MAX_LEN:-65536}
install_hint="install clang++ with libFuzzer (Debian 12: apt-get install clang libclang-rt-14-dev)"

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz.sh: error: '$cxx' not found; $install_hint" >&2
  exit 1
fi
mkdir -p "$out"

flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer "-fsanitize=address,undefined" -fno-sanitize-recover=all
       -Wall -Wextra -Wpedantic -Werror -I "$root/src")
reader_sources=("$root/src/tandem/gguf/reader.cpp" "$root/src/tandem/gguf/mapped_file.cpp"
                "$root/src/tandem/tensor/dtype.cpp" "$root/src/tandem/util/utf8.cpp"
                "$root/src/tandem/util/error.cpp" "$root/src/tandem/util/zeroed_memory.cpp")
# Model loading without the kernels (bind_model checks and binds; repacking is Model::from_file's) and every
# tokenizer source.
loader_sources=("$root/src/tandem/model/load.cpp" "$root/src/tandem/model/registry.cpp"
                "$root"/src/tandem/model/arch_*.cpp "$root"/src/tandem/model/*_bind.cpp
                "$root"/src/tandem/tokenizer/*.cpp)
writer_sources=("$root/src/tandem/gguf/writer.cpp" "${reader_sources[@]}")
pcre_flags=$(pkg-config --cflags libpcre2-8 2>/dev/null || true)
pcre_libs=$(pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)

# Rebuilds when a source, header, this script or the dictionary is newer than the binaries.
stale() {
  [ -x "$1" ] || return 0
  [ -n "$(find "$root/fuzz" "$root/src/tandem/gguf" "$root/src/tandem/tensor" "$root/src/tandem/util" \
    "$root/src/tandem/model" "$root/src/tandem/tokenizer" "$root/scripts/fuzz.sh" -newer "$1" -print -quit)" ]
}

fuzzer="$out/fuzz_gguf"
seeder="$out/gguf_seeds"
if stale "$fuzzer" || stale "$seeder"; then
  probe="$out/probe.cpp"
  printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
    'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe"
  if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >"$out/probe.log" 2>&1; then
    cat "$out/probe.log" >&2
    echo "fuzz.sh: error: '$cxx' cannot link with -fsanitize=fuzzer; $install_hint" >&2
    exit 1
  fi
  echo "fuzz.sh: building $fuzzer" >&2
  # shellcheck disable=SC2086 # pkg-config output is a list of flags
  "$cxx" "${flags[@]}" $pcre_flags -fsanitize=fuzzer "$root/fuzz/fuzz_gguf.cpp" "${reader_sources[@]}" \
    "${loader_sources[@]}" $pcre_libs -o "$fuzzer.new" &
  build_fuzzer=$!
  "$cxx" "${flags[@]}" "$root/fuzz/gguf_seeds.cpp" "${writer_sources[@]}" -o "$seeder.new"
  wait "$build_fuzzer"
  mv "$fuzzer.new" "$fuzzer"
  mv "$seeder.new" "$seeder"
fi

# Seeds: small writer-made files, plus the first max_len bytes of each shared test model (its header and
# metadata, the part the reader parses). The corpus folder keeps what earlier runs found.
seeds="$out/seeds"
rm -rf "$seeds"
mkdir -p "$seeds" "$out/corpus" "$out/artifacts"
"$seeder" "$seeds"
shopt -s nullglob
for model in "$root"/../shared/models/*.gguf "$root"/../shared/models/*/*.gguf; do
  head -c "$max_len" "$model" >"$seeds/head-$(basename "$model")"
done

echo "fuzz.sh: fuzzing for ${seconds}s (max_len $max_len)" >&2
status=0
"$fuzzer" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
  -dict="$root/fuzz/gguf.dict" -artifact_prefix="$out/artifacts/" -print_final_stats=1 \
  "$out/corpus" "$seeds" || status=$?
if [ "$status" -ne 0 ]; then
  echo "fuzz.sh: the fuzzer failed (exit $status); the failing input is in $out/artifacts/" >&2
fi
exit "$status"
