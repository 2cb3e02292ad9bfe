"""How a plugin adds a loss: :func:`register_pair_loss` (a two-view loss, its objective and preset
in one decorator) and :func:`register_preset` (a preset of any registered objective).

The top layer of ``losses``: it registers into the registries of ``objectives`` and ``presets`` and
checks what it registers with their validation (docs/decisions.md, 'Plugins').
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..augment.views import VIEW_MAKERS
from ..errors import UserError
from ..models.heads import HEADS
from .estimators import autocast_off
from .objectives import OBJECTIVES, Objective, project
from .params import FIELD_NAMES, LossParams, Needs, coerce_overrides
from .presets import PRESETS, Preset, check_ranges, head_builds, validate

# A plugin's two-view loss is one decorated function (register_pair_loss), which registers an
# objective and a preset, both under its name. A default named like a LossParams field (t,
# tau_plus, ...) is stored in that field, so the temperature is ``t`` in every manifest; any other
# default is stored in ``LossParams.extra``. Both enter the run's identity. A loss that needs more
# (several positives, labels, adversarial positives) registers an objective with
# ``objectives.objective`` and a preset with register_preset. examples/README.md shows both.

PairLoss = Callable[..., Tensor]

#: fields ``--set`` may change on a pair-loss preset besides its own parameters: they configure the
#: views and the projection head, and are not passed to the loss function
VIEW_KEYS = ("views", "mix_alpha", "mix_rho", "mix_rho_mode", "noise_scale", "head")
#: fields a plugin may not set: they say which objective runs and hold the plugin parameters
_RESERVED = ("objective", "extra")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _check_new_name(name: Any) -> None:
    """A loss name must be new (neither a preset nor an objective) and safe in ids and file names."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UserError(f"loss name {name!r}: use letters, digits and underscores, starting with a letter")
    for registry in (PRESETS, OBJECTIVES):
        if name in registry:
            raise UserError(f"{registry.kind} {name!r} is already registered; choose another name")


def _check_defaults(name: str, defaults: Mapping[str, Any]) -> None:
    for k, v in defaults.items():
        if k in _RESERVED:
            raise UserError(f"loss {name!r}: {k!r} is set by register_pair_loss itself, not a parameter")
        if isinstance(v, bool | int | float | str):
            continue
        raise UserError(
            f"loss {name!r}: default {k}={v!r} must be a number, string or boolean (it is recorded in JSON)"
        )


