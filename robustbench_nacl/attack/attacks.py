"""Attacks on [0,1]-image classifiers: a registry of callables, all with one calling convention.

Every attack is ``attack(model, x, y, *, eps, gen, norm, **params) -> x_adv`` where ``model`` maps
images in [0,1] (normalisation inside) to logits and is in eval mode, ``eps`` is in [0,1] pixel
units, ``gen`` is the ``torch.Generator`` that makes the attack reproducible, and ``x_adv`` lies in
[0,1] and in the eps-ball around ``x``. Attacks take input gradients with ``torch.autograd.grad``
(no parameter-gradient work, no ``.grad`` left on the model) and run under ``torch.enable_grad()``
so that a caller's ``no_grad`` cannot silently turn them into no-ops.

Registered: ``fgsm``, ``fgsm_l2``, ``pgd`` (Wong et al. 2020, Linf and L2), ``autoattack``
(pyautoattack, pinned, through its public API). Any ``torchattacks.<Name>`` resolves through
:func:`resolve_attack` when the optional torchattacks package is installed.

Registry metadata (read by :mod:`robustbench_nacl.attack.suites` and
:mod:`robustbench_nacl.eval.benchmark` instead of branching on names):

- ``norms``: threat models the attack supports (first = default);
- ``params``: extra keyword -> validator (suites reject unknown keys and bad values);
- ``family``: ``"single_step"`` or ``"iterative"`` (sanity check: iterative <= single-step);
- ``needs_num_classes``: pass ``num_classes`` (the logits width);
- ``sweep``: optional ``(model, x, y, *, norm, **params) -> (eps -> x_adv)`` that attacks one batch
  at any number of epsilons from shared work, returning exactly what the attack returns at each eps
  (FGSM: one input gradient for the whole sweep); :func:`robust_under_attack` uses it;
- ``check_params``: optional ``(params) -> None`` raising ValueError for invalid combinations;
- ``describe``: optional ``(params, num_classes) -> dict`` of effective settings for result rows.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import math
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from ..registry import Registry
from . import autoattack as aa_trace
from .threat import check_perturbation


class Attack(Protocol):
    """The calling convention every registered attack follows."""

    def __call__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        *,
        eps: float,
        gen: torch.Generator | None,
        norm: str,
        **params: Any,
    ) -> Tensor: ...


ATTACKS: Registry[Attack] = Registry("attack")

TORCHATTACKS_PREFIX = "torchattacks."
TORCHATTACKS_HINT = "pip install 'robustbench-nacl[torchattacks]'"


# ============ parameter validators (used by suites.py through the registry metadata) ============


def short_repr(v: Any, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters (error messages stay one short line)."""
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def int_at_least(lo: int) -> Callable[[Any], int]:
    """Validator: an integer (not a bool) >= ``lo``."""

    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"must be an integer >= {lo}, got {short_repr(v)}")
        return int(v)

    return check


