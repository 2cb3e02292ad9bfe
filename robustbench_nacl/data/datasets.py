"""Datasets by name, as uint8 image tensors, with class subsets and ArCL shift variants.

A dataset is addressed by a spec string ``name[:classes][@shift]``:

- ``name`` is one of :func:`dataset_names` (``cifar10``, ``cifar100``, ``stl10``, ``tinyimagenet``,
  ``fashion-mnist``, ``mnist``, ``digits``);
- ``classes`` keeps a subset of the original classes and relabels them ``0..k-1`` in the order
  given: ``0-4`` (inclusive range), ``3`` (one class), ``0,2,5`` (a list), or a mix ``0-4,7``;
- ``shift`` applies one of ArCL's five transformations (``grayscale``, ``crop``, ``flip``,
  ``jitter``, ``grayscale+jitter``) deterministically to every image of both splits.

Files live under a data root (:func:`data_root`) in torchvision's standard layouts, and are read
by the parsers here, never by torchvision's dataset classes (their md5 checks would reject the
tiny fixtures the tests write in the same formats). torchvision is used only to download, into a
temporary directory that is moved into place on success, so a failed download leaves nothing
behind. A dataset that cannot be had is a one-line :class:`DatasetNotFound`: no synthetic
stand-in is ever substituted for a named dataset.

``digits`` (scikit-learn's bundled 8x8 digits) is the embedded default and always works offline.
It has no official split: ``train`` is the first 1437 images in file order, ``test`` the last 360.
For ``tinyimagenet`` the labelled ``val`` set serves as ``test`` (the official test set has no
labels).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import os
import pickle
import shutil
import socket
import struct
import tempfile
import threading
import urllib.error
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import DatasetNotFound, UserError, one_line
from ..io import atomic_open
from ..registry import Registry, did_you_mean

__all__ = [
    "DATASETS",
    "ENV_VAR",
    "SPLITS",
    "DatasetSpec",
    "ImageData",
    "canonical_spec",
    "clear_cache",
    "data_root",
    "dataset_names",
    "load_dataset",
    "normalization",
    "parse_spec",
    "read_idx",
    "restricted_unpickle",
]

log = logging.getLogger(__name__)

ENV_VAR = "ROBUSTBENCH_NACL_DATA"
SPLITS = ("train", "test")
#: Where Debian's ``dataset-fashion-mnist`` package puts the IDX files (module-level so tests can
#: point it elsewhere).
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
#: Images per call of a shift function: bounds the float32 working memory (4096 CIFAR images are
#: 50 MB) without making the per-call overhead matter.
SHIFT_CHUNK = 4096
#: Seconds before a stalled connection gives up; without it an offline machine can hang forever.
DOWNLOAD_TIMEOUT_S = 10.0
DIGITS_N_TRAIN = 1437

Loader = Callable[[Path, str, bool], tuple[torch.Tensor, torch.Tensor]]

#: name -> ``loader(root, split, download) -> (x uint8 (N,C,H,W), y int64 (N,))``, with info
#: ``num_classes``, ``channels``, ``size`` (H = W), ``how_to_get`` and ``normalization``.
DATASETS: Registry[Loader] = Registry("dataset")


# --------------------------------------------------------------------------------------------
# Public types and helpers
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed ``name[:classes][@shift]`` spec."""

    name: str
    #: Original class ids kept, in label order (``digits:0-4`` -> (0, 1, 2, 3, 4)); None = all.
    #: A tuple of ids rather than a (lo, hi) pair so that lists like ``0,2,5`` fit too.
    subset: tuple[int, ...] | None = None
    shift: str | None = None

    @property
    def base(self) -> str:
        """``name[@shift]``: the images before any class subset (what shifts are seeded from)."""
        return self.name + (f"@{self.shift}" if self.shift else "")

    def __str__(self) -> str:
        text = self.name
        if self.subset is not None:
            text += ":" + _format_classes(self.subset)
        if self.shift:
            text += f"@{self.shift}"
        return text


def data_root(root: str | Path | None = None) -> Path:
    """``root`` if given, else ``$ROBUSTBENCH_NACL_DATA``, else ``~/.cache/robustbench_nacl``."""
    if root is not None and str(root) != "":
        return Path(root).expanduser().absolute()
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    return (Path.home() / ".cache" / "robustbench_nacl").absolute()


def dataset_names() -> list[str]:
    """Registered dataset names, in registration order."""
    return DATASETS.names()


