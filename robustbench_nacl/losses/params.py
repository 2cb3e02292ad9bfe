"""The unified loss parameters, what a loss needs from the trainer, ``--set k=v`` parsing, range checks.

The bottom layer of ``losses``: it imports nothing from the package above ``errors``, so every other
module of ``losses`` (estimators, terms, objectives, presets) may import it.
Formulas and defaults: docs/decisions.md, 'Loss formulas' and 'Loss presets'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UserError

ESTIMATORS = ("g0", "g1", "g2")  # negative estimators (docs/decisions.md, 'Negative estimators')
WEIGHTINGS = ("1", "w_hat")  # weightings w(x) of the robust term
ANCHORS = ("both", "one_sided")  # who anchors the Robust and VAR terms (docs/decisions.md, 'Robust term')
ARCL_FORMS = ("ntxent", "algorithm1")  # ArCL: symmetric NT-Xent on the worst pair, or Algorithm 1 as printed


@dataclass(frozen=True)
class LossParams:
    """Every parameter of the unified loss; presets fill it with each paper's defaults.

    The fields after ``head`` switch a formula between the reading the code defaults to and the form
    the paper prints (docs/decisions.md, 'Robust term', 'VAR', 'ArCL', 'DACL positives'); their
    defaults keep the losses every existing checkpoint was trained with.
    """

    objective: str = "contrastive"  # an OBJECTIVES name (objectives.py)
    G1: str = "g0"  # negative estimator of the NaCl term
    M: int = 1  # number of positives (NCA / VAR) or 1 + mixed positives (MIXNCA)
    lam: float | None = None  # MIXNCA mixing coefficient; None = plain NCA
    combine: bool = False  # NaCl Table 5: NCA(G1, M) + MIXNCA(G1, M, lam) on the same batch
    positives: str = "nca"  # positive aggregator: an AGGREGATORS name ("nca" | "var" | "worst_pair")
    alpha: float = 0.0  # weight of the robust term
    G2: str = "g0"  # negative estimator of the robust term
    w: str = "1"  # robust weighting: "1" | "w_hat"
    tau_plus: float = 0.0  # class prior (g1, g2)
    beta: float = 0.0  # hardness (g2)
    t: float = 0.5  # temperature: s = cos / t
    detach_weights: bool = False  # detach g2's importance weights (the official HCL code does not)
    views: str = "simclr"  # positive generator: a VIEW_MAKERS name (augment/views.py)
    m_views: int = 4  # ArCL: number of sampled views m
    mix_alpha: float = 0.9  # DACL: lambda ~ U(mix_alpha, 1)
    mix_rho: float = 0.1  # DACL binary mixup: fraction of values from the partner (see mix_rho_mode)
    noise_scale: float = 0.05  # Gaussian-noise positives: x + scale * N(0, I)
    adv_eps: float = 0.015  # adversarial positive budget in [0,1] pixel units (CLAE 0.03 in [-1,1])
    adv_estimator: str = "g0"  # the loss the adversarial positive maximises (CLAE: NT-Xent)
    dual_bn: bool = True  # AdvProp-style auxiliary BatchNorm for adversarial inputs
    head: str = "clae"  # projection head: a HEADS name (models/heads.py)
    robust_anchors: str = "both"  # "both": clean and adversarial views anchor; "one_sided": clean only
    var_anchors: str = "both"  # "both": view 0 and view j anchor each trial; "one_sided": view 0 only
    w_hat_grad: bool = False  # let gradient flow through w_hat (default: a detached weight)
    arcl_form: str = "ntxent"  # "ntxent" | "algorithm1" (ArCL's Algorithm 1 as printed)
    mix_rho_mode: str = "from_partner"  # "from_partner" | "keep" (DACL as printed: rho keeps the anchor)
    # a plugin loss's own parameters as sorted (name, value) pairs (a mapping is accepted and sorted);
    # a tuple keeps the dataclass frozen and hashable (docs/decisions.md, 'Plugins')
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        extra = self.extra.items() if isinstance(self.extra, Mapping) else self.extra
        object.__setattr__(self, "extra", tuple(sorted((str(k), v) for k, v in extra)))

    def extra_params(self) -> dict[str, Any]:
        """The plugin parameters as a dict (empty for every built-in preset)."""
        return dict(self.extra)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every parameter (JSON-serialisable).

        ``extra`` appears only when non-empty, so the built-in presets' dicts, and with them every
        recorded configuration hash, are those written before plugins existed.
        """
        out = dataclasses.asdict(self)
        del out["extra"]
        if self.extra:
            out["extra"] = self.extra_params()
        return out


