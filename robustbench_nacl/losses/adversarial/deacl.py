"""DeACL stage 2 (Zhang et al. 2022; pantheon5100/DeACL, ``solo/methods/mocov2_distillation_AT.py``,
``solo/methods/base_for_adversarial_training.py``): distil a frozen stage-1 teacher on clean
images and pull the adversarial features to the clean ones.

The student starts as a copy of the teacher's backbone (``student_init = "teacher"``): the
authors' base class loads the teacher's weights into the student unless ``--student_scratch`` is
passed, and their scripts never pass it. ``student_init = "scratch"`` is the randomly initialised
student (the earlier reading of this project).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...errors import UserError
from ...models.foreign import load_encoder
from ..estimators import upcast
from ..params import LossParams
from .engine import (
    CHOICES,
    InnerAttack,
    StepContext,
    attack_defaults,
    pgd_maximise,
    register_adversarial_objective,
)

STUDENT_INITS = ("teacher", "scratch")
CHOICES["student_init"] = STUDENT_INITS

#: DeACL's ``mocov2_distillation_AT.py``: epsilon 8, step_size 2 (/255), num_steps 5
DEACL_ATTACK = {**attack_defaults(8 / 255, 5, 2 / 255, eval_bn="clean"), "student_init": "teacher"}


def deacl_loss(s_clean: Tensor, s_adv: Tensor, target: Tensor, trades_k: float) -> Tensor:
    """DeACL stage 2: ``-cos(s(x), t(x)).mean() - trades_k * cos(s(x_adv), s(x)).mean()``."""
    cos = torch.nn.functional.cosine_similarity
    return -cos(s_clean, target).mean() - trades_k * cos(s_adv, s_clean).mean()


def load_teacher(p: LossParams, device: torch.device | None = None) -> dict[str, Any]:
    """DeACL's stage-1 teacher: the encoder of any checkpoint ``teacher`` names, frozen, in eval mode."""
    spec = str(p.extra_params().get("teacher", ""))
    if not spec:
        raise UserError("deacl needs a stage-1 teacher: --set teacher=DIR (a checkpoint written by `train`)")
    encoder, info = load_encoder(spec)
    for q in encoder.parameters():
        q.requires_grad_(False)
    if device is not None:
        encoder = encoder.to(device)
    return {"teacher": encoder.eval(), "teacher_info": info}


def init_from_teacher(model: nn.Module, p: LossParams) -> None:
    """``student_init = "teacher"``: the student's encoder starts as the teacher's (weights, BatchNorm
    statistics and normalisation), as the authors' ``base_for_adversarial_training.py`` loads it."""
    e = p.extra_params()
    if e.get("student_init", "scratch") != "teacher" or not e.get("teacher"):
        return  # without a teacher, ``validate`` and the trainer's setup say what is missing
    teacher = load_teacher(p)["teacher"]
    try:
        model.encoder.load_state_dict(teacher.state_dict(), strict=True)
    except RuntimeError as err:  # another architecture: a user's teacher, named in one line
        raise UserError(
            f"deacl: the teacher's encoder does not match the student's ({str(err).splitlines()[0]}); "
            "use a teacher trained with the student's --encoder and --encoder-arg, "
            "or --set student_init=scratch"
        ) from None


def deacl_objective(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DeACL stage 2: attack the weak view away from the teacher, then the two cosine terms."""
    ctx = ctx or StepContext()
    teacher = ctx.resources.get("teacher")
    if teacher is None:  # a caller without the trainer's setup
        teacher = load_teacher(p, views[0].device)["teacher"]
    x = views[0]
    with torch.no_grad():
        target = upcast(teacher(x))
    cos = torch.nn.functional.cosine_similarity

    def attack_loss(xa: list[Tensor]) -> Tensor:
        out = upcast(model(xa[0]))
        if out.shape[1] != target.shape[1]:
            raise UserError(
                f"deacl: the teacher's features have {target.shape[1]} dimensions and the student's "
                f"{out.shape[1]}; use a teacher with the student's encoder (--encoder, --encoder-arg)"
            )
        return -cos(out, target, dim=1).sum()

    (x_adv,) = pgd_maximise(model, [x], attack_loss, InnerAttack.from_params(p), gen=ctx.gen)
    # the authors' one forward of [clean; adversarial] (BatchNorm statistics over both)
    s = upcast(model(torch.cat([x, x_adv], dim=0)))
    s_clean, s_adv = s.split(x.shape[0], dim=0)
    return deacl_loss(s_clean, s_adv, target, float(p.extra_params()["trades_k"])), {}


register_adversarial_objective(
    "deacl",
    deacl_objective,
    "DeACL stage 2: distil a teacher on clean, pull adversarial to clean",
    n_views=1,
    single_bn=True,
    setup=load_teacher,
    prepare=init_from_teacher,
)
