#!/usr/bin/env bash
# Prints the README performance table (markdown, on stdout) from `tandem bench --json` runs, then one line
# saying where it was measured: the CPU, the kernel target, the threads and context, the build and the date.
#
#   scripts/perf-table.sh [-t THREADS] [-c CONTEXT] [MODEL.gguf ...]
#
# Without models it synthesizes TinyLlama-1.1B shapes in Q4_0, Q8_0 and Q4_K_M (random weights) into
# $PERF_DIR (default build/perf-models) and benchmarks those. The binary is $TANDEM (default build/tandem).
# Progress goes to stderr; expect a few minutes per model.
set -euo pipefail

threads=2
ctx=256
while getopts "t:c:" opt; do
  case $opt in
    t) threads=$OPTARG ;;
    c) ctx=$OPTARG ;;
    *) echo "usage: $0 [-t THREADS] [-c CONTEXT] [MODEL.gguf ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

root=$(cd "$(dirname "$0")/.." && pwd)
tandem=${TANDEM:-$root/build/tandem}
[[ -x $tandem ]] || { echo "no tandem binary at $tandem (build it, or set TANDEM)" >&2; exit 1; }

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  dir=${PERF_DIR:-$root/build/perf-models}
  mkdir -p "$dir"
  for type in Q4_0 Q8_0 Q4_K_M; do
    f=$dir/tinyllama-1.1b-$type.gguf
    [[ -f $f ]] || "$tandem" synth --preset tinyllama-1.1b --type "$type" -o "$f" -t "$threads" >&2
    models+=("$f")
  done
fi

echo "| model | type | threads | bandwidth GB/s | decode tok/s | roofline | roofline beside | prefill 64 tok/s | prefill 512 tok/s | verify cost n=2,4,8,16 | int8 peak GMAC/s | cost(8) floor | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
kernels=?
for m in "${models[@]}"; do
  echo "bench: $m" >&2
  json=$("$tandem" bench -m "$m" -t "$threads" -c "$ctx" --json | tail -n 1)
  name=$(basename "$m" .gguf)
  kernels=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["kernels"])' "$json")
  python3 - "$name" "$json" <<'PY'
import json, re, sys
name, j = sys.argv[1], json.loads(sys.argv[2])
m = re.search(r"(F32|F16|BF16|Q[2-8]_[01K](?:_[SM])?)$", name, re.I)
typ = m.group(1).upper() if m else "?"
v = j["verify_cost"]
cost = " / ".join(f"{v[k]:.2f}" for k in ("2", "4", "8", "16"))
print(f"| {name} | {typ} | {j['threads']} | {j['bandwidth_gbs']:.1f} | {j['decode_tps']:.1f} | "
      f"{j['roofline_fraction']:.2f} | {j['roofline_beside']:.2f} | {j['prefill64_tps']:.1f} | {j['prefill512_tps']:.1f} | {cost} | "
      f"{j['dot_peak_gmacs']:.0f} | {j['verify_cost_floor']['8']:.2f} | {j['peak_rss_mb']:.0f} |")
PY
done

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
build=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD -- src 2>/dev/null || build="$build with local changes"
echo
echo "Measured on ${cpu:-$(uname -m)}, kernels \`$kernels\`, $threads threads, context $ctx; build $build, $(date -u +%Y-%m-%d)."
