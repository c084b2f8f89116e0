"""Load and validate a study config against `workflow/schemas/config.schema.yaml`.

Validation runs once, at the entry point (the Snakefile), before any job starts. Errors
name the offending key as a dotted path, e.g. `methods.nlft-1.k`.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pipeline_src.methods.kinds import feature_cache, kind_of, method_errors
from pipeline_src.optim.schedule import schedule_errors
from pipeline_src.plan.ablations import check_ablations_config
from pipeline_src.plan.cache import cached, package_version
from pipeline_src.plan.config_strings import coerce_strings
from pipeline_src.plan.dataset_layouts import MANIFEST_SUFFIXES
from pipeline_src.plan.errors import ConfigError
from pipeline_src.plan.feature_budget import budget_report, image_store_line
from pipeline_src.plan.forget import check_forget_section
from pipeline_src.plan.fusion import check_fusion_config
from pipeline_src.plan.last_grid import check_last_grid_config
from pipeline_src.plan.privacy import check_privacy_config
from pipeline_src.plan.samples import count_train_samples
from pipeline_src.plan.search import expand_search
from pipeline_src.plan.section_seeds import check_section_seeds
from pipeline_src.plan.studies import name_error
from pipeline_src.plan.vectorized import resolve_auto_cache

__all__ = ["ConfigError", "load_schema", "validate_config"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = PACKAGE_ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _with_defaults(validator_class):
    """Extend a jsonschema validator so that `default:` values are filled in."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def allowed_values(schema: dict) -> str:
    """What a key of several types accepts, in words ('an integer ≥ 1, null, or 'same''); '' for
    a key of one type, whose schema message already says it."""
    types = schema.get("type")
    if not isinstance(types, list) or len(types) < 2:
        return ""
    words = []
    for t in types:
        if t == "integer":
            words.append("an integer" + (f" ≥ {schema['minimum']}" if "minimum" in schema else ""))
        elif t == "string" and re.fullmatch(r"\^\w+\$", schema.get("pattern", "")):
            words.append(f"'{schema['pattern'][1:-1]}'")
        elif t == "string" and "pattern" in schema:
            words.append(f"a string matching {schema['pattern']}")
        else:
            words.append({"null": "null", "string": "a string", "number": "a number", "boolean": "true or false",
                          "array": "a list", "object": "a mapping"}.get(t, t))
    return ", ".join(words[:-1]) + f" or {words[-1]}"


@functools.lru_cache(maxsize=1)
def _cached_schema() -> dict:
    """The schema as parsed once per process: read it, never change it (`load_schema` copies)."""
    # libyaml's loader where PyYAML has it: the pure-Python one spends 0.15 s of every parse here
    return yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema() -> dict:
    """The config schema, a copy of its own: a caller may change it without changing the next one's."""
    return copy.deepcopy(_cached_schema())


