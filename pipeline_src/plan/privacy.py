"""The `privacy:` section of a study config: which DP jobs exist, and semantic checks that
fail at validation time, before any job, naming the offending key.

DP-SGD budgets (Abadi et al. 2016, "Deep learning with differential privacy") as in the
TAFT paper's DP study (Liu & Soatto et al. 2024, "Tangent Transformers for Composition,
Privacy and Removal", §3.4, Table 3). The same budget is planned again, exactly, by
`pipeline_src.dp.budget.plan_budget` in each training job (with Opacus). Here the RDP accountant
is `plan/rdp_accountant.py` (numpy and scipy, checked against Opacus to 1e-9), so building the DAG
imports no torch; only a study with `privacy.accountant: prv` imports Opacus (and torch) here.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from pipeline_src.methods.kinds import kind_of, kinds_where
from pipeline_src.plan.cache import cached, package_version
from pipeline_src.plan.errors import ConfigError
from pipeline_src.plan.rdp_accountant import INTEGER_ORDERS, LARGEST_SIGMA_TRIED, epsilon
from pipeline_src.plan.search import is_variant
from pipeline_src.plan.section_seeds import section_seeds

DP_KINDS = kinds_where("private")
# Opacus' get_noise_multiplier (and rdp_accountant.noise_multiplier) doubles σ from 20 and gives up
# past 1e6, so the largest σ it tries is LARGEST_SIGMA_TRIED = 20·2^15: the target is feasible iff
# ε at that σ is within it.


def _error(key: str, message: str) -> Exception:
    return ConfigError(f"config key '{key}': {message}")


def epsilon_label(epsilon: float) -> str:
    """How a target ε appears in paths and wildcards (`eps{label}`): 1 → '1', 0.5 → '0.5'."""
    return f"{float(epsilon):g}"


def privacy_methods(cfg: dict) -> list[str]:
    """The study's methods: `privacy.methods`, or every method of a DP kind when it is empty."""
    names = cfg["privacy"]["methods"]
    return list(names) if names else [n for n, m in cfg["methods"].items()
                                      if kind_of(m).private and not is_variant(cfg, n)]


PROTOCOLS = ("ours", "paper")
DP_SETTINGS = ("delta", "max_grad_norm", "epochs", "batch_size", "lr", "accountant", "mode", "train_head")


def privacy_jobs(cfg: dict) -> list[tuple[str, str, str]]:
    """(protocol, method, regime) of every DP job family: `privacy.protocol` for every method x
    regime, plus the paper protocol for `privacy.paper.methods` x `privacy.paper.regimes`."""
    p = cfg["privacy"]
    jobs = [(p["protocol"], m, r) for m in privacy_methods(cfg) for r in p["regimes"]]
    jobs += [("paper", m, r) for m in p["paper"]["methods"] for r in p["paper"]["regimes"]]
    return list(dict.fromkeys(jobs))


def dp_settings(cfg: dict, protocol: str) -> dict:
    """The DP training settings of a protocol (recorded with each model, part of its signature).

    ours: Poisson DP-SGD with `privacy.{epochs,batch_size,lr}`. paper (TAFT paper, App. A):
    full-batch DP-GD (q = 1, one noisy step per epoch) for `privacy.paper.epochs` at
    `privacy.paper.lr` (or `privacy.lr`), no decay, in micro-batches of `micro_batch_size`
    (`privacy.paper.micro_batch_size`, else `privacy.batch_size`: memory only).
    """
    p = cfg["privacy"]
    out = {k: p[k] for k in DP_SETTINGS}
    if protocol == "paper":
        paper = p["paper"]
        out.update(epochs=paper["epochs"], lr=p["lr"] if paper["lr"] is None else paper["lr"], full_batch=True,
                   micro_batch_size=paper.get("micro_batch_size") or p["batch_size"])
    elif protocol != "ours":
        raise ValueError(f"unknown DP protocol {protocol!r}; choose one of {PROTOCOLS}")
    return {**out, "protocol": protocol}


def jvp_only_applies(method_cfg: dict, protocol: str) -> bool:
    """Whether `privacy.jvp_only` changes what a DP job of this method and protocol trains
    (`dp_method_config`): a tangent method under protocol ours (the paper's always predicts from J·Δw)."""
    return kind_of(method_cfg).tangent and protocol != "paper"


