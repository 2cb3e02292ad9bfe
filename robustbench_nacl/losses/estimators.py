"""Negative-term estimators g0 (SimCLR), g1 (Debiased) and g2 (hard negatives), in log space.

Every contrastive loss of the family is built from two numbers per anchor: the log of its
positive mass and ``log(N * G)``, the log of its estimated negative mass (docs/decisions.md,
'Negative estimators'). Both are computed from tempered similarities ``s = cos / t`` with a per-row
shift ``c`` factored out, so that ``e^{(beta+1) s}`` never overflows in fp32 even at t = 0.1.
Similarities are computed with autocast off, in float32 or float64 (docs/decisions.md,
'Loss precision').
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError
from .params import ESTIMATORS, Estimate


def check_estimator(estimator: str) -> None:
    """Raise a one-line error for an unknown estimator name."""
    if estimator not in ESTIMATORS:
        raise UserError(f"unknown negative estimator {estimator!r}; valid choices: {', '.join(ESTIMATORS)}")


def upcast(z: Tensor) -> Tensor:
    """``z`` in float32 if it has a lower precision (bf16/fp16 under autocast); float64 stays float64."""
    return z if z.dtype in (torch.float32, torch.float64) else z.float()


@contextmanager
def autocast_off(device_type: str) -> Iterator[None]:
    """Run the body with autocast disabled on ``device_type`` (a no-op where autocast is off).

    Under ``--precision bf16`` the trainer runs the model under autocast; a similarity matmul there
    would run in bf16 too (about 3e-3 to 3e-2 relative error at B = 256).
    """
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except (RuntimeError, ValueError):  # a device type without autocast support
        enabled = False
    if not enabled:
        yield
        return
    with torch.autocast(device_type, enabled=False):
        yield


def log_neg_mass(s_neg: Tensor, s_v: Tensor, est: Estimate | str | None = None, **fields: Any) -> Tensor:
    """``log(N * G)`` per anchor row.

    Args:
        s_neg: (A, N) tempered similarities of each anchor to its N negatives.
        s_v: (A, m) tempered similarities to the m samples of the positive distribution used by the
            debiasing correction (default m = 1, v_1 = the positive; M positives for NCA with M > 1,
            docs/decisions.md, 'NCA and MIXNCA').
        est: the :class:`Estimate` (estimator g0 | g1 | g2; temperature t, for the clamp
            ``N * e^{-1/t}``; tau_plus, the class prior of g1/g2; beta, g2's hardness, importance
            weights ``softmax(beta * s)``; detach_weights), or the estimator's name with the other
            fields as keywords.

    Returns:
        (A,) tensor of ``log(N * G)``.
    """
    e = Estimate.given(est, fields)
    check_estimator(e.estimator)
    n = s_neg.shape[1]
    if e.estimator == "g0":
        return torch.logsumexp(s_neg, dim=1)
    # The shift c is a constant of the row: the result is exactly shift-invariant, so detaching it
    # only removes a gradient path whose contributions cancel.
    c = torch.maximum(s_neg.max(dim=1).values, s_v.max(dim=1).values).detach()
    e_neg = torch.exp(s_neg - c[:, None])
    if e.estimator == "g1":
        first = e_neg.sum(dim=1)
    else:
        w = torch.softmax(e.beta * s_neg, dim=1)
        if e.detach_weights:
            w = w.detach()
        # N * sum_i k_i^(b+1) / sum_i k_i^b, written with softmax weights that sum to 1.
        first = n * (w * e_neg).sum(dim=1)
    corr = e.tau_plus * n * torch.exp(s_v - c[:, None]).mean(dim=1)
    ng = (first - corr) / (1.0 - e.tau_plus)
    floor = n * torch.exp(-1.0 / e.temperature - c)
    return torch.log(torch.maximum(ng, floor)) + c


def clamp_fraction(s_neg: Tensor, s_v: Tensor, est: Estimate) -> Tensor:
    """Fraction of anchors whose debiased estimate hits the ``N e^{-1/t}`` clamp (logged: there the
    negatives get no gradient for that anchor), as a 0-dim tensor on the similarities' device: the
    trainer reads its statistics out once per epoch, not once per step (no host sync)."""
    if est.estimator == "g0" or est.tau_plus == 0.0:
        return torch.zeros((), device=s_neg.device)
    with torch.no_grad():
        lng = log_neg_mass(s_neg, s_v, est)
        floor = math.log(s_neg.shape[1]) - 1.0 / est.temperature
        return (lng <= floor + 1e-6).float().mean()


def nca_row(lse_pos: Tensor, log_ng: Tensor) -> Tensor:
    """``K(sum_j e^{s_j+}, N G) = -log(P / (P + NG))`` per anchor, from ``log P`` and ``log NG``."""
    return torch.logaddexp(lse_pos, log_ng) - lse_pos


def similarity(a: Tensor, b: Tensor, temperature: float) -> Tensor:
    """Tempered similarities ``a @ b.T / t`` of unit rows, with autocast off (float32 or float64)."""
    a, b = upcast(a), upcast(b)
    with autocast_off(a.device.type):
        return a @ b.T / temperature


def base_pair_similarities(z1: Tensor, z2: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """Similarities of the standard two-view batch.

    Anchors are the 2B rows of ``cat(z1, z2)``; anchor i's positive is its other view and its
    negatives are the 2B - 2 views of the other images. The matmul runs with autocast off.

    Returns:
        ``(zz, s_pos, s_neg)``: the (2B, d) anchors, (2B,) positive and (2B, 2B-2) negative
        tempered similarities.
    """
    b = z1.shape[0]
    if b < 2:
        raise UserError("a contrastive batch needs at least 2 images (batch size >= 2)")
    zz = upcast(torch.cat([z1, z2], dim=0))
    sim = similarity(zz, zz, temperature)
    partner, negatives = _pair_indices(b, zz.device)
    s_pos = sim.gather(1, partner).squeeze(1)
    s_neg = sim.gather(1, negatives)
    return zz, s_pos, s_neg


@functools.lru_cache(maxsize=32)
def _pair_indices(b: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Column indices of each anchor's positive (2B, 1) and negatives (2B, 2B - 2), in column order.

    Computed once per (batch size, device): a boolean mask (``sim[~same]``) would make the device
    count its True entries, a host sync per loss call. Anchor i's negatives skip the columns
    ``i mod B`` and ``i mod B + B``; ``gather`` takes exactly the elements, in the order, that the
    mask took, so the loss and its gradient are bit-identical to the masked form's.
    """
    with torch.inference_mode(False):  # cached: usable by autograd even if first built without grad
        i = torch.arange(2 * b, device=device)
        r = (i % b)[:, None]
        k = torch.arange(2 * b - 2, device=device)[None, :]
        negatives = k + (k >= r).long() + (k >= r + b - 1).long()
        return ((i + b) % (2 * b))[:, None], negatives


