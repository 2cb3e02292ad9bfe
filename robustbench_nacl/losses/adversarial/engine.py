"""The engine every adversarial contrastive method shares: the inner maximisation (PGD, Linf), the
step context the trainer hands over, the NT-Xent forms the authors' codes compute, the parameter
checks and the registration of a method's objective and its model hooks.

:func:`pgd_maximise` perturbs a list of input batches jointly (the whole batch at once, every view
that the method attacks) to maximise a loss the method passes in, with a random start drawn from
the attack's own generator (:class:`StepContext`), the model in eval mode (BatchNorm on its running
statistics: every author's code attacks this way) and the BatchNorm route the method names.
Gradients are taken with respect to the inputs only, so the parameters' gradients are untouched.

Each method lives in its own module (``acl``, ``dynacl``, ``rocl``, ``deacl``) and keeps its
parameters in ``LossParams.extra``; each reading, default and the authors' file it follows:
docs/decisions.md, 'Adversarial contrastive pretraining'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..estimators import autocast_off, pair_loss_rows, upcast
from ..objectives import OBJECTIVES, Objective
from ..params import LossParams, Needs, bad_param

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
    """PGD Linf on the inputs: ``eps`` and ``step_size`` in [0, 1] pixel units, ``steps`` iterations.

    ``clamp_start``: the random start is clipped to [0, 1] before the first gradient (RoCL's
    ``RepresentationAdv``); ACL and DynACL take the first gradient at the unclipped start.
    """

    eps: float
    steps: int
    step_size: float
    random_start: bool = True
    bn_eval: bool = True  # attack with BatchNorm on its running statistics (model.eval())
    clamp_start: bool = False

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
            clamp_start=bool(e.get("attack_clamp_start", False)),
        )


def _random_start(x: Tensor, attack: InnerAttack, gen: torch.Generator | None) -> Tensor:
    # U(-eps, eps) as every author's code draws it; drawn on the generator's device, then moved
    dev = gen.device if gen is not None else x.device
    u = torch.rand(x.shape, generator=gen, device=dev, dtype=x.dtype).to(x.device)
    delta = (u * 2.0 - 1.0) * attack.eps
    return (x + delta).clamp(0.0, 1.0) - x if attack.clamp_start else delta


@contextmanager
def eval_mode(model: nn.Module, on: bool = True) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block (when ``on``), its previous mode restored after."""
    was_training = model.training
    if on:
        model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def pgd_maximise(
    model: nn.Module,
    xs: list[Tensor],
    loss_fn: Callable[[list[Tensor]], Tensor],
    attack: InnerAttack,
    *,
    gen: torch.Generator | None = None,
    attacked: list[bool] | None = None,
) -> list[Tensor]:
    """Adversarial versions of ``xs`` that maximise ``loss_fn(perturbed xs)`` within the Linf ball.

    Each step ``x' = clip_[0,1](clip_{x +- eps}(x' + step_size * sign(grad)))``: ACL's
    ``PGD_contrastive`` order (clip the perturbation, then the image), which equals RoCL's (clip the
    image, then project) and DeACL's (project, then clip) because both intervals contain ``x``.
    ``attacked[i]`` False leaves ``xs[i]`` clean (ACL's A2S attacks one view). The model runs in
    eval mode when ``attack.bn_eval`` (its previous mode is restored); ``loss_fn`` picks the
    BatchNorm route of each forward (it is the method's own forward).
    """
    attacked = attacked or [True] * len(xs)
    x0 = [x.detach() for x in xs]
    deltas = [
        _random_start(x, attack, gen) if (a and attack.random_start) else torch.zeros_like(x)
        for x, a in zip(x0, attacked, strict=True)
    ]
    with eval_mode(model, attack.bn_eval), torch.enable_grad():
        for _ in range(attack.steps):
            leaves = [d.requires_grad_(a) for d, a in zip(deltas, attacked, strict=True)]
            loss = loss_fn([x + d for x, d in zip(x0, leaves, strict=True)])
            moving = [d for d, a in zip(leaves, attacked, strict=True) if a]
            grads = iter(torch.autograd.grad(loss, moving))
            deltas = [
                _pgd_update(x, d, next(grads), attack) if a else d.detach()
                for x, d, a in zip(x0, leaves, attacked, strict=True)
            ]
    return [(x + d).detach() for x, d in zip(x0, deltas, strict=True)]


def _pgd_update(x: Tensor, d: Tensor, g: Tensor, attack: InnerAttack) -> Tensor:
    d = (d.detach() + attack.step_size * g.sign()).clamp(-attack.eps, attack.eps)
    return (x + d).clamp(0.0, 1.0) - x


# ============ the NT-Xent forms (pure functions of normalised embeddings) ============