def target_epsilon(cfg: dict, label: str) -> float:
    """The configured ε whose path label is `label` (a wildcard naming no configured ε is refused).

    Args:
        cfg: the validated config.
        label: the `eps` wildcard (`epsilon_label`).
    """
    for eps in cfg["privacy"]["epsilons"]:
        if epsilon_label(eps) == label:
            return float(eps)
    raise ValueError(f"epsilon wildcard 'eps{label}' matches none of config key 'privacy.epsilons' "
                     f"{cfg['privacy']['epsilons']}")


def dp_method_config(method_cfg: dict, protocol: str, jvp_only: bool | None) -> dict:
    """The method config a DP job trains and records. ours: `privacy.jvp_only` overrides a
    tangent method's own unless None. paper (TAFT App. A: "the standard cross entropy loss",
    "we predict only using the JVP output"): a tangent method predicts from J·Δw only, with
    cross-entropy; other kinds train with cross-entropy already.

    Args:
        method_cfg: the method's entry in `methods:`.
        protocol: ours | paper.
        jvp_only: `privacy.jvp_only`.
    """
    cfg = dict(method_cfg)
    if not kind_of(cfg).tangent:
        return cfg
    if protocol == "paper":
        for key in ("alpha", "kappa"):  # RSL-only options
            cfg.pop(key, None)
        return {**cfg, "jvp_only": True, "loss": "ce"}
    if jvp_only is not None:
        cfg["jvp_only"] = bool(jvp_only)
    return cfg


def public_shard_size(cfg: dict, shards: int) -> int:
    """n̄ of one shard of an N-way split: floor(privacy.public_train_size / N), a public number.

    Raises:
        ConfigError: `privacy.public_train_size` is not set, or leaves a shard empty.
    """
    total = cfg["privacy"].get("public_train_size")
    if total is None:
        raise _error("privacy.public_train_size", "required when privacy.enabled: a public count of the target "
                     "training split (declared, e.g. from the dataset card, rounded; never counted from the data). "
                     "DP jobs plan their sampling rate, steps and normaliser from it, because whatever they plan is "
                     "released with the model, and the true size tells D from D ± 1")
    if total // shards < 1:
        raise _error("privacy.public_train_size", f"{total} / {shards} shards leaves a public shard size of 0")
    return total // shards


def shard_sizes(cfg: dict, shards: int) -> list[int]:
    """The distinct sizes of the `shards`-way split's shards over every seed of the study
    (`pipeline_src.plan.sharding`: keyed-hash shards, balanced in expectation only)."""
    from pipeline_src.plan.forget import samples_table, train_ids
    from pipeline_src.plan.sharding import shard_manifest
    from pipeline_src.plan.sharding import shard_sizes as sizes_of

    train = train_ids(samples_table(cfg))
    return sorted({s for seed in section_seeds(cfg, "privacy") for s in sizes_of(shard_manifest(train, shards, seed), shards)})


