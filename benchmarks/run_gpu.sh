#!/usr/bin/env bash
# The one prepared GPU script (issue 41, item 5): on a CUDA machine, within --budget seconds
# (default 500, so that with the set-up it stays under 9 minutes), runs as real Snakemake studies
# (benchmarks/bench_gpu_study.py): the ViT-B/16 rules (gpu_vitb16.yaml), "Table 2 at scale"
# (gpu_table2_vitb16.yaml), the Fashion-MNIST far regime end to end, and the near regime (and the
# cross-regime report) if time remains; then writes OUT/gpu_study.parquet and OUT/gpu_study.md.
#   bash benchmarks/run_gpu.sh [--bundle DIR] [--out DIR] [--budget S] [--data DIR] [--micro] [--smoke]
#     --bundle DIR  what benchmarks/build_gpu_bundle.sh built (wheels/, data/): installed into
#                   DIR/site (no network, no index) and the IDX files re-gzipped into DIR/idx
#     --micro       also the kernel benchmarks (bench_taft, bench_last, bench_dp, bench_matching;
#                   ViT-B/16, batch 32) if time remains
#     --smoke       CPU, tiny sizes, no caps: checks this script (the test suite runs it)
# Each phase out of time is stopped with SIGKILL of Snakemake's process group: its jobs' orphan
# guards end them within 0.2 s and no output appears after (docs/reliability.md).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/results/benchmarks"; budget=500; bundle=""; data="/usr/share/datasets/fashion-mnist"; micro=0; smoke=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --micro) micro=1; shift ;;
    --smoke) smoke=1; shift ;;
    *) echo "run_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
py="${PYTHON:-python3}"
[ -x "$repo/.venv/bin/python" ] && [ -z "$bundle" ] && py="$repo/.venv/bin/python"
export PYTHONUNBUFFERED=1 PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$bundle" ]; then
  bundle="$(cd "$bundle" && pwd)"
  if [ ! -e "$bundle/site/.installed" ]; then
    if "$py" -m pip --version >/dev/null 2>&1; then
      "$py" -m pip install --quiet --no-index --no-deps --target "$bundle/site" "$bundle"/wheels/*.whl || exit 1
    else  # no pip: a wheel is a zip of its files (enough for these pure or self-contained packages)
      for w in "$bundle"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$bundle/site" || exit 1; done
    fi
    touch "$bundle/site/.installed"
  fi
  export PYTHONPATH="$bundle/site:$PYTHONPATH" PATH="$bundle/site/bin:$PATH"
  mkdir -p "$bundle/idx"
  for f in "$bundle"/data/*.xz; do
    name="$(basename "$f" .xz)"
    [ -s "$bundle/idx/$name.gz" ] || xz -dc "$f" | gzip -1 > "$bundle/idx/$name.gz"
  done
  data="$bundle/idx"
fi
"$py" -c "import snakemake, duckdb, torch, timm" || { echo "run_gpu.sh: missing packages (build a bundle: benchmarks/build_gpu_bundle.sh)" >&2; exit 1; }
mkdir -p "$out"
args=(--data "$data" --out-dir "$out" --workdir "$out/gpu_study" --part vitb --part table2 --part fashion --part near)
if [ "$smoke" = 1 ]; then
  args+=(--smoke --cores 2)
else
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  left=$(( budget - ($(date +%s) - start) ))
  # Caps keep one slow part from starving the rest; the near regime gets what is left.
  args+=(--budget "$left" --cores "$(nproc)" --mps --snakemake-args "--scheduler greedy"
         --cap vitb=90 --cap table2=170 --cap fashion=200)
fi
"$py" "$repo/benchmarks/bench_gpu_study.py" "${args[@]}"
code=$?
if [ "$micro" = 1 ] && [ "$smoke" = 0 ]; then
  for bench in bench_taft bench_last bench_dp bench_matching; do
    left=$(( budget - ($(date +%s) - start) ))
    [ "$left" -gt 30 ] || { echo "=== $bench: no time left"; continue; }
    echo "=== $bench"
    timeout "$(( left < 120 ? left : 120 ))" "$py" "$repo/benchmarks/$bench.py" --vit-b --device cuda --out-dir "$out" \
      || echo "!!! $bench exited with $?"
  done
fi
echo "run_gpu.sh: $(( $(date +%s) - start )) s; tables in $out/gpu_study.{parquet,md}"
exit $code