def parse_spec(spec: str) -> DatasetSpec:
    """Parse ``name[:classes][@shift]``; unknown names, bad class lists and unknown shifts are UserErrors."""
    text = str(spec).strip()
    if not text:
        raise UserError(f"empty dataset spec; use one of: {', '.join(dataset_names())}")
    rest, at, shift = text.partition("@")
    name, colon, class_text = rest.partition(":")
    name = name.strip()
    if name not in DATASETS:
        raise UserError(
            f"unknown dataset {name!r}{did_you_mean(name, dataset_names())} in spec {text!r}; "
            f"valid datasets: {', '.join(dataset_names())}"
        )
    subset = _parse_classes(text, name, class_text) if colon else None
    shift_name: str | None = None
    if at:
        shift_name = shift.strip()
        valid = _shift_names()
        if shift_name not in valid:
            raise UserError(
                f"unknown shift {shift_name!r} in dataset spec {text!r}; valid shifts: {', '.join(valid)}"
            )
    return DatasetSpec(name=name, subset=subset, shift=shift_name)


def canonical_spec(spec: str) -> str:
    """The one spelling of a dataset spec, for identities and grouping: ``digits:5,6,7,8,9``,
    ``digits: 5-9`` and ``digits:5-9`` are all ``digits:5-9``; a subset that keeps every class in
    its original order is the whole dataset (``digits:0-9`` -> ``digits``). Class order is kept:
    it is the label order, so ``digits:9,8`` is another dataset than ``digits:8,9``."""
    parsed = parse_spec(spec)
    n = int(DATASETS.info(parsed.name)["num_classes"])
    if parsed.subset == tuple(range(n)):
        parsed = DatasetSpec(name=parsed.name, subset=None, shift=parsed.shift)
    return str(parsed)


def normalization(name_or_spec: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) of the dataset's default normalisation.

    Every dataset uses "half" (mean 0.5, std 0.5, i.e. [0,1] -> [-1,1]), the CLAE/NaCl convention,
    so that encoders trained on different datasets see inputs on the same scale.
    """
    info = DATASETS.info(parse_spec(name_or_spec).name)
    kind = info["normalization"]
    if kind != "half":  # pragma: no cover - only "half" is registered
        raise ValueError(f"unknown normalization {kind!r}")
    channels = int(info["channels"])
    return (0.5,) * channels, (0.5,) * channels


def load_dataset(
    spec: str, split: str = "train", *, root: str | Path | None = None, download: bool = True
) -> ImageData:
    """Load one split of a dataset spec as uint8 tensors (see the module docstring for the grammar).

    Raw arrays (and shifted ones) are cached per process by (name, shift, split, root), so loading
    the same data twice costs nothing; the returned tensors may be that cache: do not mutate them.
    """
    parsed = parse_spec(spec)
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    root_path = data_root(root)
    x, y = _load_base(parsed.name, parsed.shift, split, root_path, download)
    num_classes = int(DATASETS.info(parsed.name)["num_classes"])
    if parsed.subset is None:
        return ImageData(
            x=x, y=y, num_classes=num_classes, name=str(parsed), classes=tuple(range(num_classes))
        )
    # Shifting before subsetting makes `name:0-4@crop` exactly a subset of `name@crop`.
    keep = torch.as_tensor(parsed.subset, dtype=torch.int64)
    mask = torch.isin(y, keep)
    if not bool(mask.any()):
        raise UserError(
            f"dataset {str(parsed)!r} ({split}) has no images of classes {_format_classes(parsed.subset)}"
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


# --------------------------------------------------------------------------------------------
# Spec parsing and shifts
# --------------------------------------------------------------------------------------------


def _format_classes(classes: tuple[int, ...]) -> str:
    """Class ids in label order, ascending runs of two or more written as ranges:
    ``(0,1,2,3)`` -> ``0-3``, ``(0,1,2,3,4,7)`` -> ``0-4,7``, ``(9,8)`` -> ``9,8``."""
    parts: list[str] = []
    i = 0
    while i < len(classes):
        j = i
        while j + 1 < len(classes) and classes[j + 1] == classes[j] + 1:
            j += 1
        parts.append(f"{classes[i]}-{classes[j]}" if j > i else str(classes[i]))
        i = j + 1
    return ",".join(parts)


def _parse_classes(spec: str, name: str, text: str) -> tuple[int, ...]:
    n = int(DATASETS.info(name)["num_classes"])

    def bad(reason: str) -> UserError:
        return UserError(
            f"invalid class subset {text!r} in dataset spec {spec!r}: {reason}; {name} classes are "
            f"0-{n - 1} (e.g. {name}:0-4, {name}:3 or {name}:0,2,5)"
        )

    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        lo_text, dash, hi_text = item.partition("-")
        if not lo_text.strip().isdigit() or (dash and not hi_text.strip().isdigit()):
            raise bad(f"{item!r} is not a class id or range a-b")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if lo > hi:
            raise bad(f"empty range {item!r}")
        if hi >= n:
            raise bad(f"class {hi} is out of range")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise bad("a class is listed twice")
    return tuple(out)


def _shift_names() -> list[str]:
    from ..augment.views import SHIFTS  # lazy: augment imports torchvision transforms; data must not need it

    return SHIFTS.names()


def _shift_seed(name: str, shift: str, split: str) -> int:
    # crc32 rather than hash(): Python salts str hashes per process, and shifts must be reproducible.
    return zlib.crc32(f"{name}@{shift}|{split}".encode())


def _apply_shift(x: torch.Tensor, shift: str, seed: int) -> torch.Tensor:
    """Shift uint8 images in chunks; per-image random parameters all come from one seeded generator."""
    from ..augment.views import SHIFTS

    fn = SHIFTS.get(shift)
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], SHIFT_CHUNK):
        chunk = x[start : start + SHIFT_CHUNK].float().div_(255.0)
        shifted = fn(chunk, gen)
        if shifted.shape != chunk.shape:
            raise RuntimeError(
                f"shift {shift!r} changed the image shape {tuple(chunk.shape)} -> {tuple(shifted.shape)}"
            )
        out[start : start + SHIFT_CHUNK] = (shifted * 255.0).round().clamp(0, 255).to(torch.uint8)
    return out


# --------------------------------------------------------------------------------------------
# Caching
# --------------------------------------------------------------------------------------------

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
            x = _apply_shift(raw_x, shift, _shift_seed(name, shift, split))
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


# --------------------------------------------------------------------------------------------
# Finding and downloading
# --------------------------------------------------------------------------------------------


def _places(paths: Iterable[Path]) -> str:
    items = [str(p) for p in paths]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _not_found(name: str, looked: Iterable[Path], why: str) -> DatasetNotFound:
    how = DATASETS.info(name)["how_to_get"]
    return DatasetNotFound(
        f"{name} not found under {_places(looked)} and {why}; {how}, or pass --data-root DIR"
    )


def _makedirs_tracked(path: Path) -> list[Path]:
    """mkdir -p that returns the directories it created (outermost first), so a failure can undo them."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[Path] = []
    for d in reversed(missing):
        d.mkdir()
        created.append(d)
    return created