def positive_float(v: Any) -> float:
    """Validator: a finite number > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"must be a finite number > 0, got {short_repr(v)}")
    return float(v)


def boolean(v: Any) -> bool:
    """Validator: true or false."""
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {short_repr(v)}")
    return v


def one_of(*choices: str) -> Callable[[Any], str]:
    """Validator: one of the given strings."""

    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {short_repr(v)}")
        return str(v)

    return check


def list_of(*choices: str) -> Callable[[Any], list[str]]:
    """Validator: a non-empty list of distinct strings from ``choices``."""

    def check(v: Any) -> list[str]:
        if not isinstance(v, (list, tuple)) or not v or any(c not in choices for c in v):
            raise ValueError(f"must be a non-empty list drawn from {', '.join(choices)}, got {short_repr(v)}")
        if len(set(v)) != len(v):
            raise ValueError(f"has duplicates: {short_repr(v)}")
        return [str(c) for c in v]

    return check


# ============ threat models: one small object per norm instead of if-chains ============


def _flat_norm(t: Tensor) -> Tensor:
    """Per-example L2 norm, shaped to broadcast against ``t``."""
    return t.flatten(1).norm(dim=1).view(-1, *([1] * (t.dim() - 1)))


class _Linf:
    @staticmethod
    def random_init(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
        return (_rand(x, gen) * 2 - 1) * eps

    @staticmethod
    def ascent(g: Tensor, step: float) -> Tensor:
        return step * g.sign()

    @staticmethod
    def project(delta: Tensor, eps: float) -> Tensor:
        return delta.clamp(-eps, eps)


class _L2:
    @staticmethod
    def random_init(x: Tensor, eps: float, gen: torch.Generator | None) -> Tensor:
        # Wong et al.: a Gaussian direction scaled to a radius drawn uniformly in [0, eps].
        d = _randn(x, gen)
        r = _rand(x, gen, shape=(len(x),) + (1,) * (x.dim() - 1))
        return d / _flat_norm(d).clamp_min(1e-12) * (r * eps)

    @staticmethod
    def ascent(g: Tensor, step: float) -> Tensor:
        return step * g / _flat_norm(g).clamp_min(1e-12)

    @staticmethod
    def project(delta: Tensor, eps: float) -> Tensor:
        return delta * (eps / _flat_norm(delta).clamp_min(1e-12)).clamp(max=1.0)


NORMS: dict[str, type] = {"Linf": _Linf, "L2": _L2}


def _norm_ops(norm: str) -> type:
    try:
        return NORMS[norm]
    except KeyError:
        raise UserError(f"unknown norm {norm!r}; valid norms: {', '.join(NORMS)}") from None


def project(x: Tensor, x_adv: Tensor, eps: float, norm: str = "Linf") -> Tensor:
    """Project ``x_adv`` onto the ``norm`` eps-ball around ``x`` intersected with the [0,1] box.

    Clamping to the box after the ball projection never leaves the ball: since ``x`` is in [0,1],
    the box clamp moves every coordinate of the perturbation towards zero.
    """
    delta = _norm_ops(norm).project((x_adv - x).detach(), eps)
    return (x + delta).clamp(0.0, 1.0).detach()


# ============ helpers ============


def _rand(like: Tensor, gen: torch.Generator | None, shape: Sequence[int] | None = None) -> Tensor:
    """Uniform [0,1) noise (shaped like ``like`` by default), drawn on the generator's device."""
    dev = gen.device if gen is not None else like.device
    size = tuple(like.shape if shape is None else shape)
    return torch.rand(size, generator=gen, device=dev, dtype=like.dtype).to(like.device)


def _randn(like: Tensor, gen: torch.Generator | None) -> Tensor:
    dev = gen.device if gen is not None else like.device
    return torch.randn(like.shape, generator=gen, device=dev, dtype=like.dtype).to(like.device)


def seed_from(gen: torch.Generator | None) -> int:
    """A 31-bit seed drawn from ``gen`` (for libraries that only take an integer seed)."""
    dev = gen.device if gen is not None else "cpu"
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=dev).item())