def check_privacy_config(cfg: dict, n_train: int | None, cache_dir: str | Path | None = None) -> None:
    """Semantic checks of `privacy:` (the schema has checked types and ranges).

    Args:
        cfg: the validated config, defaults filled in.
        n_train: size of the target training split, or None when it was not counted
            (then only the checks that do not need it run).
        cache_dir: where a passed budget check is remembered (`plan/cache.py`: the
            accountant costs seconds per dry run), or None.
    Raises:
        ConfigError: naming the key, e.g. `privacy.methods[1]`, `privacy.delta`,
            `privacy.epsilons[0]` (no noise multiplier reaches it in the planned steps).
    """
    p = cfg["privacy"]
    for i, name in enumerate(p["methods"]):
        if name not in cfg["methods"]:
            raise _error(f"privacy.methods[{i}]", f"'{name}' is not a method in `methods:` ({sorted(cfg['methods'])})")
        kind = cfg["methods"][name]["kind"]
        if not kind_of(kind).private:
            raise _error(f"privacy.methods[{i}]", f"'{name}' has kind '{kind}'; DP training supports kinds {DP_KINDS}")
    for i, name in enumerate(p["paper"]["methods"]):
        if name not in privacy_methods(cfg):
            raise _error(f"privacy.paper.methods[{i}]", f"'{name}' is not a method of the privacy study "
                         f"({privacy_methods(cfg)})")
    paper_used = p["protocol"] == "paper" or bool(p["paper"]["methods"])
    if paper_used and p["mode"] != "bk":
        raise _error("privacy.mode", f"'{p['mode']}': the paper protocol (full-batch DP-GD, accumulated over "
                     f"micro-batches) needs mode 'bk'")
    labels = [epsilon_label(e) for e in p["epsilons"]]
    if len(set(labels)) != len(labels):
        raise _error("privacy.epsilons", f"values {p['epsilons']} collide in paths as {labels}")
    if not p["enabled"]:
        return
    if not privacy_methods(cfg):
        raise _error("privacy.methods", f"empty, and `methods:` has no method of kind {DP_KINDS}")
    public_shard_size(cfg, 1)  # refuses a missing privacy.public_train_size, naming it
    pool = cfg["dataset"].get("pretrain_pool")
    if pool and not pool.get("public"):  # the release ships the backbone: trained without DP on the pool
        raise _error("dataset.pretrain_pool.public", "a DP study's release ships the backbone, trained WITHOUT "
                     "differential privacy on the pretraining pool, a share of this dataset's training split. "
                     "Declare the pool public (dataset.pretrain_pool.public: true; no DP guarantee covers its "
                     "images, docs/privacy.md) or pretrain on other data")
    for j, n in enumerate(p["shards"]):
        if n > p["public_train_size"] or (n_train is not None and n > n_train):
            raise _error(f"privacy.shards[{j}]", f"{n} shards but only {p['public_train_size']} public "
                         f"(privacy.public_train_size) / {n_train} training samples")
    public = {n: public_shard_size(cfg, n) for n in p["shards"]}
    if not p["delta"] < 1.0 / p["public_train_size"]:
        raise _error("privacy.delta", f"{p['delta']} must be below 1/n̄ = {1.0 / p['public_train_size']:.3g} "
                     f"(privacy.public_train_size); otherwise releasing one sample whole meets the guarantee")
    for j, n in enumerate(p["shards"]):
        if p["protocol"] == "ours" and p["batch_size"] > public[n]:
            raise _error("privacy.batch_size", f"{p['batch_size']} exceeds the public shard size {public[n]} "
                         f"(privacy.public_train_size / privacy.shards[{j}] = {n}): the sampling rate would exceed 1")
    if n_train is None:
        return
    if not 0.5 <= p["public_train_size"] / n_train <= 2:
        raise _error("privacy.public_train_size", f"{p['public_train_size']} is far from the training split's "
                     f"{n_train} samples (this message stays in your workspace); DP training would run "
                     f"{n_train / p['public_train_size']:.2g}x the planned epochs. Declare a public count near it")
    for j, n in enumerate(p["shards"]):
        try:
            shard_sizes(cfg, n)
        except ValueError as e:  # a shard left empty
            raise _error(f"privacy.shards[{j}]", str(e)) from None
    here = Path(__file__).parent
    key = {"privacy": p, "opacus": package_version("opacus"),
           "code": [hashlib.sha256((here / f).read_bytes()).hexdigest() for f in ("privacy.py", "rdp_accountant.py")]}
    cached(cache_dir, "privacy_budgets", key, lambda: _check_budgets(p, public, paper_used) or "feasible")


def _least_epsilon(accountant: str, sample_rate: float, steps: int, delta: float) -> tuple[float, str]:
    """The least ε any σ the planner tries reaches in `steps` steps (ε at the largest σ), and why it
    is infinite when the accountant fails there. rdp: `plan/rdp_accountant.py` (no torch); prv:
    Opacus' PRV accountant, which imports torch (no torch-free PRV here)."""
    try:
        if accountant == "rdp":
            return epsilon(sigma=LARGEST_SIGMA_TRIED, sample_rate=sample_rate, steps=steps, delta=delta), ""
        from opacus.accountants import create_accountant

        acc = create_accountant(mechanism=accountant)
        acc.history = [(LARGEST_SIGMA_TRIED, sample_rate, steps)]
        return float(acc.get_epsilon(delta=delta)), ""
    except Exception as e:  # an accountant failing at this σ cannot plan it either
        return float("inf"), f" ({type(e).__name__}: {e})"


