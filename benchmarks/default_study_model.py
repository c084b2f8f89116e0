"""The default study's ViT and a random training set of its size, for the benchmarks that time its
training loops (`bench_optimizer.py`, `bench_flop_counter.py`, `bench_taft_step.py`), and
`interleaved_epoch_ms`, which times the epochs of `bench_optimizer.py` and `bench_taft_step.py`.

The architecture is `config.yaml`'s `backbone.arch`, built as the `pretrain` step builds it
(`data/backbone.embedded_vit_kwargs`), so the benchmarks follow the config when it changes.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_TRAIN = 527  # the default study's target training split (digits 5-9)


def default_vit_and_data(images: int = TARGET_TRAIN, seed: int = 0):
    """(ViT with random weights, images (n, C, H, W), labels (n,)), all drawn after `torch.manual_seed(seed)`.

    Args:
        images: how many random images (and labels over the 5 target classes).
        seed: torch's seed, set first.
    """
    import torch
    import yaml
    from timm.models.vision_transformer import VisionTransformer

    from pipeline_src.data.backbone import embedded_vit_kwargs
    from pipeline_src.plan.config import validate_config

    cfg = validate_config(yaml.safe_load((REPO / "config.yaml").read_text()), count_samples=False)
    kwargs = embedded_vit_kwargs(cfg, num_classes=5)
    torch.manual_seed(seed)
    vit = VisionTransformer(**kwargs)
    x = torch.randn(images, kwargs["in_chans"], kwargs["img_size"], kwargs["img_size"])
    return vit, x, torch.randint(0, kwargs["num_classes"], (images,))


def interleaved_epoch_ms(steps: dict, images: int, epochs: int, batch: int = 32) -> dict[str, list[float]]:
    """CPU ms per epoch of each way's training step, the ways interleaved epoch by epoch in this
    process (the machine's drifting speed reaches each alike); the first epoch warms up, untimed.

    Args:
        steps: way -> `step(idx)`, one optimizer step on the images at `idx`.
        images: the training set's size; each epoch visits it in a seeded order, the same for every way.
        epochs: timed epochs.
        batch: images per step.
    """
    import time

    import torch

    times: dict[str, list[float]] = {way: [] for way in steps}
    for epoch in range(epochs + 1):
        for way, step in steps.items():
            order = torch.randperm(images, generator=torch.Generator().manual_seed(epoch))
            t = time.process_time()
            for start in range(0, images, batch):
                step(order[start:start + batch])
            if epoch:
                times[way].append((time.process_time() - t) * 1000)
    return times
