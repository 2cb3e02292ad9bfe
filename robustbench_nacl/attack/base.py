"""The calling convention every attack follows and the registry that holds the attacks.

Every attack is ``attack(model, x, y, *, eps, gen, norm, **params) -> x_adv`` where ``model`` maps
images in [0,1] (normalisation inside) to logits and is in eval mode, ``eps`` is in [0,1] pixel
units, ``gen`` is the ``torch.Generator`` that makes the attack reproducible, and ``x_adv`` lies in
[0,1] and in the eps-ball around ``x``. Attacks take input gradients with ``torch.autograd.grad``
(no parameter-gradient work, no ``.grad`` left on the model) and run under ``torch.enable_grad()``
so that a caller's ``no_grad`` cannot silently turn them into no-ops.

Registered (by their modules, imported in this order by the package): ``fgsm``, ``fgsm_l2``
(:mod:`.fgsm`), ``pgd`` (:mod:`.pgd`, Wong et al. 2020, Linf and L2), ``autoattack``
(:mod:`.autoattack_adapter`: pyautoattack, pinned, through its public API). Any
``torchattacks.<Name>`` resolves through :func:`.runner.resolve_attack` when the optional
torchattacks package is installed (:mod:`.torchattacks_adapter`).

Registry metadata (read by :mod:`robustbench_nacl.attack.suites` and
:mod:`robustbench_nacl.eval.benchmark` instead of branching on names):

- ``norms``: threat models the attack supports (first = default);
- ``params``: extra keyword -> validator (suites reject unknown keys and bad values);
- ``family``: ``"single_step"`` or ``"iterative"`` (sanity check: iterative <= single-step);
- ``needs_num_classes``: pass ``num_classes`` (the logits width);
- ``sweep``: optional ``(model, x, y, *, norm, **params) -> (eps -> x_adv)`` that attacks one batch
  at any number of epsilons from shared work, returning exactly what the attack returns at each eps
  (FGSM: one input gradient for the whole sweep); :func:`.runner.robust_under_attack` uses it;
- ``check_params``: optional ``(params) -> None`` raising ValueError for invalid combinations;
- ``describe``: optional ``(params, num_classes) -> dict`` of effective settings for result rows.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..registry import Registry


class Attack(Protocol):
    """The calling convention every registered attack follows."""

    def __call__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        *,
        eps: float,
        gen: torch.Generator | None,
        norm: str,
        **params: Any,
    ) -> Tensor: ...


ATTACKS: Registry[Attack] = Registry("attack")
