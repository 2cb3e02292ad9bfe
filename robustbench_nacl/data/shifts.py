"""ArCL's distribution shifts applied to whole dataset splits, deterministically (seeded per
dataset, shift and split), in bounded chunks."""

from __future__ import annotations

import zlib

import torch

__all__ = ["SHIFT_CHUNK", "apply_shift", "shift_names", "shift_seed"]

#: Images per call of a shift function: bounds the float32 working memory (4096 CIFAR images are
#: 50 MB) without making the per-call overhead matter.
SHIFT_CHUNK = 4096


def shift_names() -> list[str]:
    """The registered shift names (augment.views.SHIFTS)."""
    from ..augment.views import SHIFTS  # lazy: augment imports torchvision transforms; data must not need it

    return SHIFTS.names()


def shift_seed(name: str, shift: str, split: str) -> int:
    """The generator seed of one dataset's split under one shift."""
    # crc32 rather than hash(): Python salts str hashes per process, and shifts must be reproducible.
    return zlib.crc32(f"{name}@{shift}|{split}".encode())


def apply_shift(x: torch.Tensor, shift: str, seed: int) -> torch.Tensor:
    """Shift uint8 images in chunks; per-image random parameters all come from one seeded generator."""
    from ..augment.views import SHIFTS

    fn = SHIFTS.get(shift)
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], SHIFT_CHUNK):
        chunk = x[start : start + SHIFT_CHUNK].float().div_(255.0)
        shifted = fn(chunk, gen)
        if shifted.shape != chunk.shape:
            raise RuntimeError(
                f"shift {shift!r} changed the image shape {tuple(chunk.shape)} -> {tuple(shifted.shape)}"
            )
        out[start : start + SHIFT_CHUNK] = (shifted * 255.0).round().clamp(0, 255).to(torch.uint8)
    return out
