#!/usr/bin/env bash
# Runs the model-level suites again under every x86-64 kernel target below the best one that this CPU runs
# (TANDEM_KERNELS): what a CPU of that kind picks at load time (repacked weight forms, activation forms) and
# then computes, which the per-target kernel tests alone do not cover. Targets the CPU cannot run are
# skipped; on other architectures nothing runs.
#
#   tests/under_targets.sh TANDEM_BINARY TEST_DIR
set -euo pipefail
tandem=$1
dir=$2
ran=0
for target in avx2 avx2-vnni avx512-vnni avx512-vnni-vbmi; do
  TANDEM_KERNELS=$target "$tandem" --help >/dev/null 2>&1 || continue
  for suite in test_golden test_repack test_graph test_batch_invariance; do
    echo "== $suite under TANDEM_KERNELS=$target"
    TANDEM_KERNELS=$target "$dir/$suite" --gtest_brief=1
  done
  ran=$((ran + 1))
done
echo "under_targets: $ran target(s) run"
