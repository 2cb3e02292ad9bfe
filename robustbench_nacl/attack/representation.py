"""Attacks on the representation itself (no labels, no head): sign-PGD that moves an encoder's
embedding away from its clean value (untargeted) or toward another image's (targeted), and the
distances they are read with.

Two public codes define these measures, and this module follows them (docs/decisions.md,
'Label-free robustness'):

- Petrov & Kwiatkowska, "Robustness of Unsupervised Representation Learning without Labels"
  (AleksandarPetrov/unsupervised-robustness, ``utils/pgd_attack.py``): a uniform start in the
  L-inf ball (not clipped to [0, 1] before the first forward), ``steps`` signed steps on the summed
  squared L2 distance between embeddings, ascent when untargeted and descent when targeted, each
  step clipped to the ball and then to [0, 1]; the last iterate is returned (no best-iterate
  tracking). ``scripts/representation_distance_distribution.py`` gives the "universal quantiles":
  all pairwise L2 distances within shuffled batches of 256 *clean* embeddings, summarised at a
  fixed grid of quantile levels; a distance is reported as the level whose quantile is nearest
  to it (``scripts/model_eval_results.py``, ``distances_to_universal_quantiles``), or divided by
  the median (its ``normalized_at_iter``).
- layer6ai-labs/ssl-robustness (``evaluators/attack.py``, ``PGD_Sign``; ``evaluators/loss.py``):
  the same step rule with an L2 (``MSELoss``) or cosine (``-cos``, summed) objective, eps 8/255,
  step 2/255, 20 steps (``conf/action/adversarial_attack.yaml``).

Every example's attack is independent of the rest of its batch (the encoder is in eval mode and
the objective is a sum of per-example terms), so batching changes no number:
``tests/test_label_free.py`` checks the batched attack against a per-example transcription of
``pgd_attack``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..registry import Registry
from .rng import rand

__all__ = [
    "OBJECTIVES",
    "QUANTILE_LEVELS",
    "clean_median",
    "clean_quantiles",
    "embed",
    "input_gradient",
    "representation_pgd",
    "universal_quantile",
]

Objective = Callable[[Tensor, Tensor], Tensor]
#: name -> per-example distance between an embedding and its reference: the untargeted attack
#: ascends it (away from the clean embedding), the targeted one descends it (toward the target)
OBJECTIVES: Registry[Objective] = Registry("representation objective")


@OBJECTIVES.register("l2", source="Petrov et al. pgd_attack MSELoss(reduction='none').sum(1); layer6 L2")
def l2_objective(z: Tensor, ref: Tensor) -> Tensor:
    """Squared L2 distance per example (layer6's batch-mean MSE has the same per-example sign)."""
    return (z - ref).pow(2).sum(dim=1)


@OBJECTIVES.register("cos", source="layer6 evaluators/loss.py Cosine: -cos(z, ref), summed")
def cos_objective(z: Tensor, ref: Tensor) -> Tensor:
    """Negative cosine similarity per example: ascending it turns the embedding away from ``ref``."""
    return -F.cosine_similarity(z, ref, dim=1)


@torch.no_grad()
def embed(encoder: nn.Module, x: Tensor, batch_size: int = 256) -> Tensor:
    """Embeddings of images in [0, 1] (float32, on ``x``'s device), in batches, without gradients."""
    out = [encoder(x[i : i + batch_size]).float() for i in range(0, len(x), batch_size)]
    return torch.cat(out) if out else torch.empty(0, device=x.device)


def representation_pgd(
    encoder: nn.Module,
    x: Tensor,
    *,
    eps: float,
    step_size: float,
    steps: int,
    objective: str = "l2",
    target: Tensor | None = None,
    gen: torch.Generator | None = None,
    random_init: bool = True,
    init: Tensor | None = None,
    batch_size: int = 256,
) -> Tensor:
    """Sign-PGD in representation space (Petrov et al.'s ``pgd_attack``; layer6's ``PGD_Sign``).

    ``x``: images in [0, 1]. Untargeted (``target`` None): ascend ``objective(f(x + d), f(x))``;
    targeted: descend ``objective(f(x + d), target)``, ``target`` one embedding per image. The start
    ``d`` is uniform in [-eps, eps] (drawn for every image at once from ``gen``, so batching does not
    change it), or ``init`` where given; each step adds ``+/- step_size * sign(grad)`` and clips to
    the ball, then to [0, 1]. Returns the last iterate, detached.
    """
    fn = OBJECTIVES.get(objective)
    x = x.detach()
    if init is not None:
        delta = init.detach().to(x.device, x.dtype)
    else:
        delta = (rand(x, gen) * 2 - 1) * eps if random_init else torch.zeros_like(x)
    ref = embed(encoder, x, batch_size) if target is None else target.detach().to(x.device).float()
    direction = -1.0 if target is not None else 1.0
    out = []
    for i in range(0, len(x), batch_size):
        xb, db, rb = x[i : i + batch_size], delta[i : i + batch_size].clone(), ref[i : i + batch_size]
        for _ in range(steps):
            db.requires_grad_(True)
            grad = input_gradient(fn(encoder(xb + db).float(), rb).sum(), db)
            with torch.no_grad():
                # ball first, then the image box (Petrov's order; clipping to two overlapping
                # intervals in either order is clipping to their intersection)
                db = (db + direction * step_size * grad.sign()).clamp(-eps, eps)
                db = torch.minimum(torch.maximum(db, -xb), 1 - xb)
        out.append((xb + db).detach())
    return torch.cat(out) if out else x.clone()


def input_gradient(loss: Tensor, x: Tensor) -> Tensor:
    """d loss / d x; zeros where no gradient reaches ``x`` (a detached or non-differentiable encoder:
    the attack then stays at its start, which the protocol's sanity flag reports)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad


#: Petrov et al.'s grid of quantile levels (representation_distance_distribution.py):
#: 0.001 .. 0.999 in steps of 0.001, and 100 log-spaced levels in [1e-9, 1e-3)
QUANTILE_LEVELS = np.sort(
    np.concatenate([np.arange(0.001, 1.0, 0.001), np.logspace(-9, -3, 100, endpoint=False)])
)


def clean_quantiles(bank: Tensor, gen: torch.Generator, batch: int = 256) -> np.ndarray:
    """The L2 distance at each of :data:`QUANTILE_LEVELS` among *clean* embeddings ``bank``:
    every pairwise distance within shuffled batches of ``batch`` (the authors' ``--batch-size 256``,
    ``shuffle=True``, the last batch smaller), summarised by ``numpy.quantile`` (linear)."""
    perm = torch.randperm(len(bank), generator=gen)
    z = bank.detach().float().cpu()[perm]
    dists = [F.pdist(z[i : i + batch], p=2) for i in range(0, len(z), batch) if len(z[i : i + batch]) > 1]
    if not dists:
        raise ValueError("the clean bank needs at least 2 embeddings for a distance distribution")
    return np.quantile(torch.cat(dists).double().numpy(), QUANTILE_LEVELS)


def universal_quantile(d: Tensor | np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each distance as the level whose clean quantile is nearest to it (the first such level on a
    tie: Python's ``min`` over the authors' sorted dict), Petrov et al.'s "universal quantile"."""
    d = np.abs(np.asarray(d.detach().cpu() if isinstance(d, Tensor) else d, dtype=float))
    idx = np.abs(d[:, None] - values[None, :]).argmin(axis=1)
    return QUANTILE_LEVELS[idx]


def clean_median(values: np.ndarray) -> float:
    """The clean distance at the level nearest 0.5 (``model_eval_results.py``'s ``medians``)."""
    return float(values[int(np.abs(QUANTILE_LEVELS - 0.5).argmin())])
