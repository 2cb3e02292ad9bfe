"""The ``solo-learn`` layout and its stem: a Lightning checkpoint's ``backbone.*`` beside heads,
momentum encoders and queues, and the network solo-learn built, read from its ``args.json``
(docs/decisions.md, 'Foreign checkpoints')."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ...errors import CheckpointError
from .layout import Layout, has_prefix
from .normalization import NORMALIZATIONS
from .reading import clean, first_line


def _solo_prefix(state: Mapping[str, Tensor]) -> str | None:
    if has_prefix(state, "backbone."):
        return "backbone."
    # solo-learn before mid-2021 called the backbone "encoder" (its own loader still renames it)
    if "encoder.conv1.weight" in state:
        return "encoder."
    return None


def _solo_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # projector.*, predictor.*, classifier.*, momentum_*, queue* ...: training-only, not the encoder
    prefix = _solo_prefix(state) or "backbone."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


LAYOUTS = (
    (
        Layout("solo-learn", lambda s: _solo_prefix(s) is not None, _solo_convert),
        "solo-learn Lightning ckpt: backbone.* (or legacy encoder.*); stem from its args.json; heads dropped",
    ),
)


# ============ the stem solo-learn built (args.json) ============

SOLO_ARGS = "args.json"
#: solo-learn's ResNets are torchvision's; these datasets get its CIFAR stem (solo/methods/base.py)
_SOLO_CIFAR = ("cifar10", "cifar100")
_SOLO_RESNETS = ("resnet18", "resnet50")
_SOLO_CIFAR_PADDING = 2  # solo-learn: nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False)
#: solo-learn's pretraining normalisation per dataset (solo/data/pretrain_dataloader.py, MEANS_N_STD)
SOLO_NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "stl10": ((0.4914, 0.4823, 0.4466), (0.247, 0.243, 0.261)),
    "imagenet100": NORMALIZATIONS["imagenet"],
    "imagenet": NORMALIZATIONS["imagenet"],
}


@dataclass(frozen=True)
class SoloRun:
    """What solo-learn's ``args.json`` says about the network it built."""

    backbone: str
    dataset: str
    cifar: bool
    source: str


def _nested(args: Mapping[str, Any], *path: str) -> Any:
    value: Any = args
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _first_str(args: Mapping[str, Any], *paths: tuple[str, ...]) -> str | None:
    for path in paths:
        value = _nested(args, *path)
        if isinstance(value, str):
            return value
    return None


def read_solo_args(checkpoint: str | Path) -> SoloRun | None:
    """solo-learn's ``args.json`` beside ``checkpoint`` (None when there is none).

    Recent versions write ``backbone: {name}`` and ``data: {dataset}``; older ones a flat
    ``backbone`` (``encoder`` before mid-2021) and ``dataset``, and a ``cifar`` flag in
    ``backbone_args`` (or at the top level), which wins when present since it built the network.
    A file that is there but names no backbone or dataset is a one-line ``CheckpointError``.
    """
    path = Path(checkpoint).parent / SOLO_ARGS
    if not path.is_file():
        return None
    try:
        args = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({first_line(e)})") from None
    backbone = _first_str(args, ("backbone", "name"), ("backbone",), ("encoder",))
    dataset = _first_str(args, ("data", "dataset"), ("dataset",))
    if not isinstance(args, Mapping) or backbone is None or dataset is None:
        raise CheckpointError(
            f"{path} names no solo-learn backbone and dataset (backbone.name and data.dataset, or "
            f"backbone and dataset in older versions), so the stem of {Path(checkpoint).name} is unknown"
        )
    flags = (_nested(args, "backbone_args", "cifar"), args.get("cifar"))
    flag = next((v for v in flags if isinstance(v, bool)), None)
    cifar = dataset in _SOLO_CIFAR if flag is None else flag
    return SoloRun(clean(backbone), clean(dataset), cifar, str(path))


def _solo_arch(run: SoloRun, arch: str, p: Path) -> None:
    """The registered encoder solo-learn's network is must be ``arch``; a one-line error otherwise."""
    if run.backbone not in _SOLO_RESNETS:
        raise CheckpointError(
            f"{p}: solo-learn backbone {run.backbone!r} (from {run.source}) is not supported; "
            f"only {' and '.join(_SOLO_RESNETS)} map to registered encoders"
        )
    expected = f"{run.backbone}_{'cifar' if run.cifar else 'imagenet'}"
    if arch != expected:
        raise CheckpointError(
            f"{p} is a solo-learn {run.backbone} trained on {run.dataset} (says {run.source}), "
            f"built as {expected}; pass --arch {expected}"
        )


def _conv1_kernel(state: Mapping[str, Tensor]) -> int | None:
    weight = state.get("conv1.weight")
    return int(weight.shape[-1]) if weight is not None and weight.dim() == 4 else None


def solo_normalization(run: SoloRun | None) -> tuple[str, list[float], list[float]] | None:
    """(name, mean, std) solo-learn pretrained with, when its args.json names a dataset it knows."""
    if run is None or run.dataset not in SOLO_NORMALIZATIONS:
        return None
    mean, std = SOLO_NORMALIZATIONS[run.dataset]
    return f"solo-learn:{run.dataset}", list(mean), list(std)


def solo_stem(
    p: Path, run: SoloRun | None, arch: str, state: Mapping[str, Tensor], explicit: bool
) -> tuple[dict[str, Any], str]:
    """(encoder options, one-line description) of the stem solo-learn built for the file ``p``.

    From ``args.json`` (``run``) when it is there. Without it a 7x7 conv1 is torchvision's stem in
    every library; a 3x3 one is solo-learn's CIFAR stem (padding 2) only if the user says the file
    is solo-learn's (``--format solo-learn``), since other libraries pad it by 1: not guessed.
    """
    pad2 = {"stem_padding": _SOLO_CIFAR_PADDING}
    cifar_stem = f"solo-learn CIFAR stem (3x3/1 conv1, padding {_SOLO_CIFAR_PADDING}, no max-pool)"
    if run is not None:
        _solo_arch(run, arch, p)
        where = f"from {run.source}: {run.backbone} on {run.dataset}"
        return (pad2, f"{cifar_stem}, {where}") if run.cifar else ({}, f"torchvision stem, {where}")
    if _conv1_kernel(state) != 3:
        return {}, "torchvision stem (7x7/2 conv1, max-pool): solo-learn leaves it as is off CIFAR"
    if explicit:
        return pad2, f"{cifar_stem}: --format solo-learn with a 3x3 conv1, no args.json"
    raise CheckpointError(
        f"{p}: cannot tell the stem of this backbone.* checkpoint: no solo-learn {SOLO_ARGS} beside it, "
        f"and its 3x3 conv1 is padded by {_SOLO_CIFAR_PADDING} in solo-learn but by 1 elsewhere; put the "
        f"run's {SOLO_ARGS} beside it, or pass --format solo-learn (padding 2) "
        "or --format prefixed (as --arch builds it)"
    )


def with_stem(options: dict[str, Any], stem: dict[str, Any], p: Path) -> dict[str, Any]:
    """``options`` plus the stem's; an option that contradicts what the file says is refused."""
    clash = sorted(k for k in stem if k in options and options[k] != stem[k])
    if clash:
        key = clash[0]
        raise CheckpointError(f"{p} was built with {key}={stem[key]}, not {key}={options[key]}; omit {key}")
    return {**options, **stem}
