"""The named methods as presets of one parameterisation, and the validation of any parameter set.

``L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)`` (NaCl Table 1) extended with the positive
generator (``views``: augmentation, DACL mixup, Gaussian noise) and the positive aggregator
(``positives``: NCA soft-max, VAR mean, ArCL worst pair). The trainer reads ``needs(params)``;
it never branches on a preset's name. Each preset's defaults and their sources:
docs/decisions.md, 'Loss presets'.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..augment.mixup import RHO_MODES
from ..augment.views import VIEW_MAKERS
from ..errors import UserError
from ..models.heads import HEADS, create_head
from ..registry import Registry, did_you_mean
from .adversarial import ACL_ATTACK, DEACL_ATTACK, ROCL_ATTACK
from .objectives import AGGREGATORS, OBJECTIVES, needs
from .params import (
    ANCHORS,
    ARCL_FORMS,
    ESTIMATORS,
    FIELD_NAMES,
    WEIGHTINGS,
    LossParams,
    coerce_overrides,
    coerce_value,
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

# ============ adversarial contrastive pretraining (losses/adversarial.py) ============
# Their own parameters live in ``extra`` (the other presets' recorded identities stay unchanged);
# defaults and sources: docs/decisions.md, 'Adversarial contrastive pretraining'.


def _adv_preset(name: str, paper: str, description: str, extra: dict[str, Any], **kw: Any) -> None:
    PRESETS.add(name, Preset(name, LossParams(extra=extra, **kw), paper, description))


_adv_preset(
    "acl",
    "Jiang et al. 2020, ACL (NeurIPS)",
    "ACL(DS): (NT-Xent(clean) + NT-Xent(PGD-5 8/255 views))/2, dual BN; acl_mode ds, a2a or a2s",
    {**ACL_ATTACK, "acl_mode": "ds", "aug_strength": 1.0},
    objective="acl",
    views="acl",
    t=0.5,
)
_adv_preset(
    "rocl",
    "Kim et al. 2020, RoCL (NeurIPS)",
    "RoCL: PGD-7 0.0314 on view 1 vs view 2; adv view an extra positive + NT-Xent(adv, v2)/256",
    {**ROCL_ATTACK, "rocl_lamda": 256.0},
    objective="rocl",
    views="simclr",
    t=0.5,
    dual_bn=False,
)
_adv_preset(
    "dynacl",
    "Luo et al. 2023, DynACL (ICLR)",
    "DynACL: ACL(DS) with strength 1 -> 0 and adv weight 1 -> 5/3 annealed (reload_frac, swap_param)",
    {**ACL_ATTACK, "acl_mode": "ds", "reload_frac": 0.05, "swap_param": 2 / 3},
    objective="dynacl",
    views="acl",
    t=0.5,
)
_adv_preset(
    "deacl",
    "Zhang et al. 2022, DeACL (ECCV)",
    "DeACL: -cos(s(x), teacher(x)) - 2 cos(s(x_adv), s(x)), PGD-5 8/255; --set teacher=DIR",
    {**DEACL_ATTACK, "teacher": "", "trades_k": 2.0},
    objective="deacl",
    views="pad_crop_flip",
    head="none",
    dual_bn=False,
)


def list_presets() -> list[str]:
    """Names of every registered preset."""
    return PRESETS.names()


# ============ validation ============


def _bad(msg: str) -> UserError:
    return UserError(f"invalid loss parameter: {msg}")


def _check_choice(name: str, value: Any, choices: list[str] | tuple[str, ...], what: str = "") -> None:
    if value not in choices:
        raise _bad(f"{name}={value!r}; valid choices{what}: {', '.join(choices)}")


def head_builds(name: str, labels: bool) -> bool:
    """Whether the trainer could build head ``name``: with a class count exactly when labels are used.

    The trainer calls ``create_head(head, feature_dim, out_dim=num_classes if labels else None)``
    after loading the data; building it here on the meta device (no memory, no random draws) makes
    e.g. a classifier head under a contrastive objective fail before anything is loaded.
    """
    with torch.device("meta"):
        try:
            create_head(name, 8, out_dim=3 if labels else None)
        except UserError:
            return False
    return True


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


def check_ranges(p: LossParams) -> None:
    """Every numeric parameter against its valid range."""
    if p.M < 1:
        raise _bad(f"M={p.M}; M must be >= 1")
    if p.lam is not None and not 0.0 <= p.lam <= 1.0:
        raise _bad(f"lam={p.lam}; lam must lie in [0, 1]")
    if p.combine and p.lam is None:
        raise _bad("combine=true needs a mixing coefficient lam")
    if not 0.0 <= p.tau_plus < 1.0:
        raise _bad(f"tau_plus={p.tau_plus}; tau_plus must lie in [0, 1)")
    if p.beta < 0:
        raise _bad(f"beta={p.beta}; beta must be >= 0")
    if p.t <= 0:
        raise _bad(f"t={p.t}; the temperature must be > 0")
    if p.alpha < 0:
        raise _bad(f"alpha={p.alpha}; alpha must be >= 0")
    if p.positives == "worst_pair" and p.m_views < 2:
        raise _bad(f"m_views={p.m_views}; ArCL needs m_views >= 2")
    for name in ("mix_alpha", "mix_rho"):
        if not 0.0 <= getattr(p, name) <= 1.0:
            raise _bad(f"{name}={getattr(p, name)}; must lie in [0, 1]")
    if not 0.0 <= p.adv_eps <= 1.0:
        raise _bad(f"adv_eps={p.adv_eps}; must lie in [0, 1] (pixel units)")
    if p.noise_scale < 0:
        raise _bad(f"noise_scale={p.noise_scale}; must be >= 0")


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
    plugin = {k: _coerce_plugin_value(k, v, extra[k]) for k, v in items.items() if k in extra}
    if plugin:
        changes["extra"] = {**extra, **plugin}
    return dataclasses.replace(preset.params, **changes)


def _coerce_plugin_value(name: str, value: Any, default: Any) -> Any:
    """A plugin parameter converted to its default's type (bool, int, float or str), finite."""
    out = coerce_value(name, value, type(default).__name__)
    if isinstance(out, float) and not math.isfinite(out):
        raise UserError(f"--set {name}={value!r}: expected a finite number")
    return out
