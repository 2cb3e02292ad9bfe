"""Linear and kNN probes on a frozen encoder, and the attacked classifier they produce.

Features are computed once with the encoder in eval mode and no gradients; the linear layer is
trained on that cached tensor, so the paper's 1000-epoch schedule costs seconds. The cache is
only for training the probe and for clean metrics: attacks always run end to end on
``ProbedClassifier`` (normalisation -> encoder -> linear) from [0,1] pixels. A probe fitted on
standardised features (``ProbeConfig.standardize``) has the standardisation folded into its linear
layer, so the attacked model is still encoder -> linear on the raw features.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accel import CompilePlan, compile_fn, current_plan
from ..data import ImageData
from ..errors import UserError
from ..models.features import KNN_K, KNN_T, extract_features, feature_scaler, knn_accuracy
from ..utils import cpu_threads


class ProbedClassifier(nn.Module):
    """Images in [0,1] -> logits: the encoder (normalisation inside) followed by a linear head.

    Always in eval mode with frozen parameters; gradients w.r.t. the input stay enabled (attacks
    need them), so nothing here runs under ``no_grad``.
    """

    def __init__(self, encoder: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> ProbedClassifier:
        # Frozen by contract: BatchNorm must keep its running statistics under attack.
        return super().train(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


@dataclass(frozen=True)
class ProbeConfig:
    """Linear-probe and kNN recipe (NaCl/CLAE: Adam 3e-4, batch 256, 1000 epochs, no augmentation).

    Every field is recorded in each result row (``probe_config``, :meth:`as_dict`: ``standardize``
    only when set) and, except ``seed``, is part of the row's protocol: rows measured with different
    probe settings are never ranked together. ``standardize`` applies to SLF's probe; ALF and AFF
    train their own heads (docs/decisions.md, 'Linear probe'; a fitted ALF head standardises its
    features the same way, ``AlfConfig.fit``).
    """

    epochs: int = 1000  # probe training epochs on the cached features
    lr: float = 3e-4  # Adam learning rate of the linear probe
    batch_size: int = 256  # probe minibatch size (the whole training set if smaller)
    weight_decay: float = 0.0  # L2 weight decay of the probe (torch Adam's, bias included)
    seed: int | None = None  # probe init and batch order; None: the evaluation seed (0 outside evaluate)
    max_train: int | None = None  # train the probe on the first N training images only (budgeted demos)
    knn_k: int = KNN_K  # neighbours of the weighted-kNN clean metric (knn_acc)
    knn_t: float = KNN_T  # temperature of the weighted-kNN votes e^{sim/t}
    # fit on features standardised by the training split's mean/std, folded into the head afterwards
    standardize: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The ``probe_config`` rows record and hash: every field, ``standardize`` only when set, so
        that a default probe's rows keep the ids they had before the field existed."""
        out = asdict(self)
        for name in OPTIONAL_FIELDS:
            if out[name] == _DEFAULTS[name]:
                del out[name]
        return out

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        ints = {"epochs": self.epochs, "batch_size": self.batch_size, "knn_k": self.knn_k}
        for name, v in ints.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"probe {name} {v!r}: must be an integer >= 1")
        if not isinstance(self.standardize, bool):
            raise UserError(f"probe standardize {self.standardize!r}: must be true or false")
        if self.max_train is not None and (not isinstance(self.max_train, int) or self.max_train < 1):
            raise UserError(f"probe max_train {self.max_train!r}: must be an integer >= 1 (or unset)")
        reals = {
            "lr": (self.lr, False),
            "knn_t": (self.knn_t, False),
            "weight_decay": (self.weight_decay, True),
        }
        for name, (v, zero_ok) in reals.items():
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (v == 0 and not zero_ok):
                raise UserError(f"probe {name} {v!r}: must be a finite number {'>= 0' if zero_ok else '> 0'}")


# Fields recorded in ``probe_config`` only when they differ from their default (added after rows
# were published: a default probe's identity stays what it was).
OPTIONAL_FIELDS = ("standardize",)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ProbeConfig)}


