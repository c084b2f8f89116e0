"""Wall-time speedup of retrain-shard over the paragon for forgetting one sample.

SISA (Bourtoule et al., "Machine Unlearning", IEEE S&P 2021) forgets a sample by retraining
only its shard (1/N of the data); the paragon retrains on the whole training set minus the
sample. The TAFT paper (Liu, Soatto et al., ICLR 2024, Figure 3) reports up to 50x at N = 50.

On the default study's data (digits, target task, training split), with the default study's
method settings (config.yaml), from cached prefix features as the DAG trains: for each N, a
random one-sample request; retrain-shard = build + train the affected shard on its remaining
samples; paragon = build + train on all remaining samples (timed once per repeat: its cost
does not depend on N). Medians of repeated, interleaved runs; rows go to
results/benchmarks/unlearning.parquet (each retrain-shard row's `sizes` also carries the
paragon median and the speedup).

    python benchmarks/bench_unlearning.py [--quick] [--method taft-1] [--device cuda] [--vit-b]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.data.images import load_images, to_model_input  # noqa: E402
from pipeline_src.methods.registry import build_tuned_model, get_method  # noqa: E402
from pipeline_src.methods.training import batched_apply  # noqa: E402
from pipeline_src.plan.config import validate_config  # noqa: E402
from pipeline_src.plan.forget import random_request, samples_table, train_ids  # noqa: E402
from pipeline_src.plan.samples import list_samples  # noqa: E402
from pipeline_src.plan.sharding import shard_ids, shard_manifest  # noqa: E402
from pipeline_src.steps.train import train_settings  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, time_median, write_benchmark_rows  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def study_data(cfg: dict, img_size: int, in_chans: int) -> tuple[list[str], torch.Tensor, torch.Tensor, int]:
    """(sorted train ids, their images, their labels, number of classes) of the target task."""
    table = samples_table(cfg).to_pydict()
    ids = train_ids(samples_table(cfg))
    row_of = dict(zip(table["sample_id"], table["row"]))
    label_of = dict(zip(table["sample_id"], table["label"]))
    images = load_images(list_samples(cfg["dataset"]), {**cfg["dataset"], "img_size": img_size, "in_chans": in_chans})
    rows = torch.tensor([row_of[i] for i in ids])
    num_classes = len({lab for lab, t in zip(table["label"], table["task"]) if t == "target"})
    return ids, images[rows], torch.tensor([label_of[i] for i in ids]), num_classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 10 only, 3 epochs, 3 repeats")
    parser.add_argument("--method", default="taft-1", help="a method of config.yaml")
    parser.add_argument("--shards", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vit-b", action="store_true", help="ViT-B/16 at 224 px, random weights (for GPUs)")
    parser.add_argument("--out-dir", default=str(REPO / "results" / "benchmarks"))
    a = parser.parse_args()
    cfg = validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))
    method_cfg = cfg["methods"][a.method]
    settings = {**train_settings(cfg, method_cfg), "method": method_cfg}
    shards, repeats = ([10], 3) if a.quick else (a.shards, a.repeats)
    if a.quick:
        settings["epochs"] = 3
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from timm.models.vision_transformer import VisionTransformer

    if a.vit_b:
        arch = dict(img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0)
    else:
        arch = dict(img_size=cfg["dataset"]["img_size"], in_chans=cfg["dataset"]["in_chans"], **cfg["backbone"]["arch"])
    torch.manual_seed(0)
    backbone = VisionTransformer(num_classes=0, **arch).eval()
    ids, images, labels, num_classes = study_data(cfg, arch["img_size"], arch["in_chans"])
    device = torch.device(a.device)
    template = build_tuned_model(backbone, method_cfg, num_classes, cfg["seed"]).to(device).eval()
    features = batched_apply(template.prefix, to_model_input(images, [0.5] * arch["in_chans"], [0.5] * arch["in_chans"]).to(device))
    labels = labels.to(device)
    method = get_method(method_cfg["kind"])
    position = {i: k for k, i in enumerate(ids)}

    def train(subset: list[str], seed: int) -> None:
        model = build_tuned_model(backbone, method_cfg, num_classes, cfg["seed"]).to(device)
        rows = torch.tensor([position[i] for i in subset], device=device)
        with contextlib.redirect_stdout(io.StringIO()):  # per-epoch progress lines
            method.train(model, features[rows], labels[rows], settings, seed, "bench")

    # One one-sample request per N; the paragon's cost does not depend on N (it retrains on all
    # remaining samples), so it is timed once per repeat, interleaved with the shard retrainings
    # so that drift in machine load hits both alike.
    cases = []
    for n in shards:
        forgotten = random_request(ids, 1e-9, seed=0, request=n)  # one sample
        manifest = shard_manifest(ids, n, cfg["seeds"][0])
        shard = next(s for s in range(n) if forgotten[0] in shard_ids(manifest, s))
        cases.append((n, shard, [i for i in shard_ids(manifest, shard) if i not in forgotten]))
    all_rest = [i for i in ids if i not in random_request(ids, 1e-9, seed=0, request=shards[0])]
    train(cases[0][2], cases[0][1])  # warm-up: the first training in a process pays one-off set-up costs
    t_all, t_shard = [], {n: [] for n in shards}
    for _ in range(repeats):
        t_all += time_median(lambda: train(all_rest, 0), repeats=1, warmup=0, device=a.device)[1]
        for n, shard, rest in cases:
            t_shard[n] += time_median(lambda: train(rest, shard), repeats=1, warmup=0, device=a.device)[1]
    med = lambda t: statistics.median(t)  # noqa: E731
    base = {"method": a.method, "train_samples": len(ids), "epochs": settings["epochs"],
            "batch_size": settings["batch_size"], "arch": arch}
    no_mem = "a wall-time comparison of whole training runs"
    rows_out = [benchmark_row("unlearning", "paragon", a.device, {**base, "samples": len(all_rest)}, t_all, None,
                              not_measured=no_mem)]
    print(f"paragon: {med(t_all):8.1f} ms ({len(all_rest)} samples)")
    for n, _shard, _rest in cases:
        speedup = med(t_all) / med(t_shard[n])
        rows_out.append(benchmark_row("unlearning", "retrain-shard", a.device, {
            **base, "shards": n, "samples": len(rest), "paragon_ms_median": med(t_all),
            "speedup_vs_paragon": speedup, "goal_speedup": 0.5 * n}, t_shard[n], None, not_measured=no_mem))
        print(f"N={n:3d}: retrain-shard {med(t_shard[n]):8.1f} ms ({len(rest)} samples): speedup {speedup:5.1f}x "
              f"(goal {0.5 * n:.1f}x)", flush=True)
    print(f"wrote {write_benchmark_rows('unlearning', rows_out, a.out_dir)}")


if __name__ == "__main__":
    main()
