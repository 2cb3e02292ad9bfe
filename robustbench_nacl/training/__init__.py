"""Training: the config (:mod:`.config`), one optimisation step (:mod:`.step`), the resumable loop
(:mod:`.loop`) and what a finished run writes (:mod:`.manifest`)."""

from .config import TrainConfig, check_settings, check_train_size
from .loop import train
from .manifest import build_manifest, config_sha256, recipe_sha256, run_id, training_config
from .step import TrainStep, build_model

__all__ = [
    "TrainConfig",
    "TrainStep",
    "build_manifest",
    "build_model",
    "check_settings",
    "check_train_size",
    "config_sha256",
    "recipe_sha256",
    "run_id",
    "train",
    "training_config",
]
