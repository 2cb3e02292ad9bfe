"""AutoAttack screening (version ``screen``): standard's APGD-CE and APGD-T on every example, FAB-T
and Square on a seeded sample of the examples they leave correct.

On the reference board FAB-T and Square decided 4 of 73,500 attacked examples while taking most of
AutoAttack's time on robust encoders (issue 35). A screening row is therefore a cheap estimate with
a warning attached: when the sample finds any example the gradient components missed, the row's
``aa_screen_advice`` says to run AutoAttack standard and its ``sanity_screen_found_nothing`` flag
fires. Its suite hash differs from standard's, so its rows have their own protocol id and are never
ranked with standard's (docs/decisions.md, 'AutoAttack screening').
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from . import autoattack as aa_trace

#: the sample: this fraction of the survivors of the gradient components, at least SCREEN_MIN (all
#: of them when fewer survive), drawn per AutoAttack call (one per attacked chunk)
SCREEN_FRACTION = 0.10
SCREEN_MIN = 50
SCREEN_SAMPLE = (
    f"max({SCREEN_FRACTION:.0%} of the APGD survivors, {SCREEN_MIN}) per attacked chunk, "
    "drawn with torch.randperm seeded with the chunk's AutoAttack seed"
)


def screen_sample_size(survivors: int) -> int:
    """How many of ``survivors`` examples the sampled components attack."""
    return min(survivors, max(math.ceil(SCREEN_FRACTION * survivors), SCREEN_MIN))


def screen_sample(alive: Tensor, seed: int) -> Tensor:
    """The sampled examples of ``alive`` (indices), in increasing order: a permutation drawn from a
    CPU generator seeded with ``seed`` (the same on every device), its first few kept."""
    pick = torch.randperm(len(alive), generator=torch.Generator().manual_seed(seed))
    return alive[pick[: screen_sample_size(len(alive))].sort().values.to(alive.device)]


def run_screen(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    trace: aa_trace.Trace,
    names: list[str],
    run: Callable[[Tensor, list[str]], Tensor],
) -> Tensor:
    """Screen ``x``: ``run(index, components)`` runs AutoAttack components on ``x[index]`` (traced
    into ``trace``) and returns their adversarial examples; the gradient components run on every
    example, the others on :func:`screen_sample` of the survivors. Returns the adversarial examples."""
    first = [a for a in names if a in aa_trace.SCREEN_GRADIENT]
    rest = [a for a in names if a not in aa_trace.SCREEN_GRADIENT]
    every = torch.arange(len(x), device=x.device)
    x_adv = run(every, first) if first else x.clone()
    alive = (trace.decided == aa_trace.SURVIVED).nonzero().flatten()
    sample = screen_sample(alive, trace.seed)
    trace.sampled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    trace.sampled[sample] = True
    if len(sample) and rest:
        x_adv[sample] = run(sample, rest).to(x_adv.dtype)
    return x_adv
