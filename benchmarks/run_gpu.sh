#!/usr/bin/env bash
# Run the GPU benchmarks (ViT-B/16, batch 32) on a CUDA machine and collect their Parquet rows.
#   bash benchmarks/run_gpu.sh [OUT_DIR]      (default results/benchmarks)
# Each script writes <name>.parquet and prints its ratio table; see docs/performance.md, "Benchmarks".
set -uo pipefail
out="${1:-results/benchmarks}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for bench in bench_taft bench_last bench_dp bench_matching; do
  echo "=== $bench"
  timeout "${BENCH_TIMEOUT:-240}" python3 "benchmarks/$bench.py" --vit-b --device cuda --out-dir "$out" \
    || echo "!!! $bench exited with $?"
done