def _integer_order_epsilon(sample_rate: float, steps: int, delta: float) -> float:
    """RDP ε at the largest σ over the integer orders only: an upper bound of `_least_epsilon`
    (a subset of orders can only raise the minimum), cheaper than the fractional orders' series,
    so a reachable target needs no exact floor."""
    return epsilon(sigma=LARGEST_SIGMA_TRIED, sample_rate=sample_rate, steps=steps, delta=delta,
                   orders=INTEGER_ORDERS)


def _check_budgets(p: dict, public: dict[int, int], paper_used: bool) -> None:
    """Every (ε, public shard size n̄) must be reachable by some σ within the planned steps."""
    # (steps per epoch, epochs, N): ours as pipeline_src.dp.budget.steps_per_epoch, ceil(n̄ / batch_size)
    # at rate 1/that; the paper protocol one full-batch step per epoch (rate 1)
    plans = set()
    if p["protocol"] == "ours":
        plans |= {(-(-public[n] // p["batch_size"]), p["epochs"], n) for n in p["shards"]}
    if paper_used:
        plans |= {(1, p["paper"]["epochs"], n) for n in p["shards"]}
    floors, bounds = {}, {}  # (steps per epoch, steps) -> least ε (and an upper bound): independent of the target
    for i, eps in enumerate(p["epsilons"]):
        for spe, epochs, n in sorted(plans):
            steps = spe * epochs
            if p["accountant"] == "rdp":
                if (spe, steps) not in bounds:
                    bounds[spe, steps] = _integer_order_epsilon(1.0 / spe, steps, p["delta"])
                if bounds[spe, steps] <= eps:
                    continue  # reachable: the exact floor is lower still
            if (spe, steps) not in floors:
                floors[spe, steps] = _least_epsilon(p["accountant"], 1.0 / spe, steps, p["delta"])
            floor, why = floors[spe, steps]
            if floor > eps:
                raise _error(f"privacy.epsilons[{i}]", f"ε = {eps} is infeasible: no noise multiplier up to "
                             f"{LARGEST_SIGMA_TRIED:g} reaches it with δ = {p['delta']} in {steps} steps at sampling "
                             f"rate {1.0 / spe:.4g} (privacy.shards N = {n}, {p['accountant']} accountant; "
                             f"the least ε reachable is {floor:.3g}){why}")


def private_evaluation_targets(cfg: dict, results: str) -> list[str]:
    """Every metrics file of the privacy study: each DP shard model, and for N > 1 the Δw sum
    (taft) or the ensemble (other kinds) of the shards. Listed whether or not the study is enabled
    (the `privacy` target); `all` takes them only when it is.

    Args:
        cfg: the validated config.
        results: the results folder.
    """
    p = cfg["privacy"]
    out = []
    for protocol, m, regime in privacy_jobs(cfg):
        composed = "soup" if kind_of(cfg["methods"][m]).tangent else "ensemble"
        for eps in p["epsilons"]:
            for n in p["shards"]:
                for s in section_seeds(cfg, "privacy"):
                    base = f"{results}/metrics/private/{protocol}/{m}/{regime}/eps{epsilon_label(eps)}/n{n}_s{s}"
                    out += [f"{base}/shard{i}.parquet" for i in range(n)]
                    if n > 1:
                        out.append(f"{base}/{composed}.parquet")
    return out


def release_model_files(metrics: list[str], results: str) -> list[str]:
    """Every DP model file (weights and record) behind the study's DP metrics files: what the
    `release` rule exports and reports on (an ensemble's are its shards).

    Args:
        metrics: `private_evaluation_targets(cfg, results)`.
        results: the results folder.
    """
    out = set()
    for m in metrics:
        base, name = os.path.split(m.replace(f"{results}/metrics/private/", f"{results}/private/", 1))
        stem = name.removesuffix(".parquet")
        if stem == "ensemble":
            n = int(re.search(r"n(\d+)_s\d+$", base).group(1))
            names = [f"shard{i}" for i in range(n)]
        else:
            names = [stem]
        out.update(f"{base}/{s}.{ext}" for s in names for ext in ("safetensors", "json"))
    return sorted(out)
