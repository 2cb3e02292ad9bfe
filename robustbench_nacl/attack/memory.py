"""Attacks that do not fit in the device's memory: halve the batch and run the attack again.

On CUDA the attack batch is sized from the device's free memory and one measured attack step
(:func:`attack_batch`); an estimate can still fall short (AutoAttack's buffers, fragmentation).
Rather than fail an evaluation, :func:`halving_on_oom` reruns the whole attack with half the batch,
from the same generator states, until it fits: the result is exactly what a run started with the
smaller batch gives, and the batch that ran is recorded in the row (``attack_batch_size``).
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


#: the share of the device's free memory one attack batch may plan for; the rest absorbs what one
#: forward and backward does not show (AutoAttack's per-component buffers, the allocator's blocks)
MEMORY_SHARE = 0.5
#: the examples one measurement of the per-example memory runs on
MEASURE_BATCH = 16


def batch_for_memory(free_bytes: int, per_example: float, n: int, *, share: float = MEMORY_SHARE) -> int:
    """The attack batch for ``n`` examples when each takes ``per_example`` bytes and ``free_bytes``
    are free: all ``n`` when they fit in ``share`` of it (then the batch, and so the draws of every
    attack, do not depend on the device's size), else the largest power of two that fits (>= 1)."""
    cap = int(free_bytes * share / max(per_example, 1.0))
    if cap >= n:
        return max(1, n)
    return 1 << max(0, cap.bit_length() - 1)


def per_example_bytes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The peak CUDA memory one example of an attack step takes: one forward and input-gradient
    backward of ``model`` on ``x`` (a few examples), measured by the allocator (no host sync)."""
    from .grad import input_grad

    device = x.device
    model = getattr(model, "_orig_mod", model)  # a compiled wrapper's eager module: no extra compile
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    input_grad(model, x, y)
    return max(1.0, (torch.cuda.max_memory_allocated(device) - before) / max(1, len(x)))


def attack_batch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, default: int) -> int:
    """The attack batch of :func:`eval.benchmark` when none is given: on CUDA sized from the free
    memory (``torch.cuda.mem_get_info``) and one measured step (:func:`batch_for_memory`; an
    out-of-memory error later still halves it, :func:`halving_on_oom`); ``default`` elsewhere."""
    if x.device.type != "cuda":
        return default
    free, _ = torch.cuda.mem_get_info(x.device)
    k = min(MEASURE_BATCH, len(x))
    return batch_for_memory(free, per_example_bytes(model, x[:k], y[:k]), len(x))
