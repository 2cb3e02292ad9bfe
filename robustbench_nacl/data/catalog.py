"""The dataset registry: each dataset's name, loader and facts (classes, channels, size, how to get it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..registry import Registry

__all__ = ["DATASETS", "SPLITS", "Loader", "dataset_names"]

SPLITS = ("train", "test")

Loader = Callable[[Path, str, bool], tuple[torch.Tensor, torch.Tensor]]

#: name -> ``loader(root, split, download) -> (x uint8 (N,C,H,W), y int64 (N,))``, with info
#: ``num_classes``, ``channels``, ``size`` (H = W), ``how_to_get`` and ``normalization``.
DATASETS: Registry[Loader] = Registry("dataset")


def dataset_names() -> list[str]:
    """Registered dataset names, in registration order."""
    return DATASETS.names()
