"""The prepared dataset on disk: `samples.parquet` (SAMPLES_SCHEMA) and `images.safetensors`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from pipeline_src.store.atomic import atomic_path, write_parquet


@dataclass
class Subset:
    """Images and labels of one task and split, in sample-id order."""

    ids: list[str]
    images: torch.Tensor   # uint8 (N, C, H, W)
    labels: torch.Tensor   # int64 (N,)


def save_samples(table: pa.Table, images: torch.Tensor, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    with atomic_path(out_dir / "images.safetensors") as tmp:
        save_file({"images": images.contiguous()}, str(tmp))
    write_parquet(table, out_dir / "samples.parquet")


class SampleStore:
    """Read access to a prepared dataset folder."""

    def __init__(self, samples_path: str | Path) -> None:
        samples_path = Path(samples_path)
        self.table = pq.read_table(samples_path)
        self._images_path = samples_path.with_name("images.safetensors")
        self._images: torch.Tensor | None = None
        self.row_of = dict(zip(self.table.column("sample_id").to_pylist(), self.table.column("row").to_pylist()))

    @property
    def images(self) -> torch.Tensor:
        if self._images is None:
            self._images = load_file(self._images_path)["images"]
        return self._images

    def ids(self, task: str, split: str) -> list[str]:
        t = self.table.to_pydict()
        return sorted(i for i, tk, s in zip(t["sample_id"], t["task"], t["split"]) if tk == task and s == split)

    def num_classes(self, task: str) -> int:
        t = self.table.to_pydict()
        return len({lab for lab, tk in zip(t["label"], t["task"]) if tk == task})

    def subset(self, ids: list[str]) -> Subset:
        """The samples with these ids (unknown ids are an error naming the id)."""
        missing = [i for i in ids if i not in self.row_of]
        if missing:
            raise KeyError(f"sample id not in the prepared dataset: {missing[0]}")
        rows = torch.tensor([self.row_of[i] for i in ids], dtype=torch.long)
        labels = torch.tensor(self.table.column("label").to_numpy(), dtype=torch.long)[rows]
        return Subset(list(ids), self.images[rows], labels)

    def split(self, task: str, split: str) -> Subset:
        return self.subset(self.ids(task, split))