def _download(root: Path, dest_name: str, fetch: Callable[[Path], Path]) -> Exception | None:
    """Download into a temp dir under ``root`` and move ``fetch``'s result to ``root/dest_name``.

    Returns None on success, the exception otherwise; on failure nothing is left on disk (not the
    temp dir, not ``root`` itself if this call created it). The temp dir sits under ``root`` so the
    final move is a same-filesystem rename, atomic with respect to other readers.
    """
    created: list[Path] = []
    tmp: Path | None = None
    ok = False
    old_timeout = socket.getdefaulttimeout()
    try:
        created = _makedirs_tracked(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest_name}.download-", dir=root))
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        log.info("downloading %s into %s", dest_name, root)
        # torchvision prints each mirror it tries; the outcome is reported by the caller instead.
        with contextlib.redirect_stdout(io.StringIO()):
            src = fetch(tmp)
        if not src.is_dir():
            raise RuntimeError(f"the download produced no {src.name}/")
        dest = root / dest_name
        if not dest.exists():  # another process may have won the race; its copy is as good
            os.rename(src, dest)
        ok = True
        return None
    except Exception as e:  # anything (DNS, timeout, md5, disk): reported as "could not be downloaded"
        return e
    finally:
        socket.setdefaulttimeout(old_timeout)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()


def _torchvision_fetch(cls_name: str, folder: str, **kwargs: Any) -> Callable[[Path], Path]:
    """A fetch function for :func:`_download` using torchvision's downloader for ``cls_name``."""

    def fetch(tmp: Path) -> Path:
        import torchvision.datasets as tvd

        getattr(tvd, cls_name)(str(tmp), download=True, **kwargs)
        return tmp / folder

    return fetch


