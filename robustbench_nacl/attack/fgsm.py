"""FGSM (Goodfellow et al. 2015) in any threat model: one function over the norm ops, registered
as ``fgsm`` (Linf) and ``fgsm_l2`` (L2), with the sweep that shares one gradient over many eps."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .base import ATTACKS
from .grad import input_grad
from .norms import norm_ops


def fgsm_sweep(model: nn.Module, x: Tensor, y: Tensor, *, norm: str = "Linf") -> Callable[[float], Tensor]:
    """FGSM at any epsilon from one input gradient: returns ``eps -> x_adv``.

    The perturbation at every eps is ``eps * d`` with one direction ``d`` (the gradient's sign for
    Linf, the unit-L2 gradient for L2) taken at the clean input, so a sweep over k epsilons costs
    one backward and k forwards instead of k of each. :func:`fgsm` is this function at one eps, so
    a sweep returns exactly what k separate FGSM calls return. No random start: FGSM is not one-step
    PGD with a random init (see docs/decisions.md, 'Attack protocol').
    """
    g, _ = input_grad(model, x, y)
    direction = norm_ops(norm).ascent(g, 1.0)
    x = x.detach()
    return lambda eps: (x + eps * direction).clamp(0.0, 1.0)


def fgsm(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "Linf",
) -> Tensor:
    """FGSM: ``clamp(x + eps * d, 0, 1)``, ``d`` the norm's unit ascent direction of ``grad_x CE``
    (Linf: its sign; L2: ``g / ||g||_2``), no random start."""
    return fgsm_sweep(model, x, y, norm=norm)(eps)


ATTACKS.add("fgsm", fgsm, norms=("Linf",), params={}, family="single_step", sweep=fgsm_sweep)
#: The fast gradient method in L2: :func:`fgsm` with ``norm="L2"`` by default.
fgsm_l2 = ATTACKS.add(
    "fgsm_l2",
    functools.partial(fgsm, norm="L2"),
    norms=("L2",),
    params={},
    family="single_step",
    sweep=fgsm_sweep,
)
