"""ACL (Jiang et al. 2020; VITA-Group/Adversarial-Contrastive-Learning, ``train_simCLR.py``):
PGD on NT-Xent, then the dual-stream loss over the clean and the adversarial pair.

The authors forward each pair as one batch of 2B images per BatchNorm branch (the two views
interleaved in one tensor), so BatchNorm normalises both views with one set of batch statistics:
``joint_bn`` (default on) does the same; off, each view gets its own pass.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...models.dual_bn import bn_route
from ..objectives import encode
from ..params import LossParams
from .engine import (
    CHOICES,
    RANGES,
    InnerAttack,
    StepContext,
    attack_defaults,
    nt_xent,
    pgd_maximise,
    register_adversarial_objective,
    route,
)

ACL_MODES = ("ds", "a2a", "a2s")  # ACL: dual stream, adversarial-to-adversarial, adversarial-to-standard
CHOICES["acl_mode"] = ACL_MODES
RANGES["aux_bn_momentum"] = (0.0, 1.0, False, "")

#: ACL/DynACL's PGD: eps 8/255, step 2/255, 5 steps (``PGD_contrastive`` and ``--pgd_iter 5``); their
#: two BatchNorms are plain ``nn.BatchNorm2d`` (momentum 0.1, ``models/resnet_multi_bn.py``); one
#: forward of both views per branch (``joint_bn``)
ACL_ATTACK = {**attack_defaults(8 / 255, 5, 2 / 255, eval_bn="adv"), "aux_bn_momentum": 0.1, "joint_bn": True}


def acl_loss(z: list[Tensor], z_adv: list[Tensor], t: float, mode: str, adv_weight: float = 1.0) -> Tensor:
    """ACL: ``ds`` ``((2 - w) NT-Xent(clean) + w NT-Xent(adv)) / 2`` (w = 1: ACL; DynACL's w),
    ``a2a`` NT-Xent of the two adversarial views, ``a2s`` NT-Xent of (clean view 1, adversarial view 2)."""
    if mode == "a2a":
        return nt_xent(z_adv[0], z_adv[1], t)
    if mode == "a2s":
        return nt_xent(z[0], z_adv[1], t)
    return ((2.0 - adv_weight) * nt_xent(z[0], z[1], t) + adv_weight * nt_xent(z_adv[0], z_adv[1], t)) / 2.0


def joint(p: LossParams, fuse: bool) -> bool:
    """Whether the views of one BatchNorm branch go through the model in one pass."""
    return fuse or bool(p.extra_params().get("joint_bn", False))


def acl_embed(
    model: nn.Module, xs: list[Tensor], p: LossParams, fuse: bool, *, adversarial: bool
) -> list[Tensor]:
    """The pair's embeddings through the clean (``adversarial`` False) or the adversarial BatchNorm.

    Under A2S the adversarial pair is (clean view 1, attacked view 2): view 1 keeps the clean branch.
    """
    mode = p.extra_params().get("acl_mode", "ds")
    if not adversarial:
        with bn_route(model, "clean"):
            return encode(model, xs, joint(p, fuse))
    if mode != "a2s":
        with bn_route(model, route(p)):
            return encode(model, xs, joint(p, fuse))
    with bn_route(model, "clean"):
        (z1,) = encode(model, xs[:1])
    with bn_route(model, route(p)):
        return [z1, *encode(model, xs[1:])]


def acl_objective(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ACL: attack the views with PGD on the loss the mode trains, then that loss."""
    ctx = ctx or StepContext()
    mode = p.extra_params().get("acl_mode", "ds")
    attacked = [mode != "a2s", True]  # A2S attacks view 2 only

    def attack_loss(xa: list[Tensor]) -> Tensor:
        return nt_xent(*acl_embed(model, xa, p, fuse, adversarial=True), p.t)

    adv = pgd_maximise(
        model, views[:2], attack_loss, InnerAttack.from_params(p), gen=ctx.gen, attacked=attacked
    )
    z_adv = acl_embed(model, adv, p, fuse, adversarial=True)
    z = acl_embed(model, views[:2], p, fuse, adversarial=False) if mode == "ds" else z_adv
    return acl_loss(z, z_adv, p.t, mode, float(ctx.values.get("adv_weight", 1.0))), {}


register_adversarial_objective("acl", acl_objective, "ACL: PGD on NT-Xent; dual-stream (DS), A2A or A2S")