def _obtain(
    name: str,
    root: Path,
    looked: list[Path],
    find: Callable[[], Any],
    download: bool,
    dest_name: str,
    fetch: Callable[[Path], Path] | None,
) -> Any:
    """``find()`` (None when absent); else download if allowed and ``find()`` again; else DatasetNotFound."""
    found = find()
    if found is not None:
        return found
    dest = root / dest_name
    if fetch is None:
        raise _not_found(name, looked, "cannot be downloaded automatically")
    if not download:
        raise _not_found(name, looked, "downloading is disabled")
    if dest.exists():
        # Never overwrite what the user put there: a partial copy must be fixed by hand.
        raise _not_found(name, looked, f"{dest} exists but is incomplete (delete it to re-download)")
    err = _download(root, dest_name, fetch)
    if err is not None:
        offline = isinstance(err, (urllib.error.URLError, TimeoutError, ConnectionError)) or (
            "urlopen error" in str(err)  # torchvision's MNIST wraps the URLError in a RuntimeError
        )
        hint = "; no network?" if offline else ""
        why = f"could not be downloaded ({type(err).__name__}: {one_line(str(err), 120)}{hint})"
        raise _not_found(name, looked, why)
    found = find()
    if found is None:
        raise _not_found(name, looked, "the download did not contain the expected files")
    return found


# --------------------------------------------------------------------------------------------
# Format readers
# --------------------------------------------------------------------------------------------


def _reconstruct_function() -> Callable[..., Any]:
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


def _latin1_encode(text: str = "", encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3 protocol-2 pickles use it for bytes, and nothing more."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("refusing _codecs.encode with anything but (str, 'latin1')")
    return text.encode("latin1")


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild plain numpy arrays and builtin containers, and nothing else.

    A dataset file is untrusted input: ``pickle.load`` on it would run any callable it names.
    """

    _ALLOWED: ClassVar[dict[tuple[str, str], Any]] = {
        # The real CIFAR files (Python 2 / numpy 1) name numpy.core; numpy 2 writes numpy._core.
        # Returning the function directly also avoids importing the deprecated numpy.core shim.
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct_function(),
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct_function(),
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # Python 3 writes bytes in protocol 2 as _codecs.encode(str, "latin1").
        ("_codecs", "encode"): _latin1_encode,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def restricted_unpickle(path: str | Path) -> Any:
    """Load a pickle that may only contain builtin containers and numpy arrays (``encoding="bytes"``).

    Anything else (a callable, a class, a malformed stream) is a one-line UserError naming the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise UserError(
            f"{path} is not a plain data pickle ({one_line(str(e))}); delete it and re-download"
        ) from e
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from e
    except Exception as e:  # a damaged stream fails in many ways (EOFError, ValueError, struct.error, ...)
        raise UserError(
            f"{path} is corrupt or truncated ({type(e).__name__}); delete it and re-download"
        ) from e


_IDX_UBYTE = 0x08


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX ubyte file (gzipped or not, detected by content) into a uint8 array.

    The header is ``00 00 08 ndim`` then ``ndim`` big-endian uint32 sizes; the payload must have
    exactly their product in bytes. Anything else is a one-line UserError naming the file.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(
            f"cannot read {path}: {one_line(str(e) or type(e).__name__)}; delete it and re-download"
        ) from e
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != _IDX_UBYTE:
        raise UserError(f"{path} is not an IDX ubyte file (bad magic number); delete it and re-download")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise UserError(f"{path} is truncated (incomplete IDX header); delete it and re-download")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    need = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != need:
        raise UserError(
            f"{path} is truncated or corrupt: header says {dims} = {need} bytes, "
            f"file has {len(raw) - header}; delete it and re-download"
        )
    # copy(): frombuffer over bytes is read-only, which torch.from_numpy warns about.
    return np.frombuffer(raw, dtype=np.uint8, count=need, offset=header).reshape(dims).copy()


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8)), torch.from_numpy(
        np.ascontiguousarray(y, dtype=np.int64)
    )


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


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

        _obtain(name, root, [d], find, download, folder, _torchvision_fetch(tv_class, folder))
        xs, ys = [], []
        for p in paths:
            batch = restricted_unpickle(p)
            try:
                data = np.asarray(batch[b"data"], dtype=np.uint8)
                labels = np.asarray(batch[label_key], dtype=np.int64)
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

    _obtain(
        "stl10",
        root,
        [d],
        find,
        download,
        "stl10_binary",
        _torchvision_fetch("STL10", "stl10_binary", split="train"),
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

        img_path, lbl_path = _obtain(
            name, root, looked, find, download, tv_class, _torchvision_fetch(tv_class, tv_class)
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
    _obtain("tinyimagenet", root, [d], lambda: True if marker.is_file() else None, download, d.name, None)
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
