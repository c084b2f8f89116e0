"""prepare: list, split and decode the dataset into `samples.parquet` + `images.npy`.

Images are decoded and resized in bounded chunks (`data/images.py`) straight into a
memory-mapped uint8 array, so prepare's memory does not grow with the dataset.
"""
from __future__ import annotations

from pathlib import Path

from pipeline_src.data.images import write_images
from pipeline_src.data.sample_store import IMAGES_FILE
from pipeline_src.plan.samples import assign_splits, list_samples
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet


def main(args: StepArgs) -> None:
    cfg = args.config
    samples = list_samples(cfg["dataset"])
    table = assign_splits(samples, cfg["dataset"], cfg["seed"])
    out_dir = Path(args.output.samples).parent
    shape = write_images(samples, cfg["dataset"], out_dir / IMAGES_FILE, threads=args.threads)
    write_parquet(table, args.output.samples)  # last: the table names rows of a complete image array
    print(f"prepared {table.num_rows} samples from {cfg['dataset']['source']}: images {shape} uint8")
