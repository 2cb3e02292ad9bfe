"""Running attacks: look an attack up by name (registry or ``torchattacks.<Name>``), run it in
batches with every batch checked against the threat model, and measure robustness at many eps."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from . import pgd
from .base import ATTACKS, Attack
from .norms import NORMS
from .threat import check_perturbation, check_shape, check_stats, perturbation_stats
from .torchattacks_adapter import TORCHATTACKS_HINT, TORCHATTACKS_PREFIX, torchattacks_attack


def resolve_attack(name: str) -> Attack:
    """The attack callable for a registry name or ``torchattacks.<Name>``; one-line UserError otherwise."""
    if isinstance(name, str) and name.startswith(TORCHATTACKS_PREFIX):
        return torchattacks_attack(name)
    if not isinstance(name, str) or name not in ATTACKS:
        raise UserError(
            f"unknown attack {name!r}; valid choices: {', '.join(ATTACKS.names())}, "
            f"or {TORCHATTACKS_PREFIX}<Name> ({TORCHATTACKS_HINT})"
        )
    return ATTACKS.get(name)


def attack_info(name: str) -> dict[str, Any]:
    """Registry metadata; torchattacks attacks get generic metadata (any norm, family unknown)."""
    if name.startswith(TORCHATTACKS_PREFIX):
        resolve_attack(name)
        return {"norms": tuple(NORMS), "params": None, "family": "other"}
    resolve_attack(name)
    return ATTACKS.info(name)


def attack_names() -> list[str]:
    """Registered attack names (``torchattacks.<Name>`` also accepted, not listed)."""
    return ATTACKS.names()


def run_attack(
    name: str,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    norm: str,
    gen: torch.Generator | None,
    batch_size: int,
    params: dict[str, Any] | None = None,
) -> Tensor:
    """Run an attack in chunks of ``batch_size``; every returned chunk is checked against the threat model.

    Raises ``SanityError`` if any chunk leaves the eps-ball or [0,1].
    """
    fn = resolve_attack(name)
    norms = attack_info(name)["norms"]
    if norm not in norms:
        raise UserError(f"attack {name!r} does not support norm {norm!r}; it supports: {', '.join(norms)}")
    params = dict(params or {})
    out = []
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        xb_adv = fn(model, xb, yb, eps=eps, gen=gen, norm=norm, **params)
        check_perturbation(xb, xb_adv, eps, norm)
        out.append(xb_adv.detach())
    return torch.cat(out) if out else x.detach().clone()


@torch.no_grad()
def _predict(model: nn.Module, x: Tensor) -> Tensor:
    return model(x).argmax(1)


def robust_under_attack(
    name: str,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: Sequence[float],
    *,
    norm: str,
    gens: Sequence[torch.Generator | None],
    batch_size: int,
    params: dict[str, Any] | None = None,
) -> tuple[Tensor, list[float]]:
    """Attack every example at every eps independently; returns ``(correct, seconds)``.

    ``correct[k, i]``: the model still classifies ``x[i]`` correctly under the attack at ``eps[k]``
    (each eps is its own attack, never carried over from another eps); ``seconds[k]``: the wall time
    spent on ``eps[k]``. ``gens[k]`` seeds the attack at ``eps[k]``, consumed chunk by chunk exactly
    as :func:`run_attack` would. An attack with a registered ``sweep`` (FGSM) computes what the eps
    share once per chunk, and its shared time is split evenly between the eps. Every perturbation
    is checked against the threat model (``SanityError`` if it leaves the eps-ball or [0,1]).
    """
    fn, info = resolve_attack(name), attack_info(name)
    if norm not in info["norms"]:
        raise UserError(
            f"attack {name!r} does not support norm {norm!r}; it supports: {', '.join(info['norms'])}"
        )
    if len(gens) != len(eps):
        raise ValueError(f"one generator per eps: got {len(gens)} for {len(eps)} epsilons")
    params, sweep = dict(params or {}), info.get("sweep")
    correct = torch.zeros((len(eps), len(x)), dtype=torch.bool, device=x.device)
    seconds = [0.0] * len(eps)
    # on an accelerator the threat-model check of every batch is read back once, after the loop
    deferred: list[list[Tensor]] | None = [[] for _ in eps] if pgd.sync_free(x.device) else None
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        t = _clock(x.device)
        at = sweep(model, xb, yb, norm=norm, **params) if sweep is not None else None
        shared = (_clock(x.device) - t) / max(1, len(eps))
        for k, e in enumerate(eps):
            t = _clock(x.device)
            xa = at(e) if at is not None else fn(model, xb, yb, eps=e, gen=gens[k], norm=norm, **params)
            if deferred is None:
                check_perturbation(xb, xa, e, norm)
            else:
                check_shape(xb, xa, norm)
                deferred[k].append(perturbation_stats(xb, xa, norm))
            correct[k, i : i + len(xb)] = _predict(model, xa) == yb
            seconds[k] += _clock(x.device) - t + shared
    for k, stats in enumerate(deferred or []):
        if stats:
            check_stats(torch.stack(stats), eps[k], norm)
    return correct, seconds


def _clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the device has finished the work queued so far (CUDA runs
    asynchronously: without the sync, one eps's kernels would be timed under the next eps)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
