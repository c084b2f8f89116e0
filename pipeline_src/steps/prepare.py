"""prepare: list, split and decode the dataset into `samples.parquet` + `images.npy`.

Images are decoded and resized in bounded chunks (`data/images.py`) straight into a
memory-mapped uint8 array, so prepare's memory does not grow with the dataset. With
`dataset.skip_corrupt` the listing has already dropped images that do not decode
(`plan/image_check.py`); they are logged and written to `corrupt.csv`.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from pipeline_src.data.images import write_images
from pipeline_src.data.sample_store import IMAGES_FILE
from pipeline_src.plan import idx_files
from pipeline_src.plan.image_check import use_cache_dir
from pipeline_src.plan.pretrain_pool import check_disjoint
from pipeline_src.plan.samples import assign_splits, list_samples, split_and_limit
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet, write_text

CORRUPT_FILE = "corrupt.csv"


def write_corrupt_table(corrupt: list[tuple[str, str]], path: Path) -> None:
    """The images `dataset.skip_corrupt` dropped, one row each: path, reason."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["path", "reason"])
    writer.writerows(corrupt)
    write_text(buf.getvalue(), path)


def main(args: StepArgs) -> None:
    cfg = args.settings
    out_dir = Path(args.output.samples).parent
    use_cache_dir(out_dir / ".plan_cache")  # the verdicts the DAG was built with (skip_corrupt)
    idx_files.use_cache_dir(None)  # IDX files read whole, CRC included: validation read only their length records
    samples = split_and_limit(list_samples(cfg["dataset"]), cfg["dataset"], cfg["seed"])  # what images.npy holds
    table = assign_splits(samples, cfg["dataset"], cfg["seed"])
    if cfg["dataset"].get("pretrain_pool"):  # on the ids written, as validation did on the listed ones
        check_disjoint(table, cfg["dataset"]["pretrain_pool"])
    if cfg["dataset"]["skip_corrupt"]:
        write_corrupt_table(samples.corrupt, out_dir / CORRUPT_FILE)
        print(f"skipped {len(samples.corrupt)} corrupt images (dataset.skip_corrupt; listed in "
              f"{out_dir / CORRUPT_FILE})" + "".join(f"\n  {p}: {r}" for p, r in samples.corrupt[:20]))
    else:
        (out_dir / CORRUPT_FILE).unlink(missing_ok=True)  # from an earlier run that skipped some
    shape = write_images(samples, cfg["dataset"], out_dir / IMAGES_FILE, threads=args.threads)
    write_parquet(table, args.output.samples)  # last: the table names rows of a complete image array
    print(f"prepared {table.num_rows} samples from {cfg['dataset']['source']}: images {shape} uint8")
