"""The loss terms of the NaCl family as pure functions of L2-normalised embeddings.

Each returns one loss per anchor (2B rows: view-0 anchors first, then view-1 anchors; B rows for
the one-sided forms), so that weights, means and identities are easy to apply and test.
Formulas: docs/decisions.md, 'Loss formulas', and the sections named in each function.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .estimators import (
    autocast_off,
    base_pair_similarities,
    log_neg_mass,
    nca_row,
    pair_loss_rows,
    similarity,
    upcast,
)
from .params import ANCHORS, ARCL_FORMS, Estimate


def nca_rows(
    z0: Tensor, z1: Tensor, extras: list[Tensor], est: Estimate | None = None, **fields: Any
) -> Tensor:
    """L_NCA(G, M) per anchor with M = 1 + len(extras) positives (docs/decisions.md, 'NCA and MIXNCA').

    Anchors are the base views ``z0``, ``z1``; anchor a's positives are its other base view and
    the extra views of the same image; negatives are the base views of the other images
    (N = 2B - 2, independent of M). Debiasing uses all M positives (m = M, v_j = x_j+).
    ``est`` is an :class:`Estimate`, or its fields are given as keywords (as for every term here).
    """
    e = Estimate.given(est, fields)
    zz, s_pos, s_neg = base_pair_similarities(z0, z1, e.temperature)
    cols = [s_pos]
    for x in extras:
        cols.append((zz * torch.cat([x, x], dim=0)).sum(dim=1) / e.temperature)
    s_all = torch.stack(cols, dim=1)
    log_ng = log_neg_mass(s_neg, s_all, e)
    return nca_row(torch.logsumexp(s_all, dim=1), log_ng)


def mixnca_rows(
    z0: Tensor,
    z1: Tensor,
    mixed: list[Tensor],
    est: Estimate | None = None,
    *,
    lam: float,
    **fields: Any,
) -> Tensor:
    """L_MIXNCA(G, M, lambda) per anchor with M - 1 = len(mixed) mixed positives.

    ``mixed[j]`` is (2B, d): row i is the embedding of anchor i's mixed positive
    ``x'_j = lam x+ + (1 - lam) x_j-``. One N*G per anchor serves the first term and every Omega_j,
    debiased with v_1 = x+ (docs/decisions.md, 'NCA and MIXNCA'). With no mixed positives this is
    the base loss.
    """
    e = Estimate.given(est, fields)
    zz, s_pos, s_neg = base_pair_similarities(z0, z1, e.temperature)
    log_ng = log_neg_mass(s_neg, s_pos[:, None], e)
    rows = nca_row(s_pos, log_ng)
    if not mixed:
        return rows
    soft = torch.zeros_like(rows)
    for zm in mixed:
        ell = (zz * zm).sum(dim=1) / e.temperature
        den = torch.logaddexp(ell, log_ng)
        # Binary cross-entropy with soft target lambda on Omega_j = e^ell / (e^ell + NG).
        soft = soft - lam * (ell - den) - (1.0 - lam) * (log_ng - den)
    return rows + soft / len(mixed)


def var_rows(
    z0: Tensor,
    positives: list[Tensor],
    est: Estimate | None = None,
    *,
    anchors: str = "both",
    **fields: Any,
) -> Tensor:
    """L_VAR(G, M) per anchor (NaCl-ICLR): the mean of M two-view trials (view 0, view j).

    Each trial's negatives are the views 0 and j of the other images (N = 2B - 2). ``anchors="both"``
    (default) anchors every trial on view 0 and view j (2B rows); ``"one_sided"`` on view 0 only
    (B rows), as the paper prints E_x[1/M sum_j K(e^{s(x, x_j+)}, N g)] (docs/decisions.md, 'VAR').
    """
    _check_choice("anchors", anchors, ANCHORS)
    e = Estimate.given(est, fields)
    b = z0.shape[0]
    rows = [pair_loss_rows(z0, zj, e) for zj in positives]
    out = torch.stack(rows, dim=0).mean(dim=0)
    return out if anchors == "both" else out[:b]


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def worst_pair(views: list[Tensor]) -> tuple[Tensor, Tensor]:
    """ArCL's selection: per image, the two of its m views with the lowest cosine similarity."""
    zs = upcast(torch.stack(views, dim=0))  # (m, B, d)
    m, b, _ = zs.shape
    with torch.no_grad(), autocast_off(zs.device.type):
        cos = torch.einsum("jbd,kbd->bjk", zs, zs)
        upper = torch.triu(torch.ones(m, m, dtype=torch.bool, device=zs.device), diagonal=1)
        cos = cos.masked_fill(~upper, float("inf"))
        flat = cos.view(b, m * m).argmin(dim=1)
        j, k = flat // m, flat % m
    ar = torch.arange(b, device=zs.device)
    return zs[j, ar], zs[k, ar]


