"""Objectives: turn a model, a batch of views and the unified parameters into one loss.

The trainer calls ``OBJECTIVES.get(p.objective)``; inside the contrastive objective the positive
aggregator is itself a registry entry, so no code branches on a method's name.

Adding an objective
-------------------
Register one loss function with what it needs from the trainer::

    @objective("my_loss", needs=lambda p: Needs(n_views=2, adversarial=False, labels=False),
               description="one line for `robustbench-nacl losses`")
    def my_loss(model, views, y, p, gen, fuse=False) -> tuple[Tensor, dict[str, Tensor]]:
        z = encode(model, views, fuse)  # forward passes under the caller's autocast, upcast
        return pair_loss(z[0], z[1], estimator=p.G1, temperature=p.t), {}

``needs(p)`` says how many views the view maker draws per image, whether adversarial positives
(dual BatchNorm) are used and whether labels are passed (then the model's head maps to the
classes); ``resolve()`` checks the head and every registry name against it before any data is
loaded. Statistics are detached 0-dim tensors (floats are accepted too): the trainer keeps them on
the device and reads them out once per epoch. A positive aggregator for the contrastive objective
is one ``@AGGREGATORS.register`` function. Compute embeddings with :func:`encode` and similarities
with the functions of ``estimators``/``terms``: they run with autocast off in float32 or float64
(docs/decisions.md, 'Loss precision').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..models.dual_bn import bn_route
from ..registry import Registry
from .estimators import base_pair_similarities, clamp_fraction, normalize, pair_loss, upcast
from .params import Estimate, LossParams, Needs
from .terms import arcl_rows, mixnca_rows, nca_rows, robust_rows, supervised_rows, var_rows, w_hat

LossFn = Callable[..., tuple[Tensor, dict[str, Tensor | float]]]


def embed(model: nn.Module, x: Tensor) -> Tensor:
    """Normalised embedding of one batch: the forward under the caller's autocast, then upcast.

    bf16/fp16 outputs become float32 before the normalisation; float64 stays float64.
    """
    return normalize(upcast(model(x)))


def project(model: nn.Module, xs: list[Tensor], fuse: bool = False) -> list[Tensor]:
    """Projections of each input batch, upcast as in :func:`embed` but not normalised.

    What a plugin pair loss receives (losses that standardise or whiten need the raw projections);
    ``fuse`` as in :func:`encode`.
    """
    if fuse and len(xs) > 1:
        z = upcast(model(torch.cat(xs, dim=0)))
        return list(z.split([x.shape[0] for x in xs], dim=0))
    return [upcast(model(x)) for x in xs]


def encode(model: nn.Module, xs: list[Tensor], fuse: bool = False) -> list[Tensor]:
    """Normalised embeddings of each input batch (see :func:`embed` for the precision).

    By default one forward pass per view, as the papers' code does, so BatchNorm statistics are
    per view (docs/decisions.md, 'Architecture'); ``fuse`` concatenates them into one pass
    (recorded in the manifest).
    """
    if fuse and len(xs) > 1:
        z = embed(model, torch.cat(xs, dim=0))
        return list(z.split([x.shape[0] for x in xs], dim=0))
    return [embed(model, x) for x in xs]


def random_cycle(n: int, gen: torch.Generator) -> Tensor:
    """A random n-cycle: a derangement (no image is mixed with itself), drawn from ``gen``."""
    order = torch.randperm(n, generator=gen, device=gen.device)
    perm = torch.empty_like(order)
    perm[order] = order.roll(-1)
    return perm


# ============ positive aggregators ============

Aggregator = Callable[[nn.Module, list[Tensor], list[Tensor], LossParams, torch.Generator, bool], Tensor]
AGGREGATORS: Registry[Aggregator] = Registry("positive aggregator")


def _mixed_positives(views: list[Tensor], p: LossParams, gen: torch.Generator) -> list[Tensor]:
    """MIXNCA's M - 1 mixed inputs: each anchor's positive view mixed with another image's.

    A random derangement per j, in input space on augmented images (docs/decisions.md,
    'NCA and MIXNCA').
    """
    x_pos = torch.cat([views[1], views[0]], dim=0)
    b = views[0].shape[0]
    mixed = []
    for _ in range(p.M - 1):
        perm = random_cycle(b, gen)
        partner = torch.cat([views[1][perm], views[0][perm]], dim=0)
        mixed.append(p.lam * x_pos + (1.0 - p.lam) * partner)
    return mixed


@AGGREGATORS.register("nca")
def _nca(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    est = Estimate.of(p)
    rows = None
    if p.lam is None or p.combine:
        rows = nca_rows(z[0], z[1], z[2 : p.M + 1], est)
    if p.lam is not None:
        mixed_inputs = _mixed_positives(views, p, gen)
        zm = encode(model, mixed_inputs, fuse) if mixed_inputs else []
        mix = mixnca_rows(z[0], z[1], zm, est, lam=p.lam)
        rows = mix if rows is None else rows + mix
    assert rows is not None
    return rows


@AGGREGATORS.register("var")
def _var(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    return var_rows(z[0], z[1 : p.M + 1], Estimate.of(p), anchors=p.var_anchors)


@AGGREGATORS.register("worst_pair")
def _worst_pair(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    return arcl_rows(z, Estimate.of(p), form=p.arcl_form)


# ============ adversarial positives ============


def adversarial_view(model: nn.Module, x: Tensor, p: LossParams) -> Tensor:
    """CLAE's adversarial positive: one FGSM step on the contrastive loss from the anchor view.

    x_adv = x + eps * sign(grad_x' NTXent(z(x), z(x')) at x' = x), with both passes through the
    auxiliary BatchNorm (train mode) when ``dual_bn``; no random start and, as in CLAE, no clamp
    to the image range (docs/decisions.md, 'Robust term'). ``autograd.grad`` w.r.t. the input
    leaves parameter gradients untouched.
    """
    x = x.detach()
    with bn_route(model, "adv" if p.dual_bn else "clean"):
        with torch.no_grad():
            z_anchor = embed(model, x)
        xc = x.clone().requires_grad_(True)
        z_cand = embed(model, xc)
        loss = pair_loss(
            z_anchor, z_cand, estimator=p.adv_estimator, temperature=p.t, tau_plus=p.tau_plus, beta=p.beta
        )
        (g,) = torch.autograd.grad(loss, xc)
    return (x + p.adv_eps * g.sign()).detach()


def robust_term(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams) -> Tensor:
    """``L_Robust(G2, w)``: the weighted loss of (clean anchor, adversarial view) pairs."""
    x_adv = adversarial_view(model, views[0], p)
    with bn_route(model, "adv" if p.dual_bn else "clean"):
        (z_adv,) = encode(model, [x_adv])
    est = Estimate.of(p, "G2")
    weights = w_hat(z[0], z[1], est, detach=not p.w_hat_grad) if p.w == "w_hat" else None
    return robust_rows(z[0], z_adv, weights, est, anchors=p.robust_anchors).mean()


# ============ objectives ============


@dataclass(frozen=True)
class Objective:
    """A training objective: what it needs from the trainer, and how it computes the loss."""

    needs: Callable[[LossParams], Needs]
    loss: LossFn
    # True: ``loss`` also takes ``ctx=`` (the epoch and the attack's own generator, losses/adversarial.py)
    contextual: bool = False
    # per-epoch values ``schedule(p, epoch, epochs) -> {name: value}`` handed to the view maker and in ``ctx``
    schedule: Callable[[LossParams, int, int], dict[str, Any]] | None = None
    # what the objective needs once per run, ``setup(p, device) -> {name: object}``, in ``ctx.resources``
    # (DeACL's frozen teacher)
    setup: Callable[[LossParams, torch.device], dict[str, Any]] | None = None
    # called once on the freshly built model, before a resumed state is loaded into it,
    # ``prepare(model, p)`` (DeACL's student from its teacher, DynACL's EMA network)
    prepare: Callable[[nn.Module, LossParams], None] | None = None
    # the module whose weights the checkpoint holds, ``export(model, p)`` (DynACL: the EMA network);
    # None: the trained model itself
    export: Callable[[nn.Module, LossParams], nn.Module] | None = None


OBJECTIVES: Registry[Objective] = Registry("objective")


def objective(
    name: str, *, needs: Callable[[LossParams], Needs], description: str
) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn(model, views, y, p, gen, fuse) -> (loss, stats)`` as objective ``name``.

    A name already registered is a one-line ``UserError`` (a plugin must not replace a built-in).
    """

    def deco(fn: LossFn) -> LossFn:
        if name in OBJECTIVES:
            raise UserError(f"objective {name!r} is already registered; choose another name")
        OBJECTIVES.add(name, Objective(needs=needs, loss=fn), description=description)
        return fn

    return deco


