"""Dual (AdvProp-style) BatchNorm: a clean branch and an adversarial branch per BatchNorm, and the
route that picks between them (docs/decisions.md, 'Robust term').

With ``dual_bn=True`` every BatchNorm becomes a :class:`DualBatchNorm` with a clean branch ``.main``
and an adversarial branch ``.aux`` (momentum 0.01). :func:`bn_route` temporarily switches all of
them; the default route is the clean branch. Evaluation takes the branch the checkpoint's manifest
names (``eval_bn_route``): the adversarial one for ACL and DynACL, as their authors evaluate them,
the clean one otherwise; the model card says which (``bn_branch``). :func:`strip_dual_bn` exports
the clean branch as a plain state dict.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import UserError

ROUTES = ("clean", "adv")
_BN_STATE_KEYS = frozenset({"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})


class DualBatchNorm(nn.Module):
    """Two BatchNorms of the same kind: ``main`` for clean inputs and ``aux`` for adversarial ones.

    ``forward`` uses the branch named by the ``route`` attribute ("clean" -> ``main``, "adv" -> ``aux``),
    default "clean". Only the selected branch's running statistics are updated in train mode. ``aux``
    uses momentum 0.01 (CLAE's auxiliary BN). Set the route with :func:`bn_route` / :func:`set_bn_route`.

    Note: in a step that uses only one route, the other branch's affine parameters get no gradient
    (DistributedDataParallel then needs ``find_unused_parameters=True``).
    """

    def __init__(
        self,
        num_features: int,
        *,
        dim: int = 2,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        aux_momentum: float | None = 0.01,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__()
        if dim not in (1, 2):
            raise ValueError(f"DualBatchNorm dim must be 1 or 2, got {dim}")
        cls = nn.BatchNorm1d if dim == 1 else nn.BatchNorm2d
        kw = {"eps": eps, "affine": affine, "track_running_stats": track_running_stats}
        self.main = cls(num_features, momentum=momentum, **kw)
        self.aux = cls(num_features, momentum=aux_momentum, **kw)
        self.route = "clean"

    @classmethod
    def from_bn(cls, bn: nn.modules.batchnorm._BatchNorm, aux_momentum: float | None = 0.01) -> DualBatchNorm:
        """Wrap an existing BatchNorm: ``main`` is ``bn`` itself, ``aux`` a copy with ``aux_momentum``."""
        if not isinstance(bn, nn.BatchNorm1d | nn.BatchNorm2d):
            raise TypeError(f"DualBatchNorm wraps BatchNorm1d/BatchNorm2d, got {type(bn).__name__}")
        dual = cls(bn.num_features, dim=1 if isinstance(bn, nn.BatchNorm1d) else 2)
        dual.main = bn
        dual.aux = copy.deepcopy(bn)
        dual.aux.momentum = aux_momentum
        return dual

    @property
    def num_features(self) -> int:
        return self.main.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) if self.route == "clean" else self.aux(x)

    def extra_repr(self) -> str:
        return f"route={self.route!r}"


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise UserError(f"unknown BatchNorm route {route!r}; valid choices: {', '.join(ROUTES)}")


def _dual_bns(model: nn.Module) -> list[DualBatchNorm]:
    return [m for m in model.modules() if isinstance(m, DualBatchNorm)]


def has_dual_bn(model: nn.Module) -> bool:
    """Whether ``model`` contains any :class:`DualBatchNorm`."""
    return any(isinstance(m, DualBatchNorm) for m in model.modules())


def set_bn_momentum(model: nn.Module, aux: float, main: float | None = None) -> None:
    """Set the running-statistics momentum of every :class:`DualBatchNorm`'s adversarial branch to
    ``aux`` and, when given, its clean branch to ``main``. Momentum is not in a state dict, so a
    loaded encoder has :func:`convert_to_dual_bn`'s (0.1 and 0.01) until this says otherwise."""
    for m in _dual_bns(model):
        m.aux.momentum = aux
        if main is not None:
            m.main.momentum = main


def set_bn_route(model: nn.Module, route: str) -> None:
    """Route every :class:`DualBatchNorm` in ``model`` to ``route`` ("clean" or "adv"), permanently."""
    _check_route(route)
    for m in _dual_bns(model):
        m.route = route


@contextlib.contextmanager
def bn_route(model: nn.Module, route: str) -> Iterator[nn.Module]:
    """Temporarily route every :class:`DualBatchNorm` in ``model`` to ``route`` ("clean" or "adv").

    Each layer's previous route is restored on exit, also when the body raises. Models without dual
    BatchNorm are unaffected (the context is then a no-op), so callers need not special-case them.
    """
    _check_route(route)
    layers = _dual_bns(model)
    previous = [m.route for m in layers]
    try:
        for m in layers:
            m.route = route
        yield model
    finally:
        for m, r in zip(layers, previous, strict=True):
            m.route = r


def convert_to_dual_bn(module: nn.Module, aux_momentum: float | None = 0.01) -> nn.Module:
    """Replace every ``BatchNorm1d``/``BatchNorm2d`` in ``module`` (in place) with a :class:`DualBatchNorm`.

    The existing BN (with its parameters and statistics) becomes ``.main``; ``.aux`` starts as a copy.
    Returns ``module`` (or the wrapper when ``module`` itself is a BatchNorm).
    """
    if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
        return DualBatchNorm.from_bn(module, aux_momentum)
    for name, child in module.named_children():
        if isinstance(child, DualBatchNorm):
            continue
        new = convert_to_dual_bn(child, aux_momentum)
        if new is not child:
            setattr(module, name, new)
    return module


def strip_dual_bn(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the clean branch of a dual-BN state dict, renamed to the plain BatchNorm layout.

    ``layer1.0.bn1.main.weight`` -> ``layer1.0.bn1.weight``; ``...aux.*`` entries are dropped; all other
    entries pass through unchanged (order kept). A plain state dict is returned as is (copied).
    """
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) >= 2 and parts[-1] in _BN_STATE_KEYS and parts[-2] in ("main", "aux"):
            if parts[-2] == "aux":
                continue
            key = ".".join(parts[:-2] + parts[-1:])
        out[key] = value
    return out
