"""AutoAttack (Croce & Hein 2020) through pyautoattack's public API: which components can run with
the model's classes, their settings as recorded in rows, and the registered ``autoattack`` attack."""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UserError
from . import autoattack as aa_trace
from .autoattack_screen import SCREEN_SAMPLE, run_screen
from .base import ATTACKS
from .grad import model_device
from .params import list_of, one_of
from .rng import fork_rng, seed_from

AA_ATTACKS = ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t")
AA_VERSIONS = {
    "standard": ("apgd-ce", "apgd-t", "fab-t", "square"),
    # standard's components and settings, FAB-T and Square on a sample of APGD's survivors only
    "screen": ("apgd-ce", "apgd-t", "fab-t", "square"),
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
    version = "standard" if version == "screen" else version  # screening runs standard's components
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
    screen = {"screen_sample": SCREEN_SAMPLE} if version == "screen" else {}
    return {
        **screen,
        "attacks_run": kept,
        "n_target_classes": n_targets,
        "implementation": AA_PACKAGE,
        "implementation_version": autoattack_version(),
        "components": autoattack_components(aa),
        **({"note": note} if note else {}),
    }


@ATTACKS.register(
    "autoattack",
    norms=("Linf", "L2"),
    params={"version": one_of("standard", "screen", "plus", "custom"), "attacks": list_of(*AA_ATTACKS)},
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

    ``version`` is ``standard``, ``plus``, ``custom`` (then ``attacks`` lists the components) or
    ``screen`` (standard's APGD-CE and APGD-T on every example, FAB-T and Square on a seeded sample
    of their survivors: :mod:`.autoattack_screen`).
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
    with fork_rng(device), torch.enable_grad():
        trace = aa_trace.new_trace(model, x, y, seed)
        every = torch.arange(len(x), device=x.device)
        setup = {"eps": eps, "norm": norm, "device": device, "n_targets": n_targets, "order": kept}
        if version != "screen":
            x_adv = _run(model, x, y, every, kept, trace, version=version, **setup)
        else:
            x_adv = run_screen(model, x, y, trace, kept, lambda idx, names: _run(
                model, x, y, idx, names, trace, version="standard", **setup))  # fmt: skip
    aa_trace.record(eps, kept, trace)
    return x_adv.detach().to(x.dtype)


def _run(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    index: Tensor,
    names: list[str],
    trace: aa_trace.Trace,
    *,
    version: str,
    eps: float,
    norm: str,
    device: torch.device,
    n_targets: int,
    order: list[str],
) -> Tensor:
    """``names`` of one pyautoattack AutoAttack (seeded with ``trace.seed``) on ``x[index]`` in one
    batch, traced; returns the adversarial examples of ``x[index]``."""
    aa = new_autoattack(
        model,
        device=device,
        eps=eps,
        norm=norm,
        seed=trace.seed,
        version=version,
        attacks=names,
        n_target_classes=n_targets,
    )
    hook = aa_trace.trace_components(aa, model, x, y, trace, order=order, index=index)
    try:
        x_adv, _ = aa.run_standard_evaluation(x[index], y[index], batch_size=max(1, len(index)))
    finally:
        hook.remove()
    return x_adv
