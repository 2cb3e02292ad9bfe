"""Loading an encoder for evaluation from any checkpoint: :func:`load_encoder`, the one entry point,
and :func:`load_foreign_encoder`, a foreign file read strictly into a registered encoder (``--arch``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import CheckpointError, UserError
from ..checkpoint import load_strict, resolve_manifest_path
from ..factory import create_encoder
from ..timm_encoder import TIMM_PREFIX, TimmEncoder
from .formats import FORMATS, check_format, detect_format
from .layout import strip_wrappers
from .normalization import DEFAULT_NORMALIZE, pick_normalization
from .ours import load_ours, sibling_manifest
from .reading import describe_file, read_checkpoint, read_head, refuse_non_checkpoint
from .solo import read_solo_args, solo_normalization, solo_stem, with_stem


def fill_num_batches_tracked(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Add the BatchNorm counters ``state`` lacks for layers whose statistics it has (zeros)."""
    # Old (pre-0.4.1) checkpoints and some converters lack BatchNorm's num_batches_tracked. It only
    # matters in train mode with momentum=None, never for eval outputs, so fill it in rather than
    # fail; only for BatchNorms whose statistics are present, so a missing layer is still reported.
    for key, value in module.state_dict().items():
        stats = key[: -len("num_batches_tracked")] + "running_mean"
        if key.endswith("num_batches_tracked") and key not in state and stats in state:
            state[key] = torch.zeros_like(value)


def _detect(p: Path, state: Mapping[str, Tensor], fmt: str, arch: str) -> str:
    """The layout of ``state``: ``fmt`` itself, else detected; a timm file keeps timm's own names."""
    if fmt != "auto":
        return fmt
    try:
        return detect_format(state)
    except CheckpointError as e:  # the layout error names keys; say which file holds them
        if not arch.startswith(TIMM_PREFIX):
            raise CheckpointError(f"{p}: {e}") from None
    return "timm"


def stem_channels(state: dict[str, Any], default: int = 3) -> int:
    """Input channels of a state dict saved in module order: those of its first convolution kernel
    (a 1-channel Fashion-MNIST/digits network has ``(out, 1, k, k)`` there), else ``default``."""
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 4:
            return int(value.shape[1])
    return default


def load_foreign_encoder(
    path: str | Path,
    *,
    arch: str,
    fmt: str = "auto",
    normalize: str | None = DEFAULT_NORMALIZE,
    in_channels: int | None = None,
    input_shape: tuple[int, int, int] | None = None,
    **encoder_kwargs: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """Load a foreign state dict into the registered encoder ``arch``, strictly; returns (encoder, info).

    ``normalize`` names the input normalisation the weights were trained with (foreign files do not
    carry it); ``None`` takes it from the file when it has one (layout "ours"; solo-learn's args.json
    naming a dataset of :data:`SOLO_NORMALIZATIONS`), else "cifar10".
    ``encoder_kwargs`` go to :func:`create_encoder` (e.g. ``width``); a solo-learn file adds the
    stem it was built with (``stem_padding``). The encoder is in eval mode.
    info: sha256 (of the file), format, arch, normalize, path, n_tensors (in the file), stem (solo-learn
    only), plus encoder, encoder_kwargs, in_channels, mean, std and dual_bn (False) for rebuilding
    the same architecture.
    """
    check_format(fmt)
    p = Path(path)
    state, sha = read_checkpoint(p)
    explicit, fmt = fmt != "auto", _detect(p, state, fmt, arch)
    layout = FORMATS.get(fmt)
    stripped = strip_wrappers(state)
    run = read_solo_args(p) if fmt == "solo-learn" else None
    from_file = layout.normalization(stripped)
    if from_file is None and normalize is None and layout.ask_normalization:
        raise CheckpointError(
            f"{p} ({fmt} layout) carries no input normalisation: {layout.ask_normalization}"
        )
    normalize, mean, std = pick_normalization(from_file, normalize, solo_normalization(run))
    try:
        backbone_state = layout.convert(stripped)
    except CheckpointError as e:
        raise CheckpointError(f"{p}: {e}") from None
    stem: dict[str, Any] = {}
    if fmt == "solo-learn":
        options, stem["stem"] = solo_stem(p, run, arch, backbone_state, explicit)
        encoder_kwargs = with_stem(encoder_kwargs, options, p)
    if in_channels is None:
        # timm files keep the module order of torch.save, stem first; our ResNet layouts are RGB
        in_channels = stem_channels(backbone_state) if arch.startswith(TIMM_PREFIX) else 3
    if len(mean) not in (1, in_channels):
        raise CheckpointError(
            f"{p} is a {in_channels}-channel network but normalisation {normalize!r} has {len(mean)} "
            "channels; pass --normalize none, or a normalisation with one value per channel"
        )
    encoder = create_encoder(
        arch, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape, **encoder_kwargs
    )
    if isinstance(encoder, TimmEncoder):
        for key in encoder.classifier_keys(backbone_state):
            del backbone_state[key]
    fill_num_batches_tracked(encoder.backbone, backbone_state)
    load_strict(encoder.backbone, backbone_state, f"{p} ({fmt} layout, --arch {arch})")
    encoder.eval()
    return encoder, {
        "sha256": sha,
        "format": fmt,
        "arch": arch,
        "normalize": normalize,
        "path": str(p),
        "n_tensors": len(state),
        **stem,
        "encoder": arch,
        "encoder_kwargs": dict(encoder_kwargs),
        "in_channels": in_channels,
        "mean": encoder.mean.flatten().tolist(),
        "std": encoder.std.flatten().tolist(),
        "dual_bn": False,
    }


def load_encoder(
    checkpoint: str | Path,
    *,
    arch: str | None = None,
    fmt: str = "auto",
    normalize: str | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """One entry point for evaluation: any checkpoint -> (encoder in eval mode, info).

    A directory written by ``train``, its manifest.json, or the weights file a manifest beside it
    describes, is rebuilt from the manifest (sha256 verified; info holds the manifest's fields plus
    checkpoint_id and sha256). Any other file is foreign and needs ``arch``
    (see :func:`load_foreign_encoder`; ``normalize=None`` -> the file's own, else "cifar10").
    """
    check_format(fmt)
    p = Path(checkpoint)
    if not p.exists():
        raise CheckpointError(
            f"checkpoint {p} not found; pass a directory written by `train` or a weights file"
        )
    if p.is_dir() or p.suffix == ".json":
        return load_ours(resolve_manifest_path(p), arch=arch, fmt=fmt, normalize=normalize)
    sibling = sibling_manifest(p)
    if sibling is not None:
        return load_ours(sibling, arch=arch, fmt=fmt, normalize=normalize)
    head = read_head(p)
    refuse_non_checkpoint(p, head)  # a text file is not "a foreign checkpoint"
    if arch is None:
        raise UserError(
            f"{p} is {describe_file(head)[1]} without a manifest.json beside it, so a foreign "
            "checkpoint: pass --arch (one of the encoders, e.g. resnet18_cifar, or timm:NAME) to load it"
        )
    return load_foreign_encoder(p, arch=arch, fmt=fmt, normalize=normalize)
