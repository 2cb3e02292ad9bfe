"""Any ``torchattacks.<Name>`` as an attack with our calling convention (the optional torchattacks
package): seeded from the generator, minimum-norm attacks projected into the threat model."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from .base import Attack
from .grad import model_device
from .norms import project
from .rng import fork_rng, seed_from

TORCHATTACKS_PREFIX = "torchattacks."
TORCHATTACKS_HINT = "pip install 'robustbench-nacl[torchattacks]'"


def _torchattacks_class(name: str) -> type:
    try:
        torchattacks = importlib.import_module("torchattacks")
    except ImportError:
        raise UserError(
            f"attack {name!r} needs the optional torchattacks package: {TORCHATTACKS_HINT}"
        ) from None
    cls_name = name[len(TORCHATTACKS_PREFIX) :]
    valid = [
        n for n in getattr(torchattacks, "__all__", []) if n not in getattr(torchattacks, "__wrapper__", [])
    ]
    cls = getattr(torchattacks, cls_name, None) if cls_name in valid else None
    if cls is None:
        raise UserError(f"unknown attack {name!r}; torchattacks provides: {', '.join(valid)}")
    return cls


def torchattacks_params(name: str) -> dict[str, inspect.Parameter]:
    """Constructor keywords of ``torchattacks.<Name>`` other than ``model`` and ``eps``."""
    sig = inspect.signature(_torchattacks_class(name).__init__)
    return {k: p for k, p in sig.parameters.items() if k not in ("self", "model", "eps")}


def _make_torchattacks(name: str) -> Attack:
    cls = _torchattacks_class(name)
    takes_eps = "eps" in inspect.signature(cls.__init__).parameters

    def run(
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        *,
        eps: float,
        gen: torch.Generator | None = None,
        norm: str = "Linf",
        **params: Any,
    ) -> Tensor:
        unknown = sorted(set(params) - set(torchattacks_params(name)))
        if unknown:
            raise UserError(
                f"{name} does not take {', '.join(unknown)}; it takes: {', '.join(torchattacks_params(name))}"
            )
        x, y = x.detach(), y.detach()
        seed = seed_from(gen)
        with fork_rng(model_device(model, x.device)), torch.enable_grad():
            # torchattacks draws from torch's global RNG: seed it from our generator, restore after.
            torch.manual_seed(seed)
            atk = cls(model, **({"eps": eps} if takes_eps else {}), **params)
            x_adv = atk(x, y).detach()
        # Minimum-norm attacks (CW, DeepFool) have no eps: project their output into the threat model.
        return x_adv if takes_eps else project(x, x_adv, eps, norm)

    run.__name__ = name
    run.__doc__ = f"{name} through torchattacks, seeded from the generator; see its own docstring."
    return run


_TORCHATTACKS_CACHE: dict[str, Attack] = {}


def torchattacks_attack(name: str) -> Attack:
    """The attack for ``torchattacks.<Name>``, made once per name (a one-line UserError if unknown)."""
    if name not in _TORCHATTACKS_CACHE:
        _TORCHATTACKS_CACHE[name] = _make_torchattacks(name)
    return _TORCHATTACKS_CACHE[name]