def model_device(model: nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """The device of the model's first parameter or buffer (``default`` if it has none)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device(default)


def _ce_grad(logits: Tensor, y: Tensor, wrt: Tensor) -> Tensor:
    """Gradient of the summed cross-entropy w.r.t. ``wrt`` (zeros if the output ignores it).

    The sum (not the mean) makes each example's gradient independent of the batch it sits in.
    """
    loss = F.cross_entropy(logits.float(), y, reduction="sum")
    if not loss.requires_grad:  # e.g. a constant classifier with frozen parameters
        return torch.zeros_like(wrt)
    (g,) = torch.autograd.grad(loss, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if g is None else g


def input_grad(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient of the summed cross-entropy w.r.t. the input, and the (detached) logits."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x)
        g = _ce_grad(logits, y, x)
    return g, logits.detach()


# ============ FGSM ============


def fgsm_sweep(model: nn.Module, x: Tensor, y: Tensor, *, norm: str = "Linf") -> Callable[[float], Tensor]:
    """FGSM at any epsilon from one input gradient: returns ``eps -> x_adv``.

    The perturbation at every eps is ``eps * d`` with one direction ``d`` (the gradient's sign for
    Linf, the unit-L2 gradient for L2) taken at the clean input, so a sweep over k epsilons costs
    one backward and k forwards instead of k of each. :func:`fgsm` is this function at one eps, so
    a sweep returns exactly what k separate FGSM calls return. No random start: FGSM is not one-step
    PGD with a random init (see docs/decisions.md, 'Attack protocol').
    """
    g, _ = input_grad(model, x, y)
    direction = _norm_ops(norm).ascent(g, 1.0)
    x = x.detach()
    return lambda eps: (x + eps * direction).clamp(0.0, 1.0)


@ATTACKS.register("fgsm", norms=("Linf",), params={}, family="single_step", sweep=fgsm_sweep)
def fgsm(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "Linf",
) -> Tensor:
    """FGSM (Goodfellow et al. 2015): ``clamp(x + eps * sign(grad_x CE), 0, 1)``, no random start."""
    return fgsm_sweep(model, x, y, norm="Linf")(eps)


@ATTACKS.register("fgsm_l2", norms=("L2",), params={}, family="single_step", sweep=fgsm_sweep)
def fgsm_l2(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "L2",
) -> Tensor:
    """Fast gradient method in L2: ``clamp(x + eps * g / ||g||_2, 0, 1)``."""
    return fgsm_sweep(model, x, y, norm="L2")(eps)


# ============ PGD (Wong et al. 2020, "Fast is better than free": attack_pgd) ============


def _pgd_run(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    ops: type,
    steps: int,
    step_size: float,
    gen: torch.Generator | None,
    random_start: bool,
    early_stop: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """One restart. Returns (delta, final per-example CE, fooled mask)."""
    delta = ops.random_init(x, eps, gen) if random_start else torch.zeros_like(x)
    delta = (x + delta).clamp(0.0, 1.0) - x
    run_steps = _pgd_steps_masked if sync_free(x.device) else _pgd_steps_compact
    delta = run_steps(model, x, y, delta, eps, ops, steps, step_size, early_stop)
    with torch.no_grad():
        logits = model(x + delta)
        loss = F.cross_entropy(logits.float(), y, reduction="none")
        fooled = logits.argmax(1) != y
    return delta, loss, fooled


def sync_free(device: torch.device) -> bool:
    """Whether PGD steps the whole batch under a mask (no host sync per step) rather than shrinking
    it to the examples still correct: on an accelerator every shrink waits for the device (a boolean
    mask's size is data-dependent), on the CPU there is no device to wait for and a smaller batch
    is less work. Both give the same perturbations (tested on the CPU, bit for bit for a model whose
    outputs do not depend on the batch they are in)."""
    return device.type != "cpu"


def _pgd_steps_compact(
    model: nn.Module, x: Tensor, y: Tensor, delta: Tensor, eps: float, ops: type, steps: int,
    step_size: float, early_stop: bool,
) -> Tensor:  # fmt: skip
    """PGD steps on a shrinking batch: only the examples still classified correctly are stepped."""
    active = torch.arange(len(x), device=x.device)
    for _ in range(steps):
        whole = len(active) == len(x)  # avoid gather/scatter while nobody has been fooled yet
        xa, ya = (x, y) if whole else (x[active], y[active])
        da = (delta if whole else delta[active]).detach().requires_grad_(True)
        logits = model(xa + da)
        # The logits of this step's forward decide who is still correct: no extra forward.
        keep = logits.argmax(1) == ya if early_stop else torch.ones_like(ya, dtype=torch.bool)
        if not bool(keep.any()):
            break
        g = _ce_grad(logits, ya, da)
        d = ops.project(da.detach() + ops.ascent(g, step_size), eps)
        d = (xa + d).clamp(0.0, 1.0) - xa
        if whole and bool(keep.all()):
            delta = d
        else:
            delta[active[keep]] = d[keep]
            active = active[keep]
    return delta


def _pgd_steps_masked(
    model: nn.Module, x: Tensor, y: Tensor, delta: Tensor, eps: float, ops: type, steps: int,
    step_size: float, early_stop: bool,
) -> Tensor:  # fmt: skip
    """The same steps on the whole batch, an example's delta kept once it is fooled: no host sync."""
    active = torch.ones(len(x), dtype=torch.bool, device=x.device)
    shape = (-1, *([1] * (x.dim() - 1)))
    for _ in range(steps):
        da = delta.detach().requires_grad_(True)
        logits = model(x + da)
        # once fooled, never stepped again (as the compact form drops it from the batch)
        keep = active & (logits.argmax(1) == y) if early_stop else active
        g = _ce_grad(logits, y, da)
        d = ops.project(da.detach() + ops.ascent(g, step_size), eps)
        d = (x + d).clamp(0.0, 1.0) - x
        delta = torch.where(keep.view(shape), d, delta)
        active = keep
    return delta


@ATTACKS.register(
    "pgd",
    norms=("Linf", "L2"),
    params={
        "steps": int_at_least(1),
        "step_size": positive_float,
        "restarts": int_at_least(1),
        "random_start": boolean,
        "early_stop": boolean,
    },
    family="iterative",
)
def pgd(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "Linf",
    steps: int = 10,
    step_size: float | None = None,
    restarts: int = 1,
    random_start: bool = True,
    early_stop: bool = True,
) -> Tensor:
    """PGD as in Wong et al. 2020: random start, sign (Linf) or normalised (L2) steps.

    - ``step_size`` defaults to 0.01 for Linf (the paper suite's value) and ``2.5 * eps / steps`` for L2.
    - Early stop (Wong): in each step only examples still classified correctly are updated.
    - Restarts keep, per example, the delta with the highest CE, except that an example fooled by
      an earlier restart stays fooled and is not attacked again.
    - Examples misclassified on the clean input are returned unchanged (no attack work).
    """
    ops = _norm_ops(norm)
    if step_size is None:
        step_size = 0.01 if norm == "Linf" else 2.5 * eps / steps
    x, y = x.detach(), y.detach()
    with torch.enable_grad():
        with torch.no_grad():
            todo = (model(x).argmax(1) == y).nonzero().squeeze(1)
        best = torch.zeros_like(x)
        best_loss = torch.full((len(x),), -math.inf, device=x.device)
        best_fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        for _ in range(restarts):
            idx = todo[~best_fooled[todo]]
            if idx.numel() == 0:
                break
            delta, loss, fooled = _pgd_run(
                model, x[idx], y[idx], eps, ops, steps, step_size, gen, random_start, early_stop
            )
            was = best_fooled[idx]
            better = (fooled & ~was) | ((fooled == was) & (loss > best_loss[idx]))
            upd = idx[better]
            best[upd], best_loss[upd], best_fooled[upd] = delta[better], loss[better], fooled[better]
    return (x + best).clamp(0.0, 1.0)


# ============ AutoAttack through pyautoattack ============

AA_ATTACKS = ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t")
AA_VERSIONS = {
    "standard": ("apgd-ce", "apgd-t", "fab-t", "square"),
    "plus": ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t"),
}
# DLR divides by the gap between the 1st and 3rd largest logits; targeted DLR also uses the 4th.
AA_MIN_CLASSES = {"apgd-dlr": 3, "apgd-t": 4}


def autoattack_plan(
    version: str, attacks: Sequence[str] | None, num_classes: int
) -> tuple[list[str], int, str]:
    """The attacks pyautoattack can run with ``num_classes`` logits, the target count, and a note.

    DLR-based attacks need >= 3 (untargeted) / >= 4 (targeted) classes and are dropped otherwise;
    targeted attacks use ``min(9, num_classes - 1)`` target classes. A 2-class problem therefore
    runs apgd-ce, fab-t and square only under ``standard``.
    """
    wanted = list(attacks) if version == "custom" else list(AA_VERSIONS[version])
    kept = [a for a in wanted if num_classes >= AA_MIN_CLASSES.get(a, 2)]
    dropped = [a for a in wanted if a not in kept]
    note = f"dropped {', '.join(dropped)}: needs more than {num_classes} classes" if dropped else ""
    return kept, max(1, min(9, num_classes - 1)), note


def _check_autoattack(params: dict[str, Any]) -> None:
    custom = params.get("version", "standard") == "custom"
    if custom and not params.get("attacks"):
        raise ValueError("version='custom' needs attacks=[...] (e.g. ['apgd-ce', 'apgd-t'])")
    if not custom and params.get("attacks") is not None:
        raise ValueError("attacks=[...] is only allowed with version='custom'")


#: pyautoattack, pinned (pyproject.toml): its components and their settings match Croce and Hein's
#: reference code (fra31/auto-attack, autoattack.py, ``set_version``); tests/test_autoattack.py checks it
AA_PACKAGE = "pyautoattack"
AA_PINNED = "0.2.0"

#: per component: (the AutoAttack attribute that runs it, the settings recorded in result rows)
_AA_COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "apgd-ce": ("apgd", ("n_iter", "n_restarts", "eot_iter", "thr_decr")),
    "apgd-dlr": ("apgd", ("n_iter", "n_restarts", "eot_iter", "thr_decr")),
    "apgd-t": ("apgd_targeted", ("loss", "n_iter", "n_restarts", "n_target_classes", "eot_iter", "thr_decr")),
    "fab": ("fab", ("n_iter", "n_restarts", "alpha_max", "eta", "beta")),
    "fab-t": ("fab", ("n_iter", "n_target_classes", "alpha_max", "eta", "beta")),
    "square": ("square", ("n_queries", "p_init", "n_restarts", "loss", "rescale_schedule")),
}
_AA_RENAMED = {"thr_decr": "rho"}
# settings run_standard_evaluation itself applies just before running a component
_AA_AT_RUN: dict[str, dict[str, Any]] = {
    "apgd-ce": {"loss": "ce"},
    "apgd-dlr": {"loss": "dlr"},
    "fab": {"targeted": False},
    "fab-t": {"targeted": True, "n_restarts": 1},
}


def autoattack_version() -> str:
    """The installed pyautoattack version (recorded in every AutoAttack row)."""
    try:
        return importlib.metadata.version(AA_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"AutoAttack needs {AA_PACKAGE}: pip install {AA_PACKAGE}=={AA_PINNED}") from None


def new_autoattack(
    model: nn.Module,
    *,
    device: torch.device | str,
    eps: float,
    norm: str,
    seed: int,
    version: str,
    attacks: Sequence[str],
    n_target_classes: int,
) -> Any:
    """A ``pyautoattack.AutoAttack`` set up through its public API only.

    ``standard`` and ``plus`` are passed to the constructor, which applies the version's settings;
    ``attacks`` (from :func:`autoattack_plan`) then replaces the list only where components cannot
    run with the model's classes, and the documented component attributes cap the target count.
    """
    try:
        from pyautoattack import AutoAttack
    except ImportError:
        raise UserError(f"AutoAttack needs {AA_PACKAGE}: pip install {AA_PACKAGE}=={AA_PINNED}") from None
    common = {"device": device, "eps": eps, "norm": norm, "seed": seed}
    if version == "custom":
        aa = AutoAttack(model, attacks=list(attacks), version="custom", **common)
    else:
        aa = AutoAttack(model, version=version, **common)
        aa.attacks_to_run = list(attacks)
    aa.apgd_targeted.n_target_classes = n_target_classes
    aa.fab.n_target_classes = n_target_classes
    return aa


def autoattack_components(aa: Any) -> dict[str, dict[str, Any]]:
    """The settings each component of ``aa`` runs with, as run_standard_evaluation applies them."""
    out: dict[str, dict[str, Any]] = {}
    for name in aa.attacks_to_run:
        attr, keys = _AA_COMPONENTS[name]
        # APGD keeps the paper's rho (step-size decrease threshold) as thr_decr
        settings = {_AA_RENAMED.get(k, k): getattr(getattr(aa, attr), k) for k in keys}
        out[name] = {**settings, **_AA_AT_RUN.get(name, {})}
    return out


def _describe_autoattack(params: dict[str, Any], num_classes: int) -> dict[str, Any]:
    """What a row records: the components run, their settings, and which implementation ran them."""
    version = params.get("version", "standard")
    kept, n_targets, note = autoattack_plan(version, params.get("attacks"), num_classes)
    aa = new_autoattack(
        nn.Identity(),  # settings do not depend on the model; nothing runs here
        device="cpu",
        eps=0.0,
        norm="Linf",
        seed=0,
        version=version,
        attacks=kept,
        n_target_classes=n_targets,
    )
    return {
        "attacks_run": kept,
        "n_target_classes": n_targets,
        "implementation": AA_PACKAGE,
        "implementation_version": autoattack_version(),
        "components": autoattack_components(aa),
        **({"note": note} if note else {}),
    }


def _fork_rng(device: torch.device) -> AbstractContextManager[Any]:
    # pyautoattack and torchattacks reseed torch's global RNG: keep the caller's stream intact.
    cuda = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda)


