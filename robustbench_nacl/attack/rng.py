"""Random draws of attacks: uniform and normal noise from a generator, integer seeds for libraries,
stable seeds derived from a run's seed (:func:`derive_seed`), and torch's global RNG forked around
libraries that reseed it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from ..io import canonical_json


def rand(like: Tensor, gen: torch.Generator | None, shape: Sequence[int] | None = None) -> Tensor:
    """Uniform [0,1) noise (shaped like ``like`` by default), drawn on the generator's device."""
    dev = gen.device if gen is not None else like.device
    size = tuple(like.shape if shape is None else shape)
    return torch.rand(size, generator=gen, device=dev, dtype=like.dtype).to(like.device)


def randn(like: Tensor, gen: torch.Generator | None) -> Tensor:
    """Standard normal noise shaped like ``like``, drawn on the generator's device."""
    dev = gen.device if gen is not None else like.device
    return torch.randn(like.shape, generator=gen, device=dev, dtype=like.dtype).to(like.device)


def derive_seed(seed: int, *parts: Any) -> int:
    """A stable 60-bit seed from ``seed`` and JSON-able ``parts`` (independent of Python's hash salt)."""
    return int(hashlib.sha256(canonical_json([seed, *parts]).encode()).hexdigest()[:15], 16)


def seed_from(gen: torch.Generator | None) -> int:
    """A 31-bit seed drawn from ``gen`` (for libraries that only take an integer seed)."""
    dev = gen.device if gen is not None else "cpu"
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=dev).item())


def fork_rng(device: torch.device) -> AbstractContextManager[Any]:
    """Torch's global RNG (and ``device``'s, on CUDA) restored on exit."""
    # pyautoattack and torchattacks reseed torch's global RNG: keep the caller's stream intact.
    cuda = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda)
