"""robustbench-nacl: adversarial-robustness benchmark and model zoo for contrastive encoders.

The public API (everything else is reachable through the submodules)::

    from robustbench_nacl import benchmark, evaluate, train, TrainConfig, pair_loss
"""

__version__ = "0.1.0"

# Rebinding `benchmark` and `evaluate` to the functions (the submodules stay importable by their
# dotted names) gives the short spellings the README uses: robustbench_nacl.benchmark(model, ...).
from .benchmark import benchmark
from .data import load_dataset
from .encoders import create_encoder
from .evaluate import evaluate
from .foreign import load_encoder
from .leaderboard import render_leaderboard
from .losses import list_presets, pair_loss, resolve
from .probe import ProbeConfig, fit_linear_probe
from .suites import load_suite
from .trainer import TrainConfig, train

__all__ = [
    "ProbeConfig",
    "TrainConfig",
    "__version__",
    "benchmark",
    "create_encoder",
    "evaluate",
    "fit_linear_probe",
    "list_presets",
    "load_dataset",
    "load_encoder",
    "load_suite",
    "pair_loss",
    "render_leaderboard",
    "resolve",
    "train",
]
