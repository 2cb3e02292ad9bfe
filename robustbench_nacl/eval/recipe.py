"""The checkpoint and recipe fields every row of one evaluation carries: which weights were
evaluated, what trained them (:func:`recipe_of`), and the plugins involved."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import plugins
from ..data import canonical_spec
from ..errors import UserError
from ..models.checkpoint import portable_loss_params, read_manifest
from ..packaged import published_dir
from ..results.rows import KEY_PARAMS, ROW_FORMAT
from .source import IN_MEMORY, CheckpointInfo, random_init_like, weights_sha256

__all__ = ["NOT_RECIPE", "checkpoint_fields", "key_params", "recipe_of", "row_plugins"]

# Training-config fields that are not part of a recipe (for manifests without ``training_config``,
# which leaves out the same ones): the seed (seeds are what a recipe is averaged over), the run's
# name, where the data lives, the kNN monitor (it only reads features), and the preset overrides
# (the resolved loss_params, which they produce, are in the recipe).
NOT_RECIPE = ("seed", "id", "data_root", "knn_every", "knn_k", "knn_t", "overrides")


def key_params(loss_params: dict[str, Any] | None) -> str:
    """Compact description of a recipe's loss parameters (those differing from SimCLR's)."""
    if not loss_params:
        return ""
    from ..losses import LossParams

    default = LossParams().to_dict()
    parts = [
        f"{k}={loss_params[k]}" for k in KEY_PARAMS if k in loss_params and loss_params[k] != default.get(k)
    ]
    # a plugin loss's own parameters (SimCLR has none, so every one is shown)
    extra = loss_params.get("extra") or {}
    pairs = extra.items() if isinstance(extra, dict) else (tuple(kv) for kv in extra)
    parts += [f"{k}={_shown(v)}" for k, v in pairs]
    return " ".join(parts)


def _shown(value: Any) -> Any:
    """A parameter as the leaderboard shows it: an absolute path (DeACL's ``teacher``) by its last
    component, the checkpoint's folder name (its zoo id), not a path of the machine that ran it; a
    teacher named by id and sha256 (a published manifest's, hub/portable.py) by its id."""
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return value["id"]
    if isinstance(value, str) and Path(value).is_absolute():
        return Path(value).name
    return value


def recipe_of(info: CheckpointInfo, *, encoder: nn.Module, control: bool) -> dict[str, Any]:
    """What ``recipe_id`` hashes (see docs/decisions.md, 'Result rows, recipes and protocols').

    A checkpoint written by ``train``: its training configuration without the seed (the manifest's
    ``training_config``; from its ``config`` for older manifests, minus NOT_RECIPE), with the dataset
    spec canonical. A random-init control: the architecture, normalisation and pretraining dataset.
    Anything else (a foreign file, a manifest without a configuration): the weights' sha256.
    """
    if control:
        pretrain = info.dataset
        return {
            "kind": "random-init",
            "encoder": info.encoder,
            "encoder_kwargs": dict(info.encoder_kwargs),
            "in_channels": int(encoder.mean.shape[1]),
            "input_shape": list(getattr(encoder, "input_shape", None) or []),
            "mean": encoder.mean.flatten().tolist(),
            "std": encoder.std.flatten().tolist(),
            "pretrain_dataset": canonical_spec(pretrain) if pretrain else None,
        }
    if info.format == IN_MEMORY:
        return {
            "kind": "module",
            "class": info.module_class,
            "state_dict_sha256": info.module_sha256,
            "normalize": info.normalize,
        }
    training, config = info.training_config, info.config
    if info.format != "ours" or not isinstance(training or config, dict):
        return {"kind": "weights", "weights_sha256": info.sha256}
    if isinstance(training, dict):
        recipe = {k: v for k, v in training.items() if k != "seed"}
    else:  # a manifest written before training_config existed
        recipe = _training_config_of(config, info.loss_params)
    if isinstance(recipe.get("dataset"), str):
        recipe["dataset"] = canonical_spec(recipe["dataset"])
    return {"kind": "trained", "config": recipe}


def _training_config_of(config: dict[str, Any], loss_params: Any) -> dict[str, Any]:
    """An older manifest's ``config`` minus NOT_RECIPE, with the resolved loss parameters."""
    drop = NOT_RECIPE if isinstance(loss_params, dict) else tuple(k for k in NOT_RECIPE if k != "overrides")
    out = {k: v for k, v in config.items() if k not in drop} | {"loss_params": loss_params}
    for k in ("lr", "weight_decay"):  # lr=1 and lr=1.0 are one setting
        if isinstance(out.get(k), int):
            out[k] = float(out[k])
    return out


def checkpoint_fields(
    encoder: nn.Module, info: CheckpointInfo, *, control: bool, seed: int, dataset: str
) -> tuple[nn.Module, dict[str, Any]]:
    """The encoder to evaluate (the checkpoint's, or its random-init control) and the checkpoint
    and recipe fields every row of it carries (a control is named after the pretraining dataset,
    else ``dataset``, the evaluated one as the caller spelled it)."""
    sha = info.sha256
    ckpt_id = info.checkpoint_id or f"{info.encoder}.foreign-{Path(info.source).stem}"
    loss, loss_params = info.loss, info.loss_params
    if control:
        encoder = random_init_like(encoder, info, seed)
        sha = weights_sha256(encoder)
        # <encoder>.random-init_<dataset>_s<seed>, named like a zoo id
        ckpt_id = f"{info.encoder}.random-init_{_filename_safe(info.dataset or dataset)}_s{seed}"
        loss, loss_params = "random-init", None
    pretrain = info.dataset
    base = {
        "row_format": ROW_FORMAT,
        "checkpoint": ckpt_id if control else _source(info),
        "checkpoint_id": ckpt_id,
        "checkpoint_sha256": sha,
        "encoder": info.encoder,
        "loss": loss,
        "loss_params": portable_loss_params(loss_params, _teacher_block(info)),
        "key_params": key_params(loss_params),
        "control": control,
        "pretrain_dataset": canonical_spec(pretrain) if pretrain else None,
        "recipe": recipe_of(info, encoder=encoder, control=control),
        "train_seed": info.seed,
        "train_epochs": info.epochs,
        "checkpoint_format": info.format,
        "plugins": row_plugins(info),
        **({"module_class": info.module_class} if info.module_class is not None else {}),
        **({"module_sha256": info.module_sha256} if info.module_sha256 is not None else {}),
    }
    # NHWC convolutions: the same weights, 1.6-1.9x faster inference of convnet_small on CPU (and the
    # tensor-core layout on GPUs); NCHW inputs are accepted and the outputs follow the weights' format
    return encoder.to(memory_format=torch.channels_last), base


def _teacher_block(info: CheckpointInfo) -> Any:
    """The ``teacher`` block of the checkpoint's manifest (its id and sha256), None where it has none."""
    if info.format != "ours" or not isinstance(info.loss_params, dict):
        return None
    try:
        return read_manifest(info.source).get("teacher")
    except UserError:  # read once already by the loader: a vanished file names its teacher by folder
        return None


def _source(info: CheckpointInfo) -> str:
    """What rows call ``checkpoint`` (a random-init control's rows: the control's id): the path given,
    but a published model's as its path inside the package's published sets (``demo/models/NAME``),
    not the installation's folder, a download cache or a zoo's folder on this machine. A published
    model is one by location, or by content (a manifest id of a published model with its weights'
    sha256: a copy, or the zoo's own checkpoint of a published entry); hub/portable.py's rule, which
    rewrote the rows that ship."""
    with contextlib.suppress(ValueError, OSError):
        return Path(info.source).resolve().relative_to(published_dir().resolve()).as_posix()
    if info.format == "ours" and info.checkpoint_id:
        from ..hub.portable import published_index, published_reference

        found = published_reference(info.checkpoint_id, info.sha256, published_index())
        if found:
            return found
    return info.source


def row_plugins(info: CheckpointInfo) -> list[dict[str, Any]]:
    """The plugins a row records: those its checkpoint's training process loaded (the manifest's
    ``plugins``), then those this evaluation loaded; one record per (module, sha256)."""
    recorded = info.plugins
    records = [p for p in recorded if isinstance(p, dict)] if isinstance(recorded, list) else []
    records += plugins.loaded_plugins()
    seen: dict[tuple[Any, Any], dict[str, Any]] = {}
    for p in records:
        seen.setdefault((p.get("module"), p.get("sha256")), p)
    return list(seen.values())


def _filename_safe(spec: str) -> str:
    return str(spec).replace(":", "-").replace("@", "+").replace(",", "_")
