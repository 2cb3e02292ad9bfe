"""Objectives: turn a model, a batch of views and the unified parameters into one loss.

The trainer calls ``OBJECTIVES.get(p.objective)``; inside the contrastive objective the positive
aggregator is itself a registry entry, so no code branches on a method's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..registry import Registry
from .estimators import base_pair_similarities, clamp_fraction, normalize, pair_loss
from .presets import LossParams, Needs
from .terms import arcl_rows, mixnca_rows, nca_rows, robust_rows, supervised_rows, var_rows, w_hat


def encode(model: nn.Module, xs: list[Tensor], fuse: bool = False) -> list[Tensor]:
    """Normalised embeddings of each input batch.

    By default one forward pass per view, as the papers' code does, so BatchNorm statistics are
    per view (gotcha 17); ``fuse`` concatenates them into one pass (recorded in the manifest).
    """
    if fuse and len(xs) > 1:
        z = normalize(model(torch.cat(xs, dim=0)).float())
        return list(z.split([x.shape[0] for x in xs], dim=0))
    # .float(): under bf16 autocast the loss itself stays in fp32 (e^{(beta+1)s}, gotcha 3)
    return [normalize(model(x).float()) for x in xs]


def random_cycle(n: int, gen: torch.Generator) -> Tensor:
    """A random n-cycle: a derangement (no image is mixed with itself), drawn from ``gen``."""
    order = torch.randperm(n, generator=gen, device=gen.device)
    perm = torch.empty_like(order)
    perm[order] = order.roll(-1)
    return perm


def _estimator_kwargs(p: LossParams, which: str = "G1") -> dict[str, Any]:
    return {
        "estimator": getattr(p, which),
        "temperature": p.t,
        "tau_plus": p.tau_plus,
        "beta": p.beta,
        "detach_weights": p.detach_weights,
    }


# ============ positive aggregators ============

Aggregator = Callable[[nn.Module, list[Tensor], list[Tensor], LossParams, torch.Generator, bool], Tensor]
AGGREGATORS: Registry[Aggregator] = Registry("positive aggregator")


@AGGREGATORS.register("nca")
def _nca(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    kw = _estimator_kwargs(p)
    rows = None
    if p.lam is None or p.combine:
        rows = nca_rows(z[0], z[1], z[2 : p.M + 1], **kw)
    if p.lam is not None:
        # MIXNCA: mix each anchor's positive view with the positive view of another image
        # (a random derangement per j, D6), in input space on augmented images.
        x_pos = torch.cat([views[1], views[0]], dim=0)
        b = views[0].shape[0]
        mixed_inputs = []
        for _ in range(p.M - 1):
            perm = random_cycle(b, gen)
            partner = torch.cat([views[1][perm], views[0][perm]], dim=0)
            mixed_inputs.append(p.lam * x_pos + (1.0 - p.lam) * partner)
        zm = encode(model, mixed_inputs, fuse) if mixed_inputs else []
        mix = mixnca_rows(z[0], z[1], zm, lam=p.lam, **kw)
        rows = mix if rows is None else rows + mix
    assert rows is not None
    return rows


@AGGREGATORS.register("var")
def _var(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    return var_rows(z[0], z[1 : p.M + 1], **_estimator_kwargs(p))


@AGGREGATORS.register("worst_pair")
def _worst_pair(model: nn.Module, views: list[Tensor], z: list[Tensor], p: LossParams, gen, fuse) -> Tensor:
    return arcl_rows(z, **_estimator_kwargs(p))


# ============ adversarial positives ============


def adversarial_view(model: nn.Module, x: Tensor, p: LossParams) -> Tensor:
    """CLAE's adversarial positive (D8): one FGSM step on the contrastive loss from the anchor view.

    x_adv = x + eps * sign(grad_x' NTXent(z(x), z(x')) at x' = x), with both passes through the
    auxiliary BatchNorm (train mode) when ``dual_bn``; no random start and, as in CLAE, no clamp
    to the image range. ``autograd.grad`` w.r.t. the input leaves parameter gradients untouched.
    """
    from ..models.encoders import bn_route

    x = x.detach()
    with bn_route(model, "adv" if p.dual_bn else "clean"):
        with torch.no_grad():
            z_anchor = normalize(model(x))
        xc = x.clone().requires_grad_(True)
        z_cand = normalize(model(xc))
        loss = pair_loss(
            z_anchor, z_cand, estimator=p.adv_estimator, temperature=p.t, tau_plus=p.tau_plus, beta=p.beta
        )
        (g,) = torch.autograd.grad(loss, xc)
    return (x + p.adv_eps * g.sign()).detach()


# ============ objectives ============


@dataclass(frozen=True)
class Objective:
    """A training objective: what it needs, and how it computes the loss."""

    needs: Callable[[LossParams], Needs]
    loss: Callable[..., tuple[Tensor, dict[str, float]]]


OBJECTIVES: Registry[Objective] = Registry("objective")


def _contrastive_needs(p: LossParams) -> Needs:
    if p.positives == "worst_pair":
        n_views = p.m_views
    elif p.positives == "var" or p.lam is None or p.combine:
        n_views = p.M + 1
    else:
        n_views = 2
    return Needs(n_views=n_views, adversarial=p.alpha > 0, mixing=p.lam is not None and p.M > 1, labels=False)


def contrastive_loss(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """``L_NaCl(G1, M, lam) + alpha * L_Robust(G2, w)`` on one batch of views; returns (loss, stats)."""
    from ..models.encoders import bn_route

    z = encode(model, views, fuse)
    rows = AGGREGATORS.get(p.positives)(model, views, z, p, gen, fuse)
    loss = rows.mean()
    stats: dict[str, float] = {"nacl_loss": float(loss.detach())}
    if p.tau_plus > 0:
        _, s_pos, s_neg = base_pair_similarities(z[0].detach(), z[1].detach(), p.t)
        stats["clamp_frac"] = clamp_fraction(
            s_neg, s_pos[:, None], p.G1, temperature=p.t, tau_plus=p.tau_plus, beta=p.beta
        )
    if p.alpha > 0:
        x_adv = adversarial_view(model, views[0], p)
        with bn_route(model, "adv" if p.dual_bn else "clean"):
            (z_adv,) = encode(model, [x_adv])
        kw = _estimator_kwargs(p, "G2")
        weights = None
        if p.w == "w_hat":
            weights = w_hat(z[0], z[1], **{k: v for k, v in kw.items() if k != "detach_weights"})
        robust = robust_rows(z[0], z_adv, weights, **kw).mean()
        stats["robust_loss"] = float(robust.detach())
        loss = loss + p.alpha * robust
    return loss, stats


def supervised_loss(
    model: nn.Module,
    views: list[Tensor],
    y: Tensor | None,
    p: LossParams,
    gen: torch.Generator,
    fuse: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Cross-entropy of the model's logits (head = linear classifier) on the first view."""
    if y is None:
        raise ValueError("the supervised objective needs labels")
    loss = supervised_rows(model(views[0]), y).mean()
    return loss, {}


OBJECTIVES.add(
    "contrastive",
    Objective(needs=_contrastive_needs, loss=contrastive_loss),
    description="the NaCl family: NCA/MIXNCA/VAR/ArCL positives + robust term",
)
OBJECTIVES.add(
    "supervised",
    Objective(
        needs=lambda p: Needs(n_views=1, adversarial=False, mixing=False, labels=True), loss=supervised_loss
    ),
    description="cross-entropy baseline",
)