def nt_xent(z1: Tensor, z2: Tensor, t: float) -> Tensor:
    """NT-Xent of two views (the ACL/DynACL ``nt_xent``): mean over the 2B anchors."""
    return pair_loss_rows(z1, z2, estimator="g0", temperature=t).mean()


def multi_view_nt_xent(zs: list[Tensor], t: float, *, detach_columns: bool = False) -> Tensor:
    """NT-Xent over ``k`` views of B images: each of the kB anchors sums ``-s_pos + log sum_{j != a}
    e^{s_j}`` over its ``k - 1`` positives (the other views of its image); the mean over anchors.

    ``k = 2`` is :func:`nt_xent`; ``k = 3`` is RoCL's ``NT_xent(adv_type='Rep')``. ``detach_columns``
    computes the similarities as ``z @ z.detach().T``, RoCL's ``pairwise_similarity``: the value is
    the same, the gradient flows through each anchor's own row only.
    """
    zz = upcast(torch.cat(zs, dim=0))
    with autocast_off(zz.device.type):
        sim = zz @ (zz.detach() if detach_columns else zz).T / t
    n, b = zz.shape[0], zs[0].shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    lse = torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=1)
    idx = torch.arange(n, device=sim.device)
    total = sum((lse - sim[idx, (idx + j * b) % n]) for j in range(1, len(zs)))
    return total.mean()


# ============ parameters and checks ============


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


#: ``extra`` keys whose value must be one of a few names, with the choices
CHOICES: dict[str, tuple[str, ...]] = {"eval_bn": EVAL_BN}
#: ``extra`` keys with a numeric range: (low, high, low inclusive, what the error adds)
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "attack_eps": (0.0, 1.0, True, " (pixel units, e.g. 0.0314 = 8/255)"),
    "attack_step_size": (0.0, 1.0, False, " (pixel units)"),
}


def check_attack(p: LossParams) -> None:
    """One-line errors for an inner attack or method parameter out of range."""
    e = p.extra_params()
    for key, (lo, hi, closed, note) in RANGES.items():
        if key in e and not ((lo <= e[key] if closed else lo < e[key]) and e[key] <= hi):
            raise bad_param(f"{key}={e[key]}; must {_interval(lo, hi, closed)}{note}")
    if e["attack_steps"] < 1:
        raise bad_param(f"attack_steps={e['attack_steps']}; must be >= 1")
    for key, choices in CHOICES.items():
        if key in e and e[key] not in choices:
            raise bad_param(f"{key}={e[key]!r}; valid choices: {', '.join(choices)}")
    if e.get("teacher") and not Path(str(e["teacher"])).exists():
        raise bad_param(
            f"teacher={e['teacher']!r} does not exist; pass a checkpoint directory written by `train`"
        )


def _interval(lo: float, hi: float, closed: bool) -> str:
    if hi == float("inf"):
        return f"be {'>=' if closed else '>'} {lo:g}"
    return f"lie in {'[' if closed else '('}{lo:g}, {hi:g}]"


def route(p: LossParams) -> str:
    """The BatchNorm route of the adversarial forwards: ``adv`` under dual BatchNorm."""
    return "adv" if p.dual_bn else "clean"


def register_adversarial_objective(
    name: str,
    fn: Callable[..., tuple[Tensor, dict[str, float]]],
    description: str,
    *,
    n_views: int = 2,
    single_bn: bool = False,
    check: Callable[[LossParams], None] | None = None,
    **hooks: Any,
) -> None:
    """Register an objective that receives a :class:`StepContext` (``ctx=``) from the trainer.

    ``hooks`` are the :class:`Objective` fields a method may set: ``schedule``, ``setup``,
    ``prepare`` and ``export``. ``single_bn``: the method's authors use one BatchNorm, and its
    forwards here have no adversarial route, so ``dual_bn`` is refused rather than ignored.
    ``check``: the method's own checks of its parameters (a one-line error), run at validation.
    """

    def needs(p: LossParams) -> Needs:
        # needs() runs inside validate(): the method's own parameters are checked here, before any data
        check_attack(p)
        if single_bn and p.dual_bn:
            raise bad_param(f"dual_bn=True; {name} uses one BatchNorm, as its authors' code does")
        if check is not None:
            check(p)
        return Needs(n_views=n_views, adversarial=True, labels=False)

    OBJECTIVES.add(name, Objective(needs=needs, loss=fn, contextual=True, **hooks), description=description)


def replace_extra(p: LossParams, **changes: Any) -> LossParams:
    """``p`` with some ``extra`` parameters changed (a method's variant of another's parameters)."""
    return dataclasses.replace(p, extra={**p.extra_params(), **changes})
