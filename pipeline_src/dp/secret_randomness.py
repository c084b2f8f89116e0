"""Secret randomness for DP-SGD: the noise and the Poisson sampling must be unpredictable to
whoever holds the released files (Abadi et al. 2016, "Deep learning with differential privacy":
the guarantee is over the mechanism's coins, so coins the attacker can replay give none).

Each generator is seeded from the OS's cryptographic randomness (`secrets.randbits(64)`) and the
seed is never returned, logged or recorded. Noise and sampling get separate generators, so the
noise never reveals which samples were drawn. This is PyTorch's generator (Mersenne Twister on
the CPU, Philox on CUDA) behind a secret 64-bit seed, not a CSPRNG stream: Opacus'
`secure_mode` needs torchcsprng, which has no build for current torch. What stays reproducible
is everything non-private: the data split, sharding, init and the configs.
"""
from __future__ import annotations

import secrets

import torch


def secret_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh generator on `device`, seeded from the OS's CSPRNG; its seed is not kept anywhere.

    Args:
        device: where the generator draws (CUDA noise needs a CUDA generator).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(64))
    return gen
