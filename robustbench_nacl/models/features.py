"""Frozen-encoder feature extraction, the weighted kNN monitor/probe, and the training monitor's
quick linear probe."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Weighted-kNN defaults of the SimCLR/DCL monitors (Wu et al. 2018): 200 neighbours, t = 0.1.
KNN_K = 200
KNN_T = 0.1


def as_float_images(x: Tensor) -> Tensor:
    """uint8 images -> float in [0,1]; float images are returned as they are."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    x: Tensor,
    *,
    batch_size: int = 512,
    device: torch.device | None = None,
    keep_device: bool = False,
) -> Tensor:
    """Encoder outputs for every image, computed once in eval mode without gradients.

    The encoder's train/eval mode is restored afterwards, so a caller in the middle of training
    (the kNN monitor) is unaffected; BatchNorm running statistics are never updated here. The
    features are returned on the CPU, or on the encoder's device with ``keep_device`` (for a kNN
    or probe that runs there).
    """
    device = device or next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    try:
        out = [
            encoder(as_float_images(x[i : i + batch_size].to(device))).float()
            for i in range(0, len(x), batch_size)
        ]
    finally:
        encoder.train(was_training)
    if not out:
        return torch.empty(0, device=device if keep_device else "cpu")
    return torch.cat(out) if keep_device else torch.cat(out).cpu()


@torch.no_grad()
def knn_predict(
    bank: Tensor,
    bank_y: Tensor,
    query: Tensor,
    *,
    num_classes: int,
    k: int = KNN_K,
    t: float = KNN_T,
    chunk: int = 1024,
) -> Tensor:
    """Weighted kNN (Wu et al. 2018, as in the SimCLR/DCL monitors): cosine top-k, votes e^{sim/t}.

    Votes are computed as e^{(sim - max sim)/t}: the same per-query scale, so the same argmax, but
    no overflow for a small ``t`` (e^{1/0.01} is inf in float32). ``k`` above the bank size uses
    the whole bank. Runs on the query's device (the bank and its labels are moved there); the
    predictions are returned there.
    """
    check_knn(k, t)
    dev = query.device
    bank = F.normalize(bank.to(dev).float(), dim=1)
    query = F.normalize(query.float(), dim=1)
    bank_y = bank_y.to(dev)
    k = min(k, len(bank))
    preds = []
    for i in range(0, len(query), chunk):
        sim = query[i : i + chunk] @ bank.T
        top, idx = sim.topk(k, dim=1)  # sorted: top[:, :1] is each query's largest similarity
        votes = torch.zeros(len(top), num_classes, dtype=top.dtype, device=dev)
        votes.scatter_add_(1, bank_y[idx], ((top - top[:, :1]) / t).exp())
        preds.append(votes.argmax(dim=1))
    return torch.cat(preds)


def check_knn(k: int, t: float) -> None:
    """Refuse a kNN setting that has no meaning (ValueError; the evaluator turns it into a UserError)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"kNN k must be an integer >= 1, got {k!r}")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
        raise ValueError(f"kNN temperature t must be a finite number > 0, got {t!r}")


def knn_accuracy(
    bank: Tensor,
    bank_y: Tensor,
    query: Tensor,
    query_y: Tensor,
    *,
    num_classes: int,
    k: int = KNN_K,
    t: float = KNN_T,
) -> float:
    """Fraction of queries whose weighted-kNN vote is their label (computed on the query's device)."""
    pred = knn_predict(bank, bank_y, query, num_classes=num_classes, k=k, t=t)
    return float((pred == query_y.to(pred.device)).float().mean())


# A feature whose training-split std is below this is left unscaled (std 1, as scikit-learn's
# StandardScaler does): dividing a dead unit by ~0 would give a head fitted on it a huge weight.
STD_EPS = 1e-6


def feature_scaler(f: Tensor) -> tuple[Tensor, Tensor]:
    """Per-feature mean and scale of ``f`` (population std; 1 where the std is below ``STD_EPS``):
    the standardisation of the evaluation probe (``ProbeConfig.standardize``) and of the monitor's."""
    mean, std = f.mean(0), f.std(0, unbiased=False)
    return mean, torch.where(std > STD_EPS, std, torch.ones_like(std))


#: The training monitor's quick linear probe: full-batch Adam at this learning rate for this many
#: steps on standardised features, from zero weights: a fixed cost per monitored epoch, large enough
#: that the curve follows the features rather than the probe's optimisation (tests/test_curves.py: it
#: fits separable features exactly). See docs/decisions.md, 'Training monitor and learning curves'.
MONITOR_PROBE_STEPS = 200
MONITOR_PROBE_LR = 0.05


@torch.no_grad()
def monitor_probe_accuracy(
    bank: Tensor,
    bank_y: Tensor,
    query: Tensor,
    query_y: Tensor,
    *,
    num_classes: int,
    steps: int = MONITOR_PROBE_STEPS,
    lr: float = MONITOR_PROBE_LR,
) -> tuple[float, float]:
    """A quick linear probe on cached features: ``(train accuracy, test accuracy)``.

    The features are standardised with the training split's mean and std; softmax regression starts
    from zero weights and takes full-batch Adam steps. Nothing is random (no initialisation, no
    batch order), so the monitor draws from no RNG and a training run is the same bits with it or
    without it. Runs on the bank's device.
    """
    dev = bank.device
    bank, query = bank.float(), query.to(dev).float()
    mean, scale = feature_scaler(bank)
    ones = torch.ones(len(bank), 1, device=dev)
    fa = torch.cat([(bank - mean) / scale, ones], dim=1)  # (N, d+1): the bias as a last column
    qa = torch.cat([(query - mean) / scale, torch.ones(len(query), 1, device=dev)], dim=1)
    bank_y, query_y = bank_y.to(dev), query_y.to(dev)
    onehot = F.one_hot(bank_y, num_classes).float()
    wb = torch.zeros(num_classes, fa.shape[1], device=dev)  # a feature constant on train keeps weight 0
    opt = torch.optim.Adam([wb], lr=lr)
    for _ in range(steps):
        # the softmax-regression gradient in closed form (this function runs without autograd)
        wb.grad = (torch.softmax(fa @ wb.T, dim=1) - onehot).T @ fa / len(fa)
        opt.step()
    train_acc = float(((fa @ wb.T).argmax(dim=1) == bank_y).float().mean())
    test_acc = float(((qa @ wb.T).argmax(dim=1) == query_y).float().mean())
    return train_acc, test_acc
