"""RoCL (Kim et al. 2020; Kim-Minseon/RoCL, ``src/rocl_train.py``, ``src/attack_lib.py``,
``src/loss.py``): an instance-wise attack of view 1 against view 2, the adversarial view as a third
positive, and a regulariser pulling it to view 2.

As the authors' code runs it: the attack starts at ``clip_[0,1](x + U(-eps, eps))`` and ascends the
NT-Xent of the pair (x_adv, view 2), forwarded together in eval mode; the training forward is one
pass of the 3B images [view 1; view 2; x_adv] (BatchNorm over all three); the regulariser
``NT-Xent(x_adv, view 2) / lamda`` is a second forward of those 2B images; and every similarity is
``pairwise_similarity``'s ``z @ z.detach().T`` (``rocl_gradient = "authors"``): each anchor's loss
reaches the parameters and the attacked input through its own row only. ``rocl_gradient = "full"``
is the gradient of the printed formula (the earlier reading of this project).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..objectives import encode
from ..params import LossParams
from .engine import (
    CHOICES,
    RANGES,
    InnerAttack,
    StepContext,
    attack_defaults,
    eval_mode,
    multi_view_nt_xent,
    pgd_maximise,
    register_adversarial_objective,
)

ROCL_GRADIENTS = ("authors", "full")
CHOICES["rocl_gradient"] = ROCL_GRADIENTS
RANGES["rocl_lamda"] = (0.0, float("inf"), False, " (the regulariser's weight is 1 / lamda)")

#: RoCL's ``rocl_train.py`` arguments: epsilon 0.0314, alpha 0.007, k = 7, random start clipped to
#: [0, 1] (``RepresentationAdv.get_loss``); views at ``--color_jitter_strength 0.5``
ROCL_ATTACK = {
    **attack_defaults(0.0314, 7, 0.007, eval_bn="clean"),
    "attack_clamp_start": True,
    "joint_bn": True,
    "rocl_gradient": "authors",
}


def rocl_loss(
    z: list[Tensor], t: float, lamda: float, reg: list[Tensor] | None = None, *, detach_columns: bool = False
) -> Tensor:
    """RoCL: the 3-view NT-Xent of ``z = [view 1, view 2, adversarial]`` plus ``NT-Xent(reg) / lamda``
    (``reg`` = [adversarial, view 2], by default from the same embeddings; ``regularize_to='other'``)."""
    reg = reg if reg is not None else [z[2], z[1]]
    main = multi_view_nt_xent(z, t, detach_columns=detach_columns)
    return main + multi_view_nt_xent(reg, t, detach_columns=detach_columns) / lamda


def rocl_objective(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """RoCL: instance-wise attack of view 1 against view 2, then the 3-view loss and its regulariser."""
    ctx = ctx or StepContext()
    e = p.extra_params()
    detach = e.get("rocl_gradient", "full") == "authors"
    joint = fuse or bool(e.get("joint_bn", False))
    x1, x2 = views[0], views[1]
    attack = InnerAttack.from_params(p)
    with torch.no_grad(), eval_mode(model, attack.bn_eval):
        (target,) = encode(model, [x2])  # view 2 in eval mode: the same in every step of the attack

    def attack_loss(xa: list[Tensor]) -> Tensor:
        (za,) = encode(model, xa)
        return multi_view_nt_xent([za, target], p.t, detach_columns=detach)

    (x_adv,) = pgd_maximise(model, [x1], attack_loss, attack, gen=ctx.gen)
    # the authors' order (BatchNorm's running statistics see it): the regulariser's own forward in
    # ``get_loss``, then the training forward of the three views
    reg = encode(model, [x_adv, x2], joint)
    z = encode(model, [x1, x2, x_adv], joint)
    return rocl_loss(z, p.t, float(e["rocl_lamda"]), reg, detach_columns=detach), {}


register_adversarial_objective(
    "rocl",
    rocl_objective,
    "RoCL: instance-wise attack, adversarial view as a positive",
    single_bn=True,
)
