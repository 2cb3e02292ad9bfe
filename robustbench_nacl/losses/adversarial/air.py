"""AIR (Xu et al., NeurIPS 2023, "Enhancing Adversarial Contrastive Learning via Adversarial Invariant
Regularization"; GodXuxilie/Enhancing_ACL_via_AIR, ``AIR.py``, ``pretraining.py``): ACL's dual-stream
step plus two regularisers on the un-augmented image, the standard one (SIR) and the adversarial
one (AIR), and DynACL's augmentation annealing for DynACL-AIR.

As the authors' code runs it: one network (no EMA network, unlike PKU-ML/DynACL), ACL's inner
attack, then three train-mode forwards: the 2B adversarial views (adversarial BatchNorm), the 2B
clean views and the B original images (clean BatchNorm), and
``(1 - w) NT-Xent(clean) + (1 + w) NT-Xent(adv) + lambda1 SIR + lambda2 AIR`` with
``w = swap_param (1 - strength)`` under DynAug (0 for ACL-AIR). The regularisers compare, over the
batch index k, softmaxes of the matched cosine similarities: ``p_i(k) = softmax_k(cos(z_i,k, z_o,k)/t)``
(view i against the original), the same ``q_j`` for view j; for AIR ``P_i = a_i * c_i`` with
``a_i = softmax_k(cos(z_i,k^adv, z_o,k)/t)`` and ``c_i = softmax_k(cos(z_i,k^adv, z_i,k)/t)``, and
``Q_j`` likewise. ``air_form = "code"`` (default) computes what ``F.kl_div(p, log q, log_target=True,
reduction="sum")`` computes when handed a probability where it expects a log-probability:
``sum_k q(k) (log q(k) - p(k))``; ``air_form = "kl"`` is the KL divergence the paper names,
``sum_k q(k) (log q(k) - log p(k))``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...models.dual_bn import bn_route
from ..estimators import upcast
from ..objectives import encode
from ..params import LossParams
from .acl import acl_embed, joint
from .engine import (
    CHOICES,
    RANGES,
    InnerAttack,
    StepContext,
    nt_xent,
    pgd_maximise,
    register_adversarial_objective,
)

AIR_FORMS = ("code", "kl")
CHOICES["air_form"] = AIR_FORMS
RANGES["air_lambda1"] = (0.0, float("inf"), True, "")
RANGES["air_lambda2"] = (0.0, float("inf"), True, "")

#: ``pretraining.py``: ``--lambda1 0.5 --lambda2 0.5`` (never overridden by ``run.sh``), t = 0.5
AIR_DEFAULTS = {"air_lambda1": 0.5, "air_lambda2": 0.5, "air_form": "code"}


def _matched(a: Tensor, b: Tensor, t: float) -> Tensor:
    """``diag(a @ b.T) / t`` of unit rows: each image's similarity between its two embeddings."""
    a, b = upcast(a), upcast(b)
    return (a * b).sum(dim=1) / t


def _divergence(target_log: Tensor, other: Tensor, other_log: Tensor, form: str) -> Tensor:
    """``sum_k q (log q - x)``: ``x`` the other side's probability (``code``) or its log (``kl``)."""
    return (target_log.exp() * (target_log - (other if form == "code" else other_log))).sum()


def air_regularisers(
    z: list[Tensor], z_adv: list[Tensor], z_orig: Tensor, t: float, form: str = "code"
) -> tuple[Tensor, Tensor]:
    """(SIR, AIR) of ``AIR_Loss.forward``: ``z`` the clean views i, j, ``z_adv`` their adversarial
    versions, ``z_orig`` the un-augmented images, all L2-normalised rows."""
    log_p_i = torch.log_softmax(_matched(z[0], z_orig, t), dim=0)
    log_q_j = torch.log_softmax(_matched(z[1], z_orig, t), dim=0)
    sir = _divergence(log_q_j, log_p_i.exp(), log_p_i, form)
    log_big_p = torch.log_softmax(_matched(z_adv[0], z_orig, t), 0) + torch.log_softmax(
        _matched(z_adv[0], z[0], t), 0
    )
    log_big_q = torch.log_softmax(_matched(z_adv[1], z_orig, t), 0) + torch.log_softmax(
        _matched(z_adv[1], z[1], t), 0
    )
    air = _divergence(log_big_q, log_big_p.exp(), log_big_p, form)
    return sir, air


def air_loss(
    z: list[Tensor], z_adv: list[Tensor], z_orig: Tensor, p: LossParams, weight: float
) -> tuple[Tensor, dict[str, Any]]:
    """``(1 - w) NT-Xent(clean) + (1 + w) NT-Xent(adv) + lambda1 SIR + lambda2 AIR`` and the terms."""
    e = p.extra_params()
    sir, air = air_regularisers(z, z_adv, z_orig, p.t, str(e["air_form"]))
    nat, adv = nt_xent(z[0], z[1], p.t), nt_xent(z_adv[0], z_adv[1], p.t)
    loss = nat * (1.0 - weight) + adv * (1.0 + weight) + e["air_lambda1"] * sir + e["air_lambda2"] * air
    return loss, {"sir": sir.detach(), "air": air.detach()}


def air_schedule(p: LossParams, epoch: int, epochs: int) -> dict[str, Any]:
    """DynAug of ``pretraining.py``: ``strength = 1 - int((e - 1) / K) K / E`` (1-based ``e``, the data
    reloaded every epoch) and ``w = swap_param (1 - strength)``; without ``dyn_aug`` the preset's
    fixed strength and ``w = 0`` (ACL-AIR)."""
    e = p.extra_params()
    if not e.get("dyn_aug", False):
        return {"aug_strength": float(e.get("aug_strength", 1.0)), "air_weight": 0.0}
    k = max(1, round(float(e["reload_frac"]) * epochs))
    strength = 1.0 - (epoch // k) * k / epochs  # the 0-based epoch is the authors' e - 1
    return {"aug_strength": strength, "air_weight": float(e["swap_param"]) * (1.0 - strength)}


def air_objective(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """ACL(DS)'s attack and forwards plus the original images' forward, then :func:`air_loss`."""
    ctx = ctx or StepContext()
    pair, original = views[:2], views[2]

    def attack_loss(xa: list[Tensor]) -> Tensor:
        return nt_xent(*acl_embed(model, xa, p, fuse, adversarial=True), p.t)

    adv = pgd_maximise(model, pair, attack_loss, InnerAttack.from_params(p), gen=ctx.gen)
    # the authors' order (the clean branch's running statistics see it): adversarial, clean, original
    z_adv = acl_embed(model, adv, p, fuse, adversarial=True)
    z = acl_embed(model, pair, p, fuse, adversarial=False)
    with bn_route(model, "clean"):
        (z_orig,) = encode(model, [original], joint(p, fuse))
    return air_loss(z, z_adv, z_orig, p, float(ctx.values.get("air_weight", 0.0)))


register_adversarial_objective(
    "air",
    air_objective,
    "ACL(DS) + AIR's standard and adversarial invariant regularisers (DynAug optional)",
    n_views=3,
    schedule=air_schedule,
)