def _split_defaults(defaults: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(LossParams field values, plugin parameters): a default named like a field is that field."""
    fields = coerce_overrides({k: v for k, v in defaults.items() if k in FIELD_NAMES})
    extra = {k: v for k, v in defaults.items() if k not in FIELD_NAMES}
    return fields, extra


def _check_signature(name: str, fn: PairLoss, passed: tuple[str, ...]) -> None:
    """``fn(z1, z2, **params)`` must accept exactly what it will be given, checked at registration."""
    try:
        inspect.signature(fn).bind(None, None, **dict.fromkeys(passed))
    except TypeError as e:
        raise UserError(f"loss {name!r}: {fn.__name__}(z1, z2, {', '.join(passed)}) fails ({e})") from None
    except ValueError:  # a builtin without a signature: it is called as documented
        return


def _describe(out: Any) -> str:
    if isinstance(out, Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return f"a {type(out).__name__}"


def _pair_objective(name: str, fn: PairLoss, passed: tuple[str, ...]) -> Callable[..., Any]:
    """The objective calling ``fn`` on the first two views' projections, with autocast off."""

    def loss(
        model: nn.Module,
        views: list[Tensor],
        y: Tensor | None,
        p: LossParams,
        gen: torch.Generator,
        fuse: bool = False,
    ) -> tuple[Tensor, dict[str, float]]:
        z1, z2 = project(model, views[:2], fuse)
        values = {**{k: getattr(p, k) for k in FIELD_NAMES}, **p.extra_params()}
        with autocast_off(z1.device.type):
            out = fn(z1, z2, **{k: values[k] for k in passed})
        if not isinstance(out, Tensor) or out.dim() != 0:
            raise UserError(
                f"loss {name!r} returned {_describe(out)}; a pair loss must return a scalar tensor"
            )
        return out, {}

    loss.__name__ = loss.__qualname__ = f"pair_loss_{name}"
    return loss


def _two_views(p: LossParams) -> Needs:
    return Needs(n_views=2, adversarial=False, labels=False)


def _check_views_and_head(views: str, head: str) -> None:
    VIEW_MAKERS.get(views)
    HEADS.get(head)
    if not head_builds(head, labels=False):
        raise UserError(f"head {head!r} needs class labels; a pair loss takes a projection head such as clae")


def register_pair_loss(
    name: str,
    *,
    views: str = "simclr",
    head: str = "clae",
    description: str | None = None,
    paper: str = "",
    **defaults: Any,
) -> Callable[[PairLoss], PairLoss]:
    """Decorator: register ``fn(z1, z2, **params) -> scalar Tensor`` as the loss preset ``name``.

    ``z1``, ``z2`` are the (B, d) projections of two views of the same B images (not normalised);
    ``defaults`` are the parameters ``fn`` receives (numbers, strings or booleans, changed with
    ``--set k=v``). ``views`` names the view maker and ``head`` the projection head. A name that is
    already registered, or a ``fn`` that does not take the parameters, is a one-line ``UserError``.
    ``fn`` receives the projections in float32 (float64 for a float64 model) with autocast off, and
    each default by name with the ``--set`` overrides applied, converted to the default's type. A
    default named like a :class:`LossParams` field (``t``, ...) is stored in that field, any other in
    ``LossParams.extra``; ``--set`` may also change ``views``, ``head`` and the view makers'
    settings (:data:`VIEW_KEYS`), which are not passed to ``fn``.
    """

    def deco(fn: PairLoss) -> PairLoss:
        _check_new_name(name)
        _check_defaults(name, defaults)
        fields, extra = _split_defaults(defaults)
        passed = tuple(k for k in defaults if k not in VIEW_KEYS)
        _check_signature(name, fn, passed)
        _check_views_and_head(views, head)
        params = LossParams(objective=name, views=views, head=head, extra=extra, **fields)
        check_ranges(params)
        module = getattr(fn, "__module__", None)
        summary = description or _first_line(fn.__doc__) or f"pair loss from {module}"
        objective = Objective(needs=_two_views, loss=_pair_objective(name, fn, passed))
        OBJECTIVES.add(name, objective, description=summary)
        keys = tuple(dict.fromkeys([*fields, *VIEW_KEYS]))
        PRESETS.add(name, Preset(name, params, paper, summary, keys=keys, module=module), module=module)
        return fn

    return deco


def register_preset(
    name: str,
    *,
    description: str,
    paper: str = "",
    objective: str = "contrastive",
    extra: Mapping[str, Any] | None = None,
    grid: dict[str, list[Any]] | None = None,
    **fields: Any,
) -> Preset:
    """Register a preset of any objective: ``fields`` set :class:`LossParams`, ``extra`` its own parameters.

    For losses beyond two views (register their objective first, with ``objectives.objective``);
    every field and every ``extra`` key can then be changed with ``--set``. The parameters are
    validated now: a bad name or value, or a name already registered, is a one-line ``UserError``.
    """
    _check_new_preset(name)
    _check_defaults(name, dict(extra or {}))
    params = validate(LossParams(objective=objective, extra=dict(extra or {}), **coerce_overrides(fields)))
    module = sys._getframe(1).f_globals.get("__name__")  # the registering module, as for a decorator
    preset = Preset(name, params, paper, description, grid or {}, module=module)
    PRESETS.add(name, preset, module=module)
    return preset


def _check_new_preset(name: Any) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UserError(f"loss name {name!r}: use letters, digits and underscores, starting with a letter")
    if name in PRESETS:
        raise UserError(f"{PRESETS.kind} {name!r} is already registered; choose another name")


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
