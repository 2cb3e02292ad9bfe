"""Tiny dataset fixtures in the real on-disk formats, so tests exercise the real loaders.

Each writer puts files where ``robustbench_nacl.data`` looks for them under a data root and
returns the arrays it wrote, as the loader should return them: ``x`` uint8 (N, C, H, W), ``y``
int64 (N,), for ``train`` and ``test``. Labels cycle through every class (then are shuffled), so
class subsets of a fixture are never empty as long as n >= num_classes.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np

Arrays = dict[str, np.ndarray]


class _Py2StylePickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Protocol-2 pickler that writes str and bytes as Python 2 ``str`` (BINSTRING), like the real
    CIFAR batches (written by cPickle under Python 2), and names ``numpy.core`` as numpy 1 did.

    A plain Python 3 ``pickle.dump(protocol=2)`` writes bytes as ``_codecs.encode(...)`` calls
    instead; the loader accepts both, and the tests check both.
    """

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_py2_str(self, obj: str | bytes) -> None:
        data = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str

    def save_global(self, obj: object, name: str | None = None) -> None:
        if getattr(obj, "__name__", None) == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


def py2_pickle_bytes(obj: object) -> bytes:
    """``obj`` pickled the way Python 2's cPickle (protocol 2) wrote the CIFAR batches."""
    buf = io.BytesIO()
    _Py2StylePickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _labels(n: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.arange(n) % num_classes).astype(np.int64)


def _cifar_batch(x: np.ndarray, y: np.ndarray, label_key: bytes, batch_label: str, extra: dict) -> dict:
    batch = {
        b"batch_label": batch_label.encode(),
        b"data": x.reshape(len(x), -1).copy(),  # (N, 3072): R plane, G plane, B plane, row-major
        label_key: [int(v) for v in y],
        b"filenames": [f"img_{i:05d}.png".encode() for i in range(len(x))],
    }
    batch.update(extra)
    return batch


def _write_pickle(path: Path, obj: object, py2_style: bool) -> None:
    path.write_bytes(py2_pickle_bytes(obj) if py2_style else pickle.dumps(obj, protocol=2))


def write_cifar10(
    root: str | Path, n_train: int = 50, n_test: int = 20, seed: int = 0, *, py2_style: bool = True
) -> Arrays:
    """Write ``cifar-10-batches-py/`` (data_batch_1..5, test_batch, batches.meta) under ``root``."""
    rng = np.random.default_rng(seed)
    d = Path(root) / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    out = {
        "x_train": rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8),
        "y_train": _labels(n_train, 10, rng),
        "x_test": rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8),
        "y_test": _labels(n_test, 10, rng),
    }
    bounds = np.linspace(0, n_train, 6).astype(int)
    for i in range(5):
        lo, hi = bounds[i], bounds[i + 1]
        batch = _cifar_batch(
            out["x_train"][lo:hi], out["y_train"][lo:hi], b"labels", f"training batch {i + 1} of 5", {}
        )
        _write_pickle(d / f"data_batch_{i + 1}", batch, py2_style)
    _write_pickle(
        d / "test_batch",
        _cifar_batch(out["x_test"], out["y_test"], b"labels", "testing batch 1 of 1", {}),
        py2_style,
    )
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    _write_pickle(
        d / "batches.meta",
        {b"label_names": names, b"num_cases_per_batch": 10000, b"num_vis": 3072},
        py2_style,
    )
    return out


