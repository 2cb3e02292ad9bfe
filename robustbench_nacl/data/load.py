"""Loading a dataset spec as uint8 tensors (:func:`load_dataset`): the data root, the per-process
cache of whole splits, shifting before subsetting, and the check of every loader's output.

A dataset that cannot be had is a one-line :class:`~robustbench_nacl.errors.DatasetNotFound`: no
synthetic stand-in is ever substituted for a named dataset.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from .catalog import DATASETS, SPLITS
from .shifts import apply_shift, shift_seed
from .spec import DatasetSpec, format_classes, parse_spec

__all__ = ["ENV_VAR", "ImageData", "clear_cache", "data_root", "load_dataset"]

ENV_VAR = "ROBUSTBENCH_NACL_DATA"


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors elementwise is never meant here
class ImageData:
    """A loaded dataset split.

    ``x`` and ``y`` may be shared with a per-process cache: treat them as read-only (clone before
    mutating in place).
    """

    x: torch.Tensor  #: uint8 (N, C, H, W), 0..255
    y: torch.Tensor  #: int64 (N,), 0..num_classes-1
    num_classes: int
    name: str  #: canonical spec string, e.g. "digits:0-4@grayscale"
    classes: tuple[int, ...]  #: original class ids kept; label k is original class classes[k]

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        return (
            f"ImageData(name={self.name!r}, n={len(self)}, shape={tuple(self.x.shape[1:])}, "
            f"num_classes={self.num_classes})"
        )


def data_root(root: str | Path | None = None) -> Path:
    """``root`` if given, else ``$ROBUSTBENCH_NACL_DATA``, else ``~/.cache/robustbench_nacl``."""
    if root is not None and str(root) != "":
        return Path(root).expanduser().absolute()
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    return (Path.home() / ".cache" / "robustbench_nacl").absolute()


def load_dataset(
    spec: str | DatasetSpec, split: str = "train", *, root: str | Path | None = None, download: bool = True
) -> ImageData:
    """Load one split of a dataset spec as uint8 tensors (a string is parsed: data/spec.py has the grammar).

    Raw arrays (and shifted ones) are cached per process by (name, shift, split, root), so loading
    the same data twice costs nothing; the returned tensors may be that cache: do not mutate them.
    """
    parsed = parse_spec(spec)
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    root_path = data_root(root)
    x, y = _load_base(parsed.name, parsed.shift, split, root_path, download)
    num_classes = int(parsed.info["num_classes"])
    if parsed.subset is None:
        return ImageData(
            x=x, y=y, num_classes=num_classes, name=str(parsed), classes=tuple(range(num_classes))
        )
    # Shifting before subsetting makes `name:0-4@crop` exactly a subset of `name@crop`.
    keep = torch.as_tensor(parsed.subset, dtype=torch.int64)
    mask = torch.isin(y, keep)
    if not bool(mask.any()):
        raise UserError(
            f"dataset {str(parsed)!r} ({split}) has no images of classes {format_classes(parsed.subset)}"
        )
    lut = torch.full((num_classes,), -1, dtype=torch.int64)
    lut[keep] = torch.arange(len(keep), dtype=torch.int64)
    return ImageData(
        x=x[mask],  # boolean indexing copies: the subset never aliases the cache
        y=lut[y[mask]],
        num_classes=len(parsed.subset),
        name=str(parsed),
        classes=parsed.subset,
    )


def clear_cache() -> None:
    """Drop the per-process cache of loaded arrays (frees memory; tests use it to force re-reads)."""
    with _CACHE_LOCK:
        _CACHE.clear()


_CacheKey = tuple[str, str | None, str, Path]
_CACHE: dict[_CacheKey, tuple[torch.Tensor, torch.Tensor]] = {}
_CACHE_LOCK = threading.RLock()


def _load_base(
    name: str, shift: str | None, split: str, root: Path, download: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw (shift None) or shifted arrays of a whole split, cached. Failures are not cached."""
    key = (name, shift, split, root)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
        if shift is None:
            x, y = DATASETS.get(name)(root, split, download)
            _check_arrays(name, split, x, y)
        else:
            raw_x, y = _load_base(name, None, split, root, download)
            x = apply_shift(raw_x, shift, shift_seed(name, shift, split))
        _CACHE[key] = (x, y)
        return x, y


def _check_arrays(name: str, split: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """Guard the loader contract, so a bad file shows up here and not as a shape error in training."""
    info = DATASETS.info(name)
    n = int(info["num_classes"])
    expected = (int(info["channels"]), int(info["size"]), int(info["size"]))
    if x.dtype != torch.uint8 or x.ndim != 4 or tuple(x.shape[1:]) != expected:
        raise UserError(
            f"{name} ({split}): images are {x.dtype} {tuple(x.shape)}, expected uint8 (N, *{expected})"
        )
    if y.dtype != torch.int64 or y.shape != (x.shape[0],):
        raise UserError(f"{name} ({split}): {tuple(y.shape)} labels for {x.shape[0]} images")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n):
        raise UserError(
            f"{name} ({split}): labels outside 0-{n - 1}; the files are corrupt, re-download them"
        )