def pair_loss_rows(z1: Tensor, z2: Tensor, est: Estimate | None = None, **fields: Any) -> Tensor:
    """Per-anchor two-view loss ``K(e^{s(x,x+)}, N G)`` for the 2B anchors (view-1 rows first).

    ``est`` is an :class:`Estimate`, or its fields are given as keywords (``estimator=``, ...).
    """
    e = Estimate.given(est, fields)
    _, s_pos, s_neg = base_pair_similarities(z1, z2, e.temperature)
    return nca_row(s_pos, log_neg_mass(s_neg, s_pos[:, None], e))


def pair_loss(
    z1: Tensor,
    z2: Tensor,
    *,
    estimator: str,
    temperature: float,
    tau_plus: float = 0.0,
    beta: float = 0.0,
) -> Tensor:
    """The two-view contrastive batch loss with estimator g0 | g1 | g2, mean over the 2B anchors.

    ``z1``, ``z2`` are the (B, d) embeddings of the two views, already L2-normalised; each anchor's
    negatives are the other 2B - 2 embeddings. Matches the public SimCLR/DCL/HCL implementations
    (``tests/data/golden``) to 1e-6 relative in float64. The keywords are spelled out here (not an
    :class:`Estimate`): this is the function a plugin loss calls.

    Examples:
        >>> z1 = F.normalize(torch.randn(8, 16, dtype=torch.float64), dim=1)
        >>> z2 = F.normalize(torch.randn(8, 16, dtype=torch.float64), dim=1)
        >>> loss = pair_loss(z1, z2, estimator="g2", temperature=0.5, tau_plus=0.1, beta=1.0)
    """
    return pair_loss_rows(z1, z2, Estimate(estimator, temperature, tau_plus, beta)).mean()


def normalize(z: Tensor) -> Tensor:
    """L2-normalise rows (the loss always works on unit vectors)."""
    return F.normalize(z, dim=1)
