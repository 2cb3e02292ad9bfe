"""What attacks ask of a model: input gradients of its cross-entropy, and the device it lives on."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def model_device(model: nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """The device of the model's first parameter or buffer (``default`` if it has none)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device(default)


def ce_grad(logits: Tensor, y: Tensor, wrt: Tensor) -> Tensor:
    """Gradient of the summed cross-entropy w.r.t. ``wrt`` (zeros if the output ignores it).

    The sum (not the mean) makes each example's gradient independent of the batch it sits in.
    """
    loss = F.cross_entropy(logits.float(), y, reduction="sum")
    if not loss.requires_grad:  # e.g. a constant classifier with frozen parameters
        return torch.zeros_like(wrt)
    (g,) = torch.autograd.grad(loss, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if g is None else g


def input_grad(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient of the summed cross-entropy w.r.t. the input, and the (detached) logits."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x)
        g = ce_grad(logits, y, x)
    return g, logits.detach()