def write_cifar100(
    root: str | Path, n_train: int = 200, n_test: int = 100, seed: int = 0, *, py2_style: bool = True
) -> Arrays:
    """Write ``cifar-100-python/`` (train, test, meta) with fine and coarse labels under ``root``."""
    rng = np.random.default_rng(seed)
    d = Path(root) / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    out = {
        "x_train": rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8),
        "y_train": _labels(n_train, 100, rng),
        "x_test": rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8),
        "y_test": _labels(n_test, 100, rng),
    }
    for split, label in (("train", "training batch 1 of 1"), ("test", "testing batch 1 of 1")):
        y = out[f"y_{split}"]
        extra = {b"coarse_labels": [int(v) // 5 for v in y]}
        _write_pickle(d / split, _cifar_batch(out[f"x_{split}"], y, b"fine_labels", label, extra), py2_style)
    meta = {
        b"fine_label_names": [f"class{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"super{i}".encode() for i in range(20)],
    }
    _write_pickle(d / "meta", meta, py2_style)
    return out


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) as IDX: magic 00 00 08 ndim, big-endian uint32 dims, then the raw bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(
    root: str | Path,
    kind: str = "fashion-mnist",
    n_train: int = 30,
    n_test: int = 20,
    seed: int = 0,
    *,
    gz: bool = True,
    layout: str = "torchvision",
) -> Arrays:
    """Write the four MNIST-style IDX files for ``kind`` ("fashion-mnist" or "mnist").

    ``layout="torchvision"``: ``<root>/FashionMNIST/raw/`` (or ``MNIST/raw``);
    ``layout="plain"``: ``<root>/fashion-mnist/`` (or ``mnist/``). ``gz`` gzips each file.
    """
    if kind not in ("fashion-mnist", "mnist"):
        raise ValueError(f"kind must be fashion-mnist or mnist, not {kind!r}")
    if layout == "torchvision":
        d = Path(root) / ("FashionMNIST" if kind == "fashion-mnist" else "MNIST") / "raw"
    elif layout == "plain":
        d = Path(root) / kind
    else:
        raise ValueError(f"layout must be torchvision or plain, not {layout!r}")
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out: Arrays = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = _labels(n, 10, rng)
        for stem, arr in (
            (f"{prefix}-images-idx3-ubyte", x),
            (f"{prefix}-labels-idx1-ubyte", y.astype(np.uint8)),
        ):
            data = idx_bytes(arr)
            if gz:
                (d / f"{stem}.gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                (d / stem).write_bytes(data)
        out[f"x_{split}"] = x[:, None]
        out[f"y_{split}"] = y
    return out


def write_stl10(root: str | Path, n_train: int = 20, n_test: int = 10, seed: int = 0) -> Arrays:
    """Write ``stl10_binary/{train,test}_{X,y}.bin``: column-major 3x96x96 images, labels 1..10."""
    rng = np.random.default_rng(seed)
    d = Path(root) / "stl10_binary"
    d.mkdir(parents=True, exist_ok=True)
    out: Arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)
        y = _labels(n, 10, rng)
        # The binary stores each channel column-major (Fortran order): write (N, C, W, H) row-major.
        (d / f"{split}_X.bin").write_bytes(np.ascontiguousarray(x.transpose(0, 1, 3, 2)).tobytes())
        (d / f"{split}_y.bin").write_bytes((y + 1).astype(np.uint8).tobytes())
        out[f"x_{split}"] = x
        out[f"y_{split}"] = y
    return out


def write_tinyimagenet(
    root: str | Path, n_classes: int = 3, n_train_per_class: int = 2, n_val_per_class: int = 1, seed: int = 0
) -> dict[str, object]:
    """Write a ``tiny-imagenet-200/`` tree (wnids.txt, train/<wnid>/images/*.JPEG, val/images +
    val_annotations.txt) of 64x64 JPEGs. JPEG is lossy, so ``x_*`` are the pixels written, not read;
    compare loosely. wnids.txt is deliberately not sorted, like the real one.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    d = Path(root) / "tiny-imagenet-200"
    # Descending ids: the class order must come from wnids.txt, not from sorting.
    wnids = [f"n{9_000_000 - 17 * i:08d}" for i in range(n_classes)]
    (d / "train").mkdir(parents=True, exist_ok=True)
    (d / "val" / "images").mkdir(parents=True, exist_ok=True)
    (d / "wnids.txt").write_text("\n".join(wnids) + "\n")

    def image(path: Path, gray: bool) -> np.ndarray:
        # Smooth images survive JPEG nearly intact, so loose comparisons stay meaningful.
        base = rng.integers(0, 256, (3, 1, 1)).astype(np.float64)
        ramp = np.linspace(0, 60, 64)
        arr = np.clip(base + ramp[None, :, None] + ramp[None, None, :], 0, 255).astype(np.uint8)
        if gray:  # the real set has some grayscale JPEGs; the loader must convert them to RGB
            arr = np.repeat(arr[:1], 3, axis=0)
            Image.fromarray(arr[0], mode="L").save(path, format="JPEG", quality=95)
        else:
            Image.fromarray(arr.transpose(1, 2, 0), mode="RGB").save(path, format="JPEG", quality=95)
        return arr

    xs_train, ys_train = [], []
    for k, w in enumerate(wnids):
        img_dir = d / "train" / w / "images"
        img_dir.mkdir(parents=True, exist_ok=True)
        (d / "train" / w / f"{w}_boxes.txt").write_text("")
        for j in range(n_train_per_class):
            xs_train.append(image(img_dir / f"{w}_{j}.JPEG", gray=(j == 1)))
            ys_train.append(k)
    xs_val, ys_val, lines = [], [], []
    for i in range(n_classes * n_val_per_class):
        k = i % n_classes
        fname = f"val_{i}.JPEG"
        xs_val.append(image(d / "val" / "images" / fname, gray=False))
        ys_val.append(k)
        lines.append(f"{fname}\t{wnids[k]}\t0\t0\t63\t63")
    (d / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return {
        "wnids": wnids,
        "x_train": np.stack(xs_train),
        "y_train": np.asarray(ys_train, dtype=np.int64),
        "x_test": np.stack(xs_val),
        "y_test": np.asarray(ys_val, dtype=np.int64),
    }
