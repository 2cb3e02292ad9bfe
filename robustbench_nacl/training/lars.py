"""The three LARS optimizers the robust-SSL authors train with, each as its authors' code computes it.

They differ where it matters for reproducing a recipe, so they are three registered optimizers
(:mod:`.optim`), not one with switches:

- :class:`Lars`: ACL's and DynACL's own ``optimizer/lars.py`` (VITA-Group/Adversarial-Contrastive-
  Learning, identical in PKU-ML/DynACL). The learning rate is folded into the momentum buffer
  (``buf = m * buf + lr * local_lr * (g + wd * w)``, ``w -= buf``), every parameter (BatchNorm and
  biases included) is adapted and decayed, and there is no epsilon in the trust ratio.
- :class:`TorchLars`: kakaobrain's ``torchlars.LARS`` wrapping ``torch.optim.SGD``, as RoCL uses it.
  The gradient is replaced by ``trust * (g + wd * w)`` and SGD with momentum (weight decay hidden)
  takes the step, so the learning rate multiplies the buffer, not what enters it.
- :class:`SoloLars`: solo-learn's ``LARSWrapper`` around SGD, as its SimCLR recipe (DeACL's stage-1
  teacher) uses it: optional clipping of the trust ratio by the learning rate, and optional
  exclusion of every 1-d parameter (biases, normalisation) from both adaptation and weight decay.

Sources (commits) are in docs/decisions.md, 'Optimizers and learning-rate schedules'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer


def _momentum_buffer(state: dict[str, Any], d: torch.Tensor, momentum: float) -> torch.Tensor:
    """torch SGD's buffer (dampening 0): ``d`` itself at the first step, then ``m * buf + d``."""
    buf = state.get("momentum_buffer")
    if buf is None:
        buf = state["momentum_buffer"] = d.clone().detach()
    else:
        buf.mul_(momentum).add_(d)
    return buf


class _PerParameter(Optimizer):
    """The loop every LARS variant shares: the closure, then :meth:`_update` of each parameter that
    has a gradient (a momentum encoder's frozen weights have none)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError


class _SgdOverLars(_PerParameter):
    """A LARS wrapper over torch SGD: :meth:`_direction` replaces the gradient, then SGD with
    momentum (dampening 0) steps: ``buf = m * buf + d``, ``w -= lr * buf``."""

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        d = self._direction(p, group)
        p.add_(_momentum_buffer(self.state[p], d, group["momentum"]), alpha=-group["lr"])

    def _direction(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError


class Lars(_PerParameter):
    """ACL/DynACL LARS: ``local = eta * |w| / (|g| + wd * |w|)`` (1 where a norm is below 1e-15),
    ``buf = m * buf + lr * local * (g + wd * w)``, ``w -= buf``; no parameter is excluded."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
    ) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta})

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        lr, m, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
        g = p.grad
        w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
        local = eta * w_norm / (g_norm + wd * w_norm)
        # the authors' guard: a zero weight (a fresh zero bias) or gradient steps with ratio 1
        local = torch.where((w_norm < 1e-15) | (g_norm < 1e-15), torch.ones_like(local), local)
        buf = self.state[p].get("momentum_buffer")
        if buf is None:  # a zero buffer times m: the first step is lr * local * (g + wd * w)
            buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        buf.mul_(m).add_((local * lr) * (g + wd * p))
        p.sub_(buf)


class TorchLars(_SgdOverLars):
    """torchlars over SGD: ``d = trust * (g + wd * w)`` with ``trust = eta * |w| / (|g| + wd * |w| + eps)``
    (1 where a norm is 0), then SGD with momentum: ``buf = m * buf + d``, ``w -= lr * buf``."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
        eps: float = 1e-8,
    ) -> None:
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta, "eps": eps}
        super().__init__(params, defaults)

    def _direction(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        wd = group["weight_decay"]
        w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(p.grad)
        trust = w_norm / (g_norm + wd * w_norm + group["eps"]) * group["eta"]
        trust = torch.where((w_norm > 0) & (g_norm > 0), trust, torch.ones_like(trust))
        # torchlars adds the weight decay whatever the trust ratio, then scales the sum
        return (p.grad + wd * p) * trust


class SoloLars(_SgdOverLars):
    """solo-learn's LARSWrapper over SGD: for an adapted parameter with nonzero norms,
    ``d = r * (g + wd * w)`` with ``r = eta * |w| / (|g| + wd * |w| + eps)`` (``min(r / lr, 1)`` with
    ``clip``); otherwise ``d = g`` (no weight decay either); then SGD with momentum."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
        eps: float = 1e-8,
        clip: bool = False,
        exclude_bias_n_norm: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
            "clip": clip,
            "exclude_bias_n_norm": exclude_bias_n_norm,
        }
        super().__init__(params, defaults)

    def _direction(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        # solo-learn tells biases and normalisation parameters by their dimension (1-d)
        if group["exclude_bias_n_norm"] and p.ndim == 1:
            return p.grad
        return self._adapted(p, p.grad, group, group["lr"], group["weight_decay"])

    @staticmethod
    def _adapted(
        p: torch.Tensor, g: torch.Tensor, group: dict[str, Any], lr: float, wd: float
    ) -> torch.Tensor:
        """The LARS-scaled, weight-decayed gradient of one adapted parameter."""
        w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
        ratio = group["eta"] * w_norm / (g_norm + w_norm * wd + group["eps"])
        if group["clip"]:
            # lr 0 (a warm-up's first value could be) gives inf, clipped to 1 as the authors' min does
            ratio = torch.clamp(ratio / lr if lr else torch.full_like(ratio, float("inf")), max=1.0)
        scaled = (g + wd * p) * ratio
        # a zero weight or gradient: the plain gradient, without weight decay (solo-learn's branch)
        return torch.where((w_norm != 0) & (g_norm != 0), scaled, g)
