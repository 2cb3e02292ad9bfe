"""robustbench-nacl: adversarial-robustness benchmark and model zoo for contrastive encoders.

The public API (everything else is reachable through the submodules)::

    from robustbench_nacl import benchmark, evaluate, load_model, train, TrainConfig, pair_loss
"""

from . import plugins
from ._version import __version__
from .attack.suites import load_suite
from .data.datasets import load_dataset
from .eval.benchmark import benchmark
from .eval.evaluate import evaluate
from .eval.probe import ProbeConfig, fit_linear_probe
from .eval.rows import ResultRow, load_rows
from .losses import list_presets, pair_loss, register_pair_loss, register_preset, resolve
from .models.encoders import register_encoder
from .models.factory import create_encoder
from .models.foreign import load_encoder
from .published import load_model, published_models
from .report.leaderboard import render_leaderboard
from .training import TrainConfig, train

__all__ = [
    "ProbeConfig",
    "ResultRow",
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
    "plugins",
    "published_models",
    "register_encoder",
    "register_pair_loss",
    "register_preset",
    "render_leaderboard",
    "resolve",
    "train",
]
