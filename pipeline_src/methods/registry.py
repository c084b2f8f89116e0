"""The fine-tuning methods of the DAG, by `kind` (the `methods.<name>.kind` config key).

Each method builds a *tuned model* from the backbone: an `nn.Module` with
`prefix(x)` (frozen, cacheable features), `forward_from_prefix(h)` (logits),
`trainable_state()` and `load_trainable_state(state)`, and trains it with its own `train`
function. Training, caching, composition and evaluation only use that interface.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.data.throughput import Throughput
from pipeline_src.last.features import BlockBatches, block_outputs, extract_features
from pipeline_src.last.train import build_side_network, train_side_network
from pipeline_src.methods.kinds import LAST_DEFAULTS
from pipeline_src.methods.nonlinear import TailFineTune
from pipeline_src.methods.training import cross_entropy, fit
from pipeline_src.taft.tangent_vit import TangentViT
from pipeline_src.taft.train import train_tangent
from pipeline_src.vit.parts import reinit_all, reset_head


class TunedModel(Protocol):
    def prefix(self, x: torch.Tensor) -> torch.Tensor: ...
    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor: ...
    def trainable_state(self) -> dict[str, torch.Tensor]: ...
    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None: ...


TrainFn = Callable[[TunedModel, torch.Tensor, torch.Tensor, dict, int, str], dict]


@dataclass(frozen=True)
class Method:
    """A registered fine-tuning method.

    Args:
        kind: the config's `kind`.
        build: (backbone copy with the downstream head, method config) → tuned model.
        train: (model, prefix features, labels, settings, seed, description) → stats; the features are a
            tensor or a source that makes them per batch (`len`, `.device`, `features[idx]`: `CachedRows`).
        paper: the method's reference.
    """

    kind: str
    build: Callable[[VisionTransformer, dict], TunedModel]
    train: TrainFn
    paper: str


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> None:
    """Add a method; a second method of the same kind is refused."""
    if method.kind in METHODS:
        raise ValueError(f"method kind '{method.kind}' is already registered")
    METHODS[method.kind] = method


def get_method(kind: str) -> Method:
    try:
        return METHODS[kind]
    except KeyError:
        raise ValueError(f"unknown method kind '{kind}'; known: {sorted(METHODS)}") from None


def build_tuned_model(backbone: VisionTransformer, method_cfg: dict, num_classes: int, seed: int) -> TunedModel:
    """A fresh tuned model: a copy of the backbone, a seeded downstream head, the method's wrapper.

    `seed` (a run's `job_settings.init_seed`, recorded as `head_seed`) draws every random init of the
    model: the head, the from-scratch weights, TAFT's PT = F reset and reset CLS token, and the LAST
    side network unless its `init_seed` is set. Equal seeds give equal models, so a record replays.
    """
    model = copy.deepcopy(backbone)
    if method_cfg.get("init") == "random":  # `full` from scratch: the architecture, none of the pretraining
        reinit_all(model, seed)
    reset_head(model, num_classes, seed)
    return get_method(method_cfg["kind"]).build(model, {"init_seed": seed, **method_cfg})


# ---------------------------------------------------------------- non-linear baselines
def train_cross_entropy(model: TunedModel, features, labels, settings: dict, seed: int, desc: str) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    return fit(model.forward_from_prefix, params, features, labels, epochs=settings["epochs"],
               batch_size=settings["batch_size"], lr=settings["lr"], weight_decay=settings["weight_decay"],
               seed=seed, loss_fn=cross_entropy, desc=desc, schedule=settings.get("schedule"))


register_method(Method(
    "fc", lambda m, c: TailFineTune(m, k=0), train_cross_entropy,
    "Linear probing (head only)."))
register_method(Method(
    "nlft", lambda m, c: TailFineTune(m, k=c["k"], reset_cls=c.get("reset_cls", False), seed=c.get("init_seed", 0)),
    train_cross_entropy,
    "Non-linear fine-tuning of the last k blocks (Liu & Soatto et al., ICLR 2024, Table 1)."))
register_method(Method(
    "full", lambda m, c: TailFineTune(m, k=len(m.blocks), full=True), train_cross_entropy,
    "Full fine-tuning."))


# ---------------------------------------------------------------- tangent transformers
class TangentTuned(TangentViT):
    """A `TangentViT` seen through the tuned-model interface: its trained state is Δw."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return self.delta_state_dict()

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        self.load_delta_state_dict(state)


TAFT_DEFAULTS = {"reset": False, "reset_cls": False, "jvp_only": False, "loss": "rsl", "alpha": None,
                 "kappa": None, "l2": 1e-5, "radius": None}  # alpha/kappa None: RSL's own defaults (1, 15)


def taft_options(cfg: dict) -> dict:
    return {**TAFT_DEFAULTS, **{k: v for k, v in cfg.items() if k in TAFT_DEFAULTS}}


def build_taft(model: VisionTransformer, cfg: dict) -> TangentTuned:
    o = taft_options(cfg)
    # The reset seed is the run's init seed (not the shard's), so every shard of a run shares one
    # linearization point; 0 where the builder passes none.
    return TangentTuned(model, k=cfg["k"], reset=o["reset"], reset_seed=cfg.get("init_seed", 0), reset_cls=o["reset_cls"],
                        jvp_only=o["jvp_only"])


def train_taft(model: TangentTuned, features, labels, settings: dict, seed: int, desc: str) -> dict:
    o = taft_options(settings["method"])
    meter = Throughput(desc)
    out = train_tangent(model, features, labels, epochs=settings["epochs"], batch_size=settings["batch_size"],
                        lr=settings["lr"], weight_decay_l2=o["l2"], loss=o["loss"], alpha=o["alpha"],
                        kappa=o["kappa"], radius=o["radius"], seed=seed, schedule=settings.get("schedule"),
                        progress=lambda e, loss: meter.epoch(e, settings["epochs"], len(labels), loss))
    return {"train_loss": out["loss_history"][-1], "steps": out["steps"], "linearization_id": model.linearization_id()}


register_method(Method(
    "taft", build_taft, train_taft,
    "Tangent transformers (Liu, Soatto et al., 'Tangent Transformers for Composition, Privacy and Removal', ICLR 2024)."))


# ---------------------------------------------------------------- LAST side networks
LAST_KEYS = ("rank", "heads", "every", "modules_per_block", "bias_correction", "zero_init_up", "ffn_hidden", "init_seed")


class SideTuned(nn.Module):
    """A frozen backbone plus a LAST side network, seen through the tuned-model interface.

    The prefix is the stack of the block outputs the side network reads, z_0, z_g, ..., z_depth
    (B, depth / g + 1, N, D; `cache_blocks` are their backbone block indices), computed under
    no_grad or read from the `blocks` feature cache.
    """

    def __init__(self, backbone: VisionTransformer, cfg: dict) -> None:
        super().__init__()
        self.backbone = backbone.requires_grad_(False).eval()
        self.member = {**LAST_DEFAULTS, **{k: cfg[k] for k in LAST_KEYS if k in cfg and k != "init_seed"}}
        # One init seed for every shard of a run (the run's init seed, `build_tuned_model`, unless the
        # method sets its own): side networks of one run start from the same point.
        self.member["seed"] = cfg.get("init_seed", 0)
        self.side = build_side_network(backbone, self.member, num_classes=backbone.num_classes)
        self.cache_blocks = list(range(0, self.side.depth + 1, self.side.every))  # z_0, z_g, ..., z_depth

    @torch.no_grad()
    def prefix_blocks(self, x: torch.Tensor, blocks: list[int]) -> torch.Tensor:
        """The outputs of these backbone blocks (0 = embedding), stacked: (B, len(blocks), N, D)."""
        return block_outputs(self.backbone, x, blocks)

    @torch.no_grad()
    def prefix(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack(extract_features(self.backbone, x, every=self.side.every), dim=1)

    def _inputs(self, h: torch.Tensor) -> list[torch.Tensor]:
        if h.shape[1] != len(self.cache_blocks):
            raise ValueError(f"LAST (every={self.side.every}): prefix features hold {h.shape[1]} block outputs, "
                             f"expected blocks {self.cache_blocks}; read a blocks cache with "
                             "load_rows(..., model=...)")
        return list(h.unbind(1))  # (B, N, D) each

    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor:
        return self.side(self._inputs(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_from_prefix(self.prefix(x))

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.side.state_dict().items()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        self.side.load_state_dict(state)


def train_last(model: SideTuned, features, labels, settings: dict, seed: int, desc: str) -> dict:
    member = {**model.member, "lr": settings["lr"], "weight_decay": settings["weight_decay"]}
    # (n, blocks, N, D) stacked: a tensor, or `CachedRows` read one batch at a time (split per block)
    feats = BlockBatches(features, model.cache_blocks)
    meter, steps_per_epoch = Throughput(desc), -(-len(labels) // settings["batch_size"])

    def progress(epoch: int, step: int, loss: torch.Tensor) -> None:
        if (step + 1) % steps_per_epoch == 0:  # an epoch's last step (the loss is that batch's)
            meter.epoch(epoch, settings["epochs"], len(labels), loss.item())

    state = train_side_network(model.backbone, feats, labels, member, num_classes=model.backbone.num_classes,
                               epochs=settings["epochs"], batch_size=settings["batch_size"], seed=seed,
                               progress=progress, schedule=settings.get("schedule"))
    model.load_trainable_state(state)
    loss = first_samples_loss(model, features, labels, settings["batch_size"])
    print(f"{desc}: final training loss (first 512 samples) {loss:.4f}", flush=True)
    return {"train_loss": loss}


@torch.no_grad()
def first_samples_loss(model: TunedModel, features, labels: torch.Tensor, batch_size: int, n: int = 512) -> float:
    """Mean cross-entropy of the model on the first `n` training samples, a training batch at a
    time (the job's memory stays that of one batch): LAST's reported training loss.

    Args:
        model: the trained tuned model.
        features, labels: its training data (features index like a tensor).
        batch_size: samples per forward.
        n: samples scored (fewer when the shard is smaller).
    """
    n, b = min(n, len(labels)), batch_size
    return sum(F.cross_entropy(model.forward_from_prefix(features[torch.arange(s, min(s + b, n))]),
                               labels[s:min(s + b, n)], reduction="sum").item() for s in range(0, n, b)) / n


register_method(Method(
    "last", SideTuned, train_last,
    "Low-rank attention side-tuning (Tang, Fu, Zhu, Wu, 'Low-Rank Attention Side-Tuning for Parameter-Efficient Fine-Tuning', 2024)."))
