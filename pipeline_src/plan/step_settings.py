"""What each rule's jobs read of the config: their `params.settings`, built when the DAG is built.

A job's settings are a projection of the validated config onto the keys its step reads (the
config's own nesting, so a step passes them where it passed the config). They go to the job as
the rule's `settings` param, and Snakemake's params rerun trigger compares them: changing a key a
rule reads reruns its jobs, changing any other key leaves them alone. A converted step is handed
no config at all (`runner/step_args.py`: reading it raises), so a key it reads but its settings
lack fails at once, naming the rule (tests/steps/test_step_settings.py runs each one so).

`RUN_ONLY` keys are how a job runs, not what it computes, so changing them reruns nothing; every
step gets them as `args.runtime` (the keys are the project's decision, already made for the
training signatures in `plan/job_settings.py`). Torch-free: the Snakefile's parse imports it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# name in `args.runtime` -> config key: read by jobs, in no job's params
RUN_ONLY = {
    "device": "device",  # where a job runs (`--forcerun` a rule to redo it on another device)
    "num_workers": "train.num_workers",  # how images are read (bit-identical at any value)
    "eval_batch_size": "train.eval_batch_size",  # how many test images per forward pass
    "private_workspace": "privacy.enabled",  # file modes (owner-only) of the manifests, not their bytes
}

# Declarations checked at validation only (plan/privacy.py), read by no job: in no job's params or
# signature, so declaring them reruns nothing.
DECLARED_ONLY = ("dataset.pretrain_pool.public",)  # the pool's images are public (a DP study needs it)

# Keys added after results existed, left out of every job's settings and signature while at the value
# that changes nothing (the behaviour before the key), so adding them reruns no study that does not set them.
NEUTRAL = {"dataset.test_limit_per_class": "same",  # the test split capped as the others (issue 42 §1)
           "privacy.paper.micro_batch_size": None}  # full-batch DP-GD's micro-batches of privacy.batch_size

_TRAINING = ("experiment", "seed", "train", "methods.{method}", "dataset.img_size", "dataset.in_chans")
LABELS = ("experiment", "dataset.source")  # the study's name and data source, written into every metrics row
_EVALUATED = LABELS  # an evaluation of one model

_STUDY = (*LABELS, "seed", "methods.{method}")  # a study job's rows, record and head init (steps/forget/common.py)


def _evaluate_shards(cfg: Mapping, w: Mapping) -> tuple[str, ...]:
    """The shard models' rows; their ensemble's (N > 1, `ensemble` a composition) weigh the
    shards' logits by `compose_weights`."""
    ensemble = int(w["shards"]) > 1 and "ensemble" in cfg["compositions"]
    return (*_EVALUATED, "compose_weights") if ensemble else _EVALUATED


def _unlearn_drop(cfg: Mapping, w: Mapping) -> tuple[str, ...]:
    """sisa-drop weighs the remaining shards' logits by `compose_weights`; a tangent method's
    `subtract` takes its weights from the composed model's record (the `compose` job reads the key)."""
    from pipeline_src.methods.kinds import kind_of

    return _STUDY if kind_of(cfg["methods"][w["method"]]).tangent else (*_STUDY, "compose_weights")


def _nonlinear_paragon(cfg: Mapping, w: Mapping) -> tuple[str, ...]:
    """The studied method and the method of `methods:` that is its non-linear paragon, if any
    (`plan.forget.nonlinear_paragon` finds that one among the settings' methods as in the config)."""
    from pipeline_src.plan.forget import nonlinear_paragon

    found = nonlinear_paragon(cfg, w["method"])
    own = (f"methods.{found[0]}",) if found is not None and found[0] in cfg["methods"] else ()
    return (*_STUDY, "train", *own)


