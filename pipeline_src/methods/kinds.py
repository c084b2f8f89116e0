"""Facts about each method kind, without importing torch: the one place that branches on a
method's `kind` for the DAG, the studies and the steps (`kind ==` appears only in methods/).

Kinds (docs/methods.md): `fc` (the head; linear probing), `nlft` (last k blocks;
the non-linear baseline of TAFT), `full`, `taft` (a tangent model of the last k blocks; Liu,
Soatto et al., ICLR 2024) and `last` (a low-rank attention side network; Tang et al. 2024).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """What the pipeline needs to know about one kind.

    Args:
        name: the `kind` value in a method's config.
        required: config keys every method of the kind must set.
        tuned_blocks: the last `k` backbone blocks are tuned (k ≤ backbone depth).
        tangent: a linearized model: shard models compose exactly by the weighted sum of their
            Δw (around one shared linearization point), forget a shard by subtracting it, and
            may train all shards in one vectorized job.
        private: DP training is supported (the privacy study).
        fusable: the shard models have attention to match (the fusion study).
        side: a side network on the frozen backbone's block outputs (the LAST grid study's base).
        searched: the validation search covers it (`plan/search.py`; the TAFT paper's App. A: a
            learning-rate grid; tangent kinds also PT and CLS).
        reset_cls: a reset CLS token is a setting of the kind (`reset_cls`: CLS = T), so the search's
            CLS axis applies (TAFT's Table 4 chose CLS for TAFT-1 and NLFT-1).
        vectorized: all N shard models can train in one job, stacked over shards (`vectorized_shards`).
        auto_vectorized: `vectorized_shards: auto` may pick that job (measured: plan/vectorized.py).
    """

    name: str
    required: tuple[str, ...] = ()
    tuned_blocks: bool = False
    tangent: bool = False
    private: bool = False
    fusable: bool = False
    side: bool = False
    searched: bool = True
    reset_cls: bool = False
    vectorized: bool = False
    auto_vectorized: bool = False


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("fc", vectorized=True, auto_vectorized=True),
    Kind("nlft", required=("k",), tuned_blocks=True, private=True, fusable=True, reset_cls=True, vectorized=True,
         auto_vectorized=True),
    Kind("full"),
    Kind("taft", required=("k",), tuned_blocks=True, tangent=True, private=True, reset_cls=True, vectorized=True,
         auto_vectorized=True),
    Kind("last", required=("rank", "heads"), private=True, fusable=True, side=True, vectorized=True,
         auto_vectorized=True),
)}


# LAST's defaults of the DAG's `last` methods: the paper's g = 2 (one LSA block after every 2
# backbone blocks) and T = 2 modules per block (Tang et al. 2024); g must divide the depth.
LAST_DEFAULTS = {"every": 2, "modules_per_block": 2}


def kind_of(method_cfg: dict | str) -> Kind:
    """The facts of a method config's kind (or of a kind name)."""
    name = method_cfg if isinstance(method_cfg, str) else method_cfg["kind"]
    if name not in KINDS:
        raise ValueError(f"unknown method kind '{name}' (known: {sorted(KINDS)})")
    return KINDS[name]


def kinds_where(fact: str) -> tuple[str, ...]:
    """Names of the kinds with a fact set, e.g. `kinds_where("private")`."""
    return tuple(name for name, k in KINDS.items() if getattr(k, fact))


def feature_cache(method_cfg: dict) -> str | None:
    """Name of the frozen-feature cache the method trains from, or None (trains on images).

    `last{k}`: tokens entering the last k blocks (fc: k = 0; nlft/taft: their k);
    `blocks`: the embedding and every block's output (LAST side networks).
    """
    kind = kind_of(method_cfg)
    if kind.name == "full":
        return None
    if kind.side:
        return "blocks"
    return f"last{method_cfg['k'] if kind.tuned_blocks else 0}"


def method_errors(name: str, method_cfg: dict, depth: int | None) -> list[tuple[str, str]]:
    """Problems of one method's settings, as (config key, message); [] when it is fine.

    Args:
        name: the method's name in `methods:`.
        method_cfg: its settings (the schema has checked types and allowed keys).
        depth: the backbone's depth when known at parse time (the embedded ViT), else None.
    """
    kind = kind_of(method_cfg)
    for key in kind.required:
        if key not in method_cfg:
            return [(f"methods.{name}.{key}", f"required for kind '{kind.name}'")]
    if kind.side:
        if method_cfg["rank"] % method_cfg["heads"]:
            return [(f"methods.{name}.heads", f"must divide rank {method_cfg['rank']}")]
        every = method_cfg.get("every", LAST_DEFAULTS["every"])
        if depth is not None and depth % every:
            return [(f"methods.{name}.every", f"{every} must divide backbone depth {depth}"
                     + ("" if "every" in method_cfg else " (the default g = 2 is LAST's; set every: 1)"))]
    if kind.tuned_blocks and depth is not None and method_cfg["k"] > depth:
        return [(f"methods.{name}.k", f"{method_cfg['k']} exceeds backbone depth {depth}")]
    return []


def matchable_blocks(method_cfg: dict, depth: int | None) -> int | None:
    """How many blocks the fusion study's matching can touch (nlft: k; last: its LSA blocks),
    None when unknown at parse time (a timm or checkpoint backbone's depth)."""
    kind = kind_of(method_cfg)
    if kind.tuned_blocks:
        return method_cfg["k"]
    if depth is None:
        return None
    return depth // method_cfg.get("every", LAST_DEFAULTS["every"])


def nonlinear_counterpart(method_cfg: dict) -> dict | None:
    """The non-linear model a linearized method stands for, whose retraining from scratch is the
    TAFT paper's forgetting paragon (Liu, Soatto et al., ICLR 2024, App. C.3): taft-k → nlft-k.
    None for a kind that is not linearized (its own retraining is the paragon).

    Args:
        method_cfg: a method's settings.
    """
    if not kind_of(method_cfg).tangent:
        return None
    return {"kind": "nlft", "k": method_cfg["k"]}


def is_counterpart(method_cfg: dict, counterpart: dict) -> bool:
    """Whether `method_cfg` is a method of the counterpart's kind and k (any other settings)."""
    return method_cfg["kind"] == counterpart["kind"] and method_cfg.get("k") == counterpart.get("k")


def matches_ffn(method_cfg: dict | str) -> bool:
    """Whether matching permutes FFN hidden units too: only models that tune whole blocks have FFNs."""
    return kind_of(method_cfg).tuned_blocks
