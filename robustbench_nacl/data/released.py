"""Data as the robust-SSL field evaluates it (docs/decisions.md, 'Released corruption sets and
STL-10 at 32 pixels'):

* CIFAR-10-C and CIFAR-100-C from their released files (Hendrycks & Dietterich; Zenodo records
  2535967 and 3555552), the test sets everyone else uses instead of corruptions computed here: a
  folder with one ``<corruption>.npy`` per corruption, uint8 ``(5 * N, 32, 32, 3)`` holding severities
  1 to 5 in that order, N images each in the test set's order, and ``labels.npy`` ``(5 * N,)``.
  :func:`read_released` reads one (corruption, severity) of them, memory-mapped (``allow_pickle``
  stays off: an ``.npy`` holding objects is refused).
* ``stl10-32``: STL-10 resized to 32x32 as the RobustSSL benchmark's transfer from CIFAR does
  (``transforms.Resize(32)`` on PIL images: bilinear with PIL's antialiasing, uint8 out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..registry import Registry
from ..untrusted import check_regular
from .catalog import DATASETS
from .loaders import _load_stl10

SEVERITY_COUNT = 5
#: The 15 corruptions of the benchmark's ``eval_test_OOD`` (CIFAR-10-C's test corruptions; the
#: released folders also hold the 4 extra ones: speckle_noise, gaussian_blur, spatter, saturate).
BENCHMARK_CORRUPTIONS = (
    "shot_noise", "gaussian_noise", "impulse_noise", "contrast", "zoom_blur", "motion_blur", "glass_blur",
    "defocus_blur", "snow", "pixelate", "brightness", "fog", "jpeg_compression", "elastic_transform", "frost",
)  # fmt: skip
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")


@dataclass(frozen=True)
class ReleasedSet:
    """A released corruption set: the folder it is extracted to and what it corrupts."""

    folder: str  # the archive's folder name
    url: str


#: dataset name -> its released corruption set
RELEASED: Registry[ReleasedSet] = Registry("released corruption set")
RELEASED.add("cifar10", ReleasedSet("CIFAR-10-C", "https://zenodo.org/record/2535967"))
RELEASED.add("cifar100", ReleasedSet("CIFAR-100-C", "https://zenodo.org/record/3555552"))


def released_set(dataset: str) -> ReleasedSet:
    """The released set of ``dataset`` (a one-line UserError for a dataset that has none)."""
    if dataset not in RELEASED:
        raise UserError(
            f"--corruptions-from: {dataset} has no released corruption set (only "
            f"{', '.join(RELEASED.names())}); drop --corruptions-from to use the corruptions computed here"
        )
    return RELEASED.get(dataset)


def released_folder(root: str | Path, dataset: str) -> Path:
    """The folder holding the .npy files: ``root`` itself, or ``root/CIFAR-10-C`` (as extracted)."""
    p, folder = Path(root), released_set(dataset).folder
    for candidate in (p, p / folder):
        if (candidate / "labels.npy").is_file():
            return candidate
    raise UserError(
        f"--corruptions-from {p}: no labels.npy there or in {p / folder}; download {folder}.tar "
        f"({released_set(dataset).url}) and extract it"
    )


def parse_released(value: str, folder: Path) -> list[str]:
    """``all`` (the benchmark's 15) or a comma list of names, each a ``<name>.npy`` of ``folder``."""
    names = (
        list(BENCHMARK_CORRUPTIONS) if value == "all" else [n.strip() for n in value.split(",") if n.strip()]
    )
    known = (*BENCHMARK_CORRUPTIONS, *EXTRA_CORRUPTIONS)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(
            f"unknown released corruption {','.join(bad) or value!r}; valid: all, {', '.join(known)}"
        )
    missing = [n for n in names if not (folder / f"{n}.npy").is_file()]
    if missing:
        raise UserError(f"{folder} lacks {', '.join(f'{n}.npy' for n in missing)}; re-extract the archive")
    return names


def _load_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(check_regular(path, "released array"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:  # truncated, not an .npy, or objects (pickles are refused)
        raise UserError(f"{path} is not a readable .npy array ({str(e).splitlines()[0]})") from None
    if not isinstance(array, np.ndarray):  # np.load opens an .npz archive of that name too
        if hasattr(array, "close"):
            array.close()
        raise UserError(f"{path} is an .npz archive, not an .npy array: extract the released .npy files")
    return array


def _open_released(folder: str | Path, corruption: str, severity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(images, labels, N) of one corruption's file, memory-mapped and checked (nothing read yet)."""
    d = Path(folder)
    if severity not in range(1, SEVERITY_COUNT + 1):
        raise UserError(f"severity {severity}: the released sets have severities 1-{SEVERITY_COUNT}")
    paths = [d / "labels.npy", d / f"{corruption}.npy"]
    for p in paths:
        if not p.is_file():
            raise UserError(f"{p} not found; the released set is extracted with one .npy per corruption")
    labels, images = (_load_npy(p) for p in paths)
    if not np.issubdtype(labels.dtype, np.integer):  # float labels would be truncated to classes silently
        raise UserError(
            f"{paths[0]} holds {labels.dtype} labels, not integers: it is not the released labels.npy"
        )
    if labels.ndim != 1 or labels.shape[0] % SEVERITY_COUNT or not labels.shape[0]:
        raise UserError(f"{paths[0]} holds {labels.shape} labels, expected {SEVERITY_COUNT} blocks of N")
    per = labels.shape[0] // SEVERITY_COUNT
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise UserError(f"{paths[1]} holds {images.dtype} {images.shape}, expected uint8 (5N, 32, 32, 3)")
    if images.shape[0] != labels.shape[0]:
        raise UserError(
            f"{paths[1]} holds {images.shape[0]} images, {paths[0]} {labels.shape[0]} labels "
            f"({SEVERITY_COUNT} severities of {per}); the file is short or from another set"
        )
    return images, labels, per


def released_labels(folder: str | Path, corruption: str, severity: int, n: int | None = None) -> torch.Tensor:
    """The labels of the first ``n`` images of one (corruption, severity), with every check of
    :func:`read_released` but no image read: to refuse a wrong set before any work."""
    _, labels, per = _open_released(folder, corruption, severity)
    start = (severity - 1) * per
    return torch.from_numpy(
        np.asarray(labels[start : start + (per if n is None else min(n, per))], dtype=np.int64)
    )


def read_released(
    folder: str | Path, corruption: str, severity: int, n: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (n, 3, 32, 32), int64 labels (n,)) of one corruption at one severity: the first
    ``n`` images of its block (None: the whole block). A missing, short or malformed file is a
    one-line UserError."""
    images, labels, per = _open_released(folder, corruption, severity)
    take = per if n is None else min(n, per)
    block = slice((severity - 1) * per, (severity - 1) * per + take)
    x = torch.from_numpy(np.ascontiguousarray(images[block].transpose(0, 3, 1, 2)))
    return x, torch.from_numpy(np.asarray(labels[block], dtype=np.int64))


# ============ STL-10 at 32 pixels ============

STL10_32 = "stl10-32"


def resize_like_pil(x: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, C, H, W) -> (N, C, size, size) by PIL's bilinear resize (the benchmark's Resize)."""
    from PIL import Image  # lazy: only this dataset needs it

    out = np.empty((x.shape[0], size, size, x.shape[1]), dtype=np.uint8)
    for i, img in enumerate(x.permute(0, 2, 3, 1).numpy()):
        out[i] = np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


@DATASETS.register(
    STL10_32,
    num_classes=10,
    channels=3,
    size=32,
    normalization="half",
    how_to_get="the STL-10 binary files, as for stl10 (resized to 32x32 here, as the RobustSSL benchmark)",
)
def _load_stl10_32(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """STL-10's labelled splits resized to 32x32 (the benchmark's CIFAR -> STL-10 transfer)."""
    x, y = _load_stl10(root, split, download)
    return resize_like_pil(x, 32), y


#: (transfer target, in-domain image size) -> the dataset the benchmark evaluates instead
TRANSFER_AT_SIZE: dict[tuple[str, int], str] = {("stl10", 32): STL10_32}
