"""Pseudo-labels as DynACL's ``assign_label.py`` and AIR's ``LP-AFF.py`` assign them: k-means
(kmeans_pytorch 0.3, Euclidean) on the un-normalised backbone features of the unaugmented training
images, computed through the clean ('normal') BatchNorm branch in eval mode.

kmeans_pytorch's algorithm, read from its source (subhadarship/kmeans_pytorch, v0.3 = b7f57c19,
the release pip installs): initial centres are ``num_clusters`` distinct data points drawn at random
(``np.random.choice(n, k, replace=False)``); then, until ``center_shift ** 2 < tol`` with
``center_shift`` the sum over centres of their Euclidean moves: assign every point to its nearest
centre (squared distance summed over features, first minimum on ties), move every centre to the
mean of its points. The labels returned are the last assignment (made against the centres before
their last move). The authors set no seed; here the draw comes from a generator seeded from the
run's seed. An empty cluster (v0.3 makes its centre NaN) gets a random data point, as later
kmeans_pytorch does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..models.dual_bn import bn_route

#: bytes of the (rows, k, d) difference tensor per chunk: the authors' broadcast, bounded in memory
_CHUNK_BYTES = 1 << 26


@dataclass(frozen=True)
class KMeansResult:
    """Cluster ids of every point, the final centres, and how many iterations ran."""

    labels: Tensor  # int64 (N,)
    centers: Tensor  # (k, d)
    iterations: int
    init_indices: Tensor  # the data points the centres started at


def squared_distances(x: Tensor, centers: Tensor) -> Tensor:
    """``((x[:, None] - centers[None]) ** 2).sum(-1)``: kmeans_pytorch's ``pairwise_distance``, in
    row chunks (the same sums, element by element)."""
    rows = max(1, _CHUNK_BYTES // max(1, centers.numel() * x.element_size()))
    return torch.cat([((x[i : i + rows, None] - centers[None]) ** 2).sum(-1) for i in range(0, len(x), rows)])


def kmeans(
    x: Tensor, num_clusters: int, *, tol: float, gen: torch.Generator, max_iter: int = 10_000
) -> KMeansResult:
    """k-means as kmeans_pytorch runs it (module docstring); every random draw from ``gen`` (CPU)."""
    x = x.float()
    n = len(x)
    if not 2 <= num_clusters <= n:
        raise UserError(f"k-means: {num_clusters} clusters need 2 <= k <= {n} (the number of images)")
    init = torch.randperm(n, generator=gen)[:num_clusters]  # k distinct points, uniformly
    centers = x[init.to(x.device)].clone()
    iteration = 0
    while True:
        labels = squared_distances(x, centers).argmin(dim=1)
        previous = centers.clone()
        for k in range(num_clusters):
            members = x[labels == k]
            if len(members) == 0:
                members = x[torch.randint(n, (1,), generator=gen).to(x.device)]
            centers[k] = members.mean(dim=0)
        shift = torch.sqrt(((centers - previous) ** 2).sum(dim=1)).sum()
        iteration += 1
        if shift**2 < tol or iteration >= max_iter:
            break
    return KMeansResult(labels.cpu(), centers.cpu(), iteration, init)


@torch.no_grad()
def backbone_features(
    encoder: nn.Module, x: Tensor, *, route: str = "clean", batch_size: int = 500
) -> Tensor:
    """The encoder's output (backbone features, before any projection head, not L2-normalised) of
    uint8 images ``x``, unaugmented, eval mode, through BatchNorm branch ``route``; on the encoder's
    device. The encoder's mode and route are restored afterwards."""
    device = next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    try:
        with bn_route(encoder, route):
            out = [
                encoder(x[i : i + batch_size].to(device).float().div(255))
                for i in range(0, len(x), batch_size)
            ]
    finally:
        encoder.train(was_training)
    return torch.cat(out)


def assign_pseudo_labels(
    encoder: nn.Module,
    x: Tensor,
    num_clusters: int,
    *,
    tol: float,
    seed: int,
    route: str = "clean",
    max_iter: int = 10_000,
) -> KMeansResult:
    """Pseudo-labels of uint8 images ``x``: :func:`kmeans` on :func:`backbone_features` (``route``),
    initial centres drawn from a CPU generator seeded by ``seed``."""
    feats = backbone_features(encoder, x, route=route)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return kmeans(feats, num_clusters, tol=tol, gen=gen, max_iter=max_iter)
