"""Threat models as objects: per norm, the random start, the ascent step and the projection that
FGSM and PGD are written over (one small object per norm instead of if-chains)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..errors import UserError
from .rng import rand, randn


class NormOps(Protocol):
    """What an attack needs of a threat model (``Linf``: sign steps and clamping; ``L2``: normalised
    steps and rescaling)."""

    @staticmethod
    def random_init(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
        """A random start inside the eps-ball."""
        ...

    @staticmethod
    def ascent(g: Tensor, step: float) -> Tensor:
        """The step of length ``step`` along the gradient ``g`` that the norm's steepest ascent takes."""
        ...

    @staticmethod
    def project(delta: Tensor, eps: float) -> Tensor:
        """``delta`` projected onto the eps-ball."""
        ...


def _flat_norm(t: Tensor) -> Tensor:
    """Per-example L2 norm, shaped to broadcast against ``t``."""
    return t.flatten(1).norm(dim=1).view(-1, *([1] * (t.dim() - 1)))


class _Linf:
    @staticmethod
    def random_init(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
        return (rand(x, gen) * 2 - 1) * eps

    @staticmethod
    def ascent(g: Tensor, step: float) -> Tensor:
        return step * g.sign()

    @staticmethod
    def project(delta: Tensor, eps: float) -> Tensor:
        return delta.clamp(-eps, eps)


class _L2:
    @staticmethod
    def random_init(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
        # Wong et al.: a Gaussian direction scaled to a radius drawn uniformly in [0, eps].
        d = randn(x, gen)
        r = rand(x, gen, shape=(len(x),) + (1,) * (x.dim() - 1))
        return d / _flat_norm(d).clamp_min(1e-12) * (r * eps)

    @staticmethod
    def ascent(g: Tensor, step: float) -> Tensor:
        return step * g / _flat_norm(g).clamp_min(1e-12)

    @staticmethod
    def project(delta: Tensor, eps: float) -> Tensor:
        return delta * (eps / _flat_norm(delta).clamp_min(1e-12)).clamp(max=1.0)


NORMS: dict[str, type[NormOps]] = {"Linf": _Linf, "L2": _L2}


def norm_ops(norm: str) -> type[NormOps]:
    """The threat model called ``norm``; a one-line UserError naming the valid norms otherwise."""
    try:
        return NORMS[norm]
    except KeyError:
        raise UserError(f"unknown norm {norm!r}; valid norms: {', '.join(NORMS)}") from None


def project(x: Tensor, x_adv: Tensor, eps: float, norm: str = "Linf") -> Tensor:
    """Project ``x_adv`` onto the ``norm`` eps-ball around ``x`` intersected with the [0,1] box.

    Clamping to the box after the ball projection never leaves the ball: since ``x`` is in [0,1],
    the box clamp moves every coordinate of the perturbation towards zero.
    """
    delta = norm_ops(norm).project((x_adv - x).detach(), eps)
    return (x + delta).clamp(0.0, 1.0).detach()
