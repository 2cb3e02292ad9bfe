"""Adversarial contrastive pretraining: one inner maximisation (PGD, Linf) and the objectives built on it.

:func:`pgd_maximise` is the engine every method here shares: it perturbs a list of input batches
jointly (the whole batch at once, every view that the method attacks) to maximise a loss the method
passes in, with a random start drawn from the attack's own generator (:class:`StepContext`), the
model in eval mode (BatchNorm on its running statistics: every author's code attacks this way) and
the adversarial BatchNorm route when the method uses dual BatchNorm. Gradients are taken with
respect to the inputs only, so the parameters' gradients are untouched.

The objectives (ACL, RoCL, DynACL) keep their parameters in ``LossParams.extra`` so that the
identity of every run of the other presets is what it was; each reading, default and the file it
comes from: docs/decisions.md, 'Adversarial contrastive pretraining'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..models.dual_bn import bn_route
from ..models.foreign import load_encoder
from .estimators import pair_loss_rows, similarity
from .objectives import OBJECTIVES, Objective, encode
from .params import LossParams, Needs, bad_param

ACL_MODES = ("ds", "a2a", "a2s")  # ACL: dual stream, adversarial-to-adversarial, adversarial-to-standard
EVAL_BN = ("clean", "adv")  # the BatchNorm branch an evaluation of the checkpoint uses


@dataclass(frozen=True)
class StepContext:
    """What an adversarial objective needs beyond one batch: the epoch and the attack's generator.

    ``epoch`` is 0-based. ``gen`` is the attack's own random stream (random starts), derived from
    the run's seed and the epoch by the trainer, so the view stream is the one the other presets
    draw and a run resumed at an epoch boundary replays bit for bit. ``values`` are the per-epoch
    values of a scheduled method (DynACL's augmentation strength and adversarial weight).
    """

    epoch: int = 0
    epochs: int = 1
    gen: torch.Generator | None = None
    values: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)  # from the objective's setup (a teacher)


@dataclass(frozen=True)
class InnerAttack:
    """PGD Linf on the inputs: ``eps`` and ``step_size`` in [0, 1] pixel units, ``steps`` iterations."""

    eps: float
    steps: int
    step_size: float
    random_start: bool = True
    bn_eval: bool = True  # attack with BatchNorm on its running statistics (model.eval())

    @classmethod
    def from_params(cls, p: LossParams) -> InnerAttack:
        """The attack a preset's ``extra`` parameters describe."""
        e = p.extra_params()
        return cls(
            eps=float(e["attack_eps"]),
            steps=int(e["attack_steps"]),
            step_size=float(e["attack_step_size"]),
            random_start=bool(e["attack_random_start"]),
            bn_eval=bool(e["attack_bn_eval"]),
        )


def _random_start(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
    # U(-eps, eps) as every author's code draws it; drawn on the generator's device, then moved
    dev = gen.device if gen is not None else x.device
    u = torch.rand(x.shape, generator=gen, device=dev, dtype=x.dtype).to(x.device)
    return (u * 2.0 - 1.0) * eps


def pgd_maximise(
    model: nn.Module,
    xs: list[Tensor],
    loss_fn: Callable[[list[Tensor]], Tensor],
    attack: InnerAttack,
    *,
    route: str = "clean",
    gen: torch.Generator | None = None,
    attacked: list[bool] | None = None,
) -> list[Tensor]:
    """Adversarial versions of ``xs`` that maximise ``loss_fn(perturbed xs)`` within the Linf ball.

    Each step ``x' = clip_[0,1](clip_{x +- eps}(x' + step_size * sign(grad)))``: ACL's
    ``PGD_contrastive`` order (clip the perturbation, then the image), which equals RoCL's and
    DeACL's (clip the image, then project) because both intervals contain ``x``. ``attacked[i]``
    False leaves ``xs[i]`` clean (ACL's A2S attacks one view). The model runs in eval mode when
    ``attack.bn_eval`` (its previous mode is restored) and through the BatchNorm ``route``.
    """
    attacked = attacked or [True] * len(xs)
    x0 = [x.detach() for x in xs]
    deltas = [
        _random_start(x, attack.eps, gen) if (a and attack.random_start) else torch.zeros_like(x)
        for x, a in zip(x0, attacked, strict=True)
    ]
    was_training = model.training
    if attack.bn_eval:
        model.eval()
    try:
        with bn_route(model, route), torch.enable_grad():
            for _ in range(attack.steps):
                leaves = [d.requires_grad_(a) for d, a in zip(deltas, attacked, strict=True)]
                loss = loss_fn([x + d for x, d in zip(x0, leaves, strict=True)])
                moving = [d for d, a in zip(leaves, attacked, strict=True) if a]
                grads = iter(torch.autograd.grad(loss, moving))
                deltas = [
                    _pgd_update(x, d, next(grads), attack) if a else d.detach()
                    for x, d, a in zip(x0, leaves, attacked, strict=True)
                ]
    finally:
        model.train(was_training)
    return [(x + d).detach() for x, d in zip(x0, deltas, strict=True)]


def _pgd_update(x: Tensor, d: Tensor, g: Tensor, attack: InnerAttack) -> Tensor:
    d = (d.detach() + attack.step_size * g.sign()).clamp(-attack.eps, attack.eps)
    return (x + d).clamp(0.0, 1.0) - x


# ============ the losses (pure functions of normalised embeddings) ============


def nt_xent(z1: Tensor, z2: Tensor, t: float) -> Tensor:
    """NT-Xent of two views (the ACL/DynACL ``nt_xent``): mean over the 2B anchors."""
    return pair_loss_rows(z1, z2, estimator="g0", temperature=t).mean()


def acl_loss(z: list[Tensor], z_adv: list[Tensor], t: float, mode: str, adv_weight: float = 1.0) -> Tensor:
    """ACL: ``ds`` ``((2 - w) NT-Xent(clean) + w NT-Xent(adv)) / 2`` (w = 1: ACL; DynACL's w),
    ``a2a`` NT-Xent of the two adversarial views, ``a2s`` NT-Xent of (clean view 1, adversarial view 2)."""
    if mode == "a2a":
        return nt_xent(z_adv[0], z_adv[1], t)
    if mode == "a2s":
        return nt_xent(z[0], z_adv[1], t)
    return ((2.0 - adv_weight) * nt_xent(z[0], z[1], t) + adv_weight * nt_xent(z_adv[0], z_adv[1], t)) / 2.0


def rocl_rows(z1: Tensor, z2: Tensor, z_adv: Tensor, t: float) -> Tensor:
    """RoCL's NT-Xent over 3B embeddings, per anchor: the sum over its two positives (the other two
    views of its image) of ``-s_pos + log sum_{k != anchor} e^{s_k}`` (RoCL ``NT_xent`` with
    ``adv_type='Rep'``); the batch loss is the mean over the 3B anchors."""
    b = z1.shape[0]
    zz = torch.cat([z1, z2, z_adv], dim=0)
    sim = similarity(zz, zz, t)
    n = 3 * b
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    lse = torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=1)
    idx = torch.arange(n, device=sim.device)
    p1, p2 = (idx + b) % n, (idx + 2 * b) % n
    return 2.0 * lse - sim[idx, p1] - sim[idx, p2]


def rocl_loss(z1: Tensor, z2: Tensor, z_adv: Tensor, t: float, lamda: float) -> Tensor:
    """RoCL: the 3-view NT-Xent plus ``(1 / lamda) NT-Xent(adv, view 2)`` (``regularize_to='other'``)."""
    return rocl_rows(z1, z2, z_adv, t).mean() + nt_xent(z_adv, z2, t) / lamda


# ============ parameters, schedule and checks ============


def attack_defaults(eps: float, steps: int, step_size: float, eval_bn: str) -> dict[str, Any]:
    """The ``extra`` parameters of the inner attack, with the evaluation BatchNorm branch."""
    return {
        "attack_eps": eps,
        "attack_steps": steps,
        "attack_step_size": step_size,
        "attack_random_start": True,
        "attack_bn_eval": True,
        "eval_bn": eval_bn,
    }


def check_attack(p: LossParams) -> None:
    """One-line errors for an inner attack or method parameter out of range."""
    e = p.extra_params()
    if not 0.0 <= e["attack_eps"] <= 1.0:
        raise bad_param(
            f"attack_eps={e['attack_eps']}; must lie in [0, 1] (pixel units, e.g. 0.0314 = 8/255)"
        )
    if e["attack_steps"] < 1:
        raise bad_param(f"attack_steps={e['attack_steps']}; must be >= 1")
    if not 0.0 < e["attack_step_size"] <= 1.0:
        raise bad_param(f"attack_step_size={e['attack_step_size']}; must lie in (0, 1] (pixel units)")
    if e["eval_bn"] not in EVAL_BN:
        raise bad_param(f"eval_bn={e['eval_bn']!r}; valid choices: {', '.join(EVAL_BN)}")
    if "acl_mode" in e and e["acl_mode"] not in ACL_MODES:
        raise bad_param(f"acl_mode={e['acl_mode']!r}; valid choices: {', '.join(ACL_MODES)}")
    if "rocl_lamda" in e and not e["rocl_lamda"] > 0:
        raise bad_param(f"rocl_lamda={e['rocl_lamda']}; must be > 0 (the regulariser's weight is 1 / lamda)")
    if "reload_frac" in e and not 0.0 < e["reload_frac"] <= 1.0:
        raise bad_param(f"reload_frac={e['reload_frac']}; must lie in (0, 1]")
    if "aux_bn_momentum" in e and not 0.0 < e["aux_bn_momentum"] <= 1.0:
        raise bad_param(f"aux_bn_momentum={e['aux_bn_momentum']}; must lie in (0, 1]")
    if "swap_param" in e and not 0.0 <= e["swap_param"] <= 1.5:
        raise bad_param(f"swap_param={e['swap_param']}; must lie in [0, 1.5]")
    if e.get("teacher") and not Path(str(e["teacher"])).exists():
        raise bad_param(
            f"teacher={e['teacher']!r} does not exist; pass a checkpoint directory written by `train`"
        )


def _adv_needs(p: LossParams) -> Needs:
    # needs() runs inside validate(): the method's own parameters are checked here, before any data
    check_attack(p)
    return Needs(n_views=2, adversarial=True, labels=False)


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


# ============ objectives ============


def _route(p: LossParams) -> str:
    return "adv" if p.dual_bn else "clean"


def _acl(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
    *,
    ctx: StepContext | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ACL / DynACL: attack the views with PGD on the loss the mode trains, then that loss."""
    ctx = ctx or StepContext()
    mode, route = p.extra_params().get("acl_mode", "ds"), _route(p)
    # A2S attacks view 2 only; its clean view 1 keeps the clean BatchNorm route throughout
    attacked = [mode != "a2s", True]

    def embed_pair(xa: list[Tensor]) -> list[Tensor]:
        if mode != "a2s":
            with bn_route(model, route):
                return encode(model, xa, fuse)
        (z1,) = encode(model, xa[:1])
        with bn_route(model, route):
            return [z1, *encode(model, xa[1:])]

    def attack_loss(xa: list[Tensor]) -> Tensor:
        return nt_xent(*embed_pair(xa), p.t)

    adv = pgd_maximise(
        model, views[:2], attack_loss, InnerAttack.from_params(p), gen=ctx.gen, attacked=attacked
    )
    z_adv = embed_pair(adv)
    z = encode(model, views[:2], fuse) if mode == "ds" else z_adv
    weight = float(ctx.values.get("adv_weight", 1.0))
    return acl_loss(z, z_adv, p.t, mode, weight), {}


def _rocl(
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
    x1, x2 = views[0], views[1]
    with torch.no_grad(), bn_route(model, "clean"):
        was = model.training
        model.train(not e["attack_bn_eval"])
        (target,) = encode(model, [x2])  # the attack's fixed target (RoCL: view 2 in eval mode)
        model.train(was)

    def attack_loss(xa: list[Tensor]) -> Tensor:
        (za,) = encode(model, xa)
        return nt_xent(za, target, p.t)

    (x_adv,) = pgd_maximise(
        model, [x1], attack_loss, InnerAttack.from_params(p), route=_route(p), gen=ctx.gen
    )
    z1, z2 = encode(model, [x1, x2], fuse)
    with bn_route(model, _route(p)):
        (z_adv,) = encode(model, [x_adv])
    return rocl_loss(z1, z2, z_adv, p.t, float(e["rocl_lamda"])), {}


def deacl_loss(s_clean: Tensor, s_adv: Tensor, target: Tensor, trades_k: float) -> Tensor:
    """DeACL stage 2: ``-cos(s(x), t(x)).mean() - trades_k * cos(s(x_adv), s(x)).mean()``."""
    cos = torch.nn.functional.cosine_similarity
    return -cos(s_clean, target).mean() - trades_k * cos(s_adv, s_clean).mean()


def load_teacher(p: LossParams, device: torch.device) -> dict[str, Any]:
    """DeACL's stage-1 teacher: the encoder of any checkpoint ``teacher`` names, frozen, in eval mode."""
    spec = str(p.extra_params().get("teacher", ""))
    if not spec:
        raise UserError("deacl needs a stage-1 teacher: --set teacher=DIR (a checkpoint written by `train`)")
    encoder, info = load_encoder(spec)
    for q in encoder.parameters():
        q.requires_grad_(False)
    return {"teacher": encoder.to(device).eval(), "teacher_info": info}


def _deacl(
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
        target = teacher(x).float()
    cos = torch.nn.functional.cosine_similarity

    def attack_loss(xa: list[Tensor]) -> Tensor:
        out = model(xa[0]).float()
        if out.shape[1] != target.shape[1]:
            raise UserError(
                f"deacl: the teacher's features have {target.shape[1]} dimensions and the student's "
                f"{out.shape[1]}; use a teacher with the student's encoder (--encoder, --encoder-arg)"
            )
        return -cos(out, target, dim=1).sum()

    (x_adv,) = pgd_maximise(model, [x], attack_loss, InnerAttack.from_params(p), route=_route(p), gen=ctx.gen)
    # the authors' one forward of [clean; adversarial] (BatchNorm statistics over both)
    s = model(torch.cat([x, x_adv], dim=0)).float()
    s_clean, s_adv = s.split(x.shape[0], dim=0)
    return deacl_loss(s_clean, s_adv, target, float(p.extra_params()["trades_k"])), {}


def register_adversarial_objective(
    name: str,
    fn: Callable[..., tuple[Tensor, dict[str, float]]],
    description: str,
    schedule: Callable[[LossParams, int, int], dict[str, Any]] | None = None,
    setup: Callable[[LossParams, torch.device], dict[str, Any]] | None = None,
    n_views: int = 2,
) -> None:
    """Register an objective that receives a :class:`StepContext` (``ctx=``) from the trainer."""

    def needs(p: LossParams) -> Needs:
        return dataclasses.replace(_adv_needs(p), n_views=n_views)

    OBJECTIVES.add(
        name,
        Objective(needs=needs, loss=fn, contextual=True, schedule=schedule, setup=setup),
        description=description,
    )


register_adversarial_objective("acl", _acl, "ACL: PGD on NT-Xent; dual-stream (DS), A2A or A2S")
register_adversarial_objective(
    "dynacl", _acl, "DynACL: ACL with annealed augmentation and adversarial weight", schedule=dynacl_schedule
)
register_adversarial_objective("rocl", _rocl, "RoCL: instance-wise attack, adversarial view as a positive")
register_adversarial_objective(
    "deacl",
    _deacl,
    "DeACL stage 2: distil a teacher on clean, pull adversarial to clean",
    setup=load_teacher,
    n_views=1,
)

#: ACL/DynACL's PGD: eps 8/255, step 2/255, 5 steps (``PGD_contrastive`` and ``--pgd_iter 5``); their
#: two BatchNorms are plain ``nn.BatchNorm2d`` (momentum 0.1, ``models/resnet_multi_bn.py``)
ACL_ATTACK = {**attack_defaults(8 / 255, 5, 2 / 255, eval_bn="adv"), "aux_bn_momentum": 0.1}
#: RoCL's ``rocl_train.py`` arguments: epsilon 0.0314, alpha 0.007, k = 7
ROCL_ATTACK = attack_defaults(0.0314, 7, 0.007, eval_bn="clean")
#: DeACL's ``mocov2_distillation_AT.py``: epsilon 8, step_size 2 (/255), num_steps 5
DEACL_ATTACK = attack_defaults(8 / 255, 5, 2 / 255, eval_bn="clean")
