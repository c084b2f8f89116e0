#!/usr/bin/env bash
# Build what a bare CUDA machine needs for `benchmarks/run_gpu.sh` (issue 41, item 5): the wheels
# of the lock's pins that such an image lacks, and the Fashion-MNIST IDX files, in one folder
# kept under 64 MB with the checkout (a device session carries at most 64 MiB).
#   bash benchmarks/build_gpu_bundle.sh [OUT_DIR] [IDX_DIR]
#     OUT_DIR  default results/gpu_bundle (git-ignored: carry it to the machine beside the checkout)
#     IDX_DIR  default /usr/share/datasets/fashion-mnist (the four *-ubyte.gz files)
# The machine is assumed to have CPython 3.12, torch, timm, pyarrow, scikit-learn and pyyaml; it
# lacks snakemake, duckdb and opacus and has no network. Wheels are downloaded here with pip
# (`--no-deps --only-binary=:all:` for CPython 3.12, manylinux x86_64) at the versions
# requirements.lock pins; connection-pool has no wheel and is built from its sdist. pulp (16 MB,
# Snakemake's ILP scheduler) is left out: run_gpu.sh runs `--scheduler greedy`.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$repo/results/gpu_bundle}"
idx="${2:-/usr/share/datasets/fashion-mnist}"
pip=(python3 -m pip)
[ -x "$repo/.venv/bin/python" ] && pip=("$repo/.venv/bin/python" -m pip)
PKGS=(snakemake snakemake-interface-common snakemake-interface-executor-plugins snakemake-interface-logger-plugins
      snakemake-interface-report-plugins snakemake-interface-scheduler-plugins snakemake-interface-storage-plugins
      argparse-dataclass conda-inject configargparse dpath docutils gitpython gitdb smmap humanfriendly immutables
      jsonschema jsonschema-specifications referencing rpds-py nbformat fastjsonschema jupyter-core traitlets
      platformdirs smart-open tenacity throttler yte sqlmodel sqlalchemy greenlet pydantic pydantic-core
      annotated-types typing-inspection typing-extensions duckdb opacus tzdata)

pin() {  # name==version as requirements.lock pins it
  local v
  v="$(grep -i -m1 -E "^$1==" "$repo/requirements.lock" | sed -E 's/ .*//')"
  [ -n "$v" ] || { echo "build_gpu_bundle: $1 is not pinned in requirements.lock" >&2; exit 1; }
  echo "$v"
}

mkdir -p "$out/wheels" "$out/data"
pins=()
for p in "${PKGS[@]}"; do pins+=("$(pin "$p")"); done
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$out/wheels" "${pins[@]}"
"${pip[@]}" wheel --no-deps -w "$out/wheels" "$(pin connection-pool)"

for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$idx/$f.gz" ] || { echo "build_gpu_bundle: $idx/$f.gz is missing" >&2; exit 1; }
  gzip -dc "$idx/$f.gz" | xz -9e > "$out/data/$f.xz"   # 26 MB as xz against 30 MB as gzip
done

size_mb=$(( ($(du -sb "$out" | cut -f1) + $(cd "$repo" && git ls-files -z | xargs -0 cat 2>/dev/null | wc -c)) >> 20 ))
echo "bundle: $out ($(du -sh "$out" | cut -f1)); with the checkout about $size_mb MB (limit 64)"
[ "$size_mb" -lt 64 ] || { echo "build_gpu_bundle: over 64 MB" >&2; exit 1; }
