"""The named methods as presets of one parameterisation, the validation of any parameter set, and
the registration of plugin losses (:func:`register_pair_loss`, :func:`register_preset`).

``L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)`` (NaCl Table 1) extended with the positive
generator (``views``: augmentation, DACL mixup, Gaussian noise) and the positive aggregator
(``positives``: NCA soft-max, VAR mean, ArCL worst pair). The trainer reads ``needs(params)``;
it never branches on a preset's name. Each preset's defaults and their sources:
docs/decisions.md, 'Loss presets'.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..augment.mixup import RHO_MODES
from ..augment.views import VIEW_MAKERS
from ..errors import UserError
from ..models.heads import HEADS, head_builds
from ..registry import Registry, did_you_mean
from .adversarial import ACL_ATTACK, AIR_DEFAULTS, DEACL_ATTACK, ROCL_ATTACK
from .estimators import autocast_off
from .objectives import AGGREGATORS, OBJECTIVES, Objective, needs, project
from .params import (
    ANCHORS,
    ARCL_FORMS,
    ESTIMATORS,
    FIELD_NAMES,
    WEIGHTINGS,
    LossParams,
    Needs,
    bad_param,
    check_ranges,
    coerce_overrides,
    coerce_plugin_value,
    parse_overrides,
)


@dataclass(frozen=True)
class Preset:
    """A named method: its parameters, where they come from, and a one-line description."""

    name: str
    params: LossParams
    paper: str
    description: str
    grid: dict[str, list[Any]] = field(default_factory=dict)  # the paper's ablation grid, if any
    # the LossParams fields ``--set`` may change besides the plugin parameters (``params.extra``);
    # None: every field (the built-in presets)
    keys: tuple[str, ...] | None = None
    module: str | None = None  # the module that registered it: None for the built-in presets


PRESETS: Registry[Preset] = Registry("loss preset")

_NACL = "Ko et al., NaCl (ICML)"
_NACL_ICLR = "NaCl (ICLR submission)"
_D = {"tau_plus": 0.01}  # NaCl appendix H: tau+ = 0.01, beta = 1 for every debiased/hard variant
_DH = {"tau_plus": 0.01, "beta": 1.0}


def _preset(
    name: str, paper: str, description: str, grid: dict[str, list[Any]] | None = None, **kw: Any
) -> None:
    PRESETS.add(name, Preset(name, LossParams(**kw), paper, description, grid or {}))


_preset("simclr", "Chen et al. 2020 (NaCl Table 1)", "NT-Xent: NCA(g0, 1)", G1="g0")
_preset("debiased", "Chuang et al. 2020 (NaCl Table 1)", "Debiased: NCA(g1, 1)", G1="g1", **_D)
_preset("hardneg", "Robinson et al. 2021", "Hard negatives: g2, tau+=0", G1="g2", beta=1.0)
_preset(
    "debiased_hardneg", "Robinson et al. 2021 (NaCl Table 1)", "Debiased+HardNeg: NCA(g2, 1)", G1="g2", **_DH
)
_preset(
    "adv",
    "Ho & Vasconcelos 2020, CLAE (NaCl Table 1)",
    "SimCLR + Robust(g0, 1): FGSM positive, dual BN",
    G1="g0",
    alpha=1.0,
    G2="g0",
    w="1",
)
_preset(
    "nca",
    f"{_NACL} Tables 2-5",
    "NCA(g2, M=5): M positives per anchor",
    grid={"M": [1, 2, 3, 4, 5], "G1": ["g0", "g2"]},
    G1="g2",
    M=5,
    **_DH,
)
_preset(
    "mixnca",
    f"{_NACL} Tables 2-5",
    "MIXNCA(g2, M=5, lam=0.5): M-1 mixup positives, soft target",
    grid={"M": [1, 2, 3, 4, 5], "lam": [0.5, 0.6, 0.7, 0.8, 0.9]},
    G1="g2",
    M=5,
    lam=0.5,
    **_DH,
)
_preset(
    "nca_mixnca",
    f"{_NACL} Table 5",
    "NCA(g2, 5) + MIXNCA(g2, 5, 0.5) summed",
    G1="g2",
    M=5,
    lam=0.5,
    combine=True,
    **_DH,
)
_preset(
    "var",
    f"{_NACL_ICLR} Tables 1-3",
    "VAR(g2, M=5): mean of M two-view trials",
    grid={"M": [2, 3, 4, 5]},
    G1="g2",
    M=5,
    positives="var",
    **_DH,
)
_preset(
    "intcl",
    f"{_NACL} Table 1 / Fig. 1",
    "IntCl: NCA(g2, 1) + Robust(g2, w_hat)",
    G1="g2",
    alpha=1.0,
    G2="g2",
    w="w_hat",
    **_DH,
)
_preset(
    "intnacl",
    f"{_NACL} Fig. 1",
    "IntNaCl: MIXNCA(g2, 5, 0.5) + Robust(g2, w_hat)",
    grid={"M": [1, 2, 5], "lam": [0.5, 0.7, 0.9], "w": ["w_hat", "1"]},
    G1="g2",
    M=5,
    lam=0.5,
    alpha=1.0,
    G2="g2",
    w="w_hat",
    **_DH,
)
_preset(
    "arcl",
    "Zhao et al. 2023, ArCL",
    "NT-Xent on the worst-aligned pair of m=4 views",
    grid={"m_views": [4, 6, 8]},
    G1="g0",
    positives="worst_pair",
    m_views=4,
)
_preset(
    "dacl",
    "Verma et al. 2021, DACL",
    "NT-Xent on two linear-mixup positives, lam ~ U(0.9, 1)",
    G1="g0",
    views="dacl",
    mix_alpha=0.9,
    t=1.0,
)
_preset(
    "dacl_plus",
    "Verma et al. 2021, DACL+",
    "DACL with linear/geometric/binary mixup chosen per sample",
    G1="g0",
    views="dacl_plus",
    mix_alpha=0.9,
    mix_rho=0.1,
    t=1.0,
)
_preset(
    "gaussian",
    "Verma et al. 2021 (Gaussian-noise baseline)",
    "NT-Xent on x + 0.05 N(0, I) positives",
    G1="g0",
    views="gaussian",
    noise_scale=0.05,
    t=0.1,
)
_preset(
    "supervised",
    f"{_NACL} appendix I",
    "Cross-entropy on labels (crop + flip)",
    objective="supervised",
    views="crop_flip",
    head="linear",
)

# ============ adversarial contrastive pretraining (losses/adversarial/) ============
# Their own parameters live in ``extra`` (the other presets' recorded identities stay unchanged);
# defaults and sources: docs/decisions.md, 'Adversarial contrastive pretraining'.


def _adv_preset(name: str, paper: str, description: str, extra: dict[str, Any], **kw: Any) -> None:
    PRESETS.add(name, Preset(name, LossParams(extra=extra, **kw), paper, description))


_adv_preset(
    "acl",
    "Jiang et al. 2020, ACL (NeurIPS)",
    "ACL(DS): (NT-Xent(clean) + NT-Xent(PGD-5 8/255 views))/2, dual BN, 3-layer BN head; acl_mode ds/a2a/a2s",
    {**ACL_ATTACK, "acl_mode": "ds", "aug_strength": 1.0},
    objective="acl",
    views="acl",
    head="acl_mlp3_dualbn",
    t=0.5,
)
_adv_preset(
    "rocl",
    "Kim et al. 2020, RoCL (NeurIPS)",
    "RoCL: PGD-7 0.0314 on view 1 vs view 2; adv view an extra positive + NT-Xent(adv, v2)/256; jitter 0.5",
    {**ROCL_ATTACK, "rocl_lamda": 256.0, "strength": 0.5, "scale_min": 0.08},
    objective="rocl",
    views="simclr",
    head="rocl_2048_128",
    t=0.5,
    dual_bn=False,
)
_adv_preset(
    "dynacl",
    "Luo et al. 2023, DynACL (ICLR)",
    "DynACL: ACL(DS) through an online/EMA (m 0.99) swap, strength 1 -> 0 and adv weight 1 -> 5/3 annealed",
    {**ACL_ATTACK, "acl_mode": "ds", "reload_frac": 0.05, "swap_param": 2 / 3, "momentum": 0.99},
    objective="dynacl",
    views="acl",
    head="acl_mlp3_dualbn",
    t=0.5,
)
_adv_preset(
    "deacl",
    "Zhang et al. 2022, DeACL (ECCV)",
    "DeACL: student starts as teacher; -cos(s(x), t(x)) - 2 cos(s(x_adv), s(x)), PGD-5; --set teacher=DIR",
    {**DEACL_ATTACK, "teacher": "", "trades_k": 2.0},
    objective="deacl",
    views="pad_crop_flip",
    head="none",
    dual_bn=False,
)
_adv_preset(
    "acl_air",
    "Xu et al. 2023, AIR (NeurIPS)",
    "ACL-AIR: NT-Xent(clean) + NT-Xent(adv) + 0.5 SIR + 0.5 AIR on the original image, dual BN",
    {**ACL_ATTACK, **AIR_DEFAULTS, "aug_strength": 1.0, "dyn_aug": False},
    objective="air",
    views="acl_original",
    head="acl_mlp3_dualbn",
    t=0.5,
)
_adv_preset(
    "dynacl_air",
    "Xu et al. 2023, AIR (NeurIPS)",
    "DynACL-AIR: (1 - w) NT-Xent(clean) + (1 + w) NT-Xent(adv) + 0.5 (SIR + AIR); strength 1 -> 0, w -> 2/3",
    {**ACL_ATTACK, **AIR_DEFAULTS, "dyn_aug": True, "reload_frac": 0.05, "swap_param": 2 / 3},
    objective="air",
    views="acl_original",
    head="acl_mlp3_dualbn",
    t=0.5,
)


def list_presets() -> list[str]:
    """Names of every registered preset."""
    return PRESETS.names()


# ============ validation ============


def _check_choice(name: str, value: Any, choices: list[str] | tuple[str, ...], what: str = "") -> None:
    if value not in choices:
        raise bad_param(f"{name}={value!r}; valid choices{what}: {', '.join(choices)}")


def _check_names(p: LossParams) -> None:
    """Every name-valued parameter against its registry (whose error lists the valid names) or choices."""
    OBJECTIVES.get(p.objective)
    AGGREGATORS.get(p.positives)
    VIEW_MAKERS.get(p.views)
    HEADS.get(p.head)
    for g in ("G1", "G2", "adv_estimator"):
        _check_choice(g, getattr(p, g), ESTIMATORS)
    _check_choice("w", p.w, WEIGHTINGS)
    _check_choice("robust_anchors", p.robust_anchors, ANCHORS)
    _check_choice("var_anchors", p.var_anchors, ANCHORS)
    _check_choice("arcl_form", p.arcl_form, ARCL_FORMS)
    _check_choice("mix_rho_mode", p.mix_rho_mode, RHO_MODES)
    labels = needs(p).labels
    heads = [h for h in HEADS.names() if head_builds(h, labels)]
    _check_choice("head", p.head, heads, f" for the {p.objective} objective")


def validate(p: LossParams) -> LossParams:
    """Check every name and range; a one-line UserError names the bad parameter and the valid choices.

    Runs before any data is loaded (``resolve`` calls it), so a bad ``--set`` fails at once.
    """
    _check_names(p)
    check_ranges(p)
    return p


def resolve(preset: str, overrides: dict[str, Any] | list[str] | None = None) -> LossParams:
    """The preset's parameters with ``overrides`` applied (strings are converted), validated."""
    return validate(apply_overrides(PRESETS.get(preset), overrides))


def apply_overrides(preset: Preset, overrides: dict[str, Any] | list[str] | None) -> LossParams:
    """``preset.params`` with ``overrides`` applied, typed, not yet validated.

    A key naming one of the preset's plugin parameters (``params.extra``) is converted to the type
    of its default; any other key must be a field the preset allows (``preset.keys``).
    """
    items = parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides or {})
    extra = preset.params.extra_params()
    if preset.keys is not None or extra:
        allowed = [*extra, *(preset.keys if preset.keys is not None else FIELD_NAMES)]
        for k in items:
            if k not in allowed:
                raise UserError(
                    f"loss {preset.name!r} has no parameter {k!r}{did_you_mean(k, allowed)}; "
                    f"its parameters: {', '.join(allowed)}"
                )
    changes = coerce_overrides({k: v for k, v in items.items() if k not in extra})
    plugin = {k: coerce_plugin_value(k, v, extra[k]) for k, v in items.items() if k in extra}
    if plugin:
        changes["extra"] = {**extra, **plugin}
    return dataclasses.replace(preset.params, **changes)


# ============ presets from plugins ============
#
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