@ATTACKS.register(
    "autoattack",
    norms=("Linf", "L2"),
    params={"version": one_of("standard", "plus", "custom"), "attacks": list_of(*AA_ATTACKS)},
    family="iterative",
    needs_num_classes=True,
    check_params=_check_autoattack,
    describe=_describe_autoattack,
)
def autoattack(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    gen: torch.Generator | None = None,
    norm: str = "Linf",
    version: str = "standard",
    attacks: Sequence[str] | None = None,
    num_classes: int | None = None,
) -> Tensor:
    """AutoAttack (Croce & Hein 2020) via pyautoattack, always with an explicit seed drawn from ``gen``.

    ``version`` is ``standard``, ``plus`` or ``custom`` (then ``attacks`` lists the components).
    ``num_classes`` defaults to the model's logits width; see :func:`autoattack_plan`.
    """
    try:
        _check_autoattack({"version": version, "attacks": attacks})
    except ValueError as e:
        raise UserError(f"autoattack: {e}") from None
    x, y = x.detach(), y.detach()
    if num_classes is None:
        with torch.no_grad():
            num_classes = int(model(x[:1]).shape[1])
    kept, n_targets, note = autoattack_plan(version, attacks, num_classes)
    if not kept:
        raise UserError(f"autoattack: no component can run with {num_classes} classes ({note})")
    if note:
        warnings.warn(f"autoattack: {note}", stacklevel=2)
    device = model_device(model, x.device)
    seed = seed_from(gen)
    with _fork_rng(device), torch.enable_grad():
        aa = new_autoattack(
            model,
            device=device,
            eps=eps,
            norm=norm,
            seed=seed,
            version=version,
            attacks=kept,
            n_target_classes=n_targets,
        )
        decided = aa_trace.trace_components(aa, model, x, y)
        x_adv, _ = aa.run_standard_evaluation(x, y, batch_size=max(1, len(x)))
    aa_trace.record(eps, list(aa.attacks_to_run), decided)
    return x_adv.detach().to(x.dtype)


