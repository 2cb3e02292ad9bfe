"""The loss terms of the NaCl family as pure functions of L2-normalised embeddings.

Each returns one loss per anchor (2B rows: view-0 anchors first, then view-1 anchors), so that
weights, means and identities are easy to apply and test. Formulas: SEED_SPEC sections 1.2-1.14.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .estimators import base_pair_similarities, log_neg_mass, nca_row, pair_loss_rows


def nca_rows(
    z0: Tensor,
    z1: Tensor,
    extras: list[Tensor],
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
    detach_weights: bool = False,
) -> Tensor:
    """L_NCA(G, M) per anchor with M = 1 + len(extras) positives (SEED_SPEC 1.6, layout D3).

    Anchors are the base views ``z0``, ``z1``; anchor a's positives are its other base view and
    the extra views of the same image; negatives are the base views of the other images
    (N = 2B - 2, independent of M). Debiasing uses all M positives (D4: m = M, v_j = x_j+).
    """
    zz, s_pos, s_neg = base_pair_similarities(z0, z1, temperature)
    cols = [s_pos]
    for e in extras:
        cols.append((zz * torch.cat([e, e], dim=0)).sum(dim=1) / temperature)
    s_all = torch.stack(cols, dim=1)
    log_ng = log_neg_mass(
        s_neg,
        s_all,
        estimator,
        temperature=temperature,
        tau_plus=tau_plus,
        beta=beta,
        detach_weights=detach_weights,
    )
    return nca_row(torch.logsumexp(s_all, dim=1), log_ng)


def mixnca_rows(
    z0: Tensor,
    z1: Tensor,
    mixed: list[Tensor],
    *,
    lam: float,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
    detach_weights: bool = False,
) -> Tensor:
    """L_MIXNCA(G, M, lambda) per anchor with M - 1 = len(mixed) mixed positives (SEED_SPEC 1.8).

    ``mixed[j]`` is (2B, d): row i is the embedding of anchor i's mixed positive
    ``x'_j = lam x+ + (1 - lam) x_j-``. One N*G per anchor serves the first term and every Omega_j
    (D5), debiased with v_1 = x+. With no mixed positives this is the base loss.
    """
    zz, s_pos, s_neg = base_pair_similarities(z0, z1, temperature)
    log_ng = log_neg_mass(
        s_neg,
        s_pos[:, None],
        estimator,
        temperature=temperature,
        tau_plus=tau_plus,
        beta=beta,
        detach_weights=detach_weights,
    )
    rows = nca_row(s_pos, log_ng)
    if not mixed:
        return rows
    soft = torch.zeros_like(rows)
    for zm in mixed:
        ell = (zz * zm).sum(dim=1) / temperature
        den = torch.logaddexp(ell, log_ng)
        # Binary cross-entropy with soft target lambda on Omega_j = e^ell / (e^ell + NG).
        soft = soft - lam * (ell - den) - (1.0 - lam) * (log_ng - den)
    return rows + soft / len(mixed)


def var_rows(
    z0: Tensor,
    positives: list[Tensor],
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
    detach_weights: bool = False,
) -> Tensor:
    """L_VAR(G, M) per anchor (NaCl-ICLR): the mean of M two-view trials (view 0, view j)."""
    rows = [
        pair_loss_rows(
            z0,
            zj,
            estimator=estimator,
            temperature=temperature,
            tau_plus=tau_plus,
            beta=beta,
            detach_weights=detach_weights,
        )
        for zj in positives
    ]
    return torch.stack(rows, dim=0).mean(dim=0)


def worst_pair(views: list[Tensor]) -> tuple[Tensor, Tensor]:
    """ArCL's selection: per image, the two of its m views with the lowest cosine similarity."""
    zs = torch.stack(views, dim=0)  # (m, B, d)
    m, b, _ = zs.shape
    with torch.no_grad():
        cos = torch.einsum("jbd,kbd->bjk", zs, zs)
        upper = torch.triu(torch.ones(m, m, dtype=torch.bool, device=zs.device), diagonal=1)
        cos = cos.masked_fill(~upper, float("inf"))
        flat = cos.view(b, m * m).argmin(dim=1)
        j, k = flat // m, flat % m
    ar = torch.arange(b, device=zs.device)
    return zs[j, ar], zs[k, ar]


def arcl_rows(
    views: list[Tensor],
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
    detach_weights: bool = False,
) -> Tensor:
    """ArCL (D13): NT-Xent (with estimator G) on each image's worst-aligned pair of m views.

    Gradients flow only through the selected pair; the selection itself is not differentiated.
    """
    za, zb = worst_pair(views)
    return pair_loss_rows(
        za,
        zb,
        estimator=estimator,
        temperature=temperature,
        tau_plus=tau_plus,
        beta=beta,
        detach_weights=detach_weights,
    )


def w_hat(
    z0: Tensor,
    z1: Tensor,
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
) -> Tensor:
    """The adversarial weighting w_hat(x) = K(e^{s(x,x+)}, N G), per image, detached (D9).

    The image's weight is the clean loss of its view-0 anchor (x in the formula); it is a weight,
    not a loss path, hence detached, and not renormalised (the papers do not).
    """
    b = z0.shape[0]
    rows = pair_loss_rows(z0, z1, estimator=estimator, temperature=temperature, tau_plus=tau_plus, beta=beta)
    return rows[:b].detach()


def robust_rows(
    z_anchor: Tensor,
    z_adv: Tensor,
    weights: Tensor | None,
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
    detach_weights: bool = False,
) -> Tensor:
    """L_Robust(G, w) per anchor (SEED_SPEC 1.9): w(x) * K(e^{s(x, x_adv)}, N G).

    Pairs are (clean anchor, its adversarial view); negatives are the other clean anchors and the
    other adversarial views (N = 2B - 2). ``weights`` is per image (B,) or None for w = 1; it
    multiplies the loss (it is not inside the log).
    """
    rows = pair_loss_rows(
        z_anchor,
        z_adv,
        estimator=estimator,
        temperature=temperature,
        tau_plus=tau_plus,
        beta=beta,
        detach_weights=detach_weights,
    )
    if weights is None:
        return rows
    return rows * torch.cat([weights, weights], dim=0)


def supervised_rows(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy per example: the supervised baseline of NaCl appendix I."""
    return F.cross_entropy(logits, y, reduction="none")