def needs(p: LossParams) -> Needs:
    """What the trainer must provide for these parameters (declared by ``p.objective``)."""
    return OBJECTIVES.get(p.objective).needs(p)


def _contrastive_needs(p: LossParams) -> Needs:
    if p.positives == "worst_pair":
        n_views = p.m_views
    elif p.positives == "var" or p.lam is None or p.combine:
        n_views = p.M + 1
    else:
        n_views = 2
    return Needs(n_views=n_views, adversarial=p.alpha > 0, labels=False)


@objective(
    "contrastive",
    needs=_contrastive_needs,
    description="the NaCl family: NCA/MIXNCA/VAR/ArCL positives + robust term",
)
def contrastive_loss(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``L_NaCl(G1, M, lam) + alpha * L_Robust(G2, w)`` on one batch of views; returns (loss, stats)."""
    z = encode(model, views, fuse)
    rows = AGGREGATORS.get(p.positives)(model, views, z, p, gen, fuse)
    loss = rows.mean()
    # statistics stay 0-dim tensors on the device: the trainer reads them out once per epoch
    stats: dict[str, Tensor] = {"nacl_loss": loss.detach()}
    if p.tau_plus > 0:
        _, s_pos, s_neg = base_pair_similarities(z[0].detach(), z[1].detach(), p.t)
        stats["clamp_frac"] = clamp_fraction(s_neg, s_pos[:, None], Estimate.of(p))
    if p.alpha > 0:
        robust = robust_term(model, views, z, p)
        stats["robust_loss"] = robust.detach()
        loss = loss + p.alpha * robust
    return loss, stats


@objective(
    "supervised",
    needs=lambda p: Needs(n_views=1, adversarial=False, labels=True),
    description="cross-entropy baseline",
)
def supervised_loss(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy of the model's logits (head = linear classifier) on the first view, in float32+."""
    if y is None:
        raise ValueError("the supervised objective needs labels")
    loss = supervised_rows(upcast(model(views[0])), y).mean()
    return loss, {}
