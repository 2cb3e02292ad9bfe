"""Decoupled contrastive learning (Yeh et al., ECCV 2022) as a robustbench-nacl plugin.

DCL removes the positive pair from the InfoNCE denominator. For the 2B views of a batch of B
images (z_i and its other view z_i+, cosine similarities s, temperature t), every view anchors once:

    L_i = - w_i * s(z_i, z_i+) / t + log sum_{k != i, k != i+} exp(s(z_i, z_k) / t)

and the loss is the mean of L_i over the 2B anchors. ``w_i = 1`` is DCL; ``vmf=true`` gives DCLW,
the paper's negative von Mises-Fisher weighting of the positive term,
``w_i = 2 - B * softmax_j(s(z_j, z_j+) / sigma)_i``. The temperature t = 0.1, sigma = 0.5 and the
weights taking part in the gradient (not detached) follow the widely used public implementation
(github.com/raminnakhli/Decoupled-Contrastive-Learning); change them with ``--set``. Its two
one-way losses are summed, here averaged: the same loss up to a factor of 2.

Use it (from the repository root)::

    robustbench-nacl train --plugin examples/decoupled_contrastive.py --loss dcl_decoupled --set t=0.2
    robustbench-nacl losses --plugin examples/decoupled_contrastive.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from robustbench_nacl import register_pair_loss

PAPER = "Yeh et al., ECCV 2022, Decoupled Contrastive Learning"


def vmf_weights(z1: Tensor, z2: Tensor, sigma: float) -> Tensor:
    """DCLW's positive weights ``2 - B * softmax(s(z_i, z_i+) / sigma)`` for the B pairs (mean 1)."""
    cos = (F.normalize(z1, dim=1) * F.normalize(z2, dim=1)).sum(dim=1)
    return 2.0 - z1.shape[0] * torch.softmax(cos / sigma, dim=0)


@register_pair_loss("dcl_decoupled", t=0.1, vmf=False, sigma=0.5, paper=PAPER)
def decoupled_contrastive(z1: Tensor, z2: Tensor, t: float, vmf: bool, sigma: float) -> Tensor:
    """DCL: InfoNCE without the positive in the denominator (DCLW with vmf=true)."""
    b = z1.shape[0]
    if b < 2:
        raise ValueError("decoupled contrastive loss needs at least 2 images per batch")
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    sim = z @ z.T / t
    idx = torch.arange(2 * b, device=z.device)
    partner = (idx + b) % (2 * b)
    positive = sim[idx, partner]
    # the anchor itself and its positive leave the denominator: only the 2B - 2 other views remain
    excluded = (idx[:, None] == idx[None, :]) | (partner[:, None] == idx[None, :])
    negative = torch.logsumexp(sim.masked_fill(excluded, float("-inf")), dim=1)
    weights = vmf_weights(z1, z2, sigma).repeat(2) if vmf else torch.ones_like(positive)
    return (negative - weights * positive).mean()
