"""The finetuning protocols' settings (SLF / ALF / AFF): what ALF and AFF rows record in their
identity, validated; the training that uses them is ``eval.finetune``, the tables that show them
``report.protocols``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import UserError

#: The protocols ``evaluate(protocol=...)`` and ``--protocol`` accept, in display order.
PROTOCOLS = ("slf", "alf", "aff")
#: How a finetuned head starts: the SLF probe's seeded uniform, or zeros (the RobustSSL benchmark's fc).
HEAD_INITS = ("uniform", "zeros")
#: Training-image augmentation: none (the NaCl probe's), or random crop + horizontal flip (the
#: benchmark's ``transform_train``).
AUGMENTS = ("none", "crop-flip")
#: AFF on a dual-BatchNorm encoder: ``auto`` = the authors' dual-BN TRADES (clean cross-entropy through
#: the clean branch, x_adv through the adversarial one, that one evaluated), ``on`` = the same but an
#: error on a single-BN encoder, ``off`` = every forward through the encoder's evaluated branch.
DUAL_BN = ("auto", "on", "off")
#: dual-BN TRADES: ``authors`` trains both BatchNorm branches at momentum 0.1 (the authors' and the
#: benchmark's ``nn.BatchNorm2d`` default); ``encoder`` keeps the branches' momenta as loaded (the
#: clean branch 0.1, the adversarial one 0.01, CLAE's: every dual-BN AFF row before the setting)
BN_MOMENTA = {"authors": 0.1, "encoder": None}
#: The training-set size the ALF recipe's epochs were set for: CIFAR-10's 50,000 training images
#: (DynACL test_LF.py, the source of ``AlfConfig``'s defaults). A fitted ALF head keeps the recipe's
#: number of SGD steps on a smaller training set (:func:`fitted_schedule`).
RECIPE_TRAIN_SIZE = 50_000


@dataclass(frozen=True)
class AlfFit:
    """How an ALF head is fitted (``AlfConfig.fit``): docs/decisions.md, 'Fitted ALF heads'."""

    keep_steps: bool  # on fewer than RECIPE_TRAIN_SIZE images, more epochs: the recipe's SGD steps
    standardize: bool  # train on standardised clean-feature statistics, folded into the head after
    summary: str


#: ``AlfConfig.fit`` -> what it does. ``off`` is the recipe as configured, the reading of every ALF
#: row before the choice existed (their identities carry no ``fit``).
ALF_FITS: dict[str, AlfFit] = {
    "fitted": AlfFit(True, True, "the recipe's SGD steps kept, standardised features (the default)"),
    "standardized": AlfFit(False, True, "the configured epochs, standardised features"),
    "off": AlfFit(False, False, "the configured epochs on raw features (rows before the choice)"),
}


@dataclass(frozen=True)
class SlfConfig:
    """SLF trained by SGD on re-encoded, augmented images (the RobustSSL benchmark's SLF). The uniform
    recipe's SLF is the cached-feature probe instead (``ProbeConfig``): no SlfConfig, no finetune field."""

    epochs: int = 25  # SLF epochs (RobustSSL_Benchmark vanilla_finetuning.py --epochs 25)
    lr: float = 0.01  # SGD learning rate of the head (setup_hyperparameter, ACL / DynACL on CIFAR-10)
    momentum: float = 0.9  # SGD momentum (vanilla_finetuning.py --momentum 0.9)
    weight_decay: float = 2e-4  # SGD weight decay (vanilla_finetuning.py --wd 2e-4)
    milestones: str = "10,20"  # epochs after which lr is multiplied by gamma (setup_hyperparameter)
    gamma: float = 0.1  # lr factor at each milestone (MultiStepLR gamma 0.1)
    batch_size: int = 512  # training minibatch (setup_hyperparameter)
    max_train: int | None = None  # train on the first N training images; None: the probe's max_train
    head_init: str = "zeros"  # uniform | zeros: how the head starts (the benchmark zeroes its fc)
    augment: str = "crop-flip"  # none | crop-flip: training-image augmentation
    # the named recipe that resolved these settings, as (key, value) pairs; () when set by hand
    recipe: tuple[tuple[str, str], ...] = ()

    protocol = "slf"

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        _check_common(self)

    def identity(self) -> dict[str, Any]:
        """What enters the rows' identity: every setting (SLF rows of the uniform recipe have none)."""
        return _identity(self)


@dataclass(frozen=True)
class AlfConfig:
    """ALF recipe (DynACL test_LF.py / RobustSSL_Benchmark vanilla_finetuning.py defaults)."""

    epochs: int = 25  # ALF epochs (DynACL test_LF.py --epochs 25)
    lr: float = 0.01  # SGD learning rate of the head (DynACL test_LF.py --lr 0.01)
    momentum: float = 0.9  # SGD momentum (DynACL test_LF.py --momentum 0.9)
    weight_decay: float = 2e-4  # SGD weight decay (DynACL test_LF.py --wd 2e-4)
    milestones: str = "10,20"  # epochs after which lr is multiplied by gamma (test_LF.py --decreasing_lr)
    gamma: float = 0.1  # lr factor at each milestone (MultiStepLR gamma 0.1 in test_LF.py)
    batch_size: int = 512  # training minibatch (test_LF.py --batch-size 512)
    eps: float = 8 / 255  # Linf training budget in [0,1] pixel units (test_LF.py --epsilon 8/255)
    step_size: float | None = None  # PGD step; None: eps / 4 (2/255 at 8/255, test_LF.py --step-size)
    steps: int = 10  # PGD steps of the training attack (test_LF.py --num-steps-train 10)
    # train on the first N training images; None: the probe's max_train (a budgeted run's own subset)
    max_train: int | None = None
    head_init: str = "uniform"  # uniform | zeros: how the head starts (uniform: the SLF probe's)
    augment: str = "none"  # none | crop-flip: training-image augmentation (the benchmark: crop-flip)
    # the named recipe that resolved these settings, as (key, value) pairs; () when set by hand
    recipe: tuple[tuple[str, str], ...] = ()
    # fitted | standardized | off: fitted = the recipe's SGD steps kept, standardised features folded in
    fit: str = "fitted"

    protocol = "alf"

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        _check_common(self)
        if self.fit not in ALF_FITS:
            raise UserError(f"alf fit {self.fit!r}: choose one of {', '.join(ALF_FITS)}")

    def identity(self) -> dict[str, Any]:
        """What enters the rows' identity: every setting, the step size resolved."""
        return _identity(self)


@dataclass(frozen=True)
class AffConfig:
    """AFF recipe: TRADES (DynACL test_AFF.py / RobustSSL_Benchmark vanilla_finetuning.py defaults)."""

    epochs: int = 25  # AFF epochs (DynACL test_AFF.py --epochs 25)
    lr: float = 0.1  # SGD learning rate of encoder and head (test_AFF.py --lr 0.1)
    momentum: float = 0.9  # SGD momentum (test_AFF.py --momentum 0.9)
    weight_decay: float = 2e-4  # SGD weight decay (test_AFF.py --wd 2e-4)
    milestones: str = "15,20"  # epochs after which lr is multiplied by gamma (test_AFF.py --decreasing_lr)
    gamma: float = 0.1  # lr factor at each milestone (MultiStepLR gamma 0.1 in test_AFF.py)
    batch_size: int = 128  # training minibatch (test_AFF.py --batch-size 128)
    eps: float = 8 / 255  # Linf budget of the inner maximisation, [0,1] pixel units (--epsilon 8/255)
    step_size: float | None = None  # inner step; None: eps / 4 (2/255 at 8/255, test_AFF.py --step-size)
    steps: int = 10  # inner maximisation steps (test_AFF.py --num-steps-train 10)
    beta: float = 6.0  # TRADES weight of the KL term (test_AFF.py --beta 6.0)
    # train on the first N training images; None: the probe's max_train (a budgeted run's own subset)
    max_train: int | None = None
    head_init: str = "uniform"  # uniform | zeros: how the head starts (uniform: the SLF probe's)
    augment: str = "none"  # none | crop-flip: training-image augmentation (the benchmark: crop-flip)
    # dual-BN encoders: auto | on = DynACL/benchmark dual-BN TRADES, the adv branch evaluated; off = one route
    dual_bn: str = "auto"
    # dual-BN TRADES: authors = both BatchNorm branches at momentum 0.1; encoder = as loaded (aux 0.01)
    bn_momentum: str = "authors"
    # the named recipe that resolved these settings, as (key, value) pairs; () when set by hand
    recipe: tuple[tuple[str, str], ...] = ()

    protocol = "aff"

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        _check_common(self)
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise UserError(f"aff beta {self.beta!r}: must be a finite number >= 0")
        if self.dual_bn not in DUAL_BN:
            raise UserError(f"aff dual-bn {self.dual_bn!r}: choose one of {', '.join(DUAL_BN)}")
        if self.bn_momentum not in BN_MOMENTA:
            raise UserError(f"aff bn-momentum {self.bn_momentum!r}: choose one of {', '.join(BN_MOMENTA)}")

    def identity(self) -> dict[str, Any]:
        """What enters the rows' identity: every setting, the step size resolved."""
        return _identity(self)


FinetuneConfig = SlfConfig | AlfConfig | AffConfig

# Settings added after ALF/AFF rows were published: in the identity only when they differ from these
# values, so that a row computed as before keeps its id. ``dual_bn``: "auto" and "off" compute what
# rows before it computed on a single-BN encoder; ``eval.finetune_recipes.resolve_dual_bn`` turns
# "auto" into "on" for a dual-BN encoder before any identity is taken (a different computation, so a
# different id), and "off" on a dual-BN encoder is the old computation (the old id).
_LATE_FIELDS = {"max_train": (None,), "head_init": ("uniform",), "augment": ("none",)}
_LATE_FIELDS |= {"recipe": ((),), "dual_bn": ("auto", "off")}
# ``bn_momentum``: "encoder" is what every AFF row before it computed; it acts in dual-BN TRADES
# alone, so only an identity with ``dual_bn: on`` (resolved, or set so) carries it
_LATE_FIELDS |= {"bn_momentum": ("encoder",)}
# ``fit`` (ALF): "off" is what every ALF row before it computed; its default, "fitted", is not, so
# a default ALF row carries ``fit`` and a row without it reads as "off" (:data:`ABSENT_AS`)
_LATE_FIELDS |= {"fit": ("off",)}
#: what an identity that lacks a late field computed, where that differs from today's default
ABSENT_AS: dict[str, Any] = {"fit": "off"}


def _identity(cfg: FinetuneConfig) -> dict[str, Any]:
    """Every setting, the step size resolved (ALF/AFF); the late fields only where they change the
    computation; the recipe as an object."""
    out = {"protocol": cfg.protocol, **asdict(cfg)}
    if not isinstance(cfg, SlfConfig):
        out["step_size"] = resolved_step(cfg)
    if isinstance(cfg, AffConfig) and cfg.dual_bn != "on":  # it acts in dual-BN TRADES alone
        del out["bn_momentum"]
    for k, unchanged in _LATE_FIELDS.items():
        if k in out and out[k] in unchanged:
            del out[k]
    if cfg.recipe:
        out["recipe"] = dict(cfg.recipe)
    return out


def _check_common(cfg: FinetuneConfig) -> None:
    name = cfg.protocol
    for k in ("epochs", "batch_size", "steps"):
        v = getattr(cfg, k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{name} {k.replace('_', '-')} {v!r}: must be an integer >= 1")
    for k in ("lr", "eps", "gamma"):
        v = getattr(cfg, k, 1.0)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UserError(f"{name} {k} {v!r}: must be a finite number > 0")
    if cfg.head_init not in HEAD_INITS:
        raise UserError(f"{name} head-init {cfg.head_init!r}: choose one of {', '.join(HEAD_INITS)}")
    if cfg.augment not in AUGMENTS:
        raise UserError(f"{name} augment {cfg.augment!r}: choose one of {', '.join(AUGMENTS)}")
    for k in ("momentum", "weight_decay"):
        v = getattr(cfg, k)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UserError(f"{name} {k.replace('_', '-')} {v!r}: must be a finite number >= 0")
    # eps and the step are in [0,1] pixel units (as a suite's, which refuses eps 1.5); SGD momentum
    # of 1 or more never decays a past gradient: both are typos, not settings
    for k in ("eps", "step_size"):
        v = getattr(cfg, k, None)  # SLF by SGD has no attack
        if v is not None and isinstance(v, (int, float)) and v > 1:
            raise UserError(
                f"{name} {k.replace('_', '-')} {v!r}: must be <= 1 ([0,1] pixel units; 8/255 = 0.0314)"
            )
    if isinstance(cfg.momentum, (int, float)) and cfg.momentum >= 1:
        raise UserError(f"{name} momentum {cfg.momentum!r}: must be in [0, 1) (SGD momentum)")
    mt = cfg.max_train
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise UserError(f"{name} max-train {mt!r}: must be an integer >= 1 (or unset)")
    step = getattr(cfg, "step_size", None)
    if step is not None and not (math.isfinite(step) and step > 0):
        raise UserError(f"{name} step-size {step!r}: must be a finite number > 0 (or unset)")
    milestones(cfg)


def dual_bn_on(cfg: AffConfig, dual_encoder: bool) -> bool:
    """Whether AFF trains with dual-BN TRADES: ``auto`` on a dual-BN encoder, ``on`` (which a
    single-BN encoder refuses, one line), never ``off``."""
    if cfg.dual_bn == "on" and not dual_encoder:
        raise UserError("aff dual-bn on: the encoder has no dual BatchNorm (use auto or off)")
    return cfg.dual_bn != "off" and dual_encoder


def resolve_dual_bn(cfg: AffConfig, dual_encoder: bool) -> AffConfig:
    """``cfg`` with ``dual_bn`` resolved against the encoder (``on`` or ``off``), so that its identity
    says what was computed: dual-BN TRADES rows carry ``dual_bn: on`` (and ``bn_momentum: authors``
    unless set to ``encoder``: :func:`_identity` keeps it for dual-BN TRADES alone), rows computed
    as before neither."""
    return replace(cfg, dual_bn="on" if dual_bn_on(cfg, dual_encoder) else "off")


def read_identity(ft: dict[str, Any]) -> dict[str, Any]:
    """A row's ``finetune`` identity with the late fields it lacks filled with what it computed
    (:data:`ABSENT_AS`): an ALF row written before ``fit`` existed reads as ``fit: off``."""
    absent = ABSENT_AS if ft.get("protocol") == "alf" else {}
    return {**ft, **{k: v for k, v in absent.items() if k not in ft}}


def fitted_schedule(cfg: AlfConfig, n_train: int) -> AlfConfig:
    """The epochs and milestones ALF trains ``n_train`` images with (``cfg`` itself unless its
    ``fit`` keeps steps and ``n_train < RECIPE_TRAIN_SIZE``).

    The rule (docs/decisions.md, 'Fitted ALF heads'): the recipe's steps are
    ``S = epochs * ceil(RECIPE_TRAIN_SIZE / batch_size)``; ``n_train`` images make
    ``s = ceil(n_train / min(batch_size, n_train))`` steps an epoch; the fitted run has
    ``E = ceil(S / s)`` epochs (so at least S steps, fewer than S + s), and each milestone ``m``
    becomes ``round(m * E / epochs)`` (half up), the same fraction of the run."""
    if not ALF_FITS[cfg.fit].keep_steps or n_train >= RECIPE_TRAIN_SIZE or n_train < 1:
        return cfg
    target = cfg.epochs * math.ceil(RECIPE_TRAIN_SIZE / cfg.batch_size)
    per_epoch = math.ceil(n_train / min(cfg.batch_size, n_train))
    epochs = math.ceil(target / per_epoch)
    scaled = [math.floor(m * epochs / cfg.epochs + 0.5) for m in milestones(cfg)]
    return replace(cfg, epochs=epochs, milestones=",".join(map(str, scaled)))


def milestones(cfg: FinetuneConfig) -> list[int]:
    """The lr milestones of ``cfg`` as sorted epochs (a one-line UserError if malformed)."""
    text = str(cfg.milestones).strip()
    try:
        out = [int(p) for p in text.split(",")] if text else []
    except ValueError:
        raise UserError(
            f"{cfg.protocol} milestones {text!r}: give epochs as a comma list, e.g. 15,20"
        ) from None
    if any(m < 1 for m in out) or out != sorted(out):
        raise UserError(f"{cfg.protocol} milestones {text!r}: must be increasing epochs >= 1")
    return out


def resolved_step(cfg: AlfConfig | AffConfig) -> float:
    """The PGD step size: the configured one, else eps / 4 (the literature's 2/255 at 8/255)."""
    return float(cfg.step_size) if cfg.step_size is not None else cfg.eps / 4
