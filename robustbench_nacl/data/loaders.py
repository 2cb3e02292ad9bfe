"""The built-in datasets' loaders, registered in :data:`~robustbench_nacl.data.catalog.DATASETS`:
each reads one split of torchvision's standard on-disk layout into uint8 tensors.

Files are read by the parsers here, never by torchvision's dataset classes (their md5 checks would
reject the tiny fixtures the tests write in the same formats); torchvision is used only to
download (data/download.py). ``digits`` (scikit-learn's bundled 8x8 digits) is the embedded default
and always works offline. It has no official split: ``train`` is the first 1437 images in file
order, ``test`` the last 360. For ``tinyimagenet`` the labelled ``val`` set serves as ``test`` (the
official test set has no labels).
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError, one_line
from ..io import atomic_open
from .catalog import DATASETS, SPLITS, Loader
from .download import obtain, torchvision_fetch
from .formats import read_idx, restricted_unpickle

__all__ = ["FASHION_MNIST_SYSTEM_DIR", "TINYIMAGENET_URL"]

log = logging.getLogger(__name__)

#: Where Debian's ``dataset-fashion-mnist`` package puts the IDX files (module-level so tests can
#: point it elsewhere).
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
DIGITS_N_TRAIN = 1437


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8)), torch.from_numpy(
        np.ascontiguousarray(y, dtype=np.int64)
    )


@DATASETS.register(
    "digits",
    num_classes=10,
    channels=1,
    size=8,
    normalization="half",
    how_to_get="it ships with scikit-learn (pip install scikit-learn)",
)
def _load_digits(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 8x8 digits (values 0..16 -> round(v*255/16)); train = first 1437 in file order."""
    from sklearn.datasets import load_digits  # lazy: importing sklearn takes a second or two

    bunch = load_digits()
    x = np.rint(bunch.images * 255.0 / 16.0).clip(0, 255).astype(np.uint8)[:, None]
    y = bunch.target.astype(np.int64)
    part = slice(0, DIGITS_N_TRAIN) if split == "train" else slice(DIGITS_N_TRAIN, None)
    return _tensors(x[part], y[part])


