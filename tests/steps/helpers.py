"""Running steps directly (no Snakemake) on small on-disk datasets: shared by tests/steps/."""
from __future__ import annotations

from pathlib import Path

import torch

from pipeline_src.data.backbone import save_backbone
from pipeline_src.plan.config import validate_config
from pipeline_src.plan.step_settings import converted, run_only_settings, settings_for
from pipeline_src.runner.step_args import NoConfig, Paths, StepArgs, selected_params
from tests.conftest import tiny_vit

VIT = dict(img_size=8, patch_size=4, in_chans=3, num_classes=3, embed_dim=16, depth=4, num_heads=2)


def step_args(config: dict, inputs: dict | None = None, outputs: dict | None = None, params: dict | None = None,
              wildcards: dict | None = None, threads: int = 1, rule: str = "") -> StepArgs:
    """A job's arguments as `runner/step_args.from_snakemake` makes them: a converted `rule` gets
    its settings param from `config` and no config (reading it raises), the others the config; a
    `selected_at` param moves its method to the `selection` input's point."""
    inputs, outputs, params, wildcards = inputs or {}, outputs or {}, dict(params or {}), wildcards or {}
    if converted(rule):
        params["settings"] = settings_for(rule, config, wildcards)
    paths = Paths([str(v) for v in inputs.values()], {k: str(v) for k, v in inputs.items()})
    params = selected_params(params, paths)
    return StepArgs(input=paths,
                    output=Paths([str(v) for v in outputs.values()], {k: str(v) for k, v in outputs.items()}),
                    params=params, wildcards=wildcards, threads=threads, rule=rule,
                    config=NoConfig(rule) if converted(rule) else config, runtime=run_only_settings(config))


def folder_config(root: Path, **extra) -> dict:
    """A validated config of a study on the ImageFolder `root` (8 px RGB). The steps read the
    backbone that `write_backbone` saves, whatever `backbone:` says."""
    return validate_config({
        "experiment": "steps", "device": "cpu", "dataset": {"source": "imagefolder", "path": str(root), "img_size": 8,
                                                            "in_chans": 3},
        "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
        "methods": {"taft-1": {"kind": "taft", "k": 1}, "last": {"kind": "last", "rank": 4, "heads": 2, "every": 2}},
        "train": {"epochs": 1, "batch_size": 8}, "shards": [1], **extra}, count_samples=False)


def write_backbone(out_dir: Path, **overrides) -> Path:
    """A random tiny ViT (`VIT`, updated by `overrides`) saved as the `pretrain` step saves one;
    returns its model.safetensors."""
    kwargs = {**VIT, **overrides}
    model = tiny_vit(**kwargs).float().eval()
    save_backbone(model, {"vit_kwargs": kwargs, "mean": [0.5] * 3, "std": [0.25] * 3, "source": "pretrain"}, out_dir)
    return out_dir / "model.safetensors"


def run_prepare(cfg: dict, results: Path) -> Path:
    from pipeline_src.steps import prepare

    samples = results / "prepare" / "samples.parquet"
    prepare.main(step_args(cfg, outputs={"samples": samples, "images": samples.with_name("images.npy")}, threads=2,
                           rule="prepare"))
    return samples


def run_features(cfg: dict, results: Path, cache: str, everys: list[int] | None = None) -> Path:
    from pipeline_src.steps import features

    out = results / "features" / cache / "features.npy"
    features.main(step_args(cfg, inputs={"samples": results / "prepare" / "samples.parquet",
                                         "backbone": results / "pretrain" / "model.safetensors"},
                            outputs={"features": out, "meta": out.with_suffix(".json")},
                            params={"everys": everys}, wildcards={"cache": cache}, rule="features"))
    torch.set_num_threads(1)
    return out
