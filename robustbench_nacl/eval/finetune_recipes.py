"""Named finetuning recipes (``--finetune-recipe``): which SLF / ALF / AFF settings an evaluation
uses, per checkpoint family and dataset.

- ``uniform`` (the default): one protocol for every family, so that a benchmark ranks under one
  protocol: SLF is the cached-feature NaCl probe (``ProbeConfig``), ALF and AFF the settings given
  (``AlfConfig`` / ``AffConfig``, the literature's CIFAR-10 defaults). Its rows are what they were.
- ``robustssl``: GodXuxilie/RobustSSL_Benchmark ``Finetuning_Methods/Vanilla_Finetuning/``, the
  settings ``setup_hyperparameter`` (``utils.py``) gives each pretraining method and dataset on top
  of ``vanilla_finetuning.py``'s argparse defaults; SLF by SGD on re-encoded images, every protocol
  on random crop + flip, heads starting at zero, dual-BN TRADES for dual-BN checkpoints.
  ``robustssl:NAME`` picks the benchmark's method NAME instead of the checkpoint's family.

Every resolved setting and the recipe's name, method and dataset enter the rows' ``finetune``
identity, so rows of two recipes never share a protocol id (nor a table). docs/decisions.md,
'Finetuning protocols', names the authors' files each value is read from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..data import DatasetSpec
from ..errors import UserError
from ..results.finetune import AffConfig, AlfConfig, FinetuneConfig, SlfConfig, resolve_dual_bn
from .finetune import parse_protocols
from .settings import Setting

__all__ = [
    "DEFAULT_RECIPE",
    "FINETUNE_RECIPES",
    "ROBUSTSSL",
    "FinetuneRecipe",
    "RecipeTarget",
    "benchmark_dataset",
    "check_recipe",
    "parse_recipe",
    "recipe_plan",
]

DEFAULT_RECIPE = "uniform"


@dataclass(frozen=True)
class RecipeTarget:
    """What a recipe's settings may depend on: the checkpoint and the setting's dataset."""

    method: str | None  # the checkpoint's family (its row ``loss``), or the one ``name:METHOD`` forces
    dataset: DatasetSpec
    dual_bn: bool  # whether the encoder has dual BatchNorm
    alf: AlfConfig  # the ALF / AFF settings the caller gave (the uniform recipe uses them)
    aff: AffConfig


@dataclass(frozen=True)
class FinetuneRecipe:
    """A named recipe: ``resolve(protocol, target)`` is the protocol's configuration (None: the
    cached-feature SLF probe)."""

    name: str
    summary: str
    resolve: Callable[[str, RecipeTarget], FinetuneConfig | None]
    methods: tuple[str, ...] = ()  # the names ``name:METHOD`` accepts (none: no method choice)


def _uniform(protocol: str, t: RecipeTarget) -> FinetuneConfig | None:
    """Today's protocol: the probe for SLF, the given settings for ALF / AFF (dual-BN resolved)."""
    table: dict[str, Callable[[], FinetuneConfig | None]] = {
        "slf": lambda: None,
        "alf": lambda: t.alf,
        "aff": lambda: resolve_dual_bn(t.aff, t.dual_bn),
    }
    return table[protocol]()


# ---- RobustSSL_Benchmark, Finetuning_Methods/Vanilla_Finetuning/utils.py, setup_hyperparameter ----
# Per method and mode, per benchmark dataset ("*": every dataset): what it sets on top of the
# argparse defaults of vanilla_finetuning.py (25 epochs, momentum 0.9, wd 2e-4, eps 8/255, step 2/255,
# 10 train steps; MultiStepLR gamma 0.1 in get_model; TRADES' LAMBDA2 = 6 in trades_loss(_dual)).
_ACL_LINEAR = {  # ACL and DynACL, SLF and ALF: lr and batch per dataset, lr cut at 10 and 20
    "cifar10": {"lr": 0.01, "batch_size": 512, "milestones": "10,20"},
    "cifar100": {"lr": 0.05, "batch_size": 512, "milestones": "10,20"},
    "stl10@96": {"lr": 0.1, "batch_size": 512, "milestones": "10,20"},
    "stl10@32": {"lr": 0.01, "batch_size": 128, "milestones": "10,20"},
}
_ACL_AFF = {"*": {"lr": 0.1, "batch_size": 128, "epochs": 100, "milestones": "40,60"}}
_DYNACL_AFF = {
    "*": {"lr": 0.1, "batch_size": 128, "milestones": "15,20"},
    "stl10@96": {"lr": 0.1, "batch_size": 128, "milestones": "10,20"},
}


