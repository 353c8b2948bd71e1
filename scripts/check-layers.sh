#!/usr/bin/env bash
# Checks that the layers of src/tandem point one way (docs/architecture.md, "Layers"): a folder includes only
# itself and the folders before it in LAYERS below. Prints every upward include (file, line, both layers) and
# exits 1 when there is one, or when a folder is not in LAYERS (add it where it belongs).
#
#   scripts/check-layers.sh [SOURCE_ROOT]   (default: src/tandem)
#   scripts/check-layers.sh --self-test     (checks that an upward include in a scratch tree is caught)
set -euo pipefail

LAYERS=(util tensor kernels gguf tokenizer sampling cache model train speculative engine server cli)

check() {
  local root=$1 status=0 dir layer file line text dep
  declare -A rank=()
  for i in "${!LAYERS[@]}"; do rank[${LAYERS[$i]}]=$i; done
  for dir in "$root"/*/; do
    layer=$(basename "$dir")
    if [[ -z "${rank[$layer]+set}" ]]; then
      echo "$dir: the folder '$layer' is not a known layer; add it to LAYERS in scripts/check-layers.sh"
      status=1
      continue
    fi
    while IFS=: read -r file line text; do
      dep=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"tandem\/([A-Za-z0-9_]+)\/.*/\1/' <<<"$text")
      if [[ -z "${rank[$dep]+set}" ]]; then
        echo "$file:$line: includes the unknown layer '$dep'"
        status=1
      elif ((rank[$dep] > rank[$layer])); then
        echo "$file:$line: $layer includes $dep, a layer above it ($text)"
        status=1
      fi
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"tandem/' "$dir" || true)
  done
  return $status
}

if [[ ${1:-} == --self-test ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/cache" "$scratch/model"
  printf '#include "tandem/cache/kv_cache.h"\n' >"$scratch/model/ok.h"
  check "$scratch" >/dev/null || { echo "self-test: a downward include was refused"; exit 1; }
  printf '#include "tandem/model/config.h"\n' >"$scratch/cache/up.h"
  if check "$scratch" >/dev/null; then
    echo "self-test: the upward include cache -> model passed"
    exit 1
  fi
  echo "self-test passed"
  exit 0
fi

root=${1:-"$(dirname "$0")/../src/tandem"}
[[ -d $root ]] || { echo "no source folder at $root"; exit 1; }
if check "$root"; then
  echo "layers point one way: ${LAYERS[*]}"
else
  echo "upward includes found: a layer may include only the layers before it in: ${LAYERS[*]}"
  exit 1
fi
