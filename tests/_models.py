"""Tiny models shared by the attack, sanity and benchmark tests (``tests/conftest.py`` belongs to others).

``digits_model()`` trains a small conv net on scikit-learn's bundled 8x8 digits once per process
(cached), so every test file that asks for it shares the same few seconds of training.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run with one intra-op thread: for 8x8 inputs it is as fast as two, and far faster on a busy
    machine, where OpenMP threads spin-wait for each other."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class Normalize(nn.Module):
    """Input normalisation as a buffer inside the model: attacks see [0,1] pixels only."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean))
        self.register_buffer("std", torch.tensor(std))

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


def small_cnn(num_classes: int = 10, bn: bool = False) -> nn.Sequential:
    """A 2-conv net for (N, 1, 8, 8) inputs; ``bn`` adds a BatchNorm layer."""
    return nn.Sequential(
        Normalize(0.3, 0.4),
        nn.Conv2d(1, 16, 3, padding=1),
        *([nn.BatchNorm2d(16)] if bn else []),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, num_classes),
    )


@functools.cache
def digits_data() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x_train, y_train, x_test, y_test): digits scaled to [0,1], shape (N, 1, 8, 8), fixed split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return x[:1297], y[:1297], x[1297:], y[1297:]


@functools.cache
def digits_model(bn: bool = False) -> nn.Module:
    """A conv net trained to > 90 % test accuracy on digits, frozen and in eval mode."""
    xtr, ytr, _, _ = digits_data()
    torch.manual_seed(0)
    model = small_cnn(bn=bn)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        perm = torch.randperm(len(xtr), generator=g)
        for i in range(0, len(xtr), 64):
            idx = perm[i : i + 64]
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval().requires_grad_(False)


def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def randomize_bn(module: nn.Module, seed: int = 0) -> None:
    """Non-trivial BatchNorm statistics and affine parameters, so a wrong mapping cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
            m.num_batches_tracked.fill_(7)


def gen(seed: int = 0) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)
