"""Attacks that do not fit in the device's memory: halve the batch and run the attack again.

The default attack batch (1024 on CUDA) can exceed a GPU's memory for large models (timm models at
224 px). Rather than fail an evaluation, :func:`halving_on_oom` reruns the whole attack with half the
batch, from the same generator states, until it fits: the result is exactly what a run started with
the smaller batch gives, and the batch that ran is recorded in the row (``attack_batch_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def halving_on_oom(
    run: Callable[[int], T], batch_size: int, gens: Sequence[torch.Generator | None]
) -> tuple[T, int]:
    """``run(batch)`` at ``batch_size``, halved after each out-of-memory error; returns the result
    and the batch that ran.

    Before each retry the generators are put back to their states before the first try (a failed
    try has drawn from them) and the allocator's cache is emptied. An error at batch 1 propagates.
    """
    states = [g.get_state() if g is not None else None for g in gens]
    batch = batch_size
    while True:
        try:
            return run(batch), batch
        except torch.OutOfMemoryError:
            if batch <= 1:
                raise
        batch = max(1, batch // 2)
        for g, state in zip(gens, states, strict=True):
            if g is not None and state is not None:
                g.set_state(state)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