def validate_config(config: dict[str, Any], count_samples: bool = True,
                    cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Return a validated copy of `config` with defaults filled in.

    Args:
        config: the raw config mapping (as Snakemake or yaml.safe_load gives it).
        count_samples: also check shard counts against the number of training samples,
            which needs to look at the dataset (cheap: a file count, no image decoding).
        cache_dir: where to keep what these checks derive from the data (`plan/cache.py`;
            the Snakefile uses `results/prepare/.plan_cache`), or None to recompute it.

    Raises:
        ConfigError: naming the first offending key.
    """
    bad_name = name_error(config.get("experiment")) if "experiment" in config else None
    if bad_name:  # before the schema: its message would echo a 300-character name whole
        raise ConfigError(f"config key 'experiment': {bad_name}")
    schema = load_schema()
    cfg = coerce_strings(copy.deepcopy(dict(config)), schema)  # nested --config values arrive as strings
    validator_cls = _with_defaults(jsonschema.Draft202012Validator)
    validator = validator_cls(schema)
    # Two passes: the first fills defaults (possibly nested), the second reports errors.
    for _ in validator.iter_errors(cfg):
        pass
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        allowed = allowed_values(err.schema) if isinstance(err.schema, dict) else ""
        raise ConfigError(f"config key '{_key_path(err.absolute_path)}': {err.message}"
                          + (f" (allowed: {allowed})" if allowed else ""))
    auto_cache = cfg["features"]["cache"] == "auto"
    if auto_cache:  # on a GPU provisional: kept only where shards train vectorized (`resolve_auto_cache`)
        cfg["features"]["cache"] = cfg["device"] != "cuda" or not cfg["train"]["augment"]["enabled"]
    expand_search(cfg)  # the grid points are methods: the checks below see them too
    _check_semantics(cfg, count_samples, cache_dir)
    if auto_cache:  # from the shards' sizes (read from the dataset listing, which count_samples has checked)
        resolve_auto_cache(cfg)
    if count_samples:
        check_cache_budget(cfg)
    return cfg


def _check_external_backbone(bcfg: dict, in_chans: int) -> None:
    """A bad checkpoint or timm name must fail here: found in `pretrain`, it would cost the
    previous backbone (Snakemake deletes a failed job's outputs)."""
    from pipeline_src.plan.backbone_check import (
        check_torch_file,
        check_vit_keys,
        check_vit_shapes,
        recorded_num_heads,
        safetensors_header,
    )

    if bcfg["timm_name"]:
        import timm  # only for a timm name: the default study's parse stays free of torch

        if not timm.is_model(bcfg["timm_name"]):
            raise ConfigError(f"config key 'backbone.timm_name': '{bcfg['timm_name']}' is not a timm model "
                              "(see timm.list_models())")
    if bcfg["source"] != "checkpoint":
        return
    try:
        if bcfg["checkpoint"].endswith(".safetensors"):
            named = bcfg["timm_name"]  # a timm architecture has its own depth and width
            arch = bcfg["arch"]
            tensors = safetensors_header(bcfg["checkpoint"])
            check_vit_keys(tensors, None if named else arch["depth"], None if named else arch["embed_dim"])
            if not named:  # a timm name brings its own architecture
                check_vit_shapes(tensors, arch, in_chans)
                heads = recorded_num_heads(bcfg["checkpoint"])
                if heads is not None and heads[0] != arch["num_heads"]:
                    raise ValueError(f"{heads[1]} records num_heads {heads[0]}, backbone.arch.num_heads is "
                                     f"{arch['num_heads']}")
        else:
            check_torch_file(bcfg["checkpoint"])
    except (OSError, ValueError) as e:
        raise ConfigError(f"config key 'backbone.checkpoint': {bcfg['checkpoint']}: {e}") from None


def _check_semantics(cfg: dict, count_samples: bool, cache_dir: str | Path | None) -> None:
    depth = cfg["backbone"]["arch"]["depth"]
    if cfg["backbone"]["source"] == "pretrain":
        if not cfg["dataset"]["source_classes"] and not cfg["dataset"]["pretrain_pool"]:
            raise ConfigError("config key 'dataset.source_classes': backbone.source 'pretrain' needs source classes "
                              "(or dataset.pretrain_pool) to pretrain on")
        arch = cfg["backbone"]["arch"]
        if arch["embed_dim"] % arch["num_heads"]:
            raise ConfigError("config key 'backbone.arch.num_heads': must divide embed_dim "
                              f"({arch['embed_dim']} % {arch['num_heads']} != 0)")
        if cfg["dataset"]["img_size"] % arch["patch_size"]:
            raise ConfigError("config key 'backbone.arch.patch_size': must divide dataset.img_size")
    if cfg["backbone"]["source"] == "timm" and not cfg["backbone"]["timm_name"]:
        raise ConfigError("config key 'backbone.timm_name': required when backbone.source is 'timm'")
    if cfg["backbone"]["source"] == "checkpoint":
        ckpt = cfg["backbone"]["checkpoint"]
        if not ckpt:
            raise ConfigError("config key 'backbone.checkpoint': required when backbone.source is 'checkpoint'")
        if not Path(ckpt).is_file():
            raise ConfigError(f"config key 'backbone.checkpoint': file not found: {ckpt}")
    if cfg["backbone"]["source"] != "pretrain":
        _check_external_backbone(cfg["backbone"], cfg["dataset"]["in_chans"])
        if cfg["dataset"]["pretrain_pool"]:
            raise ConfigError("config key 'dataset.pretrain_pool': only for backbone.source 'pretrain' "
                              f"(backbone.source is '{cfg['backbone']['source']}')")
    if cfg["dataset"]["source"] == "imagefolder":
        _check_dataset_path(cfg["dataset"], cache_dir)
    elif cfg["dataset"]["layout"] != "folders" or cfg["dataset"]["skip_corrupt"]:
        key = "layout" if cfg["dataset"]["layout"] != "folders" else "skip_corrupt"
        raise ConfigError(f"config key 'dataset.{key}': only for dataset.source 'imagefolder'")
    if cfg["dataset"]["source"] == "idx":
        _check_idx(cfg["dataset"], cache_dir)
    elif cfg["dataset"]["class_names"]:
        raise ConfigError("config key 'dataset.class_names': only for dataset.source 'idx' (other sources name "
                          "their classes: digits by their digit, image folders by their folder or label)")
    kind_keys = _cached_schema()["properties"]["methods"]["x-kind-keys"]
    shared = {"kind", "epochs", "batch_size", "lr", "weight_decay", "schedule", "shards"}
    for key, message in schedule_errors(cfg["train"]["schedule"], cfg["train"]["epochs"]):
        raise ConfigError(f"config key '{key}': {message}")
    pretrain = cfg["backbone"]["pretrain"]
    if "schedule" in pretrain:
        for key, message in schedule_errors(pretrain["schedule"], pretrain["epochs"], "backbone.pretrain.schedule"):
            raise ConfigError(f"config key '{key}': {message}")
    for name, method in cfg["methods"].items():
        for key in method:
            if key not in shared and key not in kind_keys[method["kind"]]:
                raise ConfigError(f"config key 'methods.{name}.{key}': not an option of kind '{method['kind']}'")
        if "schedule" in method or "epochs" in method:  # the schedule this method trains with
            where = f"methods.{name}.schedule" if "schedule" in method else "train.schedule"
            epochs = method.get("epochs", cfg["train"]["epochs"])
            for key, message in schedule_errors(method.get("schedule", cfg["train"]["schedule"]), epochs, where):
                raise ConfigError(f"config key '{key}': {message} (methods.{name} trains {epochs} epochs)")
        for key, message in method_errors(name, method, depth if cfg["backbone"]["source"] == "pretrain" else None):
            raise ConfigError(f"config key '{key}': {message}")
    _check_augment(cfg)
    # Each study checks its own section and raises ConfigError naming <section>.<key>.
    check_section_seeds(cfg)
    _check_method_shards(cfg)
    check_fusion_config(cfg)
    check_last_grid_config(cfg)
    check_ablations_config(cfg)
    check_forget_section(cfg, check_ids=count_samples)
    n_train = None
    if count_samples:
        try:
            n_train = _train_count(cfg, cache_dir)
        except ValueError as e:  # the dataset itself: unreadable root, empty class, unknown class
            raise ConfigError(str(e)) from None
        for n in cfg["shards"]:
            if n > n_train:
                raise ConfigError(f"config key 'shards': {n} shards but only {n_train} training samples")
        _check_no_empty_shard(cfg)
    check_privacy_config(cfg, n_train, cache_dir)


def _check_method_shards(cfg: dict) -> None:
    """A method's own `shards` are some of the study's. (The fusion and unlearning studies train
    the shard models they read at their own N, whatever the method's `shards`.)"""
    for name, method in cfg["methods"].items():
        extra = sorted(set(method.get("shards", ())) - set(cfg["shards"]))
        if extra:
            raise ConfigError(f"config key 'methods.{name}.shards': {extra} not in the study's `shards` {cfg['shards']}")


def _check_augment(cfg: dict) -> None:
    """`train.augment` needs methods that train from images, one batch at a time."""
    if not cfg["train"]["augment"]["enabled"]:
        return
    for name, method in cfg["methods"].items():
        kind = kind_of(method)
        if kind.side:
            raise ConfigError(f"config key 'train.augment.enabled': methods.{name} (last) trains from the frozen "
                              "block outputs of the whole shard, which augmentation cannot replace per batch")
        if method.get("vectorized_shards"):
            raise ConfigError(f"config key 'train.augment.enabled': methods.{name}.vectorized_shards trains from "
                              "precomputed features; set vectorized_shards: false")
        if cfg["features"]["cache"] and feature_cache(method) is not None:
            raise ConfigError(f"config key 'train.augment.enabled': methods.{name} trains from the cached features "
                              f"'{feature_cache(method)}', computed once without augmentation; "
                              "set features.cache: false")


def _check_dataset_path(dataset_cfg: dict, cache_dir: str | Path | None) -> None:
    from pipeline_src.plan.image_check import use_cache_dir

    use_cache_dir(cache_dir)  # skip_corrupt's per-file verdicts live beside the other parse-time values
    path, layout = dataset_cfg["path"], dataset_cfg["layout"]
    if layout == "manifest":
        if not path or not Path(path).is_file():
            raise ConfigError(f"config key 'dataset.path': manifest file not found: {path}")
        if Path(path).suffix.lower() not in MANIFEST_SUFFIXES:
            raise ConfigError(f"config key 'dataset.path': a manifest is a {' or '.join(MANIFEST_SUFFIXES)} file: {path}")
    elif not path or not Path(path).is_dir():
        raise ConfigError(f"config key 'dataset.path': ImageFolder root not found: {path}")


def _check_idx(dataset_cfg: dict, cache_dir: str | Path | None) -> None:
    """IDX files (`plan/idx_files.py`): every file there, with the right magic number, its data as
    long as its header says, as many labels as images; `dataset.path` defaults to Debian's
    Fashion-MNIST (filled in here, so the signatures name the files read)."""
    from pipeline_src.plan.idx_files import DEFAULT_PATH, IdxError, list_idx, use_cache_dir

    use_cache_dir(cache_dir)  # files checked whole before, unchanged, have only their header read
    dataset_cfg["path"] = dataset_cfg["path"] or DEFAULT_PATH
    try:
        list_idx(dataset_cfg)  # checks both splits' files; the labels are read once per parse (cached headers)
    except IdxError as e:
        raise ConfigError(f"config key 'dataset.path': {type(e).__name__}: {e}") from None
    except ValueError as e:  # class names that do not fit the labels
        raise ConfigError(str(e)) from None


def check_cache_budget(cfg: dict) -> list[str]:
    """The estimated size of the image store and of each feature cache, one line each; refuses
    a study whose feature caches exceed `features.max_cache_gb`, naming the cache (`plan/feature_budget.py`)."""
    from pipeline_src.plan.forget import samples_table

    num_samples = samples_table(cfg).num_rows
    lines, error = budget_report(cfg, num_samples)
    if error:
        raise ConfigError(error)
    return [image_store_line(cfg, num_samples), *lines]


def _train_count(cfg: dict, cache_dir: str | Path | None) -> int:
    """`count_train_samples`, cached for `digits` (a fixed dataset per scikit-learn version;
    loading it imports sklearn, seconds per dry run). An ImageFolder is listed every time."""
    if cfg["dataset"]["source"] != "digits":
        return count_train_samples(cfg)
    from pipeline_src.plan import pretrain_pool, samples

    key = {"dataset": cfg["dataset"], "seed": cfg["seed"], "sklearn": package_version("scikit-learn"),
           "code": hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (samples, pretrain_pool))).hexdigest()}
    return cached(cache_dir, "train_count", key, lambda: count_train_samples(cfg))


def _check_no_empty_shard(cfg: dict) -> None:
    """Keyed-hash shards are balanced in expectation only: refuse a shard count that leaves one empty."""
    from pipeline_src.plan.forget import samples_table, train_ids
    from pipeline_src.plan.sharding import shard_manifest

    train = train_ids(samples_table(cfg))
    for n in cfg["shards"]:
        for seed in cfg["seeds"]:
            try:
                shard_manifest(train, n, seed)
            except ValueError as e:
                raise ConfigError(f"config key 'shards': {e}") from None
