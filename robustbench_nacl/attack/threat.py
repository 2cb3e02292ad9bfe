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
    check_shape(x, x_adv, norm, what=what)
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


def check_shape(x: Tensor, x_adv: Tensor, norm: str, *, what: str = "attack") -> None:
    """The part of :func:`check_perturbation` that reads nothing from the device: a known norm, and
    ``x_adv`` a tensor of x's shape."""
    if norm not in PERTURBATION_NORMS:
        raise UserError(f"unknown norm {norm!r}; valid norms: {', '.join(PERTURBATION_NORMS)}")
    if not isinstance(x_adv, Tensor) or x_adv.shape != x.shape:
        got = tuple(x_adv.shape) if isinstance(x_adv, Tensor) else type(x_adv).__name__
        raise SanityError(f"{what} returned {got}, expected a tensor of shape {tuple(x.shape)}")


def perturbation_stats(x: Tensor, x_adv: Tensor, norm: str) -> Tensor:
    """What :func:`check_perturbation` checks of a non-empty batch, left on its device (no host sync):
    float64 ``[non-finite values, min, max, largest perturbation]``; :func:`check_stats` reads them."""
    xa = x_adv.detach().double()
    size = PERTURBATION_NORMS[norm](xa - x.detach().double()).max()
    return torch.stack([(~torch.isfinite(xa)).sum().double(), xa.min(), xa.max(), size])


def check_stats(stats: Tensor, eps: float, norm: str, *, what: str = "attack") -> None:
    """:func:`check_perturbation`'s verdict on the :func:`perturbation_stats` of one or more batches
    (rows of ``stats``), read back in one transfer; the same errors, for the first batch that fails."""
    for bad, lo, hi, size in stats.reshape(-1, 4).tolist():
        if bad:
            raise SanityError(f"{what} returned non-finite values")
        if lo < -1e-6 or hi > 1 + 1e-6:
            raise SanityError(f"{what} left the [0,1] image box (min {lo:.3g}, max {hi:.3g})")
        tol = 1e-6 * (max(1.0, eps) if norm == "L2" else 1.0)
        if size > eps + tol:
            raise SanityError(f"{what} left the {norm} ball: perturbation {size:.6g} > eps {eps:.6g}")
