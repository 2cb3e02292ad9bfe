"""The finetuning protocols' settings (SLF / ALF / AFF): what ALF and AFF rows record in their
identity, validated; the training that uses them is ``eval.finetune``, the tables that show them
``report.protocols``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UserError

#: The protocols ``evaluate(protocol=...)`` and ``--protocol`` accept, in display order.
PROTOCOLS = ("slf", "alf", "aff")


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

    protocol = "alf"

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        _check_common(self)

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

    protocol = "aff"

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        _check_common(self)
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise UserError(f"aff beta {self.beta!r}: must be a finite number >= 0")

    def identity(self) -> dict[str, Any]:
        """What enters the rows' identity: every setting, the step size resolved."""
        return _identity(self)


FinetuneConfig = AlfConfig | AffConfig


def _identity(cfg: FinetuneConfig) -> dict[str, Any]:
    """Every setting, the step size resolved; ``max_train`` only when set, so that rows measured
    before it existed keep their ids."""
    out = {"protocol": cfg.protocol, **asdict(cfg), "step_size": resolved_step(cfg)}
    if cfg.max_train is None:
        del out["max_train"]
    return out


def _check_common(cfg: FinetuneConfig) -> None:
    name = cfg.protocol
    for k in ("epochs", "batch_size", "steps"):
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{name} {k.replace('_', '-')} {v!r}: must be an integer >= 1")
    for k in ("lr", "eps", "gamma"):
        v = getattr(cfg, k)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UserError(f"{name} {k} {v!r}: must be a finite number > 0")
    for k in ("momentum", "weight_decay"):
        v = getattr(cfg, k)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UserError(f"{name} {k.replace('_', '-')} {v!r}: must be a finite number >= 0")
    # eps and the step are in [0,1] pixel units (as a suite's, which refuses eps 1.5); SGD momentum
    # of 1 or more never decays a past gradient: both are typos, not settings
    for k in ("eps", "step_size"):
        v = getattr(cfg, k)
        if v is not None and isinstance(v, (int, float)) and v > 1:
            raise UserError(
                f"{name} {k.replace('_', '-')} {v!r}: must be <= 1 ([0,1] pixel units; 8/255 = 0.0314)"
            )
    if isinstance(cfg.momentum, (int, float)) and cfg.momentum >= 1:
        raise UserError(f"{name} momentum {cfg.momentum!r}: must be in [0, 1) (SGD momentum)")
    mt = cfg.max_train
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise UserError(f"{name} max-train {mt!r}: must be an integer >= 1 (or unset)")
    if cfg.step_size is not None and not (math.isfinite(cfg.step_size) and cfg.step_size > 0):
        raise UserError(f"{name} step-size {cfg.step_size!r}: must be a finite number > 0 (or unset)")
    milestones(cfg)


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


def resolved_step(cfg: FinetuneConfig) -> float:
    """The PGD step size: the configured one, else eps / 4 (the literature's 2/255 at 8/255)."""
    return float(cfg.step_size) if cfg.step_size is not None else cfg.eps / 4
