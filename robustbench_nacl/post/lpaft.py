"""The two training stages of the "++" post-processing, on pseudo-labels: linear probing (LP) of a
head on the frozen encoder, then adversarial finetuning (AFT) of encoder and head with TRADES
(DynACL ``LPAFT.py`` / ``LPAFT_AFF.py``, AIR ``LP-AFF.py``).

The epoch loop follows eval/finetune_loop.py's (SGD with momentum, MultiStepLR, one generator per
epoch) and saves and resumes its state with that module's ``save_state`` / ``resume_state``, so a
killed run resumes bit-identically. It differs where the authors' loaders do: ``drop_last=True``
and the recipe's view maker on uint8 images; and its epoch generators are seeded by ``(seed,
"post", stage, epoch)``, so the published "++" checkpoints stay what this loop trained.

The TRADES attack of AFT starts where the recipe says (:data:`.recipes.TRADES_STARTS`). DynACL's
``trades_loss`` starts at ``x`` itself. There the KL divergence and, in exact arithmetic, its
gradient are zero; in float32 the gradient is rounding noise (about 1e-9, almost never exactly
zero: ``softmax`` and ``exp(log_softmax)`` differ in their last bits), whose sign is a full first
step. So the authors' attack is not idle: its first step goes in a direction set by rounding, the
next nine follow the real gradient. We run the same computation (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..attack.rng import derive_seed
from ..augment.views import VIEW_MAKERS
from ..eval.finetune import trades_examples, trades_loss
from ..eval.finetune_loop import resume_state, save_state
from ..models.dual_bn import bn_route
from .recipes import PostRecipe

Step = Callable[[Tensor, Tensor, torch.Generator], None]


@dataclass
class Stage:
    """One stage's optimiser settings, what it trains and where its per-epoch state lives."""

    name: str  # "lp" or "aft": part of every epoch generator's seed
    epochs: int
    lr: float
    momentum: float
    weight_decay: float
    milestones: list[int]
    gamma: float
    modules: dict[str, nn.Module]  # what the state saves
    params: list[nn.Parameter]  # what the optimiser trains
    state_path: Path | None


def lp_stage(recipe: PostRecipe, head: nn.Linear, state_path: Path | None) -> Stage:
    """LP: the head alone, SGD(lr 0.01, momentum 0.9, wd 1e-4), constant lr (``milestones=[]``)."""
    return Stage(
        "lp", recipe.lp_epochs, recipe.lp_lr, recipe.lp_momentum, recipe.lp_weight_decay, [], 1.0,
        {"head": head}, list(head.parameters()), state_path,
    )  # fmt: skip


def aft_stage(recipe: PostRecipe, model: nn.Module, state_path: Path | None) -> Stage:
    """AFT: encoder and head, SGD(lr 0.1, momentum 0.9, wd 1e-4), lr x0.1 after epochs 10 and 20."""
    return Stage(
        "aft", recipe.aft_epochs, recipe.aft_lr, recipe.aft_momentum, recipe.aft_weight_decay,
        recipe.milestones(), recipe.aft_gamma, {"model": model}, list(model.parameters()), state_path,
    )  # fmt: skip


def run_stage(
    stage: Stage, x: Tensor, y: Tensor, step: Step, *, recipe: PostRecipe, seed: int, progress: bool = False
) -> None:
    """``stage.epochs`` epochs over uint8 images ``x`` and pseudo-labels ``y``: shuffled batches of
    ``recipe.batch_size`` (the last partial one dropped), augmented, ``step`` computing gradients."""
    opt = torch.optim.SGD(stage.params, lr=stage.lr, momentum=stage.momentum, weight_decay=stage.weight_decay)
    start = resume_state(stage.state_path, stage.modules, opt, what="post")
    device = stage.params[0].device
    n = len(x)
    bs = min(recipe.batch_size, n)
    augment = VIEW_MAKERS.get(recipe.augment)
    for epoch in tqdm(
        range(start, stage.epochs), desc=f"post {stage.name}", disable=not progress, leave=False
    ):
        for g in opt.param_groups:
            g["lr"] = stage.lr * stage.gamma ** sum(1 for m in stage.milestones if epoch >= m)
        gen = torch.Generator(device="cpu").manual_seed(derive_seed(seed, "post", stage.name, epoch))
        perm = torch.randperm(n, generator=gen)
        for i in range(n // bs):  # drop_last=True, as the authors' loaders
            idx = perm[i * bs : (i + 1) * bs]
            (xb,) = augment(x[idx].to(device), 1, gen)
            step(xb, y[idx].to(device), gen)
            opt.step()
            opt.zero_grad(set_to_none=True)
        save_state(stage.state_path, stage.modules, opt, epoch + 1)


# ============ the steps ============


def lp_step(encoder: nn.Module, head: nn.Linear) -> Step:
    """Cross-entropy of the head on the frozen encoder's features (eval mode, the encoder's route)."""

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> None:
        encoder.eval()
        with torch.no_grad():
            f = encoder(x)
        F.cross_entropy(head(f), y).backward()

    return step


def trades_attack(
    model: nn.Module, x: Tensor, p_nat: Tensor, recipe: PostRecipe, gen: torch.Generator
) -> Tensor:
    """TRADES' inner maximisation of ``KL(p_nat || p(x_adv))`` (summed), ``recipe.steps`` signed
    steps, projection onto the ball and [0,1]; the model as it is (eval, its route). Starts at
    ``x + 0.001 N(0,1)`` (``trades_start='randn'``: eval/finetune.py's ``trades_examples``) or at
    ``x`` itself (``'x'``: DynACL's ``trades_loss``; see the module docstring)."""
    if recipe.trades_start == "randn":
        return trades_examples(
            model, x, p_nat, eps=recipe.eps, step_size=recipe.step_size, steps=recipe.steps, gen=gen
        )
    lo, hi = (x - recipe.eps).clamp(min=0.0), (x + recipe.eps).clamp(max=1.0)
    x_adv = x.detach()
    for _ in range(recipe.steps):
        x_adv = x_adv.detach().requires_grad_(True)
        with torch.enable_grad():
            kl = F.kl_div(F.log_softmax(model(x_adv), dim=1), p_nat, reduction="sum")
            (g,) = torch.autograd.grad(kl, x_adv)
        x_adv = torch.clamp(x_adv.detach() + recipe.step_size * g.sign(), lo, hi)
    return x_adv.detach()


def aft_step(model: nn.Module, recipe: PostRecipe) -> Step:
    """One TRADES step on pseudo-labels: the clean target in eval mode through
    ``recipe.attack_target_route``, the attack in eval mode through the model's route (the
    adversarial one), then the outer loss in train mode (``CE(f(x), y) + beta KL / B``, both
    forwards through the model's route: ``trades_loss`` / ``trades_loss_dual(natural_mode='pgd')``)."""

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> None:
        model.eval()
        with torch.no_grad(), bn_route(model, recipe.attack_target_route):
            p_nat = F.softmax(model(x), dim=1)
        x_adv = trades_attack(model, x, p_nat, recipe, gen)
        model.train()
        trades_loss(model, x, x_adv, y, recipe.beta).backward()

    return step


def zero_head(dim: int, outputs: int, device: torch.device) -> nn.Linear:
    """The authors' head: ``nn.Linear(dim, outputs)`` with weight and bias set to zeros."""
    head = nn.Linear(dim, outputs)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return head.to(device)
