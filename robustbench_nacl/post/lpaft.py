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

#: one batch's step: computes the gradients, returns the loss (detached, for the epoch's log)
Step = Callable[[Tensor, Tensor, torch.Generator], Tensor]
#: called after each epoch with (epoch number, 1-based; the epoch's mean loss): the stage's monitor
EpochHook = Callable[[int, float], None]


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
    stage: Stage,
    x: Tensor,
    y: Tensor,
    step: Step,
    *,
    recipe: PostRecipe,
    seed: int,
    progress: bool = False,
    on_epoch: EpochHook | None = None,
) -> int:
    """``stage.epochs`` epochs over uint8 images ``x`` and pseudo-labels ``y``: shuffled batches of
    ``recipe.batch_size`` (the last partial one dropped), augmented, ``step`` computing gradients.
    ``on_epoch`` runs after each epoch, before its state is saved. Returns the epoch it resumed at."""
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
        total = torch.zeros((), device=device)
        for i in range(n // bs):  # drop_last=True, as the authors' loaders
            idx = perm[i * bs : (i + 1) * bs]
            (xb,) = augment(x[idx].to(device), 1, gen)
            total += step(xb, y[idx].to(device), gen)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if on_epoch is not None:
            on_epoch(epoch + 1, float(total) / (n // bs))  # one host sync per epoch
        save_state(stage.state_path, stage.modules, opt, epoch + 1)
    return start


# ============ the steps ============


def lp_step(encoder: nn.Module, head: nn.Linear) -> Step:
    """Cross-entropy of the head on the frozen encoder's features (eval mode, the encoder's route)."""

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> Tensor:
        encoder.eval()
        with torch.no_grad():
            f = encoder(x)
        loss = F.cross_entropy(head(f), y)
        loss.backward()
        return loss.detach()

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


def aft_loss(model: nn.Module, x: Tensor, y: Tensor, recipe: PostRecipe, gen: torch.Generator) -> Tensor:
    """TRADES on pseudo-labels: the attack's clean target in eval mode through
    ``recipe.attack_target_route``, the attack in eval mode through ``recipe.train_route``, then the
    outer loss in train mode (``CE(f(x), y) + beta KL / B``, both forwards through
    ``recipe.train_route``). DynACL's ``trades_loss`` and AIR's April-2023 ``trades_loss_dual
    (natural_mode='pgd')`` put all of it through the adversarial branch; AIR's October-2023 one aims
    the attack at the clean branch's prediction (``attack_target_route='clean'``)."""
    model.eval()
    with torch.no_grad(), bn_route(model, recipe.attack_target_route):
        p_nat = F.softmax(model(x), dim=1)
    with bn_route(model, recipe.train_route):
        x_adv = trades_attack(model, x, p_nat, recipe, gen)
        model.train()
        return trades_loss(model, x, x_adv, y, recipe.beta)


def aft_step(model: nn.Module, recipe: PostRecipe) -> Step:
    """One AFT step: :func:`aft_loss`, backward."""

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> Tensor:
        loss = aft_loss(model, x, y, recipe, gen)
        loss.backward()
        return loss.detach()

    return step


@torch.no_grad()
def branch_agreement(model: nn.Module, x: Tensor) -> dict[str, float]:
    """How far the two BatchNorm branches of ``model`` (encoder, head) have drifted apart on images
    ``x`` in [0,1], eval mode: the fraction of images whose predicted pseudo-class is the same
    through both, and the mean cosine of the two branches' features. AFT trains the adversarial
    branch only; a clean branch left behind makes a clean-branch attack target meaningless."""
    was_training = model.training
    model.eval()
    encoder, head = model[0], model[1]
    with bn_route(model, "clean"):
        f_clean = encoder(x)
    with bn_route(model, "adv"):
        f_adv = encoder(x)
    model.train(was_training)
    agree = (head(f_clean).argmax(1) == head(f_adv).argmax(1)).float().mean()
    cos = F.cosine_similarity(f_clean, f_adv, dim=1).mean()
    return {"agreement": round(float(agree), 6), "feature_cosine": round(float(cos), 6)}


def zero_head(dim: int, outputs: int, device: torch.device) -> nn.Linear:
    """The authors' head: ``nn.Linear(dim, outputs)`` with weight and bias set to zeros."""
    head = nn.Linear(dim, outputs)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return head.to(device)
