"""PGD as in Wong et al. 2020 ("Fast is better than free": attack_pgd), Linf and L2, over the norm
ops: random start, early stop, restarts that keep each example's strongest perturbation."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import ATTACKS
from .grad import ce_grad
from .norms import NormOps, norm_ops
from .params import boolean, int_at_least, positive_float


def _pgd_run(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    ops: type[NormOps],
    steps: int,
    step_size: float,
    gen: torch.Generator | None,
    random_start: bool,
    early_stop: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """One restart. Returns (delta, final per-example CE, fooled mask)."""
    delta = ops.random_init(x, eps, gen) if random_start else torch.zeros_like(x)
    delta = (x + delta).clamp(0.0, 1.0) - x
    run_steps = _pgd_steps_masked if sync_free(x.device) else _pgd_steps_compact
    delta = run_steps(model, x, y, delta, eps, ops, steps, step_size, early_stop)
    with torch.no_grad():
        logits = model(x + delta)
        loss = F.cross_entropy(logits.float(), y, reduction="none")
        fooled = logits.argmax(1) != y
    return delta, loss, fooled


def sync_free(device: torch.device) -> bool:
    """Whether PGD steps the whole batch under a mask (no host sync per step) rather than shrinking
    it to the examples still correct: on an accelerator every shrink waits for the device (a boolean
    mask's size is data-dependent), on the CPU there is no device to wait for and a smaller batch
    is less work. Both give the same perturbations (tested on the CPU, bit for bit for a model whose
    outputs do not depend on the batch they are in)."""
    return device.type != "cpu"


def _pgd_steps_compact(
    model: nn.Module, x: Tensor, y: Tensor, delta: Tensor, eps: float, ops: type[NormOps], steps: int,
    step_size: float, early_stop: bool,
) -> Tensor:  # fmt: skip
    """PGD steps on a shrinking batch: only the examples still classified correctly are stepped."""
    active = torch.arange(len(x), device=x.device)
    for _ in range(steps):
        whole = len(active) == len(x)  # avoid gather/scatter while nobody has been fooled yet
        xa, ya = (x, y) if whole else (x[active], y[active])
        da = (delta if whole else delta[active]).detach().requires_grad_(True)
        logits = model(xa + da)
        # The logits of this step's forward decide who is still correct: no extra forward.
        keep = logits.argmax(1) == ya if early_stop else torch.ones_like(ya, dtype=torch.bool)
        if not bool(keep.any()):
            break
        g = ce_grad(logits, ya, da)
        d = ops.project(da.detach() + ops.ascent(g, step_size), eps)
        d = (xa + d).clamp(0.0, 1.0) - xa
        if whole and bool(keep.all()):
            delta = d
        else:
            delta[active[keep]] = d[keep]
            active = active[keep]
    return delta


def _pgd_steps_masked(
    model: nn.Module, x: Tensor, y: Tensor, delta: Tensor, eps: float, ops: type[NormOps], steps: int,
    step_size: float, early_stop: bool,
) -> Tensor:  # fmt: skip
    """The same steps on the whole batch, an example's delta kept once it is fooled: no host sync."""
    active = torch.ones(len(x), dtype=torch.bool, device=x.device)
    shape = (-1, *([1] * (x.dim() - 1)))
    for _ in range(steps):
        da = delta.detach().requires_grad_(True)
        logits = model(x + da)
        # once fooled, never stepped again (as the compact form drops it from the batch)
        keep = active & (logits.argmax(1) == y) if early_stop else active
        g = ce_grad(logits, y, da)
        d = ops.project(da.detach() + ops.ascent(g, step_size), eps)
        d = (x + d).clamp(0.0, 1.0) - x
        delta = torch.where(keep.view(shape), d, delta)
        active = keep
    return delta


@ATTACKS.register(
    "pgd",
    norms=("Linf", "L2"),
    params={
        "steps": int_at_least(1),
        "step_size": positive_float,
        "restarts": int_at_least(1),
        "random_start": boolean,
        "early_stop": boolean,
    },
    family="iterative",
)
def pgd(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "Linf",
    steps: int = 10,
    step_size: float | None = None,
    restarts: int = 1,
    random_start: bool = True,
    early_stop: bool = True,
) -> Tensor:
    """PGD as in Wong et al. 2020: random start, sign (Linf) or normalised (L2) steps.

    - ``step_size`` defaults to 0.01 for Linf (the paper suite's value) and ``2.5 * eps / steps`` for L2.
    - Early stop (Wong): in each step only examples still classified correctly are updated.
    - Restarts keep, per example, the delta with the highest CE, except that an example fooled by
      an earlier restart stays fooled and is not attacked again.
    - Examples misclassified on the clean input are returned unchanged (no attack work).
    """
    ops = norm_ops(norm)
    if step_size is None:
        step_size = 0.01 if norm == "Linf" else 2.5 * eps / steps
    x, y = x.detach(), y.detach()
    with torch.enable_grad():
        with torch.no_grad():
            todo = (model(x).argmax(1) == y).nonzero().squeeze(1)
        best = torch.zeros_like(x)
        best_loss = torch.full((len(x),), -math.inf, device=x.device)
        best_fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        for _ in range(restarts):
            idx = todo[~best_fooled[todo]]
            if idx.numel() == 0:
                break
            delta, loss, fooled = _pgd_run(
                model, x[idx], y[idx], eps, ops, steps, step_size, gen, random_start, early_stop
            )
            was = best_fooled[idx]
            better = (fooled & ~was) | ((fooled == was) & (loss > best_loss[idx]))
            upd = idx[better]
            best[upd], best_loss[upd], best_fooled[upd] = delta[better], loss[better], fooled[better]
    return (x + best).clamp(0.0, 1.0)
