"""Evaluation time per (method, N): N per-shard jobs and an ensemble job (before) vs one job (after).

Issue 34: the rule `evaluate_shards` scores a method's N shard models and their ensemble in one
job, one frozen-prefix pass per batch; before it, `evaluate_shard` ran one job per shard model and
`evaluate_ensemble` one more for their ensemble. Both are timed here as their steps run, in this
process (`steps/evaluate.main`, the code the rules run), on a study's data and backbone shape
(default: config.yaml's; `--configfile` another): the samples table from the `prepare` step, a
random backbone of the study's architecture, and N shard models per method as `build_tuned_model`
makes them (evaluation's cost does not depend on what the weights hold):

- before: N calls with one shard model each + one ensemble call with all N;
- after: one call with all N, shard rows and ensemble rows.

The step's time includes what each job loads (samples, backbone, models) and writes; what a job
costs outside its step (process start, imports: the efficiency table's `outside_step_s`) comes on
top, once per job, and is not in these figures. Medians of `--repeats` interleaved runs; rows go to
results/benchmarks/evaluate.parquet (case `<method>:before` / `<method>:after`, sizes N, the test
images, and on the after rows the speedup).

    python benchmarks/bench_evaluate.py [--shards 4 10] [--methods fc nlft-1 taft-1 last] [--repeats 3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.data.backbone import EMBEDDED_MEAN_STD, embedded_vit_kwargs, load_backbone, save_backbone  # noqa: E402
from pipeline_src.data.sample_store import SampleStore  # noqa: E402
from pipeline_src.methods.registry import build_tuned_model  # noqa: E402
from pipeline_src.plan.config import validate_config  # noqa: E402
from pipeline_src.plan.step_settings import run_only_settings, settings_for  # noqa: E402
from pipeline_src.runner.step_args import NoConfig, Paths, StepArgs  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows  # noqa: E402
from pipeline_src.store.model_io import save_model  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def step_args(cfg: dict, rule: str, inputs: dict, outputs: dict, params: dict, wildcards: dict) -> StepArgs:
    """A job's arguments as the rule gives them (its settings param, no config)."""
    params = {**params, "settings": settings_for(rule, cfg, wildcards)}
    return StepArgs(input=Paths([str(v) for v in inputs.values()], {k: v for k, v in inputs.items()}),
                    output=Paths([str(v) for v in outputs.values()], {k: str(v) for k, v in outputs.items()}),
                    params=params, wildcards=wildcards, threads=1, rule=rule, config=NoConfig(rule),
                    runtime=run_only_settings(cfg))


def prepare_study(cfg: dict, root: Path) -> tuple[Path, Path, int]:
    """(samples table, backbone file, target classes): the `prepare` step's files and a random
    backbone of the study's architecture, saved as `pretrain` saves one."""
    from pipeline_src.steps import prepare

    samples = root / "prepare" / "samples.parquet"
    with contextlib.redirect_stdout(io.StringIO()):
        prepare.main(step_args(cfg, "prepare", {}, {"samples": samples, "images": samples.with_name("images.npy")},
                               {}, {}))
    store = SampleStore(samples)
    torch.manual_seed(0)
    from timm.models.vision_transformer import VisionTransformer

    kwargs = embedded_vit_kwargs(cfg, num_classes=store.num_classes("source"))
    mean, std = [m * cfg["dataset"]["in_chans"] for m in EMBEDDED_MEAN_STD]
    save_backbone(VisionTransformer(**kwargs).eval(), {"vit_kwargs": kwargs, "mean": mean, "std": std,
                                                       "source": "pretrain"}, root / "pretrain")
    return samples, root / "pretrain" / "model.safetensors", store.num_classes("target")


def shard_models(cfg: dict, method: str, n: int, backbone: Path, num_classes: int, root: Path) -> list[str]:
    """N shard models of `method` (untrained: the seeded start), saved as the `train` step saves them."""
    loaded, _ = load_backbone(backbone.parent)
    paths = []
    for i in range(n):
        model = build_tuned_model(loaded, cfg["methods"][method], num_classes, cfg["seed"])  # one head seed, as `train`
        path = root / "train" / method / f"n{n}_s0" / f"shard{i}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_model(model.trainable_state(), {"kind": "trained", "method": method, "method_config": cfg["methods"][method],
                                             "shards": n, "shard_id": i, "seed": 0, "head_seed": cfg["seed"],
                                             "num_classes": num_classes, "num_samples": 1}, path)
        paths.append(str(path))
    return paths


def evaluate(cfg: dict, rule: str, models: list[str], params: dict, wildcards: dict, inputs: dict, out: Path) -> None:
    from pipeline_src.steps import evaluate as step

    args = step_args(cfg, rule, inputs, {"metrics": out}, params, wildcards)
    args.input._names["models"] = models
    args.input[:] = [*args.input, *models]
    with contextlib.redirect_stdout(io.StringIO()):
        step.main(args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default=str(REPO / "config.yaml"), help="the study whose data and backbone shape to use")
    parser.add_argument("--methods", nargs="+", default=["fc", "nlft-1", "taft-1", "last"])
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out-dir", default=str(REPO / "results" / "benchmarks"))
    a = parser.parse_args()
    cfg = validate_config({**yaml.safe_load(Path(a.configfile).read_text()), "device": "cpu"}, count_samples=False)
    torch.set_num_threads(1)  # as a job with threads: 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        samples, backbone, num_classes = prepare_study(cfg, root)
        test_images = len(SampleStore(samples).split("target", "test").ids)
        inputs = {"samples": str(samples), "backbone": str(backbone)}
        for n in a.shards:
            for method in a.methods:
                models = shard_models(cfg, method, n, backbone, num_classes, root)
                w = {"method": method, "shards": str(n), "seed": "0"}
                out = root / "metrics.parquet"

                def before() -> None:
                    for model in models:
                        evaluate(cfg, "evaluate_shards", [model], {"model": "shards", "ensemble": False}, w, inputs, out)
                    evaluate(cfg, "evaluate_shards", models, {"model": "ensemble"}, w, inputs, out)

                def after() -> None:
                    evaluate(cfg, "evaluate_shards", models, {"model": "shards", "ensemble": True}, w, inputs, out)

                times: dict[str, list[float]] = {"before": [], "after": []}
                after()  # warm-up: imports, first allocations
                for _ in range(a.repeats):
                    for case, fn in (("before", before), ("after", after)):
                        t0 = time.perf_counter()
                        fn()
                        times[case].append((time.perf_counter() - t0) * 1e3)
                med = {c: statistics.median(t) for c, t in times.items()}
                speedup = med["before"] / med["after"]
                sizes = {"shards": n, "test_images": test_images, "jobs_before": n + 1, "jobs_after": 1,
                         "img_size": cfg["dataset"]["img_size"], "embed_dim": cfg["backbone"]["arch"]["embed_dim"]}
                for case in ("before", "after"):
                    rows.append(benchmark_row("evaluate", f"{method}:{case}", "cpu",
                                              {**sizes, **({"speedup": speedup} if case == "after" else {})},
                                              times[case], None, not_measured="time only"))
                print(f"{method:8s} N={n:3d}: before {med['before']:8.1f} ms ({n + 1} steps), after "
                      f"{med['after']:8.1f} ms (1 step): {speedup:.2f}x", flush=True)
    print(f"wrote {len(rows)} rows to {write_benchmark_rows('evaluate', rows, a.out_dir)}")


if __name__ == "__main__":
    main()