@dataclass(frozen=True)
class ProbeResult:
    """What a probe reports: final-epoch accuracy, and a best epoch that is selected on test."""

    test_acc: float  # final-epoch accuracy on the cached test features (the reported number)
    best_test_acc: float  # best over epochs: selected on the test set (CLAE's number), for comparison only
    best_epoch: int
    train_acc: float
    knn_acc: float  # weighted kNN (config knn_k, knn_t) on the same features: a second clean metric
    n_train: int
    n_test: int
    config: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict."""
        return asdict(self)


def _accuracy(head: nn.Linear, f: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float((head(f).argmax(dim=1) == y).float().mean()) if len(f) else float("nan")


def fit_linear_probe(
    encoder: nn.Module,
    train: ImageData,
    test: ImageData,
    cfg: ProbeConfig | None = None,
    *,
    feature_batch: int = 512,
) -> tuple[ProbedClassifier, ProbeResult]:
    """Train a linear probe on cached features of a frozen encoder; returns the attacked classifier.

    The encoder is put in eval mode and never updated: its state dict, BatchNorm running
    statistics included, is bit-identical before and after (tested).
    """
    cfg = cfg or ProbeConfig()
    cfg.check()
    device = next(encoder.parameters()).device
    encoder.eval()
    if cfg.max_train is not None:
        train = dataclasses.replace(train, x=train.x[: cfg.max_train], y=train.y[: cfg.max_train])
    f_train = extract_features(encoder, train.x, batch_size=feature_batch, keep_device=True)
    f_test = extract_features(encoder, test.x, batch_size=feature_batch, keep_device=True)
    y_train, y_test = train.y.to(device), test.y.to(device)
    head, best_acc, best_epoch = fit_head_on_features(
        f_train, y_train, f_test, y_test, train.num_classes, cfg
    )
    # on the features' device (a GPU's, not one CPU thread of a pool worker)
    knn = knn_accuracy(
        f_train, train.y, f_test, test.y, num_classes=train.num_classes, k=cfg.knn_k, t=cfg.knn_t
    )
    result = ProbeResult(
        test_acc=_accuracy(head, f_test, y_test),
        best_test_acc=best_acc,
        best_epoch=best_epoch,
        train_acc=_accuracy(head, f_train, y_train),
        knn_acc=knn,
        n_train=len(f_train),
        n_test=len(f_test),
        config=cfg.as_dict(),
    )
    return ProbedClassifier(encoder, head), result


def fit_head_on_features(
    f_train: Tensor, y_train: Tensor, f_test: Tensor, y_test: Tensor, num_classes: int, cfg: ProbeConfig
) -> tuple[nn.Linear, float, int]:
    """The probe's linear head fitted on cached features (on their device): seeded init, the
    schedule of ``cfg``, standardisation folded in when ``cfg.standardize``. Returns (head, best test
    accuracy over epochs, its epoch); also the ALF underfit check's SLF reference (eval/finetune.py)."""
    device = f_train.device
    gen = torch.Generator(device="cpu").manual_seed(0 if cfg.seed is None else cfg.seed)
    head = nn.Linear(f_train.shape[1], num_classes).to(device)
    with torch.no_grad():  # seeded init, independent of the global RNG
        bound = 1.0 / f_train.shape[1] ** 0.5
        head.weight.copy_(torch.empty_like(head.weight, device="cpu").uniform_(-bound, bound, generator=gen))
        head.bias.copy_(torch.empty_like(head.bias, device="cpu").uniform_(-bound, bound, generator=gen))
    # standardize: the head is fitted on standardised features, then folded back onto the raw ones
    scaler = feature_scaler(f_train) if cfg.standardize else None
    fit_train, fit_test = (
        (f_train, f_test) if scaler is None else (scaled(f_train, scaler), scaled(f_test, scaler))
    )
    plan = current_plan(device, "probe")
    train_head = _train_head_compiled if plan.enabled else _train_head
    # One thread: this loop is many tiny ops, which contended threads only slow down.
    with cpu_threads(1) if device.type == "cpu" else contextlib.nullcontext():
        best_acc, best_epoch = train_head(head, fit_train, y_train, fit_test, y_test, cfg, gen, plan)
    if scaler is not None:
        fold_standardization(head, *scaler)
    return head, best_acc, best_epoch


def scaled(f: Tensor, scaler: tuple[Tensor, Tensor]) -> Tensor:
    """``f`` standardised by ``scaler`` (:func:`~..models.features.feature_scaler`'s mean, scale)."""
    return (f - scaler[0]) / scaler[1]


def fold_standardization(head: nn.Linear, mean: Tensor, scale: Tensor) -> None:
    """Make ``head`` act on raw features as it did on standardised ones, in place:
    ``W' = W / scale``, ``b' = b - W' mean`` (computed in float64), so that
    ``W' f + b' = W (f - mean) / scale + b`` and the attacked classifier keeps its function."""
    with torch.no_grad():
        w = head.weight.double() / scale.double()
        b = head.bias.double() - w @ mean.double()
        head.weight.copy_(w)
        head.bias.copy_(b)