def _cut_10_20(c10: tuple, c100: tuple, stl96: tuple, stl32: tuple) -> dict[str, dict[str, Any]]:
    """A linear mode's (lr, batch size[, epochs]) per benchmark dataset, lr cut at epochs 10 and 20."""
    out = {}
    for dataset, values in (("cifar10", c10), ("cifar100", c100), ("stl10@96", stl96), ("stl10@32", stl32)):
        out[dataset] = {"lr": values[0], "batch_size": values[1], "milestones": "10,20"}
        if len(values) > 2:
            out[dataset]["epochs"] = values[2]
    return out


# The AIR variants (Xu et al. 2023) have branches of their own, with per-dataset quirks kept as
# written: DynACL-AIR's CIFAR-10 SLF sets 5 epochs, DynACL-AIR++'s CIFAR-10 ALF 4; DynACL-AIR++'s
# STL-10 (32 px) SLF/ALF sets nothing, leaving argparse's lr 0.1, batch 128; its CIFAR-10 AFF sets
# ``args.epoch = 19``, an attribute nothing reads. What a mode runs is what the modes before it left
# in the shared ``args`` (:func:`_carried`): DynACL-AIR's CIFAR-10 ALF and AFF run 5 epochs too,
# DynACL-AIR++'s CIFAR-10 AFF 4.
_AIR_AFF = {"*": {"lr": 0.1, "batch_size": 128, "milestones": "15,20"}}
_ACL_IR = {
    "slf": _cut_10_20((0.005, 512), (0.1, 512), (0.01, 512), (0.01, 128)),
    "alf": _cut_10_20((0.01, 512), (0.1, 512), (0.01, 512), (0.01, 128)),
    "aff": _ACL_AFF,
}
_DYNACL_AIR = {
    "slf": _cut_10_20((0.01, 512, 5), (0.1, 512), (0.1, 512), (0.01, 128)),
    "alf": _cut_10_20((0.01, 512), (0.1, 512), (0.1, 128), (0.01, 128)),
    "aff": _AIR_AFF,
}
_DYNACL_AIR_PP = {
    "slf": _cut_10_20((0.01, 512), (0.09, 512), (0.1, 512), (0.1, 128)),
    "alf": _cut_10_20((0.01, 512, 4), (0.1, 512), (0.1, 128), (0.1, 128)),
    "aff": _AIR_AFF,
}
_LATE_CUT_LINEAR = {"*": {"lr": 0.01, "batch_size": 512, "milestones": "15,20"}}  # AdvCL, A-InfoNCE, DeACL
_ELSE = {"*": {"lr": 0.1, "batch_size": 128, "milestones": "15,20"}}  # the final else: every mode
ROBUSTSSL: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "ACL": {"slf": _ACL_LINEAR, "alf": _ACL_LINEAR, "aff": _ACL_AFF},
    "DynACL": {"slf": _ACL_LINEAR, "alf": _ACL_LINEAR, "aff": _DYNACL_AFF},
    "DynACL++": {"slf": _ACL_LINEAR, "alf": _ACL_LINEAR, "aff": _DYNACL_AFF},
    "ACL_IR": _ACL_IR,
    "DynACL-AIR": _DYNACL_AIR,
    "DynACL-AIR++": _DYNACL_AIR_PP,
    "AdvCL": {"slf": _LATE_CUT_LINEAR, "alf": _LATE_CUT_LINEAR, "aff": _ELSE},
    "A-InfoNCE": {"slf": _LATE_CUT_LINEAR, "alf": _LATE_CUT_LINEAR, "aff": _ELSE},
    "DeACL": {"slf": _LATE_CUT_LINEAR, "alf": _LATE_CUT_LINEAR, "aff": _ELSE},
    "other": {"slf": _ELSE, "alf": _ELSE, "aff": _ELSE},
}
#: our loss families -> the benchmark's ``--pretraining`` name (``dynacl++`` is its own); any other
#: family takes "other". ACL with AIR is ``ACL_IR`` in ``setup_hyperparameter`` (its loader lists
#: ``ACL_AIR``, which that function does not know: it would take the final else)
LOSS_TO_METHOD = {
    "acl": "ACL",
    "dynacl": "DynACL",
    "deacl": "DeACL",
    "acl_air": "ACL_IR",
    "dynacl_air": "DynACL-AIR",
    "dynacl_air++": "DynACL-AIR++",
}
_BASE = {"epochs": 25, "momentum": 0.9, "weight_decay": 2e-4, "gamma": 0.1, "head_init": "zeros"}
#: ``run_vanilla_tune.sh`` runs every method with ``--mode ALL``: vanilla_finetuning.py calls
#: ``setup_hyperparameter(args, mode)`` for SLF, then ALF, then AFF on one shared ``args``
_MODE_ORDER = ("slf", "alf", "aff")
_ADV = {"eps": 8 / 255, "step_size": 2 / 255, "steps": 10, "beta": 6.0}  # beta: AFF only
_CONFIGS: dict[str, type] = {"slf": SlfConfig, "alf": AlfConfig, "aff": AffConfig}