def arcl_rows(
    views: list[Tensor], est: Estimate | None = None, *, form: str = "ntxent", **fields: Any
) -> Tensor:
    """ArCL per anchor on each image's worst-aligned pair of its m views (docs/decisions.md, 'ArCL').

    ``form="ntxent"`` (default): the two-view loss with estimator G on the selected pair, both
    selected views as anchors, negatives the selected views of the other images, the positive in
    the denominator (2B rows). ``form="algorithm1"``: ArCL's Algorithm 1 as printed (B rows, see
    :func:`arcl_algorithm1_rows`). Gradients flow only through the embeddings the loss uses; the
    selection itself is not differentiated.
    """
    _check_choice("form", form, ARCL_FORMS)
    e = Estimate.given(est, fields)
    if form == "algorithm1":
        return arcl_algorithm1_rows(views, e)
    za, zb = worst_pair(views)
    return pair_loss_rows(za, zb, e)


def arcl_algorithm1_rows(views: list[Tensor], est: Estimate | None = None, **fields: Any) -> Tensor:
    """ArCL Algorithm 1 as printed: ``-log(e^{s_i+} / sum_{j != i} e^{s_ij-})`` for the B view-1 anchors.

    ``s_i+`` is the worst pair's tempered cosine; the 2B - 1 negatives of anchor ``z_i1`` are every
    view 1 and view 2 of the batch except ``z_i1`` itself, so its own second view is a negative and
    the positive is not in the denominator. With g0 this is the printed loss exactly; g1/g2 replace
    the denominator by their estimate N G (N = 2B - 1).
    """
    e = Estimate.given(est, fields)
    za, zb = worst_pair(views)
    s_pos = (za * zb).sum(dim=1) / e.temperature
    z1, z2 = views[0], views[1]
    b = z1.shape[0]
    sim = similarity(z1, torch.cat([z1, z2], dim=0), e.temperature)  # (B, 2B)
    keep = torch.ones_like(sim, dtype=torch.bool)
    keep[torch.arange(b), torch.arange(b)] = False  # drop z_i1 . z_i1 only
    s_neg = sim[keep].view(b, 2 * b - 1)
    return log_neg_mass(s_neg, s_pos[:, None], e) - s_pos


def w_hat(
    z0: Tensor, z1: Tensor, est: Estimate | None = None, *, detach: bool = True, **fields: Any
) -> Tensor:
    """The adversarial weighting w_hat(x) = K(e^{s(x,x+)}, N G), per image (docs/decisions.md, 'Robust term').

    The image's weight is the clean loss of its view-0 anchor (x in the formula). Detached by
    default (a weight, not a loss path); ``detach=False`` lets gradient flow through it, as the
    formula read literally does. Not renormalised (the papers do not). The weight never detaches
    g2's importance weights (``est.detach_weights`` is ignored here, as it always was).
    """
    e = dataclasses.replace(Estimate.given(est, fields), detach_weights=False)
    b = z0.shape[0]
    rows = pair_loss_rows(z0, z1, e)
    return rows[:b].detach() if detach else rows[:b]


def robust_rows(
    z_anchor: Tensor,
    z_adv: Tensor,
    weights: Tensor | None,
    est: Estimate | None = None,
    *,
    anchors: str = "both",
    **fields: Any,
) -> Tensor:
    """L_Robust(G, w) per anchor: w(x) * K(e^{s(x, x_adv)}, N G) (docs/decisions.md, 'Robust term').

    Pairs are (clean anchor, its adversarial view); negatives are the other clean anchors and the
    other adversarial views (N = 2B - 2). ``anchors="both"`` (default) also anchors on the
    adversarial views (2B rows); ``"one_sided"`` keeps the B clean anchors, as NaCl prints
    E_x[w(x) K(...)]. ``weights`` is per image (B,) or None for w = 1; it multiplies the loss
    (it is not inside the log).
    """
    _check_choice("anchors", anchors, ANCHORS)
    rows = pair_loss_rows(z_anchor, z_adv, Estimate.given(est, fields))
    if anchors == "one_sided":
        rows = rows[: z_anchor.shape[0]]
    if weights is None:
        return rows
    return rows * weights.repeat(rows.shape[0] // weights.shape[0])


def supervised_rows(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy per example: the supervised baseline of NaCl appendix I."""
    return F.cross_entropy(logits, y, reduction="none")
