"""AdamW's three torch paths in the default study's training loops: single-tensor, foreach, fused.

Each loop (full fine-tuning of the study's ViT, TAFT-1 and TAFT-4 from cached prefix features) is
built three times from the same weights, one per optimizer path; one thread; the epochs (527
images, batch 32) of the three are interleaved in one process, so the machine's drifting speed
reaches all three alike. `pipeline_src/optim/adamw.py` builds the fused one, as every loop of the
package now does. Rows go to <out-dir>/optimizer.parquet (`store/benchmark_rows.py`), CPU ms per
epoch, one row per (loop, path).

    python benchmarks/bench_optimizer.py --epochs 8
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

PATHS = {"single": {"foreach": False}, "foreach": {"foreach": True}}  # fused: pipeline_src.optim.adamw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="timed epochs per (loop, path)")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    from default_study_model import default_vit_and_data, interleaved_epoch_ms

    from pipeline_src.optim.adamw import adamw
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows
    from pipeline_src.taft import TangentViT
    from pipeline_src.taft.losses import get_loss
    from pipeline_src.taft.train import tangent_step

    torch.set_num_threads(1)
    vit, x, y = default_vit_and_data()  # config.yaml's backbone.arch
    rsl = get_loss("rsl", None, None)

    def optimizer(params, path):
        return adamw(params, lr=1e-3, weight_decay=0.0) if path == "fused" else \
            torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, **PATHS[path])

    def full_loop(path):
        model = copy.deepcopy(vit).train()
        opt = optimizer(list(model.parameters()), path)

        def step(idx):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    def taft_loop(k):
        def build(path):
            model = TangentViT(copy.deepcopy(vit), k).eval()
            with torch.no_grad():
                h = model.prefix(x)
            opt = optimizer(model.delta_parameters(), path)
            return lambda idx: tangent_step(model, opt, h[idx], y[idx], rsl)
        return build

    rows = []
    for loop, build in {"full": full_loop, "taft-1": taft_loop(1), "taft-4": taft_loop(4)}.items():
        steps = {path: build(path) for path in (*PATHS, "fused")}
        times = interleaved_epoch_ms(steps, len(y), args.epochs)
        for path, ms in times.items():
            median = sorted(ms)[len(ms) // 2]
            print(f"{loop:7s} {path:8s} CPU per epoch: median {median:7.1f} ms, min {min(ms):7.1f} ms")
            rows.append(benchmark_row("optimizer", f"{loop}/{path}", "cpu",
                                      {"images": len(y), "batch": 32, "threads": 1, "dtype": "float32"}, ms, None,
                                      not_measured="the three paths share one process"))
    print(write_benchmark_rows("optimizer", rows, args.out_dir))


if __name__ == "__main__":
    main()
