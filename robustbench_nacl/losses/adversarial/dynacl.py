"""DynACL (Luo et al. 2023; PKU-ML/DynACL, ``train_DynACL.py``, ``models/resnet_multi_bn.py``):
ACL with annealed augmentation and adversarial weight, and a momentum (EMA) encoder.

The authors' ``resnet18_momentum`` holds two networks, the online ``encoder_q`` and the EMA
``encoder_k`` (m = 0.99), each with its own projection head and dual BatchNorm. With
``swap=True`` view 1 of every pair goes through ``encoder_q`` and view 2 through ``encoder_k``, in
the inner attack (eval mode, 'pgd' branch) and in both training forwards (train mode: each
network's BatchNorm sees its own B images). After the two training forwards and before the
backward pass, ``_momentum_update_encoder_k`` averages the parameters (not the BatchNorm buffers,
which ``encoder_k`` accumulates from its own forwards). ``encoder_k`` is what the authors save and
evaluate (``model_encoder_k.pt``). Here the EMA network is the ``momentum`` submodule of the
trained model (:func:`attach_momentum`), the checkpoint exports it (:func:`export_momentum`), and
``momentum = 0`` is the symmetric reading without it (one network, the online weights exported).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from ...models.dual_bn import bn_route
from ..objectives import embed
from ..params import LossParams, bad_param
from .acl import acl_loss, acl_objective
from .engine import (
    RANGES,
    InnerAttack,
    StepContext,
    nt_xent,
    pgd_maximise,
    register_adversarial_objective,
    route,
)

RANGES["reload_frac"] = (0.0, 1.0, False, "")
RANGES["swap_param"] = (0.0, 1.5, True, "")
RANGES["momentum"] = (0.0, 1.0, True, " (0: no EMA encoder)")

MOMENTUM = "momentum"  # the EMA network's submodule name (its keys in train_state.pt: momentum.*)


def dynacl_schedule(p: LossParams, epoch: int, epochs: int) -> dict[str, Any]:
    """DynACL's per-epoch augmentation strength and adversarial weight (``train_DynACL.py``).

    With the authors' 1-based epoch ``e`` and reload period ``K`` (``reload_frequency``, here the
    fraction ``reload_frac`` of the run): ``strength = 1 - ((e - 1) // K) K / E`` (the data is
    reloaded at ``e % K == 1``) and ``w = min(1 + (e // K)(K / E) swap_param, 2)``, with the
    authors' ``e // K`` (so ``w`` steps up one epoch before the strength does).
    """
    e = p.extra_params()
    k = max(1, round(float(e["reload_frac"]) * epochs))
    ep = epoch + 1
    strength = 1.0 - ((ep - 1) // k) * k / epochs
    weight = min(1.0 + (ep // k) * (k / epochs) * float(e["swap_param"]), 2.0)
    return {"aug_strength": strength, "adv_weight": weight}


def _m(p: LossParams) -> float:
    return float(p.extra_params().get("momentum", 0.0))


def check_dynacl(p: LossParams) -> None:
    """The EMA step is DynACL's dual stream: another ``acl_mode`` needs ``momentum = 0``."""
    mode = p.extra_params().get("acl_mode", "ds")
    if _m(p) > 0.0 and mode != "ds":
        raise bad_param(f"acl_mode={mode!r} with momentum={_m(p)}; DynACL's EMA step is ds (set momentum=0)")


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself under a DistributedDataParallel wrapper."""
    return getattr(model, "module", model)


def attach_momentum(model: nn.Module, p: LossParams) -> None:
    """Give ``model`` its EMA copy (``_init_encoder_k``: the online parameters copied, no gradient)."""
    if _m(p) <= 0.0:
        return
    ema = copy.deepcopy(model)
    for q in ema.parameters():
        q.requires_grad_(False)
    model.add_module(MOMENTUM, ema)


def export_momentum(model: nn.Module, p: LossParams) -> nn.Module:
    """What the checkpoint holds: the EMA network (``encoder_k``) when there is one."""
    model = unwrap(model)
    return getattr(model, MOMENTUM) if _m(p) > 0.0 else model


@torch.no_grad()
def momentum_update(model: nn.Module, m: float) -> None:
    """``param_k = m param_k + (1 - m) param_q`` over the parameters (the buffers are not averaged)."""
    model = unwrap(model)
    online = [q for name, q in model.named_parameters() if not name.startswith(MOMENTUM + ".")]
    for k, q in zip(getattr(model, MOMENTUM).parameters(), online, strict=True):
        k.mul_(m).add_(q.detach(), alpha=1.0 - m)


def swap_embed(model: nn.Module, xs: list[Tensor], bn: str) -> list[Tensor]:
    """``swap=True``: view 1 through the online network, view 2 through the EMA one, BatchNorm ``bn``."""
    ema = getattr(unwrap(model), MOMENTUM)
    with bn_route(model, bn):
        return [embed(model, xs[0]), embed(ema, xs[1])]


def dynacl_objective(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DynACL: the swap forward through the online and the EMA network, then the EMA update."""
    m = _m(p)
    if m <= 0.0:  # the symmetric reading: ACL's step with DynACL's weight
        return acl_objective(model, views, y, p, gen, fuse, ctx=ctx)
    ctx = ctx or StepContext()
    adv_route = route(p)

    def attack_loss(xa: list[Tensor]) -> Tensor:
        return nt_xent(*swap_embed(model, xa, adv_route), p.t)

    adv = pgd_maximise(model, views[:2], attack_loss, InnerAttack.from_params(p), gen=ctx.gen)
    z_adv = swap_embed(model, adv, adv_route)
    z = swap_embed(model, views[:2], "clean")
    momentum_update(model, m)  # after the forwards, before the backward pass (train_DynACL.py)
    return acl_loss(z, z_adv, p.t, "ds", float(ctx.values.get("adv_weight", 1.0))), {}


register_adversarial_objective(
    "dynacl",
    dynacl_objective,
    "DynACL: ACL with annealed augmentation and adversarial weight, online/EMA swap",
    schedule=dynacl_schedule,
    prepare=attach_momentum,
    export=export_momentum,
    check=check_dynacl,
)
