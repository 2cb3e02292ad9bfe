"""robustbench-nacl: adversarial-robustness benchmark and model zoo for contrastive encoders.

The public API (everything else is reachable through the submodules)::

    from robustbench_nacl import benchmark, evaluate, load_model, train, TrainConfig, pair_loss
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import plugins
from ._version import __version__

# Imported on first use (PEP 562), so that ``import robustbench_nacl.report`` and the renderers it
# serves load no torch: name -> the module that defines it.
_LAZY = {
    "load_suite": "attack.suites",
    "load_dataset": "data",
    "benchmark": "eval.benchmark",
    "evaluate": "eval.evaluate",
    "EvalConfig": "eval.config",
    "DataOptions": "eval.config",
    "SourceOptions": "eval.config",
    "ProbeOptions": "eval.config",
    "AttackOptions": "eval.config",
    "OutputOptions": "eval.config",
    "AlfConfig": "results.finetune",
    "AffConfig": "results.finetune",
    "DatasetSpec": "data",
    "parse_spec": "data",
    "ProbeConfig": "eval.probe",
    "fit_linear_probe": "eval.probe",
    "list_presets": "losses",
    "pair_loss": "losses",
    "register_pair_loss": "losses",
    "register_preset": "losses",
    "resolve": "losses",
    "create_encoder": "models.factory",
    "register_encoder": "models.encoders",
    "load_encoder": "models.foreign",
    "load_model": "hub.load",
    "published_models": "hub.catalog",
    "render_leaderboard": "report.leaderboard",
    "ResultRow": "results.rows",
    "load_rows": "results.rows",
    "TrainConfig": "training",
    "train": "training",
}

if TYPE_CHECKING:  # what the names are, for readers and type checkers; nothing is imported at run time
    from .attack.suites import load_suite
    from .data import DatasetSpec, load_dataset, parse_spec
    from .eval.benchmark import benchmark
    from .eval.config import (
        AttackOptions,
        DataOptions,
        EvalConfig,
        OutputOptions,
        ProbeOptions,
        SourceOptions,
    )
    from .eval.evaluate import evaluate
    from .eval.probe import ProbeConfig, fit_linear_probe
    from .hub.catalog import published_models
    from .hub.load import load_model
    from .losses import list_presets, pair_loss, register_pair_loss, register_preset, resolve
    from .models.encoders import register_encoder
    from .models.factory import create_encoder
    from .models.foreign import load_encoder
    from .report.leaderboard import render_leaderboard
    from .results.finetune import AffConfig, AlfConfig
    from .results.rows import ResultRow, load_rows
    from .training import TrainConfig, train


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (then cached here)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AffConfig",
    "AlfConfig",
    "AttackOptions",
    "DataOptions",
    "DatasetSpec",
    "EvalConfig",
    "OutputOptions",
    "ProbeConfig",
    "ProbeOptions",
    "ResultRow",
    "SourceOptions",
    "TrainConfig",
    "__version__",
    "benchmark",
    "create_encoder",
    "evaluate",
    "fit_linear_probe",
    "list_presets",
    "load_dataset",
    "load_encoder",
    "load_model",
    "load_rows",
    "load_suite",
    "pair_loss",
    "parse_spec",
    "plugins",
    "published_models",
    "register_encoder",
    "register_pair_loss",
    "register_preset",
    "render_leaderboard",
    "resolve",
    "train",
]
