"""Which listed images do not decode: checked for every image when the DAG is built.

Checking lives in the listing, not in `prepare`. A `prepare` that failed on a bad file would have
its outputs deleted by Snakemake first, so one corrupt image added to an existing study would cost
its samples table and image store, and then most of its jobs. So the listing decodes every image
(PIL's full `load`, which is what finds a truncated file). Without `dataset.skip_corrupt` a bad
image is a config error naming it, before any job starts, and `results/` stays as it was. With
`skip_corrupt` the listing drops those images; `prepare` lists the same way, so the samples
table, the image store and every id list agree, and prepare writes the dropped files to
`results/prepare/corrupt.csv` (shard members are computed from the listing when the DAG is
built, so a sample that `prepare` alone dropped would still be in some shard). Verdicts are
cached per file (path, size, mtime, ctime) under the parse cache, so later parses decode only new or
changed files: the first parse of 30,000 images decodes them all (docs/datasets-and-backbones.md, "Corrupt images"). The
stamp holds the ctime too: a chmod, or contents replaced under a kept size and mtime (`cp -p`,
`rsync -t`, `touch -r`), changes it, and the file is decoded again.
"""
from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from pipeline_src.plan.cache import read_entry, write_entry
from pipeline_src.plan.dataset_layouts import SampleList

CACHE_FILE = "image_check.json"
_cache_dir: Path | None = None


def use_cache_dir(path: str | Path | None) -> None:
    """Keep verdicts under `path` (the parse cache, `results/prepare/.plan_cache`); None: not kept."""
    global _cache_dir
    _cache_dir = None if path is None else Path(path)


def decode_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for a file that is not a readable image (truncated, not an image, a bomb)."""
    from PIL import Image

    return OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError


def check_image(path: str) -> str | None:
    """None when the file decodes fully, else the reason."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
    except decode_errors() as e:
        return f"{type(e).__name__}: {e}"
    return None


def _stamp(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def corrupt_images(paths: list[str], threads: int | None = None) -> dict[str, str]:
    """{path: reason} of the files that do not decode, checking only files not seen unchanged before.

    Args:
        paths: image files.
        threads: decoding threads (PIL releases the GIL); default: the machine's CPUs.
    """
    from PIL import __version__ as pil_version

    cache_path = None if _cache_dir is None else _cache_dir / CACHE_FILE
    known: dict[str, list] = {}
    if cache_path is not None:
        try:
            entry = read_entry(cache_path)
            known = entry["files"] if entry.get("pil") == pil_version else {}
        except (OSError, ValueError, KeyError, TypeError):
            known = {}
    stamps = {p: _stamp(p) for p in paths}
    todo = [p for p in paths if p not in known or known[p][:3] != stamps[p]]
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        for p, reason in zip(todo, pool.map(check_image, todo)):
            known[p] = [*stamps[p], reason]
    if todo and cache_path is not None:
        write_entry({"pil": pil_version, "files": {p: known[p] for p in paths}}, cache_path)
    return {p: known[p][3] for p in paths if known[p][3] is not None}


def refuse_corrupt(samples: SampleList) -> None:
    """Raise ValueError naming the images of the listing that do not decode (none: return).

    Args:
        samples: a listing of image files.
    """
    bad = corrupt_images(samples.paths)
    if bad:
        path, reason = sorted(bad.items())[0]
        raise ValueError(f"config key 'dataset.path': {len(bad)} image(s) do not decode, e.g. {path} ({reason}); "
                         "repair or remove them, or set dataset.skip_corrupt: true to leave them out")


def drop_corrupt(samples: SampleList) -> SampleList:
    """The listing without the samples whose image does not decode; they go to `samples.corrupt`.

    Args:
        samples: a listing of image files.
    """
    bad = corrupt_images(samples.paths)
    if not bad:
        return samples
    keep = [k for k, p in enumerate(samples.paths) if p not in bad]
    return replace(samples.pick(keep), corrupt=sorted(bad.items()))
