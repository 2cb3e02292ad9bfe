"""The epoch loop every finetuning protocol trains with (eval/finetune.py): SGD with momentum and a
MultiStepLR schedule, per-epoch randomness from one seeded generator, a resumable state saved after
each epoch (or every ``Run.save_every``), and the training-image augmentation a recipe asks for.

Why one generator per epoch: every random number of epoch ``e`` (batch order, crops and flips,
attack starts) comes from a CPU generator seeded by ``(seed, protocol, e)``, so a run killed after
epoch ``e`` and resumed from its saved state draws exactly what an uninterrupted run draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..accel import compiled_in_place, current_plan, fused
from ..io import atomic_open
from ..results.finetune import FinetuneConfig, milestones

__all__ = [
    "Run",
    "augment_batch",
    "crop_padding",
    "epoch_generator",
    "lr_at",
    "resume_state",
    "run_epochs",
    "save_state",
]


def lr_at(cfg: FinetuneConfig, epoch: int) -> float:
    """The learning rate of (0-based) ``epoch``: MultiStepLR's ``lr * gamma^(milestones passed)``."""
    return cfg.lr * cfg.gamma ** sum(1 for m in milestones(cfg) if epoch >= m)


def epoch_generator(seed: int, protocol: str, epoch: int) -> torch.Generator:
    """The CPU generator of one epoch: batch order, augmentation and attack noise come from it alone."""
    from ..attack.rng import derive_seed

    return torch.Generator(device="cpu").manual_seed(derive_seed(seed, protocol, epoch))


def crop_padding(size: int) -> int:
    """Zero padding of the random crop: 4 pixels from 32-pixel images up (the benchmark's
    ``RandomCrop(32 or 96, padding=4)``), an eighth of the side below (1 pixel on 8-pixel digits,
    where 4 would crop away half the image)."""
    return 4 if size >= 32 else max(1, round(size / 8))


def augment_batch(x: Tensor, kind: str, gen: torch.Generator) -> Tensor:
    """``x`` (B, C, H, W in [0,1]) augmented per image: ``none`` returns it; ``crop-flip`` is
    torchvision's ``RandomCrop(H, padding=p)`` (zero fill) then ``RandomHorizontalFlip()``, offsets
    and flips drawn from ``gen`` (offsets first, then flips)."""
    if kind == "none":
        return x
    b, _, h, w = x.shape
    p = crop_padding(min(h, w))
    padded = F.pad(x, (p, p, p, p))
    dy = torch.randint(0, 2 * p + 1, (b,), generator=gen).to(x.device)
    dx = torch.randint(0, 2 * p + 1, (b,), generator=gen).to(x.device)
    flip = (torch.rand(b, generator=gen) < 0.5).to(x.device)
    rows = dy[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = dx[:, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)  # a flip reads the crop's columns backwards
    idx = torch.arange(b, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


@dataclass
class Run:
    """A finetuning run: what is trained, how, and where its per-epoch state lives."""

    cfg: FinetuneConfig
    modules: dict[str, nn.Module]  # what the state saves (and the optimizer trains, if trainable)
    params: list[nn.Parameter]
    x: Tensor  # uint8 training images (N, C, H, W)
    y: Tensor
    seed: int
    state_path: Path | None
    progress: bool
    # save the resumable state after every this many epochs (and the last): a schedule lengthened
    # to many short epochs (a fitted ALF head) saves about once per recipe epoch, not once per epoch
    save_every: int = 1


def run_epochs(run: Run, step: Callable[[Tensor, Tensor, torch.Generator], None]) -> None:
    """SGD with momentum over ``run.cfg.epochs`` epochs; ``step(x, y, gen)`` computes one batch's
    gradients (``x`` in [0,1], augmented as ``cfg.augment`` says).

    After every ``run.save_every`` epochs (and the last) the modules' state dicts and the optimizer's
    state are saved atomically; a saved state is resumed from (loaded with ``weights_only=True``)."""
    cfg = run.cfg
    device = run.params[0].device
    # accel.compiling's setting (evaluate's --compile; eager outside one): on CUDA, the modules run
    # compiled for the epochs and SGD is fused
    plan = current_plan(device, "finetune")
    opt = torch.optim.SGD(run.params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    opt = fused(opt, plan)
    start = resume_state(run.state_path, run.modules, opt, what="finetuning")
    with compiled_in_place(run.modules.values(), plan):
        _epochs(run, step, opt, start, device)


def _epochs(
    run: Run,
    step: Callable[[Tensor, Tensor, torch.Generator], None],
    opt: torch.optim.Optimizer,
    start: int,
    device: torch.device,
) -> None:
    """:func:`run_epochs`' loop from epoch ``start``."""
    cfg = run.cfg
    n, bs = len(run.x), min(cfg.batch_size, len(run.x))
    # on an accelerator the uint8 images move there once, not one batch per step (the same values)
    x, y = (run.x, run.y) if device.type == "cpu" else (run.x.to(device), run.y.to(device))
    bar = tqdm(range(start, cfg.epochs), desc=cfg.protocol, disable=not run.progress, leave=False)
    for epoch in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, epoch)
        gen = epoch_generator(run.seed, cfg.protocol, epoch)
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            idx = perm[i : i + bs]
            xb = augment_batch(x[idx].to(device).float().div_(255), cfg.augment, gen)
            step(xb, y[idx].to(device), gen)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if (epoch + 1) % run.save_every == 0 or epoch + 1 == cfg.epochs:
            save_state(run.state_path, run.modules, opt, epoch + 1)


def resume_state(
    path: Path | None, modules: dict[str, nn.Module], opt: torch.optim.Optimizer, *, what: str
) -> int:
    """Load a state saved by :func:`save_state` into ``modules`` and ``opt`` (``weights_only=True``)
    and return the number of epochs it completed; 0 when there is none, or when it cannot be read
    (a truncated or foreign file: start over rather than trust it, and say so)."""
    if path is None or not path.is_file():
        return 0
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        for name, module in modules.items():
            module.load_state_dict(state["modules"][name])
        opt.load_state_dict(state["optimizer"])
        return int(state["epoch"])
    except Exception as e:
        print(f"ignoring unreadable {what} state {path} ({type(e).__name__}); starting over")
        return 0


def save_state(
    path: Path | None, modules: dict[str, nn.Module], opt: torch.optim.Optimizer, epoch: int
) -> None:
    """Write the modules' and the optimiser's state after ``epoch`` epochs to ``path`` atomically (a
    killed write leaves the previous state); nothing when ``path`` is None."""
    if path is None:
        return
    state = {
        "epoch": epoch,
        "modules": {k: m.state_dict() for k, m in modules.items()},
        "optimizer": opt.state_dict(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
