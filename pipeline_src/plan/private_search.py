"""The paper's DP search (PT ∈ {T, F}) in the privacy study: which DP models are validated and
which selections exist (`workflow/rules/select.smk`). The PT points themselves are methods added
by `plan/search.py` (`dp_only`); the DP jobs are the privacy study's (`plan/privacy.py`).
Selection per protocol, taft method, regime and ε, on the DP models' validation accuracy. Torch-free.
"""
from __future__ import annotations

from pipeline_src.plan.privacy import epsilon_label, privacy_jobs
from pipeline_src.plan.search import dp_candidates
from pipeline_src.plan.section_seeds import section_seeds


def private_searched(cfg: dict) -> list[str]:
    """The taft methods of the privacy study whose PT is searched (their other PT is a method)."""
    variants = cfg["search"].get("variants") or {}
    return list(dict.fromkeys(v["base"] for v in variants.values() if v.get("dp_only")))


def private_selections(cfg: dict) -> list[tuple[str, str, str, str]]:
    """(protocol, method, regime, ε label) of every DP selection, in the study's job order."""
    bases = set(private_searched(cfg))
    return [(protocol, m, regime, epsilon_label(e)) for protocol, m, regime in privacy_jobs(cfg) if m in bases
            for e in cfg["privacy"]["epsilons"]]


def private_validation_targets(cfg: dict, results: str, protocol: str, method: str, regime: str,
                               eps: str) -> list[str]:
    """The validation metrics files one DP selection reads: each PT point's DP model (shard 0 at
    N = 1, the Δw sum at N > 1) at every privacy shard count and seed."""
    out = []
    for c in dp_candidates(cfg, method):
        for n in cfg["privacy"]["shards"]:
            model = "shard0" if n == 1 else "soup"
            out += [f"{results}/validate_private/{protocol}/{c['name']}/{regime}/eps{eps}/n{n}_s{s}/{model}.parquet"
                    for s in section_seeds(cfg, "privacy")]
    return out


def private_selection_targets(cfg: dict, results: str) -> list[str]:
    """The `select_private` outputs of the study (empty without search or privacy study)."""
    if not (cfg["search"]["enabled"] and cfg["privacy"]["enabled"]):
        return []
    return [f"{results}/select_private/{p}/{m}/{r}/eps{e}.parquet" for p, m, r, e in private_selections(cfg)]
