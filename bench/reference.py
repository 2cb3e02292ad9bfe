"""A reference-style SimCLR pipeline, written the way the public HCL/DCL code works (joshr17/HCL).

- a ``Dataset`` of PIL images whose ``__getitem__`` applies a per-sample torchvision transform twice
  (``CIFAR10Pair``): RandomResizedCrop(size), RandomHorizontalFlip(0.5),
  RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2), ToTensor();
- a ``DataLoader`` with worker processes, shuffle, drop_last;
- two separate forward passes, the NT-Xent loss written out as in HCL's ``train`` (``estimator='easy'``),
  ``zero_grad``, ``backward``, ``step``.

The HCL code ends the transform with ``Normalize``; here the encoder normalises internally (the same
encoder as our trainer), so the transform stops at ``ToTensor``: the same work, in a different place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


def simclr_transform(size: int) -> transforms.Compose:
    """HCL/DCL's ``train_transform`` (without the final Normalize, see the module docstring)."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(p=0.5),
            transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            transforms.RandomGrayscale(p=0.2),
            transforms.ToTensor(),
        ]
    )


class PairDataset(Dataset):
    """``CIFAR10Pair``: uint8 images held as numpy arrays, each item two transformed views and the label."""

    def __init__(self, x: Tensor, y: Tensor, transform: Any) -> None:
        arr = x.numpy()
        self.data = arr[:, 0] if arr.shape[1] == 1 else np.ascontiguousarray(arr.transpose(0, 2, 3, 1))
        self.mode = "L" if arr.shape[1] == 1 else "RGB"
        self.targets = y.tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, int]:
        img = Image.fromarray(self.data[index], mode=self.mode)
        return self.transform(img), self.transform(img), self.targets[index]


def make_loader(dataset: Dataset, batch_size: int, workers: int, seed: int) -> DataLoader:
    """HCL's loader: shuffle, drop_last, ``workers`` processes (pin_memory only matters on a GPU)."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(seed),
    )


def get_negative_mask(batch_size: int) -> Tensor:
    """HCL's mask of the 2B x 2B similarity matrix that drops each anchor and its positive."""
    mask = torch.ones((batch_size, 2 * batch_size), dtype=torch.bool)
    for i in range(batch_size):
        mask[i, i] = 0
        mask[i, i + batch_size] = 0
    return torch.cat((mask, mask), 0)


def train_steps(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    *,
    temperature: float,
    device: torch.device,
    steps: int | None = None,
) -> int:
    """HCL's ``train`` loop (SimCLR estimator) for at most ``steps`` batches; returns the images seen."""
    model.train()
    seen = 0
    for i, (pos_1, pos_2, _) in enumerate(loader):
        if steps is not None and i >= steps:
            break
        pos_1, pos_2 = pos_1.to(device, non_blocking=True), pos_2.to(device, non_blocking=True)
        out_1 = F.normalize(model(pos_1), dim=-1)
        out_2 = F.normalize(model(pos_2), dim=-1)
        batch_size = len(pos_1)
        out = torch.cat([out_1, out_2], dim=0)
        neg = torch.exp(torch.mm(out, out.t().contiguous()) / temperature)
        mask = get_negative_mask(batch_size).to(device)
        neg = neg.masked_select(mask).view(2 * batch_size, -1)
        pos = torch.exp(torch.sum(out_1 * out_2, dim=-1) / temperature)
        pos = torch.cat([pos, pos], dim=0)
        ng = neg.sum(dim=-1)
        loss = (-torch.log(pos / (pos + ng))).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += batch_size
    return seen