def benchmark_dataset(spec: DatasetSpec) -> str:
    """The benchmark's dataset branch: cifar10, cifar100, stl10@96 / stl10@32 by image size; any
    other dataset takes CIFAR-10's (the benchmark's main table, and small images like ours)."""
    if spec.name == "stl10":
        return "stl10@96" if int(spec.info.get("size", 96)) >= 96 else "stl10@32"
    return spec.name if spec.name in ("cifar10", "cifar100") else "cifar10"


#: the caller's settings a named recipe keeps: the training budget and how AFF reads a dual-BN encoder
_PASS_THROUGH = ("max_train", "dual_bn", "bn_momentum")


def _robustssl(protocol: str, t: RecipeTarget) -> FinetuneConfig:
    """The benchmark's settings of ``protocol`` for the target's method and dataset."""
    method = _method_name(t.method)
    dataset = benchmark_dataset(t.dataset)
    values = _carried(method, dataset, protocol)
    cls = _CONFIGS[protocol]
    names = {f.name for f in fields(cls)}
    values |= {k: v for k, v in _ADV.items() if k in names} | {"augment": "crop-flip"}
    if "fit" in names:  # the benchmark's own reading: its epochs on raw features (set per dataset)
        values["fit"] = "off"
    given = t.alf if protocol == "alf" else t.aff if protocol == "aff" else None
    if given is not None:  # the budget (max_train) and the dual-BN switches stay the caller's
        values |= {k: getattr(given, k) for k in _PASS_THROUGH if k in names}
    recipe = (("name", "robustssl"), ("method", method), ("dataset", dataset))
    cfg = cls(**values, recipe=recipe)
    return resolve_dual_bn(cfg, t.dual_bn) if isinstance(cfg, AffConfig) else cfg


def _carried(method: str, dataset: str, protocol: str) -> dict[str, Any]:
    """The settings ``protocol`` runs with under the benchmark's ``--mode ALL``: argparse's defaults,
    then what SLF's branch sets, then ALF's, ... up to ``protocol``'s own (a setting a branch leaves
    alone keeps what an earlier mode set: DynACL-AIR's CIFAR-10 ALF and AFF run SLF's 5 epochs)."""
    values = dict(_BASE)
    for mode in _MODE_ORDER[: _MODE_ORDER.index(protocol) + 1]:
        by_dataset = ROBUSTSSL[method][mode]
        values |= by_dataset.get(dataset, by_dataset.get("*", {}))
    return values