def _folded(head: nn.Linear, f_train: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The hand-written Adam's start: features with a column of ones (N, d+1), the head as one
    weight matrix with the bias as its last column (C, d+1), and zero first and second moments."""
    ones = torch.ones(len(f_train), 1, dtype=f_train.dtype, device=f_train.device)
    fa = torch.cat([f_train, ones], dim=1)
    wb = torch.cat([head.weight.detach(), head.bias.detach()[:, None]], dim=1).clone()
    return fa, wb, torch.zeros_like(wb), torch.zeros_like(wb)


def _train_head(
    head: nn.Linear,
    f_train: Tensor,
    y_train: Tensor,
    f_test: Tensor,
    y_test: Tensor,
    cfg: ProbeConfig,
    gen: torch.Generator,
    plan: CompilePlan | None = None,
) -> tuple[float, int]:
    """Minibatch Adam on softmax cross-entropy over the cached features, written out by hand.

    The gradient of a linear layer under cross-entropy is ``(softmax - onehot)^T [f, 1] / B``; with
    the bias folded in as a column of ones, one step is ~12 tensor ops instead of autograd's ~40,
    which is what the 1000-epoch schedule costs on CPU (tested equal to torch.optim.Adam).
    Returns the best test accuracy over epochs and its epoch (selected on test: logged only).
    """
    b1, b2, eps = 0.9, 0.999, 1e-8
    fa, wb, m, v = _folded(head, f_train)
    n, bs, step = len(fa), min(cfg.batch_size, len(fa)), 0
    best_acc, best_epoch = -1.0, 0
    for epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen).to(fa.device)
        for i in range(0, n, bs):
            idx = perm[i : i + bs]
            xb = fa[idx]
            p = torch.softmax(xb @ wb.T, dim=1)
            p[torch.arange(len(idx), device=p.device), y_train[idx]] -= 1.0
            grad = p.T @ xb / len(idx)
            if cfg.weight_decay:
                grad.add_(wb, alpha=cfg.weight_decay)  # torch Adam's (L2) weight decay, bias included
            step += 1
            m.mul_(b1).add_(grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (v / (1 - b2**step)).sqrt_().add_(eps)
            wb.addcdiv_(m, denom, value=-cfg.lr / (1 - b1**step))
        acc = float(((f_test @ wb[:, :-1].T + wb[:, -1]).argmax(dim=1) == y_test).float().mean())
        if acc > best_acc:
            best_acc, best_epoch = acc, epoch + 1
    with torch.no_grad():
        head.weight.copy_(wb[:, :-1])
        head.bias.copy_(wb[:, -1])
    return best_acc, best_epoch


def _adam_step(
    xb: Tensor, yb: Tensor, wb: Tensor, m: Tensor, v: Tensor, hyper: Tensor, weight_decay: float
) -> tuple[Tensor, Tensor, Tensor]:
    """One step of :func:`_train_head`'s Adam, out of place (what ``torch.compile`` captures as one
    graph; under CUDA graphs its outputs are the next step's inputs). ``hyper`` holds the step's
    ``(1 - b2^t, -lr / (1 - b1^t))`` as a tensor, so that one graph serves every step."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    p = torch.softmax(xb @ wb.T, dim=1) - F.one_hot(yb, wb.shape[0]).to(wb.dtype)
    grad = p.T @ xb / len(yb)
    if weight_decay:
        grad = grad + weight_decay * wb
    m = m * b1 + (1 - b1) * grad
    v = v * b2 + (1 - b2) * grad * grad
    wb = wb + hyper[1] * m / ((v / hyper[0]).sqrt() + eps)
    return wb, m, v


def _train_head_compiled(
    head: nn.Linear,
    f_train: Tensor,
    y_train: Tensor,
    f_test: Tensor,
    y_test: Tensor,
    cfg: ProbeConfig,
    gen: torch.Generator,
    plan: CompilePlan | None = None,
) -> tuple[float, int]:
    """:func:`_train_head` with its step compiled under ``plan`` (the same draws, batches and
    updates; equal to float rounding, tested) and no host sync per epoch: the test accuracies stay
    on the device and are read out once at the end."""
    step_fn = compile_fn(_adam_step, plan or CompilePlan())
    b1, b2 = 0.9, 0.999
    fa, wb, m, v = _folded(head, f_train)
    n, bs, step = len(fa), min(cfg.batch_size, len(fa)), 0
    # every step's bias corrections, on the device once: no host-to-device copy per step
    t = torch.arange(1, cfg.epochs * math.ceil(n / bs) + 1, dtype=torch.float64)
    hypers = torch.stack([1 - b2**t, -cfg.lr / (1 - b1**t)], dim=1).to(wb.dtype).to(wb.device)
    graphs = plan is not None and plan.mode == "reduce-overhead"
    accs = []
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen).to(fa.device)
        for i in range(0, n, bs):
            idx = perm[i : i + bs]
            if graphs:  # each step a new replay; its outputs are copied out of the graph's memory
                torch.compiler.cudagraph_mark_step_begin()
            wb, m, v = step_fn(fa[idx], y_train[idx], wb, m, v, hypers[step], cfg.weight_decay)
            if graphs:
                wb, m, v = wb.clone(), m.clone(), v.clone()
            step += 1
        accs.append(((f_test @ wb[:, :-1].T + wb[:, -1]).argmax(dim=1) == y_test).float().mean())
    values = torch.stack(accs).tolist()
    best = max(range(len(values)), key=lambda e: (values[e], -e))  # the first epoch of the best
    with torch.no_grad():
        head.weight.copy_(wb[:, :-1])
        head.bias.copy_(wb[:, -1])
    return values[best], best + 1


def fit_knn_probe(
    encoder: nn.Module, train: ImageData, test: ImageData, *, k: int = KNN_K, t: float = KNN_T
) -> float:
    """Weighted kNN accuracy of the frozen encoder's features (a second clean metric)."""
    bank = extract_features(encoder, train.x, keep_device=True)
    query = extract_features(encoder, test.x, keep_device=True)
    return knn_accuracy(bank, train.y, query, test.y, num_classes=train.num_classes, k=k, t=t)
