"""The input normalisations a checkpoint may have been trained with: the named ones, and the choice
between the file's own, solo-learn's and a name given by the user."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...registry import unknown_choice

#: Input normalisations of foreign checkpoints (mean, std); one value is broadcast to every channel.
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # the HCL/DCL training code's CIFAR-10 constants (not the true dataset std, but what they trained with)
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "half": ((0.5,), (0.5,)),  # CLAE / NaCl / our trainer: [0,1] -> [-1,1]
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "none": ((0.0,), (1.0,)),
}

DEFAULT_NORMALIZE = "cifar10"


def normalization_name(mean: Sequence[float], std: Sequence[float]) -> str | None:
    """The name in :data:`NORMALIZATIONS` equal to (mean, std), broadcasting single values."""
    for name, (m, s) in NORMALIZATIONS.items():
        n = max(len(mean), len(std), len(m), len(s))
        if any(len(v) not in (1, n) for v in (mean, std, m, s)):
            continue
        if all(
            math.isclose(a[i % len(a)], b[i % len(b)], abs_tol=1e-6)
            for a, b in ((mean, m), (std, s))
            for i in range(n)
        ):
            return name
    return None


def named_normalization(normalize: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    try:
        return NORMALIZATIONS[normalize]
    except KeyError:
        raise unknown_choice("normalization", normalize, NORMALIZATIONS) from None


def pick_normalization(
    from_file: tuple[list[float], list[float]] | None,
    normalize: str | None,
    solo: tuple[str, list[float], list[float]] | None = None,
) -> tuple[str, list[float], list[float]]:
    """(name, mean, std): with ``normalize`` None the file's own (or solo-learn's, from its
    args.json) when known, else the named one ("cifar10" by default)."""
    if normalize is None and from_file is not None:
        mean, std = from_file
        return normalization_name(mean, std) or "file", mean, std
    if normalize is None and solo is not None:
        return solo
    normalize = normalize or DEFAULT_NORMALIZE
    mean, std = (list(v) for v in named_normalization(normalize))
    return normalize, mean, std
