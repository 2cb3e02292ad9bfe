"""One parameterisation for the whole family, and the named methods as presets of it.

``L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)`` (NaCl Table 1) extended with the positive
generator (``views``: augmentation, DACL mixup, Gaussian noise) and the positive aggregator
(``positives``: NCA soft-max, VAR mean, ArCL worst pair). The trainer reads ``needs(params)``;
it never branches on a preset's name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from ..registry import Registry
from .estimators import ESTIMATORS

AGGREGATORS = ("nca", "var", "worst_pair")
WEIGHTINGS = ("1", "w_hat")


@dataclass(frozen=True)
class LossParams:
    """Every parameter of the unified loss; presets fill it with each paper's defaults."""

    objective: str = "contrastive"  # "contrastive" | "supervised" (registry in objectives.py)
    G1: str = "g0"  # negative estimator of the NaCl term
    M: int = 1  # number of positives (NCA / VAR) or 1 + mixed positives (MIXNCA)
    lam: float | None = None  # MIXNCA mixing coefficient; None = plain NCA
    combine: bool = False  # Table 5: NCA(G1, M) + MIXNCA(G1, M, lam) on the same batch (D7)
    positives: str = "nca"  # aggregator: "nca" | "var" | "worst_pair" (ArCL)
    alpha: float = 0.0  # weight of the robust term
    G2: str = "g0"  # negative estimator of the robust term
    w: str = "1"  # robust weighting: "1" | "w_hat"
    tau_plus: float = 0.0  # class prior (g1, g2)
    beta: float = 0.0  # hardness (g2)
    t: float = 0.5  # temperature: s = cos / t
    detach_weights: bool = False  # detach g2 importance weights (official HCL code: no, D16)
    views: str = "simclr"  # positive generator: a VIEW_MAKERS name in augment.py
    m_views: int = 4  # ArCL: number of sampled views m
    mix_alpha: float = 0.9  # DACL: lambda ~ U(mix_alpha, 1)
    mix_rho: float = 0.1  # DACL binary mixup: fraction of features from the partner (D14)
    noise_scale: float = 0.05  # Gaussian-noise positives: x + scale * N(0, I) (D15)
    adv_eps: float = 0.015  # adversarial positive budget in [0,1] pixel units (CLAE 0.03 in [-1,1])
    adv_estimator: str = "g0"  # the loss the adversarial positive maximises (CLAE: NT-Xent, D8)
    dual_bn: bool = True  # AdvProp-style auxiliary BatchNorm for adversarial inputs
    head: str = "clae"  # projection head (CLAE 512-512-64, D2)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every parameter (JSON-serialisable)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Needs:
    """What a loss needs from the trainer, derived from its parameters."""

    n_views: int  # views produced by the view maker per image
    adversarial: bool  # needs adversarial positives (dual BatchNorm if dual_bn)
    mixing: bool  # forms MIXNCA mixed positives from the base views
    labels: bool  # needs class labels (supervised baseline)


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
    "NCA(g2, 5) + MIXNCA(g2, 5, 0.5) summed (D7)",
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


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a name"}


def _coerce(name: str, value: Any, current: Any, ftype: Any) -> Any:
    """Convert a ``--set k=v`` string to the field's type (other values are type-checked as given)."""
    t = str(ftype)
    if not isinstance(value, str):
        return _check_type(name, value, t)
    v = value.strip()
    if v.lower() in ("none", "null") and "None" in t:
        return None
    try:
        if "bool" in t:
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
        if t.startswith("int"):
            return int(v)
        if "float" in t:
            return float(v)
    except ValueError:
        raise UserError(f"--set {name}={value!r}: expected {_TYPE_WORDS.get(t.split(' |')[0], t)}") from None
    return v


def _check_type(name: str, value: Any, t: str) -> Any:
    """A non-string override (library callers, manifests) must already have the field's type."""
    if value is None and "None" in t:
        return None
    base = t.split(" |")[0]
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": False,  # strings never reach here
    }.get(base, True)
    if not ok:
        raise UserError(f"loss parameter {name}={value!r}: expected {_TYPE_WORDS.get(base, base)}")
    return float(value) if base == "float" else value


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """``["M=5", "lam=0.9"]`` -> ``{"M": "5", "lam": "0.9"}``."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set M=5")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def validate(p: LossParams) -> LossParams:
    """Check every parameter's range; a one-line UserError names the bad one and its valid range."""
    from ..augment import views as augment  # lazy: augment imports torch ops only

    def bad(msg: str) -> UserError:
        return UserError(f"invalid loss parameter: {msg}")

    for g in ("G1", "G2", "adv_estimator"):
        if getattr(p, g) not in ESTIMATORS:
            raise bad(f"{g}={getattr(p, g)!r}; valid choices: {', '.join(ESTIMATORS)}")
    if p.M < 1:
        raise bad(f"M={p.M}; M must be >= 1")
    if p.lam is not None and not 0.0 <= p.lam <= 1.0:
        raise bad(f"lam={p.lam}; lam must lie in [0, 1]")
    if p.combine and p.lam is None:
        raise bad("combine=true needs a mixing coefficient lam")
    if not 0.0 <= p.tau_plus < 1.0:
        raise bad(f"tau_plus={p.tau_plus}; tau_plus must lie in [0, 1)")
    if p.beta < 0:
        raise bad(f"beta={p.beta}; beta must be >= 0")
    if p.t <= 0:
        raise bad(f"t={p.t}; the temperature must be > 0")
    if p.alpha < 0:
        raise bad(f"alpha={p.alpha}; alpha must be >= 0")
    if p.w not in WEIGHTINGS:
        raise bad(f"w={p.w!r}; valid choices: {', '.join(WEIGHTINGS)}")
    if p.positives not in AGGREGATORS:
        raise bad(f"positives={p.positives!r}; valid choices: {', '.join(AGGREGATORS)}")
    if p.positives == "worst_pair" and p.m_views < 2:
        raise bad(f"m_views={p.m_views}; ArCL needs m_views >= 2")
    if not 0.0 <= p.mix_alpha <= 1.0:
        raise bad(f"mix_alpha={p.mix_alpha}; must lie in [0, 1]")
    if not 0.0 <= p.mix_rho <= 1.0:
        raise bad(f"mix_rho={p.mix_rho}; must lie in [0, 1]")
    if not 0.0 <= p.adv_eps <= 1.0:
        raise bad(f"adv_eps={p.adv_eps}; must lie in [0, 1] (pixel units)")
    if p.noise_scale < 0:
        raise bad(f"noise_scale={p.noise_scale}; must be >= 0")
    augment.VIEW_MAKERS.get(p.views)
    from .objectives import OBJECTIVES

    OBJECTIVES.get(p.objective)
    return p


def resolve(preset: str, overrides: dict[str, Any] | list[str] | None = None) -> LossParams:
    """The preset's parameters with ``overrides`` applied (strings are converted), validated."""
    base = PRESETS.get(preset).params
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    fields = {f.name: f for f in dataclasses.fields(LossParams)}
    changes: dict[str, Any] = {}
    for k, v in (overrides or {}).items():
        if k not in fields:
            raise UserError(f"unknown loss parameter {k!r}; valid parameters: {', '.join(fields)}")
        changes[k] = _coerce(k, v, getattr(base, k), fields[k].type)
    return validate(dataclasses.replace(base, **changes))


def needs(p: LossParams) -> Needs:
    """What the trainer must provide for these parameters."""
    from .objectives import OBJECTIVES

    return OBJECTIVES.get(p.objective).needs(p)