# ============ torchattacks.<Name> ============


def _torchattacks_class(name: str) -> type:
    try:
        torchattacks = importlib.import_module("torchattacks")
    except ImportError:
        raise UserError(
            f"attack {name!r} needs the optional torchattacks package: {TORCHATTACKS_HINT}"
        ) from None
    cls_name = name[len(TORCHATTACKS_PREFIX) :]
    valid = [
        n for n in getattr(torchattacks, "__all__", []) if n not in getattr(torchattacks, "__wrapper__", [])
    ]
    cls = getattr(torchattacks, cls_name, None) if cls_name in valid else None
    if cls is None:
        raise UserError(f"unknown attack {name!r}; torchattacks provides: {', '.join(valid)}")
    return cls


def torchattacks_params(name: str) -> dict[str, inspect.Parameter]:
    """Constructor keywords of ``torchattacks.<Name>`` other than ``model`` and ``eps``."""
    sig = inspect.signature(_torchattacks_class(name).__init__)
    return {k: p for k, p in sig.parameters.items() if k not in ("self", "model", "eps")}


def _make_torchattacks(name: str) -> Attack:
    cls = _torchattacks_class(name)
    takes_eps = "eps" in inspect.signature(cls.__init__).parameters

    def run(
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        *,
        eps: float,
        gen: torch.Generator | None = None,
        norm: str = "Linf",
        **params: Any,
    ) -> Tensor:
        unknown = sorted(set(params) - set(torchattacks_params(name)))
        if unknown:
            raise UserError(
                f"{name} does not take {', '.join(unknown)}; it takes: {', '.join(torchattacks_params(name))}"
            )
        x, y = x.detach(), y.detach()
        seed = seed_from(gen)
        with _fork_rng(model_device(model, x.device)), torch.enable_grad():
            # torchattacks draws from torch's global RNG: seed it from our generator, restore after.
            torch.manual_seed(seed)
            atk = cls(model, **({"eps": eps} if takes_eps else {}), **params)
            x_adv = atk(x, y).detach()
        # Minimum-norm attacks (CW, DeepFool) have no eps: project their output into the threat model.
        return x_adv if takes_eps else project(x, x_adv, eps, norm)

    run.__name__ = name
    run.__doc__ = f"{name} through torchattacks, seeded from the generator; see its own docstring."
    return run


