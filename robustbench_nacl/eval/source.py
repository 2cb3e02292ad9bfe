"""The thing evaluated, loaded: a checkpoint on disk or an in-memory ``nn.Module`` -> (encoder,
:class:`CheckpointInfo`), and the untrained encoder of its random-initialisation control."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn

from ..data import DatasetSpec, parse_spec
from ..errors import UserError
from ..io import sha256_bytes
from ..models.encoders import materialize_lazy
from ..models.factory import create_encoder
from ..models.foreign import NORMALIZATIONS, load_encoder
from ..registry import unknown_choice

__all__ = [
    "IN_MEMORY",
    "CheckpointInfo",
    "NormalizedModule",
    "in_memory_encoder",
    "load_source",
    "random_init_like",
    "state_dict_sha256",
]

#: ``CheckpointInfo.format`` (and the rows' ``checkpoint_format``) of an evaluated ``nn.Module``
IN_MEMORY = "module"


@dataclass(frozen=True)
class CheckpointInfo:
    """What evaluation reads about the encoder it evaluates: ``load_encoder``'s info (the manifest's
    fields for a checkpoint written by ``train``), or what describes an in-memory module."""

    source: str  # what rows call ``checkpoint``: the path given, or ``in-memory:<name>``
    format: str  # "ours", a foreign layout, or IN_MEMORY
    sha256: str  # of the weights evaluated
    encoder: str  # the architecture (an in-memory module's class)
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint_id: str | None = None  # the manifest's id; None: named after the file
    loss: str = "foreign"
    loss_params: Any = None
    dataset: str | None = None  # the pretraining dataset, as the manifest spells it
    seed: Any = None  # training seed and epochs, as the manifest records them
    epochs: Any = None
    training_config: Any = None  # the manifest's recipe (see recipe.recipe_of)
    config: Any = None  # an older manifest's whole TrainConfig
    plugins: Any = None  # the plugins the training process loaded
    normalize: Any = None  # an in-memory module: {"mean", "std"} put in front of it, or None
    module_class: str | None = None  # an in-memory module's class and its own state dict's sha256
    module_sha256: str | None = None

    @classmethod
    def from_info(cls, info: Mapping[str, Any], source: str = "") -> CheckpointInfo:
        """From ``load_encoder``'s info dict (keys it lacks take the defaults above)."""
        return cls(
            source=source,
            format=info.get("format", "ours"),
            sha256=info["sha256"],
            encoder=info["encoder"],
            encoder_kwargs=dict(info.get("encoder_kwargs") or {}),
            **{k: info.get(k, f.default) for k, f in _OPTIONAL.items()},
        )


_OPTIONAL = {
    f.name: f
    for f in CheckpointInfo.__dataclass_fields__.values()
    if f.name not in ("source", "format", "sha256", "encoder", "encoder_kwargs")
}


def load_source(
    checkpoint: str | Path | nn.Module,
    dataset: str | DatasetSpec | None,
    *,
    arch: str | None,
    fmt: str,
    normalize: Any,
    name: str | None,
) -> tuple[nn.Module, CheckpointInfo]:
    """(encoder, info) of a checkpoint on disk or an in-memory module; ``info.source`` names it."""
    if isinstance(checkpoint, nn.Module):
        if arch is not None or fmt != "auto":
            raise UserError("arch and fmt describe a checkpoint file; an in-memory module takes neither")
        return in_memory_encoder(checkpoint, dataset, name=name, normalize=normalize)
    if name is not None:
        raise UserError("name= labels an in-memory module; a checkpoint is named by its manifest or file")
    if normalize is not None and not isinstance(normalize, str):
        raise UserError("normalize= for a checkpoint file is a name: cifar10 | half | imagenet | none")
    encoder, info = load_encoder(checkpoint, arch=arch, fmt=fmt, normalize=normalize)
    return encoder, CheckpointInfo.from_info(info, source=str(checkpoint))


def random_init_like(encoder: nn.Module, info: CheckpointInfo | Mapping[str, Any], seed: int) -> nn.Module:
    """An untrained encoder of the same architecture and normalisation (the random-init control);
    ``info`` is the checkpoint's (``load_encoder``'s dict is read as :meth:`CheckpointInfo.from_info`).

    Its weights come from ``seed`` alone; the caller's global RNG is forked, not reseeded.
    """
    if not isinstance(info, CheckpointInfo):
        info = CheckpointInfo.from_info(info)
    with torch.random.fork_rng(devices=[]):  # built on the CPU: only the CPU generator is used
        torch.manual_seed(seed)
        fresh = create_encoder(
            info.encoder,
            in_channels=int(encoder.mean.shape[1]),
            mean=encoder.mean.flatten().tolist(),
            std=encoder.std.flatten().tolist(),
            input_shape=getattr(encoder, "input_shape", None),
            **info.encoder_kwargs,
        )
    return fresh.to(next(encoder.parameters()).device).eval()


