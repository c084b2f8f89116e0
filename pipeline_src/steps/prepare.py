"""prepare: list, split and decode the dataset into `samples.parquet` + `images.safetensors`."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.data.images import load_images
from pipeline_src.data.sample_store import save_samples
from pipeline_src.plan.samples import assign_splits, list_samples
from pipeline_src.runner.step_args import StepArgs


def main(args: StepArgs) -> None:
    cfg = args.config
    samples = list_samples(cfg["dataset"])
    table = assign_splits(samples, cfg["dataset"], cfg["seed"])
    images = load_images(samples, cfg["dataset"])
    save_samples(table, images, Path(args.output.samples).parent)
    print(f"prepared {table.num_rows} samples from {cfg['dataset']['source']}")