def _method_name(method: str | None) -> str:
    """A family or benchmark name -> the benchmark's method (case-insensitive; unknown: "other")."""
    text = (method or "").strip()
    by_lower = {m.lower(): m for m in ROBUSTSSL}
    return by_lower.get(text.lower()) or LOSS_TO_METHOD.get(text.lower(), "other")


FINETUNE_RECIPES: dict[str, FinetuneRecipe] = {
    r.name: r
    for r in (
        FinetuneRecipe(
            "uniform", "one protocol for every family (NaCl probe SLF; ALF/AFF as given)", _uniform
        ),
        FinetuneRecipe(
            "robustssl",
            "RobustSSL_Benchmark Vanilla_Finetuning: per-method SLF/ALF/AFF (setup_hyperparameter)",
            _robustssl,
            tuple(ROBUSTSSL),
        ),
    )
}


def parse_recipe(text: str | None) -> tuple[FinetuneRecipe, str | None]:
    """``"robustssl"`` / ``"robustssl:ACL"`` -> (recipe, forced method or None); one-line UserError."""
    name, _, method = (text or DEFAULT_RECIPE).strip().partition(":")
    recipe = FINETUNE_RECIPES.get(name.strip().lower())
    if recipe is None:
        raise UserError(f"finetune recipe {name!r}: choose one of {', '.join(FINETUNE_RECIPES)}")
    if method and method.strip().lower() not in {m.lower() for m in recipe.methods}:
        choices = ", ".join(recipe.methods) or "none: it takes no method"
        raise UserError(f"finetune recipe {text!r}: unknown method {method!r} (methods: {choices})")
    return recipe, (method.strip() or None)


def check_recipe(text: str | None, alf: AlfConfig | None, aff: AffConfig | None) -> None:
    """Before any work: the recipe exists, and a named recipe is not given ALF / AFF settings it
    would silently replace (only :data:`_PASS_THROUGH` does: the budget, the dual-BN switches)."""
    recipe, _ = parse_recipe(text)
    if recipe.name == DEFAULT_RECIPE:
        return
    keep = set(_PASS_THROUGH)
    for given, default in ((alf, AlfConfig()), (aff, AffConfig())):
        if given is None:
            continue
        changed = [
            f.name
            for f in fields(given)
            if f.name not in keep and getattr(given, f.name) != getattr(default, f.name)
        ]
        if changed:
            flags = ", ".join(f"--{given.protocol}-{k.replace('_', '-')}" for k in changed)
            raise UserError(
                f"finetune recipe {recipe.name} sets {given.protocol.upper()}'s settings itself: "
                f"drop {flags} (or use --finetune-recipe uniform)"
            )


def recipe_plan(
    text: str | None,
    protocol: str | Sequence[str],
    settings: list[Setting],
    kinds: tuple[str, ...] | None,
    *,
    alf: AlfConfig | None,
    aff: AffConfig | None,
    loss: str | None,
    dual_bn: bool,
) -> list[tuple[FinetuneConfig | None, list[Setting]]]:
    """(configuration, its settings) per protocol and distinct configuration, in protocol order.

    A recipe may give two datasets two configurations (robustssl: CIFAR-100's SLF lr), so each
    group runs as one job. A finetuned configuration (not None) runs on the setting ``kinds`` only
    (None: every setting), as ``--finetune-settings`` says."""
    recipe, method = parse_recipe(text)
    out: list[tuple[FinetuneConfig | None, list[Setting]]] = []
    for p in parse_protocols(protocol):
        groups: dict[FinetuneConfig | None, list[Setting]] = {}
        for s in settings:
            target = RecipeTarget(method or loss, s.spec, dual_bn, alf or AlfConfig(), aff or AffConfig())
            cfg = recipe.resolve(p, target)
            if cfg is not None:
                cfg.check()
            if cfg is None or kinds is None or s.name in kinds:
                groups.setdefault(cfg, []).append(s)
        out += list(groups.items())
    return out