def _private_training(cfg: Mapping, w: Mapping) -> tuple[str, ...]:
    """The DP settings of the job's protocol (`plan.privacy.dp_settings`), the public shard size,
    the method (and `privacy.jvp_only` where it applies) and the head seed: public values only,
    no member id, no true size, no `train:` block (a DP job trains with `privacy:` settings)."""
    from pipeline_src.plan.privacy import DP_SETTINGS, jvp_only_applies

    protocol = w.get("protocol", cfg["privacy"]["protocol"])
    jvp = ("privacy.jvp_only",) if jvp_only_applies(cfg["methods"][w["method"]], protocol) else ()
    paper = ("privacy.paper.epochs", "privacy.paper.lr", "privacy.paper.micro_batch_size") if protocol == "paper" else ()
    return ("experiment", "seed", "methods.{method}", "privacy.public_train_size",
            *(f"privacy.{k}" for k in DP_SETTINGS), *paper, *jvp)


def _head_permutation(cfg: Mapping) -> tuple[str, ...]:
    """`fusion.head_permutation` where it is on (off, the settings stay as before it existed: nothing reruns)."""
    return ("fusion.head_permutation",) if cfg.get("fusion", {}).get("head_permutation") else ()


# Rule -> the config keys its step reads (dotted paths; `{wildcard}` is the job's value), or a
# function of (config, wildcards) giving them. A rule listed here is converted: its step reads
# its settings only (every rule with a step is: tests/plan/test_step_settings.py).
RULE_KEYS: dict[str, tuple[str, ...] | Callable[[Mapping, Mapping], tuple[str, ...]]] = {
    "signature": (),
    "forget_manifest": (),
    "compose": ("compose_weights",),
    "compose_private": (),
    "release": (),  # the DP models' records and metrics are its inputs
    "prepare": ("dataset", "seed"),
    "baseline_pixel_logreg": (*LABELS, "seed"),  # reads the target images only (their split is prepare's)
    # the methods' protocol on the target images: train block (less RUN_ONLY and augmentation) and lr grid
    "baseline_small_cnn": (*LABELS, "seed", "train.epochs", "train.batch_size", "train.weight_decay",
                           "train.schedule", "search.lrs"),
    "pretrain": (*LABELS, "seed", "backbone", "dataset.img_size", "dataset.in_chans", "dataset.pretrain_pool"),
    "features": ("seed", "features.dtype", "train.precision"),
    "evaluate_shards": _evaluate_shards,
    "evaluate_soup": _EVALUATED,
    "evaluate_private": _EVALUATED,
    "validate": (*_EVALUATED, "compose_weights"),  # a search candidate on the validation split (select.smk)
    "select": LABELS,  # the candidates are its `candidates` param; the rows its input files
    "validate_private": _EVALUATED,  # a DP search's candidate on the validation split
    "select_private": LABELS,  # as select; protocol, regime and ε are its `labels` param
    # training as steps/train.load_job: the train block (less RUN_ONLY), the method, the head seed;
    # the image size and channels for augmentation
    "train": _TRAINING,
    "train_vectorized": _TRAINING,  # one rule per method, N and seed: `{method}` is passed in as a wildcard
    "fusion_train": _TRAINING,
    "last_grid": (*_TRAINING, "dataset.source", "last_grid"),  # the grid's points vary the base method
    "fusion_match": lambda cfg, w: (*LABELS, "fusion.blocks", "fusion.match_ffn", *_head_permutation(cfg)),
    "fuse": lambda cfg, w: (*LABELS, "fusion.blocks", "fusion.match_ffn", *_head_permutation(cfg),
                            *{"fisher": ("fusion.fisher_samples",), "regmean": ("fusion.regmean_alpha",)}.get(
                                w["fusion"], ())),
    # the unlearning and ablation studies (steps/forget/, steps/ablation.py): training as the train step
    "unlearn_drop": _unlearn_drop,
    "unlearn_retrain": (*_STUDY, "train", "compose_weights"),  # retrains shards, recomposes as `compose`
    "unlearn_paragon": (*_STUDY, "train"),
    "unlearn_paragon_nonlinear": _nonlinear_paragon,
    "ablation": (*_STUDY, "train"),  # the variant's point is its `point` param
    "train_private": _private_training,  # its target ε is its `epsilon` param
    # the claims report's settings line and method order (reports/claims.py)
    "report": ("experiment", "dataset.source", "dataset.path", "dataset.img_size", "dataset.limit_per_class",
               "dataset.test_limit_per_class", "dataset.source_classes", "backbone.source", "backbone.timm_name", "backbone.checkpoint",
               "backbone.arch", "train.epochs", "train.batch_size", "train.lr", "shards", "seeds", "device",
               "methods"),
}


