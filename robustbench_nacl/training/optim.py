"""The trainer's optimizers and learning-rate schedules, by name (:data:`OPTIMIZERS`, :data:`SCHEDULES`).

``adam`` with the ``constant`` schedule is the CLAE/NaCl recipe and the default: a run that names
neither is built, recorded and hashed exactly as before these registries existed. The others are
what the robust-SSL authors train with (docs/decisions.md, 'Optimizers and learning-rate
schedules', names each file and commit):

- ``sgd``: torch SGD with momentum (DeACL's stage 2, solo-learn's ``--optimizer sgd``);
- ``lars`` (ACL, DynACL), ``torchlars`` (RoCL), ``lars_solo`` (solo-learn's SimCLR, DeACL's teacher):
  :mod:`.lars`;
- ``cosine``: ACL's and DynACL's ``LambdaLR(cosine_annealing)``, linear warm-up then cosine to
  ``min_lr``, per iteration (ACL) or per epoch (DynACL);
- ``warmup_cosine``: solo-learn's pl_bolts ``LinearWarmupCosineAnnealingLR``, per epoch;
- ``gradual_warmup_cosine``: RoCL's ``GradualWarmupScheduler`` (warm-up to ``multiplier`` x lr) chained
  to ``CosineAnnealingLR(T_max=epochs)``, per epoch.

Every schedule is a closed form of (epoch, step within it): :class:`LrSchedule` sets it on the
optimizer before each step (a step pre-hook, so the training step itself is unchanged) and counts
the steps, which is its whole state (saved in ``train_state.pt`` beside the optimizer's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UserError
from ..registry import Registry, unknown_choice
from .lars import Lars, SoloLars, TorchLars

DEFAULT_OPTIMIZER = "adam"
DEFAULT_SCHEDULE = "constant"


@dataclass(frozen=True)
class OptimizerSpec:
    """A registered optimizer: ``build(params, lr, weight_decay, **kwargs)`` and its settings' defaults."""

    build: Callable[..., torch.optim.Optimizer]
    defaults: dict[str, Any]
    summary: str
    choices: dict[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule: ``lr(base_lr, pos, kwargs)`` and its settings' defaults."""

    lr: Callable[[float, LrPosition, dict[str, Any]], float]
    defaults: dict[str, Any]
    summary: str
    choices: dict[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class LrPosition:
    """Where an optimizer step falls: its 0-based ``epoch`` and ``step`` within the epoch."""

    epoch: int
    step: int
    epochs: int
    steps_per_epoch: int


OPTIMIZERS: Registry[OptimizerSpec] = Registry("optimizer")
SCHEDULES: Registry[ScheduleSpec] = Registry("schedule")

OPTIMIZERS.add(
    "adam",
    OptimizerSpec(
        lambda params, lr, weight_decay: torch.optim.Adam(params, lr=lr, weight_decay=weight_decay),
        {},
        "Adam (CLAE/NaCl recipe; the default)",
    ),
)
OPTIMIZERS.add(
    "sgd",
    OptimizerSpec(
        lambda params, lr, weight_decay, momentum, nesterov: torch.optim.SGD(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
        ),
        {"momentum": 0.9, "nesterov": False},  # solo-learn's extra_optimizer_args for sgd
        "SGD with momentum (DeACL stage 2)",
    ),
)
OPTIMIZERS.add(
    "lars",
    OptimizerSpec(
        Lars, {"momentum": 0.9, "eta": 1e-3}, "ACL/DynACL optimizer/lars.py (lr inside the buffer)"
    ),
)
OPTIMIZERS.add(
    "torchlars",
    OptimizerSpec(
        TorchLars, {"momentum": 0.9, "eta": 1e-3, "eps": 1e-8}, "kakaobrain torchlars over SGD (RoCL)"
    ),
)
OPTIMIZERS.add(
    "lars_solo",
    OptimizerSpec(
        SoloLars,
        {"momentum": 0.9, "eta": 1e-3, "eps": 1e-8, "clip": False, "exclude_bias_n_norm": False},
        "solo-learn LARSWrapper over SGD (its SimCLR recipe: DeACL's teacher)",
    ),
)


def _constant(base_lr: float, pos: LrPosition, kw: dict[str, Any]) -> float:
    return base_lr


def _acl_cosine(base_lr: float, pos: LrPosition, kw: dict[str, Any]) -> float:
    """ACL/DynACL: ``base_lr * cosine_annealing(t, total, 1, min_lr / base_lr, warmup)`` in LambdaLR.

    The two codes differ twice, and both differences are kept (``variant``): ACL steps the scheduler
    at the top of each iteration (the u-th unit trains at t = u + 1) and warms up with ``t / W``;
    DynACL steps it after each epoch (t = u) and warms up with ``(t + 1) / W``. Warm-up is then the
    same, ``(u + 1) / W``; ACL's cosine starts one unit earlier and ends exactly at ``min_lr``.
    """
    per = pos.steps_per_epoch if kw["interval"] == "step" else 1
    unit = pos.epoch * per + (pos.step if kw["interval"] == "step" else 0)
    total, warmup = pos.epochs * per, kw["warmup_epochs"] * per
    t = unit + 1 if kw["variant"] == "acl" else unit
    if t < warmup:
        factor = t / warmup if kw["variant"] == "acl" else (t + 1) / warmup
    else:
        low = kw["min_lr"] / base_lr
        factor = low + (1 - low) * 0.5 * (1 + math.cos((t - warmup) / (total - warmup) * math.pi))
    return base_lr * factor


def _warmup_cosine(base_lr: float, pos: LrPosition, kw: dict[str, Any]) -> float:
    """pl_bolts LinearWarmupCosineAnnealingLR's closed form at ``last_epoch = epoch`` (Lightning steps
    an epoch-interval scheduler after each epoch): from ``warmup_start_lr`` to ``base_lr`` over
    ``warmup_epochs`` epochs (reached at the last of them), then cosine to ``min_lr`` at ``epochs``."""
    e, w, start, low = pos.epoch, kw["warmup_epochs"], kw["warmup_start_lr"], kw["min_lr"]
    if e < w:
        return start + e * (base_lr - start) / max(1, w - 1)
    return low + 0.5 * (base_lr - low) * (1 + math.cos(math.pi * (e - w) / (pos.epochs - w)))


def _gradual_warmup_cosine(base_lr: float, pos: LrPosition, kw: dict[str, Any]) -> float:
    """RoCL: GradualWarmupScheduler(multiplier, total_epoch=W) stepped at the start of each epoch, so
    epoch e trains at its ``last_epoch = e + 1``: ``lr * ((m - 1) * (e + 1) / W + 1)`` while e + 1 <= W,
    then the chained CosineAnnealingLR(T_max=epochs) from ``m * lr``, its k-th step at epoch W + k
    (to zero at T_max = epochs, which the run never reaches: it stops W epochs short)."""
    s, w, m = pos.epoch + 1, kw["warmup_epochs"], kw["multiplier"]
    if s <= w:
        return base_lr * (s / w) if m == 1.0 else base_lr * ((m - 1.0) * s / w + 1.0)
    return base_lr * m * 0.5 * (1 + math.cos(math.pi * (s - 1 - w) / pos.epochs))


SCHEDULES.add("constant", ScheduleSpec(_constant, {}, "the base lr throughout (the default)"))
SCHEDULES.add(
    "cosine",
    ScheduleSpec(
        _acl_cosine,
        {"warmup_epochs": 10, "min_lr": 1e-6, "interval": "step", "variant": "acl"},
        "ACL/DynACL: linear warm-up, cosine to min_lr (LambdaLR cosine_annealing)",
        {"interval": ("step", "epoch"), "variant": ("acl", "dynacl")},
    ),
)
SCHEDULES.add(
    "warmup_cosine",
    ScheduleSpec(
        _warmup_cosine,
        {"warmup_epochs": 10, "warmup_start_lr": 0.003, "min_lr": 0.0},
        "solo-learn/pl_bolts LinearWarmupCosineAnnealingLR, per epoch",
    ),
)
SCHEDULES.add(
    "gradual_warmup_cosine",
    ScheduleSpec(
        _gradual_warmup_cosine,
        {"warmup_epochs": 10, "multiplier": 15.0},
        "RoCL: GradualWarmupScheduler to multiplier x lr, then CosineAnnealingLR(T_max=epochs), per epoch",
    ),
)


def _resolve(
    kind: str, name: str, defaults: dict[str, Any], choices: dict[str, tuple[Any, ...]], given: Any
) -> dict[str, Any]:
    """``defaults`` updated by ``given``: known keys, values of the default's type, numbers finite, >= 0."""
    if not isinstance(given, dict):
        raise UserError(f"{kind} {name!r}: its settings must be a KEY=VALUE mapping, not {given!r}")
    out = dict(defaults)
    for key, value in given.items():
        if not defaults:
            raise UserError(f"{kind} {name!r} takes no settings (got {key!r})")
        if key not in defaults:
            raise unknown_choice(f"{kind} {name!r} setting", key, defaults)
        want = type(defaults[key])
        numeric = want in (int, float) and isinstance(value, int | float) and not isinstance(value, bool)
        if want is float and numeric:
            value = float(value)
        elif not isinstance(value, want) or (want is int and isinstance(value, bool)):
            what = {int: "a whole number", float: "a number", bool: "true or false"}.get(want, "a string")
            raise UserError(f"{kind} {name!r} setting {key}={value!r}: must be {what}")
        if numeric and not (math.isfinite(value) and value >= 0):
            raise UserError(f"{kind} {name!r} setting {key}={value!r}: must be a finite number >= 0")
        if key in choices and value not in choices[key]:
            raise unknown_choice(f"{kind} {name!r} {key}", value, choices[key])
        out[key] = value
    return out


def optimizer_settings(name: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of optimizer ``name``: its defaults updated by ``kwargs`` (one-line errors)."""
    spec = OPTIMIZERS.get(name)
    return _resolve("optimizer", name, spec.defaults, spec.choices, kwargs or {})


def schedule_settings(name: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of schedule ``name``: its defaults updated by ``kwargs`` (one-line errors)."""
    spec = SCHEDULES.get(name)
    return _resolve("schedule", name, spec.defaults, spec.choices, kwargs or {})


def check_recipe(
    optimizer: str, optimizer_kwargs: Any, schedule: str, schedule_kwargs: Any, *, epochs: int
) -> None:
    """One-line :class:`UserError` for an unknown optimizer or schedule, a bad setting, or a warm-up
    that does not end before the last epoch (the cosine would divide by zero)."""
    optimizer_settings(optimizer, optimizer_kwargs)
    settings = schedule_settings(schedule, schedule_kwargs)
    warmup = settings.get("warmup_epochs")
    if warmup is not None and warmup >= epochs:
        raise UserError(f"schedule {schedule!r}: warmup_epochs {warmup} must be < --epochs {epochs}")
    if schedule == "gradual_warmup_cosine" and settings["multiplier"] < 1:
        raise UserError(f"schedule {schedule!r}: multiplier {settings['multiplier']} must be >= 1")


def build_optimizer(
    name: str,
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    kwargs: dict[str, Any] | None = None,
) -> torch.optim.Optimizer:
    """Optimizer ``name`` over ``params`` with its resolved settings."""
    return OPTIMIZERS.get(name).build(
        params, lr=lr, weight_decay=weight_decay, **optimizer_settings(name, kwargs)
    )


def lr_at(name: str, kwargs: dict[str, Any] | None, base_lr: float, pos: LrPosition) -> float:
    """The learning rate schedule ``name`` gives the optimizer step at ``pos``."""
    return SCHEDULES.get(name).lr(base_lr, pos, schedule_settings(name, kwargs))


class LrSchedule:
    """A schedule driving an optimizer: before each of its steps (a step pre-hook) every parameter
    group's lr is set to the schedule's value there. ``steps``, the steps taken, is its state."""

    def __init__(
        self, name: str, kwargs: dict[str, Any] | None, base_lr: float, *, epochs: int, steps_per_epoch: int
    ) -> None:
        self.name, self.settings = name, schedule_settings(name, kwargs)
        self.spec = SCHEDULES.get(name)
        self.base_lr, self.epochs, self.steps_per_epoch = base_lr, epochs, steps_per_epoch
        self.steps = 0
        self.last_lr: float | None = None

    def lr(self, step: int) -> float:
        """The lr of the ``step``-th optimizer step of the run (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        return self.spec.lr(
            self.base_lr, LrPosition(epoch, within, self.epochs, self.steps_per_epoch), self.settings
        )

    def attach(self, optimizer: torch.optim.Optimizer) -> LrSchedule:
        """Drive ``optimizer`` from now on; returns self."""
        optimizer.register_step_pre_hook(self._before_step)
        return self

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.last_lr = self.lr(self.steps)
        for group in optimizer.param_groups:
            group["lr"] = self.last_lr
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        """What ``train_state.pt`` keeps: the schedule, its settings and the steps taken."""
        return {
            "name": self.name,
            "settings": dict(self.settings),
            "steps": self.steps,
            "last_lr": self.last_lr,
        }

    def load_state_dict(self, state: dict[str, Any], *, expected_steps: int) -> None:
        """Continue from ``state``; a one-line error when it is not this schedule at this step."""
        if state.get("name") != self.name or state.get("settings") != self.settings:
            raise UserError(f"the saved schedule {state.get('name')!r} is not this run's {self.name!r}")
        if state.get("steps") != expected_steps:
            raise UserError(
                f"the saved schedule took {state.get('steps')} steps, the epochs done take {expected_steps}; "
                "delete the training state to restart the run"
            )
        self.steps, self.last_lr = int(state["steps"]), state.get("last_lr")


def build_schedule(
    name: str,
    kwargs: dict[str, Any] | None,
    optimizer: torch.optim.Optimizer,
    *,
    base_lr: float,
    epochs: int,
    steps_per_epoch: int,
) -> LrSchedule | None:
    """Schedule ``name`` attached to ``optimizer``; None for ``constant`` (nothing to set: the optimizer
    keeps its lr, exactly as every run before the schedules existed)."""
    if name == DEFAULT_SCHEDULE:
        schedule_settings(name, kwargs)  # still refuses settings given to it
        return None
    return LrSchedule(name, kwargs, base_lr, epochs=epochs, steps_per_epoch=steps_per_epoch).attach(optimizer)
