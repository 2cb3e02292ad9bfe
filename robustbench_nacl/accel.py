"""The compiled path: ``--compile off|auto|on`` and what it switches on each device.

One setting decides, for every place that is compiled (:data:`SITES`: the training step, the
attacked classifier under PGD/APGD and the other attacks, the ALF/AFF finetuning epochs and the
linear probe's step), whether it runs under ``torch.compile`` and with which options
(:func:`compile_plan`):

- ``off``: eager everywhere, exactly the code that ran before the switch existed (on a GPU too).
- ``auto`` (the default): compiled on CUDA, eager on any other device. On the CPU compiling did not
  pay (measured once on the 2-core machine under load: a convnet_small SimCLR step at batch 256 took
  3.1 s eager and 4.5 s inductor-compiled, after a 46 s first step; docs/decisions.md, 'Compiled
  steps').
- ``on``: compiled on every device.

Compiled on CUDA also means fused optimizers (``fused=True`` for Adam, AdamW and SGD) and, where a
site's shapes never change, CUDA graphs (``mode="reduce-overhead"``). None of it is part of any
identity: a row or a checkpoint is the same measurement whichever path computed it, and records the
path beside its device (``compile``: present only when not eager, so every eager row and manifest
is what it was).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from .registry import Registry, unknown_choice

__all__ = [
    "COMPILE_CHOICES",
    "EAGER",
    "SITES",
    "CompilePlan",
    "Site",
    "check_compile",
    "compile_fn",
    "compile_module",
    "compile_plan",
    "compiled_in_place",
    "compiling",
    "current_plan",
    "current_setting",
    "fused",
    "recorded",
]

COMPILE_CHOICES = ("off", "auto", "on")
#: what a manifest or row records for the eager path (and what the absence of ``compile`` means)
EAGER = "eager"
#: where ``auto`` compiles: on these device types only
AUTO_DEVICES = ("cuda",)
#: torch.compile's backend when none is named (bench/gpu_check.py --cpu-smoke sets ``aot_eager``:
#: inductor's C++ build of one model takes minutes on 2 cores)
DEFAULT_BACKEND = "inductor"
#: the optimizers whose constructor takes ``fused=True`` (torch >= 2.4 on CUDA: Adam, AdamW, SGD)
FUSED_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.SGD,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Site:
    """A place that is compiled. ``fixed_shapes``: every call sees the same shapes, so CUDA graphs
    can replay it (one graph, no re-recording); ``summary``: what is compiled there."""

    fixed_shapes: bool
    summary: str


SITES: Registry[Site] = Registry("compile site")
# The training step's model is called several times per step in different modes (each view, the
# inner PGD of the adversarial presets, the monitor's eval-mode features at other batch sizes):
# compiled kernels, no CUDA graphs (not verified on a GPU yet; bench/gpu_check.py measures both).
SITES.add("train", Site(False, "TrainStep: the model's forward and backward (views and loss eager)"))
# attacks see the clean-correct subset of each chunk, and APGD/FAB shrink it as examples fall
SITES.add("attack", Site(False, "the attacked classifier: PGD/APGD/FAB/Square steps' forward and backward"))
SITES.add("finetune", Site(False, "ALF/AFF epochs: the forward and backward (the last batch is smaller)"))
# one minibatch shape per probe (a smaller last batch is a second graph)
SITES.add("probe", Site(True, "the linear probe's Adam step on cached features"))


@dataclass(frozen=True)
class CompilePlan:
    """How one site runs: eager, or ``torch.compile(backend, mode)``, with fused optimizers or not."""

    enabled: bool = False
    backend: str = "inductor"
    mode: str | None = None  # None: the backend's default; "reduce-overhead": CUDA graphs
    fused_optimizer: bool = False

    def label(self) -> str:
        """What is recorded: ``eager``, or the backend (``+cudagraphs`` under reduce-overhead)."""
        if not self.enabled:
            return EAGER
        return self.backend + ("+cudagraphs" if self.mode == "reduce-overhead" else "")


def check_compile(value: object) -> str:
    """``value`` when it is one of :data:`COMPILE_CHOICES`; a one-line UserError otherwise."""
    if value not in COMPILE_CHOICES:
        raise unknown_choice("--compile setting", value, COMPILE_CHOICES)
    return str(value)


def compiles(setting: str, device: torch.device | str) -> bool:
    """Whether ``setting`` compiles on ``device``: ``on`` always, ``auto`` on CUDA, ``off`` never."""
    check_compile(setting)
    kind = torch.device(device).type
    return setting == "on" or (setting == "auto" and kind in AUTO_DEVICES)


def compile_plan(
    setting: str, device: torch.device | str, site: str, *, backend: str | None = None
) -> CompilePlan:
    """The plan of ``site`` under ``setting`` on ``device``. CUDA-only options (fused optimizers,
    CUDA graphs for a site whose shapes are fixed) are chosen from the device type alone, so they
    are tested without a GPU."""
    spec = SITES.get(site)
    if not compiles(setting, device):
        return CompilePlan()
    cuda = torch.device(device).type == "cuda"
    mode = "reduce-overhead" if cuda and spec.fixed_shapes else None
    return CompilePlan(True, backend or DEFAULT_BACKEND, mode, fused_optimizer=cuda)


def recorded(setting: str, device: torch.device | str, site: str = "attack") -> dict[str, str]:
    """The provenance field of a manifest or row: ``{"compile": label}`` when ``site`` is compiled,
    nothing when it runs eager (every row and manifest written before the switch is eager)."""
    label = compile_plan(setting, device, site).label()
    return {} if label == EAGER else {"compile": label}


def _options(plan: CompilePlan) -> dict[str, Any]:
    return {"backend": plan.backend, **({"mode": plan.mode} if plan.mode else {})}


def compile_module(module: nn.Module, plan: CompilePlan) -> nn.Module:
    """``torch.compile(module)`` under ``plan`` (a wrapper sharing the module's parameters and
    buffers: the module itself is never changed, so it is saved, copied and read as before), or
    ``module`` itself when the plan is eager."""
    return torch.compile(module, **_options(plan)) if plan.enabled else module  # type: ignore[return-value]


@contextlib.contextmanager
def compiled_in_place(modules: Iterable[nn.Module], plan: CompilePlan) -> Iterator[None]:
    """``modules`` compiled in place (``nn.Module.compile``) for the block and eager again after it.

    For code that calls modules it was handed (a finetuning step's closure): they run compiled
    without a wrapper. Scoped, so that nothing compiled outlives the block (``copy.deepcopy`` of
    a module compiled in place gives an eager copy, which is also safe)."""
    compiled = [m for m in modules if plan.enabled and getattr(m, "_compiled_call_impl", None) is None]
    for m in compiled:
        m.compile(**_options(plan))
    try:
        yield
    finally:
        for m in compiled:  # what nn.Module.compile set (torch has no public way back)
            m._compiled_call_impl = None


#: the setting (and backend) of the innermost :func:`compiling` block
_SETTING: ContextVar[tuple[str, str | None]] = ContextVar("robustbench_nacl_compile", default=("off", None))


@contextlib.contextmanager
def compiling(setting: str, *, backend: str | None = None) -> Iterator[None]:
    """Make ``setting`` the one :func:`current_setting` returns inside the block (``evaluate`` sets
    its ``compile`` so for the probe and the finetuning epochs it calls). ``backend``: torch.compile's
    (None: :data:`DEFAULT_BACKEND`; the CPU tests use ``aot_eager``)."""
    token = _SETTING.set((check_compile(setting), backend))
    try:
        yield
    finally:
        _SETTING.reset(token)


def current_setting() -> str:
    """The setting of the innermost :func:`compiling` block; ``off`` outside any (a library caller
    of ``fit_linear_probe`` or ``run_epochs`` gets the eager code it always got)."""
    return _SETTING.get()[0]


def current_plan(device: torch.device | str, site: str) -> CompilePlan:
    """:func:`compile_plan` of ``site`` on ``device`` under the innermost :func:`compiling` block."""
    setting, backend = _SETTING.get()
    return compile_plan(setting, device, site, backend=backend)


def compile_fn(fn: F, plan: CompilePlan) -> F:
    """``torch.compile(fn)`` under ``plan``, or ``fn`` itself when the plan is eager."""
    return torch.compile(fn, **_options(plan)) if plan.enabled else fn  # type: ignore[return-value]


def fuses(optimizer_class: type) -> bool:
    """Whether an optimizer class is one whose ``fused=True`` this project uses (exact type: a
    subclass may step differently) and whose constructor takes it."""
    return optimizer_class in FUSED_OPTIMIZERS and "fused" in inspect.signature(optimizer_class).parameters


def fused(optimizer: torch.optim.Optimizer, plan: CompilePlan) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with ``fused=True`` (one kernel per step for all parameters) when the
    plan asks for it and its class takes it; otherwise ``optimizer`` itself. Call it before the
    first step: the rebuilt optimizer has the same parameter groups and settings, and no state."""
    cls = type(optimizer)
    if not plan.fused_optimizer or not fuses(cls):
        return optimizer
    if optimizer.state:
        raise RuntimeError("fused(): rebuild an optimizer before its first step, not after")
    takes = inspect.signature(cls).parameters  # defaults may hold keys the constructor does not take
    defaults = {k: v for k, v in optimizer.defaults.items() if k in takes}
    defaults.update(fused=True, foreach=None)
    groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in optimizer.param_groups]
    return cls(groups, **defaults)