class SettingsError(KeyError):
    """A rule without settings, or a key it needs that the config lacks."""


VECTORIZED_RULE = "train_vectorized_"  # train_vectorized_{method}_n{N}_s{seed} (train.smk)


def settings_rule(rule: str) -> str:
    """The `RULE_KEYS` entry of a rule: the vectorized training rules share one."""
    return "train_vectorized" if rule.startswith(VECTORIZED_RULE) else rule


def converted(rule: str) -> bool:
    """Whether `rule`'s step reads its settings only (and is handed no config)."""
    return settings_rule(rule) in RULE_KEYS


def settings_for(rule: str, config: Mapping, wildcards: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings of one job of `rule`: the config's keys the rule reads, nested as in the
    config, with every mapping's keys sorted (so reordering the config reruns nothing).

    Args:
        rule: a rule of `RULE_KEYS`.
        config: the validated config.
        wildcards: the job's wildcards (for keys that name one, e.g. `methods.{method}`).
    """
    if not converted(rule):
        raise SettingsError(f"rule '{rule}' has no settings in pipeline_src/plan/step_settings.py")
    w = dict(wildcards.items()) if wildcards is not None else {}  # a Snakemake Wildcards is a list with items()
    keys = RULE_KEYS[settings_rule(rule)]
    paths = keys(config, w) if callable(keys) else keys
    out: dict[str, Any] = {}
    for path in paths:
        parts = path.format(**w).split(".")
        node: Any = config
        for i, part in enumerate(parts):
            if not isinstance(node, Mapping) or part not in node:
                raise SettingsError(f"rule '{rule}' reads config key '{'.'.join(parts[:i + 1])}', "
                                    "which the config lacks")
            node = node[part]
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = node
    return without(canonical(out), RUN_ONLY.values())  # a section read whole holds them (named leaves stay)


def without(tree: dict[str, Any], paths) -> dict[str, Any]:
    """`tree` (changed in place) without the values at dotted `paths` below its top level; also
    `DECLARED_ONLY`, which no job reads, and `NEUTRAL` keys at their neutral value.

    Args:
        tree: a (settings or config) mapping.
        paths: dotted config keys.
    """
    for path in (*paths, *DECLARED_ONLY, *NEUTRAL):
        *parents, leaf = path.split(".")
        node: Any = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if parents and isinstance(node, dict) and (path not in NEUTRAL or node.get(leaf, None) == NEUTRAL[path]):
            node.pop(leaf, None)
    return tree


def dataset_signature(config: Mapping) -> dict[str, Any]:
    """The `dataset:` section as the signatures of prepare and of the shard jobs' upstream files
    see it: without `DECLARED_ONLY` keys (nor `NEUTRAL` ones at their neutral value).

    Args:
        config: the validated config.
    """
    return without({"dataset": canonical(config["dataset"])}, ())["dataset"]


def job_config(settings: Mapping, runtime: Mapping) -> dict[str, Any]:
    """A job's settings with its `RUN_ONLY` values put back at their config keys: the part of the
    config the job reads, for code that takes a config (e.g. `job_settings.train_settings`).

    Args:
        settings: the job's settings (`settings_for`).
        runtime: its run-only settings (`run_only_settings`).
    """
    out = canonical(settings)
    for name, path in RUN_ONLY.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = runtime.get(name)
    return out


def run_only_settings(config: Mapping) -> dict[str, Any]:
    """The `RUN_ONLY` settings (`args.runtime`) of any job: a missing key is None.

    Args:
        config: the validated config.
    """
    out = {}
    for name, path in RUN_ONLY.items():
        node: Any = config
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        out[name] = node
    return out


def canonical(value: Any) -> Any:
    """`value` with every mapping a plain dict whose keys are sorted (lists keep their order)."""
    if isinstance(value, Mapping):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value
