"""What a finished run writes into ``manifest.json``, and the run's identity (id and hashes).

A run's *training configuration* (:func:`training_config`) is everything that determines its weights:
every :class:`TrainConfig` field except the ones that cannot change them (:data:`NOT_TRAINING`), with
the loss given by its resolved parameters rather than by the ``--set`` overrides and the dataset by
its canonical spec, plus the fixed parts of the recipe (optimizer, ``drop_last``). Its sha256 over
:func:`robustbench_nacl.io.canonical_json` is ``config_sha256``; the same without the seed is
``recipe_sha256`` (runs that differ only in their seed: one recipe). The default checkpoint id ends
in the first :data:`ID_HASH_CHARS` hex digits of ``config_sha256``, so two configurations never
share an id (see docs/decisions.md, 'Checkpoint ids and recipes').

Code that is not this package's enters the configuration too (see docs/decisions.md, 'Plugins'):
``plugins`` lists the plugins (module, version, sha256 of the source) that provide the loss preset,
its objective and the encoder, present only when there is one (so the identity of every run
without plugins is what it always was); a ``timm:NAME`` encoder adds the installed ``timm``
version. The manifest itself records every plugin loaded in the training process.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

from .. import losses, plugins
from ..accel import EAGER
from ..data import canonical_spec, normalization
from ..io import canonical_json, sha256_bytes
from ..models.checkpoint import WEIGHTS, read_manifest, resolve_manifest_path
from ..models.encoders import ENCODERS
from ..models.timm_encoder import TIMM_PREFIX
from ..utils import versions
from . import optim
from .config import TrainConfig

#: TrainConfig fields left out of the training configuration: the id itself, where the data files
#: live (not what they hold), the kNN and probe monitors (they only read the encoder and draw from no
#: training RNG: the weights are the same bits whatever they are set to; tested), and the overrides
#: (the resolved loss parameters stand in); ``compile`` too (how the steps ran, like the device).
NOT_TRAINING = ("id", "data_root", "knn_every", "knn_k", "knn_t", "monitor_probe", "overrides", "compile")
#: hex digits of ``config_sha256`` in a default checkpoint id (32 bits: a collision among a few
#: hundred runs has a probability of about 1e-5)
ID_HASH_CHARS = 8
OPTIMIZER = "adam"  # Adam, no schedule (the CLAE/NaCl recipe): TrainConfig's default


def optimizer_recipe(cfg: TrainConfig) -> dict[str, Any]:
    """The optimizer's and schedule's resolved settings, for a run that is not Adam with a constant lr
    (empty for one that is: its configuration, and hash, stay what they always were). Resolved, so
    that a setting given at its default and one left out are one recipe."""
    out: dict[str, Any] = {}
    if cfg.optimizer != OPTIMIZER or cfg.optimizer_kwargs:
        out["optimizer_kwargs"] = optim.optimizer_settings(cfg.optimizer, cfg.optimizer_kwargs)
    if cfg.schedule != optim.DEFAULT_SCHEDULE or cfg.schedule_kwargs:
        out["schedule"] = cfg.schedule
        out["schedule_kwargs"] = optim.schedule_settings(cfg.schedule, cfg.schedule_kwargs)
    return out


def training_config(
    cfg: TrainConfig, params: losses.LossParams | None = None, *, bn_shards: int = 1
) -> dict[str, Any]:
    """Everything that determines the weights, as plain JSON (``params``: resolved from ``cfg`` if None).

    ``bn_shards``: into how many shards BatchNorm splits each batch (a multi-process run without
    ``--sync-bn``); recorded as ``per_rank_batchnorm`` only when > 1 (docs/decisions.md,
    'Distributed training').
    """
    params = params if params is not None else losses.resolve(cfg.loss, cfg.overrides)
    out = {k: v for k, v in cfg.to_dict().items() if k not in NOT_TRAINING}
    out["dataset"] = canonical_spec(cfg.dataset)  # digits:0,1,2 and digits:0-2 are one dataset
    # lr=1 and lr=1.0 are one setting: the JSON must not depend on the number's Python type
    out.update(lr=float(cfg.lr), weight_decay=float(cfg.weight_decay))
    out.update(loss_params=_loss_params_identity(params), optimizer=cfg.optimizer, drop_last=True)
    out.update(optimizer_recipe(cfg))
    used = recipe_plugins(cfg, params)
    if used:  # only when present: the configuration (and hash) of a run without plugins is unchanged
        out["plugins"] = used
    if cfg.encoder.startswith(TIMM_PREFIX):
        out["timm"] = _timm_version()  # timm's architectures change between releases
    if bn_shards > 1:  # BatchNorm statistics over batch_size / bn_shards images: another recipe
        out["per_rank_batchnorm"] = bn_shards
    return out


def _loss_params_identity(params: losses.LossParams) -> dict[str, Any]:
    """The resolved loss parameters, with a DeACL teacher named by what it is rather than where it
    lies: its ``recipe_sha256`` (the weights' sha256 for a checkpoint without one). The seeds of one
    zoo entry, each distilling its own seed's teacher, are then one recipe, as are copies of a run
    made on machines with other paths (the manifest's ``teacher`` block keeps path, id and sha256)."""
    out = params.to_dict()
    teacher = params.extra_params().get("teacher")
    if teacher:
        recorded = read_manifest(resolve_manifest_path(str(teacher)))
        key = "recipe_sha256" if recorded.get("recipe_sha256") else "weights_sha256"
        out["extra"] = {**out["extra"], "teacher": {key: recorded.get(key)}}
    return out


def recipe_plugins(cfg: TrainConfig, params: losses.LossParams) -> list[dict[str, Any]]:
    """The plugins providing the run's loss preset, objective and encoder: ``[{module, version,
    sha256}, ...]`` sorted by module; empty for built-in ones."""
    modules = [losses.PRESETS.get(cfg.loss).module if cfg.loss in losses.PRESETS else None]
    if params.objective in losses.OBJECTIVES:
        modules.append(getattr(losses.OBJECTIVES.get(params.objective).loss, "__module__", None))
    if cfg.encoder in ENCODERS:
        modules.append(ENCODERS.info(cfg.encoder).get("module"))
    found = {p.module: p.record() for m in modules if (p := plugins.plugin_of(m)) is not None}
    return [found[m] for m in sorted(found)]


def _timm_version() -> str:
    try:
        return importlib.metadata.version("timm")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def config_sha256(training: dict[str, Any]) -> str:
    """sha256 of a training configuration's canonical JSON."""
    return sha256_bytes(canonical_json(training).encode())


def recipe_sha256(training: dict[str, Any]) -> str:
    """sha256 of a training configuration without its seed: the same for every seed of one recipe."""
    return config_sha256({k: v for k, v in training.items() if k != "seed"})


def run_id(cfg: TrainConfig, params: losses.LossParams | None = None, *, bn_shards: int = 1) -> str:
    """``cfg.id``, or ``<encoder>.<preset>_<dataset>_s<seed>_<hash>`` (the canonical dataset spec
    made filename-safe).

    ``<hash>`` is the start of :func:`config_sha256` of :func:`training_config`: configurations that
    differ in anything that changes the weights (encoder width, a ``--set`` override, lr, ...) get
    different ids, identical ones the same.
    """
    if cfg.id:
        return cfg.id
    training = training_config(cfg, params, bn_shards=bn_shards)
    ds = training["dataset"].replace(":", "-").replace("@", "+").replace(",", "_")
    digest = config_sha256(training)[:ID_HASH_CHARS]
    # the id names a folder: timm:NAME (and a hub name's "/") must not reach the file system
    encoder = cfg.encoder.replace(":", "-").replace("/", "-")
    return f"{encoder}.{cfg.loss}_{ds}_s{cfg.seed}_{digest}"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What the run measured and wrote, for the manifest."""

    in_channels: int
    input_size: tuple[int, int]
    num_classes: int
    weights_sha256: str
    device: str
    wall_s: float
    knn_acc: float | None
    knn_acc_init: float | None  # the same encoder before training (epoch 0)
    compile: str = EAGER  # the step's path (accel.CompilePlan.label): recorded beside the device


def build_manifest(
    cfg: TrainConfig,
    params: losses.LossParams,
    outcome: RunOutcome,
    *,
    distributed: dict[str, Any] | None = None,
    bn_shards: int = 1,
) -> dict[str, Any]:
    """The content of ``manifest.json`` (see the module docstring for the identity keys).

    ``distributed``: the process group's block (world size, backend, ...), present only for a run
    trained under one; ``bn_shards`` as in :func:`training_config`.
    """
    need = losses.needs(params)
    training = training_config(cfg, params, bn_shards=bn_shards)
    manifest = {
        "id": run_id(cfg, params, bn_shards=bn_shards),
        "encoder": cfg.encoder,
        "encoder_kwargs": cfg.encoder_kwargs,
        "in_channels": outcome.in_channels,
        "input_size": list(outcome.input_size),
        "num_classes": outcome.num_classes,
        "dual_bn": need.adversarial and params.dual_bn,
        "head": params.head,
        "loss": cfg.loss,
        "loss_params": params.to_dict(),
        "needs": dataclasses.asdict(need),
        "dataset": cfg.dataset,
        "recipe": _recipe_summary(cfg, params),
        "seed": cfg.seed,
        "epochs": cfg.epochs,
        "normalization": dict(zip(("mean", "std"), normalization(cfg.dataset), strict=True)),
        "weights": WEIGHTS,
        "weights_sha256": outcome.weights_sha256,
        "versions": versions(),
        "plugins": plugins.loaded_plugins(),  # every plugin of the training process
        "device": outcome.device,
        "wall_s": round(outcome.wall_s, 3),
        "knn_acc": outcome.knn_acc,
        "knn_acc_init": outcome.knn_acc_init,
        "knn": {"k": cfg.knn_k, "t": cfg.knn_t, "split": "test"},
        "config": cfg.to_dict(),
        "training_config": training,
        "config_sha256": config_sha256(training),
        "recipe_sha256": recipe_sha256(training),
    }
    if distributed is not None:
        manifest["distributed"] = distributed
    if outcome.compile != EAGER:  # only then: every eager manifest is what it was
        manifest["compile"] = outcome.compile
    teacher = params.extra_params().get("teacher")
    if teacher:  # DeACL: the stage-1 checkpoint the student was distilled from, by content
        recorded = read_manifest(resolve_manifest_path(str(teacher)))
        manifest["teacher"] = {
            "checkpoint": str(teacher),
            "id": recorded.get("id"),
            "loss": recorded.get("loss"),
            "weights_sha256": recorded.get("weights_sha256"),
        }
    eval_bn = params.extra_params().get("eval_bn", "clean")
    if manifest["dual_bn"] and eval_bn != "clean":  # only then: every other manifest is unchanged
        manifest["eval_bn_route"] = eval_bn  # the BatchNorm branch evaluations use (ACL: the adversarial one)
    return manifest


def _recipe_summary(cfg: TrainConfig, params: losses.LossParams) -> dict[str, Any]:
    # the optimisation settings at a glance (zoo manifests use the same keys); the complete
    # configuration is ``training_config``
    return {
        "epochs": cfg.epochs,
        "batch_size": cfg.batch_size,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        **optimizer_recipe(cfg),
        "augmentation": params.views,
        "fuse_views": cfg.fuse_views,
        "precision": cfg.precision,
        "channels_last": cfg.channels_last,
        "drop_last": True,
    }
