"""The named methods as presets of one parameterisation, and the validation of any parameter set.

``L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)`` (NaCl Table 1) extended with the positive
generator (``views``: augmentation, DACL mixup, Gaussian noise) and the positive aggregator
(``positives``: NCA soft-max, VAR mean, ArCL worst pair). The trainer reads ``needs(params)``;
it never branches on a preset's name. Each preset's defaults and their sources:
docs/decisions.md, 'Loss presets'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from ..augment import views as augment
from ..errors import UserError
from ..models.encoders import HEADS, create_head
from ..registry import Registry
from .objectives import AGGREGATORS, OBJECTIVES, needs
from .params import ANCHORS, ARCL_FORMS, ESTIMATORS, WEIGHTINGS, LossParams, coerce_overrides


@dataclass(frozen=True)
class Preset:
    """A named method: its parameters, where they come from, and a one-line description."""

    name: str
    params: LossParams
    paper: str
    description: str
    grid: dict[str, list[Any]] = field(default_factory=dict)  # the paper's ablation grid, if any


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


def list_presets() -> list[str]:
    """Names of every registered preset."""
    return PRESETS.names()


# ============ validation ============


def _bad(msg: str) -> UserError:
    return UserError(f"invalid loss parameter: {msg}")


def _check_choice(name: str, value: Any, choices: list[str] | tuple[str, ...], what: str = "") -> None:
    if value not in choices:
        raise _bad(f"{name}={value!r}; valid choices{what}: {', '.join(choices)}")


def _head_builds(name: str, labels: bool) -> bool:
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
    augment.VIEW_MAKERS.get(p.views)
    HEADS.get(p.head)
    for g in ("G1", "G2", "adv_estimator"):
        _check_choice(g, getattr(p, g), ESTIMATORS)
    _check_choice("w", p.w, WEIGHTINGS)
    _check_choice("robust_anchors", p.robust_anchors, ANCHORS)
    _check_choice("var_anchors", p.var_anchors, ANCHORS)
    _check_choice("arcl_form", p.arcl_form, ARCL_FORMS)
    _check_choice("mix_rho_mode", p.mix_rho_mode, augment.RHO_MODES)
    labels = needs(p).labels
    heads = [h for h in HEADS.names() if _head_builds(h, labels)]
    _check_choice("head", p.head, heads, f" for the {p.objective} objective")


def _check_ranges(p: LossParams) -> None:
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
    _check_ranges(p)
    return p


def resolve(preset: str, overrides: dict[str, Any] | list[str] | None = None) -> LossParams:
    """The preset's parameters with ``overrides`` applied (strings are converted), validated."""
    base = PRESETS.get(preset).params
    return validate(dataclasses.replace(base, **coerce_overrides(overrides)))
