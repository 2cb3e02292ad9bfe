"""Threat models: the perturbation sets attacks must stay in, checked on every batch.

Epsilon is always in [0,1] pixel units (its /255 label for humans: ``results.eps.eps_label``).
:func:`check_perturbation` runs on every batch every attack returns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import SanityError, UserError

PERTURBATION_NORMS: dict[str, Callable[[Tensor], Tensor]] = {
    "Linf": lambda d: d.flatten(1).abs().amax(1),
    "L2": lambda d: d.flatten(1).norm(dim=1),
}


def check_perturbation(x: Tensor, x_adv: Tensor, eps: float, norm: str, *, what: str = "attack") -> None:
    """Raise ``SanityError`` unless ``x_adv`` has x's shape, is finite, in [0,1] and within the eps-ball.

    Tolerance: ``eps + 1e-6`` (for L2 the slack scales with eps above 1, as float32 norms do).
    """
    if norm not in PERTURBATION_NORMS:
        raise UserError(f"unknown norm {norm!r}; valid norms: {', '.join(PERTURBATION_NORMS)}")
    if not isinstance(x_adv, Tensor) or x_adv.shape != x.shape:
        got = tuple(x_adv.shape) if isinstance(x_adv, Tensor) else type(x_adv).__name__
        raise SanityError(f"{what} returned {got}, expected a tensor of shape {tuple(x.shape)}")
    if len(x) == 0:
        return
    xa = x_adv.detach().double()
    if not bool(torch.isfinite(xa).all()):
        raise SanityError(f"{what} returned non-finite values")
    lo, hi = float(xa.min()), float(xa.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise SanityError(f"{what} left the [0,1] image box (min {lo:.3g}, max {hi:.3g})")
    size = float(PERTURBATION_NORMS[norm](xa - x.detach().double()).max())
    tol = 1e-6 * (max(1.0, eps) if norm == "L2" else 1.0)
    if size > eps + tol:
        raise SanityError(f"{what} left the {norm} ball: perturbation {size:.6g} > eps {eps:.6g}")