_TORCHATTACKS_CACHE: dict[str, Attack] = {}


# ============ lookup and execution ============


def resolve_attack(name: str) -> Attack:
    """The attack callable for a registry name or ``torchattacks.<Name>``; one-line UserError otherwise."""
    if isinstance(name, str) and name.startswith(TORCHATTACKS_PREFIX):
        if name not in _TORCHATTACKS_CACHE:
            _TORCHATTACKS_CACHE[name] = _make_torchattacks(name)
        return _TORCHATTACKS_CACHE[name]
    if not isinstance(name, str) or name not in ATTACKS:
        raise UserError(
            f"unknown attack {name!r}; valid choices: {', '.join(ATTACKS.names())}, "
            f"or {TORCHATTACKS_PREFIX}<Name> ({TORCHATTACKS_HINT})"
        )
    return ATTACKS.get(name)


def attack_info(name: str) -> dict[str, Any]:
    """Registry metadata; torchattacks attacks get generic metadata (any norm, family unknown)."""
    if name.startswith(TORCHATTACKS_PREFIX):
        resolve_attack(name)
        return {"norms": tuple(NORMS), "params": None, "family": "other"}
    resolve_attack(name)
    return ATTACKS.info(name)


def attack_names() -> list[str]:
    """Registered attack names (``torchattacks.<Name>`` also accepted, not listed)."""
    return ATTACKS.names()


