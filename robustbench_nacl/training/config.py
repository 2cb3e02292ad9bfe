"""What determines a training run (:class:`TrainConfig`) and the checks on it.

:func:`check_settings` needs no data and runs before anything is loaded or written;
:func:`check_train_size` runs once the training set's size is known.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ..accel import check_compile
from ..data import DatasetSpec, parse_spec
from ..errors import UserError
from ..models.factory import check_encoder
from ..models.features import check_knn
from ..untrusted import int64, safe_name
from .optim import check_recipe

#: fields added after runs were recorded: absent from :meth:`TrainConfig.to_dict` at these defaults
#: (the monitor's probe off; Adam with a constant lr, the only recipe there was)
RECORDED_WHEN_SET: dict[str, Any] = {
    "monitor_probe": False,
    "optimizer": "adam",
    "optimizer_kwargs": {},
    "schedule": "constant",
    "schedule_kwargs": {},
}
#: fields that choose how a run is computed, never what: absent from :meth:`TrainConfig.to_dict` (the
#: recorded configuration, its hash and the resume checks); the manifest records what ran beside the
#: device (``compile``, see robustbench_nacl/accel.py)
EXECUTION_ONLY = ("compile",)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (checked on resume, recorded in the manifest)."""

    loss: str = "simclr"  # a preset name (losses.PRESETS)
    overrides: dict[str, Any] = field(default_factory=dict)  # --set k=v on top of the preset
    dataset: str = "digits"
    encoder: str = "convnet_small"
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"width": 16}
    epochs: int = 10
    batch_size: int = 256
    lr: float = 3e-4  # base learning rate (CLAE/NaCl recipe: Adam 3e-4, no schedule, no weight decay)
    weight_decay: float = 0.0
    optimizer: str = "adam"  # adam | sgd | lars | torchlars | lars_solo (training.optim.OPTIMIZERS)
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"momentum": 0.9, "eta": 0.001}
    # learning-rate schedule: constant | cosine | warmup_cosine | gradual_warmup_cosine (training.optim)
    schedule: str = "constant"
    schedule_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"warmup_epochs": 10}
    seed: int = 0
    fuse_views: bool = False  # one forward for all views (changes BatchNorm statistics)
    knn_every: int = 5  # kNN monitor every N epochs, at epoch 0 and after the last (0: only the last)
    knn_k: int = 200
    knn_t: float = 0.1
    # also a quick linear probe at the kNN monitor's epochs (train_probe_acc, test_probe_acc in log.jsonl)
    monitor_probe: bool = False
    precision: str = "fp32"  # "fp32" | "bf16" (autocast; the loss itself is always fp32)
    channels_last: bool = True  # NHWC convolutions: 1.2-1.6x faster training steps on CPU (bench/)
    # torch.compile the step (off | auto: on CUDA only | on); not part of the run's identity
    compile: str = "auto"
    data_root: str | None = None
    max_train: int | None = None  # use only the first N training images (documented demo budgets)
    # checkpoint id; default <encoder>.<preset>_<dataset>_s<seed>_<config hash> (train.manifest.run_id)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the fields of :data:`RECORDED_WHEN_SET` only when not at their default, so
        that the recorded configuration of every run without them (manifest ``config``, the resume
        checks against it, the configuration hash) is what it always was."""
        out = dataclasses.asdict(self)
        for name in EXECUTION_ONLY:
            del out[name]
        for name, default in RECORDED_WHEN_SET.items():
            if out[name] == default:
                del out[name]
        return out

    @functools.cached_property
    def spec(self) -> DatasetSpec:
        """``dataset`` parsed, once (the string stays the field: it is what the manifest records)."""
        return parse_spec(self.dataset)


def check_settings(cfg: TrainConfig) -> None:
    """One-line :class:`UserError` for a setting that is wrong whatever the data."""
    # before anything is loaded or written: torch's optimizers raise a bare ValueError for a bad lr,
    # and a NaN would pass it
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UserError(f"--lr {cfg.lr}: must be a finite number > 0")
    if not (math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0):
        raise UserError(f"--weight-decay {cfg.weight_decay}: must be a finite number >= 0")
    if cfg.precision not in ("fp32", "bf16"):
        raise UserError(f"--precision {cfg.precision!r}; valid choices: fp32, bf16")
    check_compile(cfg.compile)
    if cfg.epochs < 1:
        raise UserError(f"--epochs {cfg.epochs}: must be >= 1")
    if cfg.batch_size < 2:
        raise UserError(f"--batch-size {cfg.batch_size}: a contrastive batch needs at least 2 images")
    if cfg.max_train is not None and cfg.max_train < 2:
        raise UserError(f"--max-train {cfg.max_train}: must be >= 2")
    if cfg.knn_every < 0:
        raise UserError(f"--knn-every {cfg.knn_every}: must be >= 0")
    try:  # the monitor's settings, checked here: the monitor first runs after an epoch's work
        check_knn(cfg.knn_k, cfg.knn_t)
    except ValueError as e:
        raise UserError(f"--knn-k/--knn-t: {e}") from None
    int64(cfg.seed, "--seed", low=0)
    if cfg.id is not None:
        safe_name(cfg.id, "--id")  # it names the checkpoint's card (eval --card) and zoo folders
    check_encoder(cfg.encoder)  # an unknown name (or timm missing) before any data is loaded
    check_recipe(cfg.optimizer, cfg.optimizer_kwargs, cfg.schedule, cfg.schedule_kwargs, epochs=cfg.epochs)


def check_train_size(cfg: TrainConfig, n_train: int) -> None:
    """One-line :class:`UserError` when one batch needs more images than the training set has."""
    if cfg.batch_size > n_train:
        raise UserError(
            f"--batch-size {cfg.batch_size} exceeds the {n_train} training images of {cfg.dataset}"
        )