def weights_sha256(encoder: nn.Module) -> str:
    """sha256 of an encoder's state dict as ``train`` writes it (safetensors, contiguous CPU tensors)."""
    return sha256_bytes(st_save({k: v.contiguous().cpu() for k, v in encoder.state_dict().items()}))


# ============ in-memory modules ============


class NormalizedModule(nn.Module):
    """``module((x - mean) / std)``: an input normalisation in front of a user's module.

    ``mean``/``std`` are buffers, so the state dict (and its sha256) covers them.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, module: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.module = module
        self.register_buffer("mean", torch.tensor([float(v) for v in mean]).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor([float(v) for v in std]).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module((x - self.mean) / self.std)


def state_dict_sha256(module: nn.Module) -> str:
    """sha256 of a module's state dict serialised as safetensors (the format checkpoints use)."""
    # clones: safetensors refuses tensors that share storage (tied weights)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    return sha256_bytes(st_save(state))


def _normalization(
    normalize: Any, dataset: DatasetSpec, spelled: str
) -> tuple[list[float], list[float]] | None:
    """The (mean, std) ``normalize=`` names or gives, checked against the channels of ``dataset``
    (``spelled`` as the caller wrote it, for the message)."""
    if normalize is None:
        return None
    if isinstance(normalize, str):
        if normalize not in NORMALIZATIONS:
            raise unknown_choice("normalization", normalize, NORMALIZATIONS)
        normalize = NORMALIZATIONS[normalize]
    try:
        mean, std = ([float(v) for v in part] for part in normalize)
    except (TypeError, ValueError):
        raise UserError("normalize= must be a name or a pair (mean, std) of per-channel numbers") from None
    channels = dataset.channels
    for what, values in (("mean", mean), ("std", std)):
        if len(values) not in (1, channels):
            raise UserError(f"normalize {what} has {len(values)} values; {spelled} has {channels} channel(s)")
    if min(std) <= 0:
        raise UserError(f"normalize std must be positive, got {std}")
    return mean, std


def in_memory_encoder(
    module: nn.Module, dataset: str | DatasetSpec | None, *, name: str | None = None, normalize: Any = None
) -> tuple[nn.Module, CheckpointInfo]:
    """(encoder, info) for evaluating ``module`` (images in [0,1] -> features) as it is in memory.

    The module is copied, so evaluation never moves, converts or re-modes the caller's (only its lazy
    layers, if any, are materialised first, in place, as its own first forward would). ``normalize``
    (a name such as ``"cifar10"``, or ``(mean, std)``) puts that normalisation in front of it.
    Its rows name it ``name`` (default: the class name), as checkpoint id and loss family, and
    record its class and the sha256 of its state dict; their recipe is (class, state dict sha256).
    """
    if not dataset:
        raise UserError("evaluate(module, dataset=...): an in-memory module needs the dataset to probe on")
    cls = type(module)
    label = str(name or cls.__name__).strip()
    if not label or any(c in label for c in "/\\:") or label.startswith("."):
        raise UserError(f"name {label!r}: give a short label without path separators or ':'")
    spec = parse_spec(dataset)
    ds = spec.info
    # lazy layers get their shapes now, in the caller's module (as its own first forward would do):
    # a module without weights has no state dict to hash, copy or probe
    materialize_lazy(module, (int(ds["channels"]), int(ds["size"]), int(ds["size"])))
    module_sha = state_dict_sha256(module)
    encoder = copy.deepcopy(module)
    stats = _normalization(normalize, spec, str(dataset))
    if stats is not None:
        encoder = NormalizedModule(encoder, *stats)
    qualname = f"{cls.__module__}.{cls.__qualname__}"
    info = CheckpointInfo(
        source=f"in-memory:{label}",
        format=IN_MEMORY,
        checkpoint_id=label,
        loss=label,
        encoder=qualname,
        module_class=qualname,
        module_sha256=module_sha,  # the caller's state dict
        sha256=state_dict_sha256(encoder),  # what is evaluated (the normalisation included)
        normalize=None if stats is None else {"mean": stats[0], "std": stats[1]},
    )
    return encoder, info