def run_attack(
    name: str,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    eps: float,
    norm: str,
    gen: torch.Generator | None,
    batch_size: int,
    params: dict[str, Any] | None = None,
) -> Tensor:
    """Run an attack in chunks of ``batch_size``; every returned chunk is checked against the threat model.

    Raises ``SanityError`` if any chunk leaves the eps-ball or [0,1].
    """
    fn = resolve_attack(name)
    norms = attack_info(name)["norms"]
    if norm not in norms:
        raise UserError(f"attack {name!r} does not support norm {norm!r}; it supports: {', '.join(norms)}")
    params = dict(params or {})
    out = []
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        xb_adv = fn(model, xb, yb, eps=eps, gen=gen, norm=norm, **params)
        check_perturbation(xb, xb_adv, eps, norm)
        out.append(xb_adv.detach())
    return torch.cat(out) if out else x.detach().clone()


@torch.no_grad()
def _predict(model: nn.Module, x: Tensor) -> Tensor:
    return model(x).argmax(1)


def robust_under_attack(
    name: str,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: Sequence[float],
    *,
    norm: str,
    gens: Sequence[torch.Generator | None],
    batch_size: int,
    params: dict[str, Any] | None = None,
) -> tuple[Tensor, list[float]]:
    """Attack every example at every eps independently; returns ``(correct, seconds)``.

    ``correct[k, i]``: the model still classifies ``x[i]`` correctly under the attack at ``eps[k]``
    (each eps is its own attack, never carried over from another eps); ``seconds[k]``: the wall time
    spent on ``eps[k]``. ``gens[k]`` seeds the attack at ``eps[k]``, consumed chunk by chunk exactly
    as :func:`run_attack` would. An attack with a registered ``sweep`` (FGSM) computes what the eps
    share once per chunk, and its shared time is split evenly between the eps. Every perturbation
    is checked against the threat model (``SanityError`` if it leaves the eps-ball or [0,1]).
    """
    fn, info = resolve_attack(name), attack_info(name)
    if norm not in info["norms"]:
        raise UserError(
            f"attack {name!r} does not support norm {norm!r}; it supports: {', '.join(info['norms'])}"
        )
    if len(gens) != len(eps):
        raise ValueError(f"one generator per eps: got {len(gens)} for {len(eps)} epsilons")
    params, sweep = dict(params or {}), info.get("sweep")
    correct = torch.zeros((len(eps), len(x)), dtype=torch.bool, device=x.device)
    seconds = [0.0] * len(eps)
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        t = _clock(x.device)
        at = sweep(model, xb, yb, norm=norm, **params) if sweep is not None else None
        shared = (_clock(x.device) - t) / max(1, len(eps))
        for k, e in enumerate(eps):
            t = _clock(x.device)
            xa = at(e) if at is not None else fn(model, xb, yb, eps=e, gen=gens[k], norm=norm, **params)
            check_perturbation(xb, xa, e, norm)
            correct[k, i : i + len(xb)] = _predict(model, xa) == yb
            seconds[k] += _clock(x.device) - t + shared
    return correct, seconds


def _clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the device has finished the work queued so far (CUDA runs
    asynchronously: without the sync, one eps's kernels would be timed under the next eps)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
