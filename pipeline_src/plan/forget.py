"""Forget requests and the unlearning strategies built on sharded training.

Papers:
- SISA: Bourtoule et al., "Machine Unlearning", IEEE S&P 2021 (disjoint shards; forgetting a
  sample retrains only its shard; the ensemble of shard models may also just drop the shard).
- TAFT: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and Removal",
  ICLR 2024, §3.3 (a composed tangent model forgets a shard by subtracting its Δw, no training).

A forget request is a file of sample ids (text: one per line; CSV: a `sample_id` column or a
single column), named by `forget.requests` in the config. It is validated against the samples
table as a whole before any job runs (unknown, duplicate, test/val or source-task ids are
errors naming the id; an id of the backbone's pretraining pool, `dataset.pretrain_pool`, is refused
as such: forgetting it needs a new backbone), so nothing is ever half-applied. The samples table and the shard
manifests are pure functions of the config (`datasets.assign_splits`,
`sharding.shard_manifest`), so the shard of every forgotten id is known at DAG-build time and
only the affected shards' manifests change.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_src.methods.kinds import is_counterpart, nonlinear_counterpart
from pipeline_src.plan.arrow_tables import bool_array, string_array, string_scalar
from pipeline_src.plan.errors import ConfigError
from pipeline_src.plan.samples import study_samples
from pipeline_src.plan.section_seeds import section_seeds
from pipeline_src.plan.sharding import shard_manifest, shard_sizes

T = TypeVar("T")


class ForgetRequestError(ValueError):
    """A forget request that cannot be applied as a whole."""


SHOWN_CHARS = 80  # an id in a message: a 10 MB line (a file with no line breaks) is never echoed whole


def shown_id(sample_id: str) -> str:
    """A requested id as a message quotes it: repr-quoted, cut to `SHOWN_CHARS` with its length."""
    if len(sample_id) <= SHOWN_CHARS:
        return repr(sample_id)
    return f"{sample_id[:SHOWN_CHARS]!r}... ({len(sample_id):,} characters)"


# ---------------------------------------------------------------- requests
def read_request(path: str | Path) -> list[str]:
    """Sample ids of a request file, in file order (duplicates kept, so validation can name them).

    Args:
        path: `.csv` (a `sample_id` column, or a single unnamed column) or text (one id per
            line). Blank lines and lines starting with `#` are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise ForgetRequestError(f"forget request file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # -sig: an editor's BOM
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ForgetRequestError(f"forget request {path}: not UTF-8 text (byte {e.start}, line {line}: "
                                 f"{data[e.start:e.start + 4]!r}); save it as UTF-8, one sample id per line") from None
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if path.suffix.lower() != ".csv":
        return lines
    rows = list(csv.reader(lines))
    if rows and "sample_id" in rows[0]:
        col = rows[0].index("sample_id")
        return [r[col].strip() for r in rows[1:]]
    if any(len(r) != 1 for r in rows):
        raise ForgetRequestError(f"forget request {path}: a CSV needs a 'sample_id' header or a single column")
    return [r[0].strip() for r in rows]


def validate_request(ids: Sequence[str], samples: pa.Table, pool: dict | None = None) -> list[str]:
    """Check every id of a request and return them sorted.

    Args:
        ids: the requested sample ids.
        samples: the samples table (`datasets.SAMPLES_SCHEMA`).
        pool: `dataset.pretrain_pool` when the source task is that pool (its ids are refused by name).
    Raises:
        ForgetRequestError: naming the first duplicate, unknown, non-training or source-task id.
    """
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise ForgetRequestError(f"forget request: duplicate sample id {shown_id(i)}")
        seen.add(i)
    # Arrow lookups: only the requested ids' task and split become Python objects, not the table's.
    pos = pc.index_in(string_array(list(ids)), value_set=samples.column("sample_id").combine_chunks())
    found = pos.drop_null()
    tasks = samples.column("task").take(found).to_pylist()
    splits = samples.column("split").take(found).to_pylist()
    where = dict(zip((i for i, p in zip(ids, pos.is_valid().to_pylist()) if p), zip(tasks, splits)))
    for i in ids:
        if i not in where:
            raise ForgetRequestError(f"forget request: unknown sample id {shown_id(i)}")
        task, split = where[i]
        if task != "target" and pool:
            raise ForgetRequestError(f"forget request: sample id {shown_id(i)} is in the backbone's pretraining pool "
                                     f"(dataset.pretrain_pool, key pool/{pool['seed']}), which no fine-tuned model "
                                     "trains on; forgetting it needs a new backbone (pretrained without it)")
        if task != "target":
            raise ForgetRequestError(f"forget request: sample id {shown_id(i)} belongs to the {task} (pretraining) task, "
                                     "which no fine-tuned model trains on; forgetting it needs a new backbone")
        if split != "train":
            raise ForgetRequestError(f"forget request: sample id {shown_id(i)} is in the {split} split, not the training split")
    return sorted(ids)


# ---------------------------------------------------------------- requests → shards (DAG-build time)
def _samples_of(dataset_key: str, seed: int) -> pa.Table:
    return study_samples(json.loads(dataset_key), seed)[1]


def samples_table(cfg: dict) -> pa.Table:
    """The samples table the `prepare` step will write (no image decoding), cached per config."""
    return study_samples(cfg["dataset"], cfg["seed"])[1]


def _is_target_train(samples: pa.Table) -> pa.ChunkedArray:
    # Arrow scalars, not Python strings: converting those imports pandas (arrow_tables.py)
    return pc.and_(pc.equal(samples.column("task"), string_scalar("target")),
                   pc.equal(samples.column("split"), string_scalar("train")))


def train_ids(samples: pa.Table) -> list[str]:
    """Sorted ids of the target task's training split."""
    return sorted(pc.filter(samples.column("sample_id"), _is_target_train(samples)).to_pylist())


def train_count(samples: pa.Table) -> int:
    """How many samples the target task's training split has (`len(train_ids(samples))`, unsorted)."""
    return pc.sum(_is_target_train(samples)).as_py() or 0


def requested_ids(cfg: dict) -> list[str]:
    """The validated, sorted ids of the config's forget request ([] when there is none)."""
    path = cfg["forget"]["requests"]
    if not path:
        return []
    return validate_request(read_request(path), samples_table(cfg), cfg["dataset"].get("pretrain_pool"))


def forgotten_by_shard(manifest: pa.Table, ids: Sequence[str]) -> dict[int, list[str]]:
    """Sorted forgotten ids per shard of a manifest (only shards with forgotten ids appear).

    Args:
        manifest: `sharding.MANIFEST_SCHEMA` table.
        ids: forgotten ids (every one must be in the manifest).
    """
    shard_of = dict(zip(manifest.column("sample_id").to_pylist(), manifest.column("shard").to_pylist()))
    out: dict[int, list[str]] = {}
    for i in sorted(ids):
        if i not in shard_of:
            raise ForgetRequestError(f"forget request: sample id {shown_id(i)} is not in the shard manifest")
        out.setdefault(int(shard_of[i]), []).append(i)
    return out


_FROM_SAMPLES: dict[tuple, tuple[pa.Table, object]] = {}  # key -> (the samples table it came from, value)


def _from_samples(key: tuple, samples: pa.Table, compute: Callable[[pa.Table], T]) -> T:
    """`compute(samples)`, kept per `key` while the study's kept samples table is the same object.
    Validation lists the dataset again (`study_samples(fresh=True)`), so a second plan in one
    process after the files on disk changed gets the new members; a cache on the config alone
    kept the old ones."""
    hit = _FROM_SAMPLES.get(key)
    if hit is not None and hit[0] is samples:
        return hit[1]
    value = compute(samples)
    _FROM_SAMPLES.pop(key, None)
    while len(_FROM_SAMPLES) >= 256:  # a few (N, seed) per study
        _FROM_SAMPLES.pop(next(iter(_FROM_SAMPLES)))
    _FROM_SAMPLES[key] = (samples, value)
    return value


def _forgotten_in(dataset_key: str, data_seed: int, path: str, stamp: tuple[int, int, int], shards: int,
                  seed: int) -> dict[int, list[str]]:
    # `stamp` (size, mtime, ctime of the request file) is only a key: an edited request is read again
    def compute(samples: pa.Table) -> dict[int, list[str]]:
        ids = validate_request(read_request(path), samples, json.loads(dataset_key).get("pretrain_pool"))
        return forgotten_by_shard(shard_manifest(train_ids(samples), shards, seed), ids)

    key = ("forgotten", dataset_key, data_seed, path, stamp, shards, seed)
    return _from_samples(key, _samples_of(dataset_key, data_seed), compute)


def forgotten_in_shard(cfg: dict, shards: int, seed: int, shard: int) -> list[str]:
    """The forgotten ids that fall in one shard: the `params` of that shard's manifest job, so a
    request changes the params (and reruns the jobs) of the affected shards only."""
    import json

    path = cfg["forget"]["requests"]
    if not path:
        return []
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # any write changes the ctime
    return _forgotten_in(json.dumps(cfg["dataset"], sort_keys=True), cfg["seed"], str(path), stamp, shards,
                         seed).get(shard, [])


def _shard_members(dataset_key: str, data_seed: int, shards: int, seed: int) -> tuple[tuple[str, ...], ...]:
    from pipeline_src.plan.sharding import shard_ids, shard_manifest

    def compute(samples: pa.Table) -> tuple[tuple[str, ...], ...]:
        manifest = shard_manifest(train_ids(samples), shards, seed)
        return tuple(tuple(shard_ids(manifest, i)) for i in range(shards))

    return _from_samples(("members", dataset_key, data_seed, shards, seed), _samples_of(dataset_key, data_seed), compute)


def shard_members(cfg: dict, shards: int, seed: int, shard: int) -> list[str]:
    """One shard's training ids minus the forgotten ones, from the config alone (DAG-build time):
    the `params` of that shard's manifest job, which has no input files. So new, removed or
    forgotten samples rerun exactly the manifest jobs (and the training) of the shards they fall
    into (keyed-hash sharding), whatever else reruns."""
    import json

    members = _shard_members(json.dumps(cfg["dataset"], sort_keys=True), cfg["seed"], shards, seed)[shard]
    drop = set(forgotten_in_shard(cfg, shards, seed, shard))
    return [i for i in members if i not in drop]


def remove_ids(table: pa.Table, forgotten: Sequence[str]) -> pa.Table:
    """The manifest rows whose sample id is not forgotten."""
    drop = set(forgotten)
    keep = [i not in drop for i in table.column("sample_id").to_pylist()]
    return table.filter(bool_array(keep))


def check_forget_section(cfg: dict, check_ids: bool = True) -> None:
    """Semantic checks of the `forget:` section, called from `config._check_semantics`.

    Validates the request file as a whole (so no job starts on a bad request), checks that no
    shard of any shard count and seed would be left empty, and checks the study settings.

    Args:
        cfg: the config with schema defaults filled in.
        check_ids: check the request's ids against the dataset (lists it, decodes no image).

    Raises:
        ConfigError: naming the key (`forget.requests`, `forget.study.*`) and the offending id.
    """

    fg = cfg["forget"]
    study = fg["study"]
    shard_counts = sorted(set(cfg["shards"]) | (set(study["shards"]) if study["enabled"] else set()))
    if fg["requests"] and check_ids:
        try:
            ids = requested_ids(cfg)
        except ForgetRequestError as err:
            raise ConfigError(f"config key 'forget.requests' ({fg['requests']}): {err}") from None
        if ids:
            train = train_ids(samples_table(cfg))
            for n in shard_counts:
                for s in cfg["seeds"]:
                    manifest = shard_manifest(train, n, s)
                    sizes = shard_sizes(manifest, n)
                    for shard, lost in forgotten_by_shard(manifest, ids).items():
                        if len(lost) >= sizes[shard]:
                            raise ConfigError(f"config key 'forget.requests': the request removes every sample of "
                                              f"shard {shard} of n{n}_s{s}; nothing would be left to train on")
    if not study["enabled"]:
        return
    for name in study["methods"]:
        if name not in cfg["methods"]:
            raise ConfigError(f"config key 'forget.study.methods': '{name}' is not a method in 'methods'")
    for r in study["removed_shards"]:
        for n in study["shards"]:
            if r >= n:
                raise ConfigError(f"config key 'forget.study.removed_shards': removing {r} of {n} shards "
                                  f"(forget.study.shards) leaves no model")
    for f in study["forget_fractions"]:
        if not 0 <= f < 1:  # 0: requests of one sample each (random_request)
            raise ConfigError(f"config key 'forget.study.forget_fractions': {f} is not in [0, 1)")


def nonlinear_paragon(cfg: dict, method: str) -> tuple[str, dict] | None:
    """(name, settings) of the method whose retraining on the remaining data is the TAFT paper's
    forgetting paragon ("re-training the non-linear model from scratch", App. C.3, Fig. 3) for
    `method`: a method of `methods:` of the non-linear counterpart's kind and k (its own
    settings; the first in config order), else the counterpart with the shared `train:`
    settings, named `<method>-nonlinear`. None when `method` is not linearized: its own
    retraining (`unlearn_paragon`) is then that paragon.

    Args:
        cfg: the validated config.
        method: a method name of `forget.study.methods`.
    """
    counterpart = nonlinear_counterpart(cfg["methods"][method])
    if counterpart is None:
        return None
    for name, m in cfg["methods"].items():
        if is_counterpart(m, counterpart):
            return name, m
    return f"{method}-nonlinear", counterpart


# ---------------------------------------------------------------- study requests
def random_request(ids: Sequence[str], fraction: float, seed: int, request: int) -> list[str]:
    """A reproducible random request: max(1, round(fraction·n)) of `ids`, sorted.

    Args:
        ids: the current training ids (sorted; any order gives the same result after sorting).
        fraction: the forgotten fraction; 0 is a request of exactly one sample (one person asks to be
            removed), which touches one shard, as the unlearning-cost claim needs.
        seed, request: seed the draw (with the fraction), so every strategy sees the same ids.
    """
    ids = sorted(ids)
    k = max(1, int(round(fraction * len(ids))))
    rng = np.random.default_rng([seed, request, int(round(fraction * 1e6))])
    return sorted(ids[i] for i in rng.choice(len(ids), size=k, replace=False))


def random_shards(num_shards: int, removed: int, seed: int, request: int) -> list[int]:
    """A reproducible random set of `removed` shards out of `num_shards` (a request hitting them)."""
    rng = np.random.default_rng([seed, request, removed, num_shards])
    return sorted(int(i) for i in rng.choice(num_shards, size=removed, replace=False))


def fraction_tag(fraction: float) -> str:
    """How a forget fraction appears in paths (`f{tag}`): 0.02 -> '0.02'."""
    return f"{fraction:g}"


def unlearning_targets(cfg: dict, results: str) -> list[str]:
    """Every metrics file of the unlearning study (empty when it is off): per method and seed the
    paragon (and TAFT App. C.3's non-linear paragon) per fraction and request; per shard count the
    shard drop, and the retraining per fraction and request.

    Args:
        cfg: the validated config.
        results: the results folder.
    """
    study = cfg["forget"]["study"]
    if not study["enabled"]:
        return []
    out = []
    requests = range(study["requests_per_point"])
    for m in study["methods"]:
        for s in section_seeds(cfg, "forget.study"):
            for f in study["forget_fractions"]:
                out += [f"{results}/metrics/unlearn_paragon/{m}/s{s}/f{fraction_tag(f)}_r{j}.parquet" for j in requests]
                if nonlinear_paragon(cfg, m) is not None:
                    out += [f"{results}/metrics/unlearn_paragon_nonlinear/{m}/s{s}/f{fraction_tag(f)}_r{j}.parquet"
                            for j in requests]
            for n in study["shards"]:
                out.append(f"{results}/metrics/unlearn_drop/{m}/n{n}_s{s}.parquet")
                for f in study["forget_fractions"]:
                    out += [f"{results}/metrics/unlearn_retrain/{m}/n{n}_s{s}/f{fraction_tag(f)}_r{j}.parquet"
                            for j in requests]
    return out