@dataclass(frozen=True)
class Estimate:
    """How a contrastive term estimates its negative mass: the estimator and the parameters it reads.

    Built once per term from :class:`LossParams` (:meth:`of`) and passed through the estimators and
    terms unchanged (docs/decisions.md, 'Negative estimators').
    """

    estimator: str  # "g0" | "g1" | "g2"
    temperature: float  # t: s = cos / t
    tau_plus: float = 0.0  # class prior of the debiasing correction (g1, g2)
    beta: float = 0.0  # hardness concentration of g2
    detach_weights: bool = False  # detach g2's importance weights (the official HCL code does not)

    @classmethod
    def of(cls, p: LossParams, which: str = "G1") -> Estimate:
        """The estimate of ``p``'s NaCl term (``which="G1"``), robust term ("G2") or adversarial positive."""
        return cls(getattr(p, which), p.t, p.tau_plus, p.beta, p.detach_weights)

    @classmethod
    def given(cls, est: Estimate | str | None, fields: Mapping[str, Any]) -> Estimate:
        """``est`` itself, or one built from the keyword form (``estimator=..., temperature=...``).

        The loss functions take either, so that library callers keep the keyword arguments.
        """
        if isinstance(est, Estimate):
            if fields:
                raise TypeError(f"pass an Estimate or its fields, not both (got {', '.join(fields)})")
            return est
        return cls(**fields) if est is None else cls(est, **fields)


@dataclass(frozen=True)
class Needs:
    """What a loss needs from the trainer, declared by its objective for given parameters."""

    n_views: int  # views produced by the view maker per image
    adversarial: bool  # needs adversarial positives (dual BatchNorm if dual_bn)
    labels: bool  # needs class labels (the model's head then maps to the classes)


# ============ --set k=v overrides ============

_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a name"}
# the fields ``--set`` reaches directly; a plugin parameter is set by its own name (presets.resolve)
_FIELDS = {f.name: f for f in dataclasses.fields(LossParams) if f.name != "extra"}
FIELD_NAMES = tuple(_FIELDS)


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """``["M=5", "lam=0.9"]`` -> ``{"M": "5", "lam": "0.9"}``."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set M=5")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def coerce_overrides(overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    """Typed field values from ``--set`` strings or library values; unknown names are a UserError."""
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    changes: dict[str, Any] = {}
    for k, v in (overrides or {}).items():
        if k not in _FIELDS:
            raise UserError(f"unknown loss parameter {k!r}; valid parameters: {', '.join(_FIELDS)}")
        changes[k] = coerce_value(k, v, str(_FIELDS[k].type))
    return changes


def coerce_value(name: str, value: Any, t: str) -> Any:
    """Convert a ``--set k=v`` string to the field's type (other values are type-checked as given)."""
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


# ============ ranges ============


def bad_param(msg: str) -> UserError:
    """The one-line error for a loss parameter out of range or not among its choices."""
    return UserError(f"invalid loss parameter: {msg}")


def check_ranges(p: LossParams) -> None:
    """Every numeric parameter against its valid range (every float finite first: a NaN passes
    every comparison below and is only found when the manifest is written, after training)."""
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise bad_param(f"{f.name}={v}; must be a finite number")
    if p.M < 1:
        raise bad_param(f"M={p.M}; M must be >= 1")
    if p.lam is not None and not 0.0 <= p.lam <= 1.0:
        raise bad_param(f"lam={p.lam}; lam must lie in [0, 1]")
    if p.combine and p.lam is None:
        raise bad_param("combine=true needs a mixing coefficient lam")
    if not 0.0 <= p.tau_plus < 1.0:
        raise bad_param(f"tau_plus={p.tau_plus}; tau_plus must lie in [0, 1)")
    if p.beta < 0:
        raise bad_param(f"beta={p.beta}; beta must be >= 0")
    if p.t <= 0:
        raise bad_param(f"t={p.t}; the temperature must be > 0")
    if p.alpha < 0:
        raise bad_param(f"alpha={p.alpha}; alpha must be >= 0")
    if p.positives == "worst_pair" and p.m_views < 2:
        raise bad_param(f"m_views={p.m_views}; ArCL needs m_views >= 2")
    for name in ("mix_alpha", "mix_rho"):
        if not 0.0 <= getattr(p, name) <= 1.0:
            raise bad_param(f"{name}={getattr(p, name)}; must lie in [0, 1]")
    if not 0.0 <= p.adv_eps <= 1.0:
        raise bad_param(f"adv_eps={p.adv_eps}; must lie in [0, 1] (pixel units)")
    if p.noise_scale < 0:
        raise bad_param(f"noise_scale={p.noise_scale}; must be >= 0")


def coerce_plugin_value(name: str, value: Any, default: Any) -> Any:
    """A plugin parameter converted to its default's type (bool, int, float or str), finite."""
    out = coerce_value(name, value, type(default).__name__)
    if isinstance(out, float) and not math.isfinite(out):
        raise UserError(f"--set {name}={value!r}: expected a finite number")
    return out