def _cifar_loader(
    name: str, folder: str, files: dict[str, list[str]], label_key: bytes, tv_class: str
) -> Loader:
    def load(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
        d = root / folder
        paths = [d / f for f in files[split]]

        def find() -> list[Path] | None:
            return paths if all(p.is_file() for p in files_all(d)) else None

        obtain(name, root, [d], find, download, folder, torchvision_fetch(tv_class, folder))
        xs, ys = [], []
        for p in paths:
            batch = restricted_unpickle(p)
            try:
                data = np.asarray(batch[b"data"], dtype=np.uint8)
                raw_labels = np.asarray(batch[label_key])
                if not np.issubdtype(raw_labels.dtype, np.integer):  # 1.7 would silently be class 1
                    raise ValueError(f"integer labels ({raw_labels.dtype} ones)")
                labels = raw_labels.astype(np.int64)
            except (KeyError, TypeError, ValueError) as e:
                raise UserError(f"{p} is not a {name} batch (no {e}); delete it and re-download") from e
            if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (data.shape[0],):
                raise UserError(
                    f"{p} has data {data.shape} and {labels.shape} labels; expected (N, 3072) and (N,)"
                )
            xs.append(data.reshape(-1, 3, 32, 32))  # rows are R plane, G plane, B plane, row-major
            ys.append(labels)
        return _tensors(np.concatenate(xs), np.concatenate(ys))

    def files_all(d: Path) -> list[Path]:
        # Check both splits: a half-extracted folder should be reported, not half-used.
        return [d / f for fs in files.values() for f in fs]

    return load


DATASETS.add(
    "cifar10",
    _cifar_loader(
        "cifar10",
        "cifar-10-batches-py",
        {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
        b"labels",
        "CIFAR10",
    ),
    num_classes=10,
    channels=3,
    size=32,
    normalization="half",
    how_to_get="download the CIFAR-10 python version "
    "(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz) and extract it under the data root",
)
DATASETS.add(
    "cifar100",
    _cifar_loader(
        "cifar100", "cifar-100-python", {"train": ["train"], "test": ["test"]}, b"fine_labels", "CIFAR100"
    ),
    num_classes=100,
    channels=3,
    size=32,
    normalization="half",
    how_to_get="download the CIFAR-100 python version "
    "(https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz) and extract it under the data root",
)


@DATASETS.register(
    "stl10",
    num_classes=10,
    channels=3,
    size=96,
    normalization="half",
    how_to_get="download the STL-10 binary files "
    "(https://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz) and extract them under the data root",
)
def _load_stl10(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """STL-10 labelled splits: column-major 3x96x96 uint8 images, labels 1..10 (unlabelled split unused)."""
    d = root / "stl10_binary"
    needed = [d / f"{s}_{k}.bin" for s in SPLITS for k in ("X", "y")]

    def find() -> bool | None:
        return True if all(p.is_file() for p in needed) else None

    obtain(
        "stl10",
        root,
        [d],
        find,
        download,
        "stl10_binary",
        torchvision_fetch("STL10", "stl10_binary", split="train"),
    )
    x_path, y_path = d / f"{split}_X.bin", d / f"{split}_y.bin"
    x = np.fromfile(x_path, dtype=np.uint8)
    y = np.fromfile(y_path, dtype=np.uint8).astype(np.int64)
    per = 3 * 96 * 96
    if x.size % per or x.size // per != y.size:
        raise UserError(
            f"{x_path} ({x.size} bytes) and {y_path} ({y.size} labels) do not match; "
            "delete them and re-download"
        )
    if y.size and (y.min() < 1 or y.max() > 10):
        raise UserError(f"{y_path} has labels outside 1..10; delete it and re-download")
    # Stored Fortran-style per image: reshape gives (C, W, H), so swap the last two axes.
    x = x.reshape(-1, 3, 96, 96).transpose(0, 1, 3, 2)
    return _tensors(x, y - 1)


_IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _idx_file(d: Path, stem: str) -> Path | None:
    """The file for ``stem`` in ``d``: plain or .gz, with '-idx' or the '.idx' spelling some mirrors use."""
    for s in (stem, stem.replace("-idx", ".idx")):
        for candidate in (d / s, d / f"{s}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _mnist_loader(name: str, tv_class: str, dirs: Callable[[Path], list[Path]]) -> Loader:
    def load(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
        looked = dirs(root)

        def find() -> tuple[Path, Path] | None:
            for d in looked:
                found = [_idx_file(d, stem) for stem in _IDX_STEMS[split]]
                if found[0] is not None and found[1] is not None:
                    return found[0], found[1]
            return None

        img_path, lbl_path = obtain(
            name, root, looked, find, download, tv_class, torchvision_fetch(tv_class, tv_class)
        )
        x, y = read_idx(img_path), read_idx(lbl_path)
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.shape != (x.shape[0],):
            raise UserError(
                f"{img_path} {x.shape} and {lbl_path} {y.shape} are not matching 28x28 images and labels"
            )
        return _tensors(x[:, None], y)

    return load


DATASETS.add(
    "fashion-mnist",
    _mnist_loader(
        "fashion-mnist",
        "FashionMNIST",
        lambda root: [root / "FashionMNIST" / "raw", root / "fashion-mnist", FASHION_MNIST_SYSTEM_DIR],
    ),
    num_classes=10,
    channels=1,
    size=28,
    normalization="half",
    how_to_get="install Debian's dataset-fashion-mnist package, or put the IDX files "
    "(https://github.com/zalandoresearch/fashion-mnist) in DATA_ROOT/fashion-mnist",
)
DATASETS.add(
    "mnist",
    _mnist_loader("mnist", "MNIST", lambda root: [root / "MNIST" / "raw", root / "mnist"]),
    num_classes=10,
    channels=1,
    size=28,
    normalization="half",
    how_to_get="put the four MNIST IDX files (train-images-idx3-ubyte.gz, ...) in DATA_ROOT/mnist",
)


def _read_rgb(path: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8)  # ~2% of Tiny ImageNet is grayscale
    except OSError as e:
        raise UserError(f"cannot decode {path}: {one_line(str(e))}; re-extract the archive") from e
    if arr.shape != (64, 64, 3):
        raise UserError(f"{path} is {arr.shape[1]}x{arr.shape[0]}, expected 64x64; re-extract the archive")
    return arr.transpose(2, 0, 1)


def _tiny_listing(d: Path, split: str) -> tuple[list[str], list[Path], np.ndarray]:
    """(wnids in wnids.txt order, image paths, labels) for a split; val plays the test split."""
    wnids = [w.strip() for w in (d / "wnids.txt").read_text().split() if w.strip()]
    index = {w: i for i, w in enumerate(wnids)}
    paths: list[Path] = []
    labels: list[int] = []
    if split == "train":
        for w in wnids:
            files = sorted((d / "train" / w / "images").glob("*.JPEG"))
            paths += files
            labels += [index[w]] * len(files)
    else:
        ann = d / "val" / "val_annotations.txt"
        for line in ann.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) < 2:
                continue
            if parts[1] not in index:
                raise UserError(f"{ann} names class {parts[1]!r}, which is not in wnids.txt")
            paths.append(d / "val" / "images" / parts[0])
            labels.append(index[parts[1]])
    if not paths:
        raise UserError(f"no {split} images found under {d}; re-extract {TINYIMAGENET_URL}")
    return wnids, paths, np.asarray(labels, dtype=np.int64)


@DATASETS.register(
    "tinyimagenet",
    num_classes=200,
    channels=3,
    size=64,
    normalization="half",
    how_to_get=f"download {TINYIMAGENET_URL} and unzip it in the data root "
    "(giving DATA_ROOT/tiny-imagenet-200/)",
)
def _load_tinyimagenet(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiny ImageNet from the extracted zip; decoded once and cached as ``cache_<split>.npz`` beside it."""
    d = root / "tiny-imagenet-200"
    marker = d / "wnids.txt"
    # No torchvision downloader exists for it; the message carries the URL instead.
    obtain("tinyimagenet", root, [d], lambda: True if marker.is_file() else None, download, d.name, None)
    wnids, paths, y = _tiny_listing(d, split)
    cache = d / f"cache_{split}.npz"
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as z:
                if list(z["wnids"]) == wnids and z["y"].shape == y.shape and np.array_equal(z["y"], y):
                    return _tensors(z["x"], z["y"])
            log.info("%s is stale; rebuilding it", cache)
        except (OSError, ValueError, KeyError, EOFError, zlib.error):
            log.info("%s is unreadable; rebuilding it", cache)
    from concurrent.futures import ThreadPoolExecutor

    # PIL's JPEG decoder releases the GIL, so threads help for the 100k small files.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        x = np.stack(list(pool.map(_read_rgb, paths)))
    try:
        with atomic_open(cache, "wb") as f:
            np.savez(f, x=x, y=y, wnids=np.asarray(wnids, dtype=str))
    except UserError as e:  # a read-only data root still works, only slower next time
        log.warning("not caching Tiny ImageNet: %s", e)
    return _tensors(x, y)
