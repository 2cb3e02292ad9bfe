"""Tests for robustbench_nacl.data: every loader is run on tiny fixtures in the real file formats."""

from __future__ import annotations

import gzip
import os
import pickle
import sys
import types
import urllib.error
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import (  # tests/ is on sys.path under pytest's default import mode
    idx_bytes,
    py2_pickle_bytes,
    write_cifar10,
    write_cifar100,
    write_idx,
    write_stl10,
    write_tinyimagenet,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import robustbench_nacl.data as data
from robustbench_nacl.data import (
    DATASETS,
    ENV_VAR,
    DatasetSpec,
    ImageData,
    data_root,
    dataset_names,
    load_dataset,
    loaders,
    normalization,
    parse_spec,
    read_idx,
    restricted_unpickle,
    shifts,
)
from robustbench_nacl.errors import DatasetNotFound, UserError
from robustbench_nacl.registry import Registry

ALL = ["cifar10", "cifar100", "stl10", "stl10-32", "tinyimagenet", "fashion-mnist", "mnist", "digits"]


@pytest.fixture(autouse=True)
def _fresh_cache():
    data.clear_cache()
    yield
    data.clear_cache()


def tree(path: Path) -> list[str]:
    """Every file and directory under ``path`` (hidden ones included), for "nothing was written" checks."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def digits_reference() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return np.rint(d.images * 255 / 16).astype(np.uint8)[:, None], d.target


# ------------------------------------------------------------------------------------------
# registry, specs, roots
# ------------------------------------------------------------------------------------------


def test_registry_names_and_info():
    assert sorted(dataset_names()) == sorted(ALL)
    for name in ALL:
        info = DATASETS.info(name)
        assert {"num_classes", "channels", "size", "how_to_get", "normalization"} <= set(info)
        assert info["normalization"] == "half"
        mean, std = normalization(name)
        assert mean == std == (0.5,) * info["channels"]
    assert normalization("cifar100:0-49@grayscale") == ((0.5,) * 3, (0.5,) * 3)
    assert normalization("digits") == ((0.5,), (0.5,))


def test_parse_spec_forms():
    assert parse_spec("cifar10") == DatasetSpec("cifar10", None, None)
    assert parse_spec(" digits:0-4 ") == DatasetSpec("digits", (0, 1, 2, 3, 4), None)
    assert parse_spec("digits:3").subset == (3,)
    assert parse_spec("digits:7,2,5").subset == (7, 2, 5)
    assert parse_spec("digits:0-2,9").subset == (0, 1, 2, 9)
    s = parse_spec("cifar100:0-49@grayscale+jitter")
    assert (s.name, s.subset, s.shift) == ("cifar100", tuple(range(50)), "grayscale+jitter")
    assert s.base == "cifar100@grayscale+jitter"
    # str() is canonical: a spelled-out ascending run prints as a range
    assert str(parse_spec("digits:0,1,2,3,4@flip")) == "digits:0-4@flip"
    assert str(parse_spec("digits:7,2")) == "digits:7,2"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "cifar10"),
        ("imagenet", "fashion-mnist"),  # unknown name lists the valid ones
        ("digits:10", "0-9"),
        ("digits:0-10", "0-9"),
        ("cifar100:0-100", "0-99"),
        ("digits:4-2", "0-9"),
        ("digits:", "0-9"),
        ("digits:a", "0-9"),
        ("digits:-1", "0-9"),
        ("digits:1,1", "twice"),
        ("digits@blur", "grayscale+jitter"),  # unknown shift lists the valid ones
        ("digits@", "grayscale"),
    ],
)
def test_parse_spec_errors(spec, needle):
    with pytest.raises(UserError) as e:
        parse_spec(spec)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_split():
    with pytest.raises(UserError, match="train, test"):
        load_dataset("digits", "val")


def test_data_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert data_root() == tmp_path / "home" / ".cache" / "robustbench_nacl"
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root(str(tmp_path / "arg")) == tmp_path / "arg"
    assert not (tmp_path / "home").exists() and not (tmp_path / "env").exists()


def test_env_var_is_used_for_loading(tmp_path, monkeypatch):
    written = write_cifar10(tmp_path / "envroot")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "envroot"))
    ds = load_dataset("cifar10", "test", download=False)
    np.testing.assert_array_equal(ds.x.numpy(), written["x_test"])
    # An explicit root still wins over the variable.
    with pytest.raises(DatasetNotFound, match=str(tmp_path / "other")):
        load_dataset("cifar10", "test", root=tmp_path / "other", download=False)


# ------------------------------------------------------------------------------------------
# digits (the embedded default)
# ------------------------------------------------------------------------------------------


def test_digits_offline_shapes_and_values(tmp_path):
    ref_x, ref_y = digits_reference()
    train = load_dataset("digits", "train", root=tmp_path / "nothing-here", download=False)
    test = load_dataset("digits", "test", root=tmp_path / "nothing-here", download=False)
    assert isinstance(train, ImageData)
    assert (len(train), len(test)) == (1437, 360)
    assert train.x.shape == (1437, 1, 8, 8) and test.x.shape == (360, 1, 8, 8)
    assert train.x.dtype == torch.uint8 and train.y.dtype == torch.int64
    assert int(train.x.min()) == 0 and int(train.x.max()) == 255
    assert train.num_classes == 10 and train.classes == tuple(range(10)) and train.name == "digits"
    np.testing.assert_array_equal(train.x.numpy(), ref_x[:1437])
    np.testing.assert_array_equal(test.y.numpy(), ref_y[1437:])
    assert sorted(set(test.y.tolist())) == list(range(10))
    assert not (tmp_path / "nothing-here").exists()  # loading digits writes nothing
    assert "n=1437" in repr(train)


def test_digits_subset_remaps_labels():
    full = load_dataset("digits", "train")
    sub = load_dataset("digits:5-9", "train")
    keep = full.y >= 5
    assert sub.num_classes == 5 and sub.classes == (5, 6, 7, 8, 9) and sub.name == "digits:5-9"
    assert torch.equal(sub.x, full.x[keep])
    assert torch.equal(sub.y, full.y[keep] - 5)
    one = load_dataset("digits:3", "test")
    assert one.num_classes == 1 and set(one.y.tolist()) == {0}
    assert len(one) == int((load_dataset("digits", "test").y == 3).sum())
    rev = load_dataset("digits:7,2", "train")
    assert rev.classes == (7, 2)
    assert torch.equal(rev.y, (full.y[(full.y == 7) | (full.y == 2)] == 2).long())  # label 0 is class 7


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=10, unique=True))
def test_subset_property(classes):
    full = load_dataset("digits", "test")
    spec = "digits:" + ",".join(map(str, classes))
    sub = load_dataset(spec, "test")
    mask = torch.isin(full.y, torch.tensor(classes))
    assert sub.classes == tuple(classes) and sub.num_classes == len(classes)
    assert torch.equal(sub.x, full.x[mask])
    assert [classes[k] for k in sub.y.tolist()] == full.y[mask].tolist()
    assert parse_spec(sub.name).subset == tuple(classes)  # the canonical name round-trips


def test_raw_arrays_are_cached():
    a = load_dataset("digits", "train")
    b = load_dataset("digits", "train")
    assert a.x is b.x and a.y is b.y
    sub = load_dataset("digits:0-4", "train")
    assert sub.x.data_ptr() != a.x.data_ptr()  # subsets are copies, never views of the cache


# ------------------------------------------------------------------------------------------
# shifts
# ------------------------------------------------------------------------------------------


def _fake_augment(monkeypatch, calls: list[tuple[int, int]]) -> None:
    """A stand-in augment module (shape-preserving, generator-driven) to test the plumbing alone."""
    shifts: Registry = Registry("distribution shift")

    def noise(x, gen):
        calls.append((x.shape[0], gen.initial_seed()))
        assert x.dtype == torch.float32 and float(x.min()) >= 0 and float(x.max()) <= 1
        return (x + 0.2 * torch.rand(x.shape[0], 1, 1, 1, generator=gen)).clamp(0, 1)

    shifts.add("noise", noise)
    module = types.ModuleType("robustbench_nacl.augment.views")
    module.SHIFTS = shifts
    monkeypatch.setitem(sys.modules, "robustbench_nacl.augment.views", module)


def test_shift_plumbing(monkeypatch):
    calls: list[tuple[int, int]] = []
    _fake_augment(monkeypatch, calls)
    monkeypatch.setattr(shifts, "SHIFT_CHUNK", 500)
    base = load_dataset("digits", "train")
    a = load_dataset("digits@noise", "train")
    assert [n for n, _ in calls] == [500, 500, 437]  # chunked, one generator across chunks
    seed = zlib.crc32(b"digits@noise|train")  # stable across processes, unlike hash()
    assert {s for _, s in calls} == {seed}
    data.clear_cache()
    b = load_dataset("digits@noise", "train")
    assert torch.equal(a.x, b.x) and torch.equal(a.y, base.y)
    assert a.x.dtype == torch.uint8 and a.x.shape == base.x.shape
    assert not torch.equal(a.x, base.x)
    # per-image parameters: the brightness offsets differ between images
    assert len({int((a.x[i].int() - base.x[i].int()).max()) for i in range(50)}) > 5
    calls.clear()
    load_dataset("digits@noise", "test")
    assert {s for _, s in calls} == {zlib.crc32(b"digits@noise|test")}  # the split is part of the seed
    # a subset of a shifted set is exactly the shifted set's subset
    sub = load_dataset("digits:2-3@noise", "train")
    assert torch.equal(sub.x, a.x[(a.y == 2) | (a.y == 3)])
    assert sub.name == "digits:2-3@noise"
    with pytest.raises(UserError, match="valid shifts: noise"):
        load_dataset("digits@grayscale", "train")


def test_real_shifts_deterministic_and_effective(tmp_path):
    from robustbench_nacl.augment.views import SHIFTS

    assert set(SHIFTS.names()) == {"grayscale", "crop", "flip", "jitter", "grayscale+jitter"}
    write_cifar10(tmp_path, n_train=50, n_test=20)
    base = load_dataset("cifar10", "test", root=tmp_path)
    for shift in SHIFTS.names():
        spec = f"cifar10@{shift}"
        a = load_dataset(spec, "test", root=tmp_path)
        data.clear_cache()
        b = load_dataset(spec, "test", root=tmp_path)
        assert torch.equal(a.x, b.x), shift
        assert a.x.dtype == torch.uint8 and a.x.shape == base.x.shape, shift
        assert not torch.equal(a.x, base.x), shift
        assert torch.equal(a.y, base.y), shift
        if "grayscale" in shift:
            assert torch.equal(a.x[:, 0], a.x[:, 1]) and torch.equal(a.x[:, 1], a.x[:, 2])
    # random shifts draw per-image parameters: flip changes some images and leaves others alone
    flip = load_dataset("cifar10@flip", "test", root=tmp_path)
    flipped = [torch.equal(flip.x[i], base.x[i].flip(-1)) for i in range(len(base))]
    assert 0 < sum(flipped) < len(base)
    assert all(f or torch.equal(flip.x[i], base.x[i]) for i, f in enumerate(flipped))


# ------------------------------------------------------------------------------------------
# CIFAR and the restricted unpickler
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("py2_style", [True, False])
def test_cifar10_fixture_roundtrip(tmp_path, py2_style):
    w = write_cifar10(tmp_path, n_train=55, n_test=12, py2_style=py2_style)
    tr = load_dataset("cifar10", "train", root=tmp_path, download=False)
    te = load_dataset("cifar10", "test", root=tmp_path, download=False)
    assert tr.x.shape == (55, 3, 32, 32) and te.x.shape == (12, 3, 32, 32)
    np.testing.assert_array_equal(tr.x.numpy(), w["x_train"])
    np.testing.assert_array_equal(tr.y.numpy(), w["y_train"])
    np.testing.assert_array_equal(te.x.numpy(), w["x_test"])
    np.testing.assert_array_equal(te.y.numpy(), w["y_test"])


def test_cifar_pixel_layout(tmp_path):
    """Row i of b'data' is 1024 red, 1024 green, 1024 blue values, each plane row-major."""
    write_cifar10(tmp_path, n_train=5, n_test=1)
    d = tmp_path / "cifar-10-batches-py"
    row = np.zeros(3072, dtype=np.uint8)
    row[0] = 10  # red, (0, 0)
    row[1] = 11  # red, (0, 1)
    row[32] = 12  # red, (1, 0)
    row[1024] = 20  # green, (0, 0)
    row[2048 + 1023] = 30  # blue, (31, 31)
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"data": row[None],
        b"labels": [3],
        b"filenames": [b"x.png"],
    }
    (d / "test_batch").write_bytes(py2_pickle_bytes(batch))
    img = load_dataset("cifar10", "test", root=tmp_path).x[0]
    assert (int(img[0, 0, 0]), int(img[0, 0, 1]), int(img[0, 1, 0])) == (10, 11, 12)
    assert (int(img[1, 0, 0]), int(img[2, 31, 31])) == (20, 30)


def test_cifar100_fine_labels_and_subset(tmp_path):
    w = write_cifar100(tmp_path, n_train=200, n_test=100)
    tr = load_dataset("cifar100", "train", root=tmp_path, download=False)
    assert tr.num_classes == 100
    np.testing.assert_array_equal(tr.y.numpy(), w["y_train"])  # fine, not coarse, labels
    np.testing.assert_array_equal(tr.x.numpy(), w["x_train"])
    half = load_dataset("cifar100:0-49", "test", root=tmp_path, download=False)
    keep = w["y_test"] < 50
    assert half.num_classes == 50 and len(half) == int(keep.sum())
    np.testing.assert_array_equal(half.x.numpy(), w["x_test"][keep])
    np.testing.assert_array_equal(half.y.numpy(), w["y_test"][keep])


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = tmp_path / "evil.pkl"
    payload.write_bytes(pickle.dumps({b"data": _Evil(marker)}, protocol=2))
    with pytest.raises(UserError, match="refusing to load global") as e:
        restricted_unpickle(payload)
    assert str(payload) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()
    # The same payload in place of a real CIFAR batch: a clean error, and nothing runs.
    write_cifar10(tmp_path / "root", n_train=5, n_test=2)
    (tmp_path / "root" / "cifar-10-batches-py" / "test_batch").write_bytes(payload.read_bytes())
    with pytest.raises(UserError, match="test_batch"):
        load_dataset("cifar10", "test", root=tmp_path / "root")
    assert not marker.exists()


@pytest.mark.parametrize(
    "global_name",
    [b"builtins\neval\n", b"numpy\nload\n", b"numpy.core.multiarray\nscalar\n", b"torch\nload\n"],
)
def test_restricted_unpickler_allowlist(tmp_path, global_name):
    p = tmp_path / "g.pkl"
    p.write_bytes(b"\x80\x02c" + global_name + b".")
    with pytest.raises(UserError, match="refusing"):
        restricted_unpickle(p)


def test_restricted_unpickler_codecs_only_latin1(tmp_path):
    p = tmp_path / "c.pkl"
    p.write_bytes(pickle.dumps(b"\xffok", protocol=2))  # _codecs.encode('\xffok', 'latin1')
    assert restricted_unpickle(p) == b"\xffok"
    p.write_bytes(pickle.dumps(b"ok", protocol=2).replace(b"latin1", b"rot_13"))
    with pytest.raises(UserError, match="refusing"):
        restricted_unpickle(p)


def test_truncated_cifar_pickle(tmp_path):
    write_cifar10(tmp_path, n_train=5, n_test=3)
    batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(batch.read_bytes()[:200])
    with pytest.raises(UserError, match="test_batch") as e:
        load_dataset("cifar10", "test", root=tmp_path)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------
# not found, and downloads that fail or succeed
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("root_exists", [True, False])
@pytest.mark.parametrize("download", [True, False])
def test_missing_dataset_writes_nothing(tmp_path, monkeypatch, root_exists, download):
    attempts: list[Path] = []

    class OfflineCIFAR10:  # what torchvision does without network: partial files, then an error
        def __init__(self, root, download=False, **kw):
            attempts.append(Path(root))
            (Path(root) / "cifar-10-python.tar.gz").write_bytes(b"partial")
            raise urllib.error.URLError("[Errno -2] Name or service not known")

    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", OfflineCIFAR10)
    root = tmp_path / "data"
    if root_exists:
        root.mkdir()
        (root / "unrelated.txt").write_text("keep")
    before = tree(tmp_path)
    with pytest.raises(DatasetNotFound) as e:
        load_dataset("cifar10", "train", root=root, download=download)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(root / "cifar-10-batches-py") in msg and "--data-root" in msg and "CIFAR-10" in msg
    assert ("no network" in msg) == download
    assert len(attempts) == int(download)
    if download:
        assert attempts[0].parent == root  # the temp dir lives under the root (same-filesystem rename)
    assert tree(tmp_path) == before


def test_download_success_moves_into_place(tmp_path, monkeypatch):
    written: dict = {}

    class FakeCIFAR10:
        def __init__(self, root, download=False, **kw):
            written.update(write_cifar10(root, n_train=10, n_test=5))

    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    root = tmp_path / "new" / "root"
    ds = load_dataset("cifar10", "test", root=root)
    np.testing.assert_array_equal(ds.x.numpy(), written["x_test"])
    assert [p.name for p in root.iterdir()] == ["cifar-10-batches-py"]  # no temp dir left


def test_incomplete_folder_is_not_overwritten(tmp_path):
    write_cifar10(tmp_path, n_train=5, n_test=2)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    before = tree(tmp_path)
    with pytest.raises(DatasetNotFound, match="incomplete"):
        load_dataset("cifar10", "test", root=tmp_path, download=True)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", ["cifar100", "stl10", "tinyimagenet", "mnist", "fashion-mnist"])
def test_every_dataset_reports_not_found(tmp_path, monkeypatch, name):
    monkeypatch.setattr(loaders, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "no-system-copy")
    root = tmp_path / "data"
    root.mkdir()
    before = tree(tmp_path)
    with pytest.raises(DatasetNotFound) as e:
        load_dataset(name, "test", root=root, download=False)
    msg = str(e.value)
    assert "\n" not in msg and str(root) in msg and msg.startswith(f"{name} not found under ")
    if name == "tinyimagenet":
        assert "http://cs231n.stanford.edu/tiny-imagenet-200.zip" in msg
    if name == "fashion-mnist":
        for place in ("FashionMNIST/raw", "fashion-mnist", "no-system-copy"):
            assert place in msg
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------------------
# IDX (mnist, fashion-mnist)
# ------------------------------------------------------------------------------------------


def test_idx_parser(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = idx_bytes(arr)
    assert raw[:4] == b"\x00\x00\x08\x03" and raw[4:8] == b"\x00\x00\x00\x02"  # big-endian dims
    (tmp_path / "a").write_bytes(raw)
    (tmp_path / "a.gz").write_bytes(gzip.compress(raw))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    labels = np.array([3, 1, 4], dtype=np.uint8)
    (tmp_path / "l").write_bytes(idx_bytes(labels))
    np.testing.assert_array_equal(read_idx(tmp_path / "l"), labels)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (lambda raw: raw[:-5], "truncated"),
        (lambda raw: raw + b"\x00", "corrupt"),
        (lambda raw: raw[:10], "truncated"),
        (lambda raw: b"\x00\x00\x0d" + raw[3:], "bad magic"),
        (lambda raw: b"", "bad magic"),
        (lambda raw: gzip.compress(raw)[:-20], "cannot read"),
    ],
)
def test_idx_parser_rejects_bad_files(tmp_path, content, needle):
    p = tmp_path / "bad-idx3-ubyte"
    p.write_bytes(content(idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))))
    with pytest.raises(UserError, match=needle) as e:
        read_idx(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kind", "layout", "gz"), [("mnist", "torchvision", True), ("fashion-mnist", "plain", False)]
)
def test_idx_datasets_load(tmp_path, kind, layout, gz):
    w = write_idx(tmp_path, kind=kind, n_train=30, n_test=20, layout=layout, gz=gz)
    for split in ("train", "test"):
        ds = load_dataset(kind, split, root=tmp_path, download=False)
        assert ds.x.shape == (len(w[f"y_{split}"]), 1, 28, 28) and ds.x.dtype == torch.uint8
        np.testing.assert_array_equal(ds.x.numpy(), w[f"x_{split}"])
        np.testing.assert_array_equal(ds.y.numpy(), w[f"y_{split}"])


def test_truncated_idx_dataset_is_a_clean_error(tmp_path):
    write_idx(tmp_path, kind="fashion-mnist", gz=True)
    p = tmp_path / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-100]))
    with pytest.raises(UserError, match=r"t10k-images-idx3-ubyte\.gz") as e:
        load_dataset("fashion-mnist", "test", root=tmp_path, download=False)
    assert "truncated" in str(e.value) and "\n" not in str(e.value)


def test_fashion_mnist_from_debian_package(tmp_path):
    """Debian's dataset-fashion-mnist puts the gzipped IDX files in /usr/share/datasets/fashion-mnist."""
    root = tmp_path / "empty-root"
    system_dir = loaders.FASHION_MNIST_SYSTEM_DIR
    if (system_dir / "train-images-idx3-ubyte.gz").is_file():
        tr = load_dataset("fashion-mnist", "train", root=root, download=False)
        te = load_dataset("fashion-mnist", "test", root=root, download=False)
        assert tr.x.shape == (60000, 1, 28, 28) and te.x.shape == (10000, 1, 28, 28)
        assert tr.x.dtype == torch.uint8 and int(tr.x.max()) == 255
        assert torch.bincount(tr.y).tolist() == [6000] * 10
        assert torch.bincount(te.y).tolist() == [1000] * 10
    else:
        with pytest.raises(DatasetNotFound, match=str(system_dir)):
            load_dataset("fashion-mnist", "train", root=root, download=False)
    assert not root.exists()


# ------------------------------------------------------------------------------------------
# STL-10 and Tiny ImageNet
# ------------------------------------------------------------------------------------------


def test_stl10_fixture_and_orientation(tmp_path):
    w = write_stl10(tmp_path, n_train=6, n_test=4)
    tr = load_dataset("stl10", "train", root=tmp_path, download=False)
    np.testing.assert_array_equal(tr.x.numpy(), w["x_train"])
    np.testing.assert_array_equal(tr.y.numpy(), w["y_train"])
    # One image whose only bright pixel is green, row 0, column 5. Each channel is stored
    # column-major, so that pixel's byte sits at channel * 96*96 + column * 96 + row.
    raw = np.zeros(3 * 96 * 96, dtype=np.uint8)
    raw[96 * 96 + 5 * 96 + 0] = 200
    d = tmp_path / "stl10_binary"
    (d / "test_X.bin").write_bytes(raw.tobytes())
    (d / "test_y.bin").write_bytes(bytes([10]))
    te = load_dataset("stl10", "test", root=tmp_path, download=False)
    assert te.x.shape == (1, 3, 96, 96) and int(te.x[0, 1, 0, 5]) == 200 and int(te.y[0]) == 9


def test_stl10_mismatched_files(tmp_path):
    write_stl10(tmp_path, n_train=3, n_test=2)
    (tmp_path / "stl10_binary" / "test_y.bin").write_bytes(bytes([1, 2, 3]))
    with pytest.raises(UserError, match=r"test_y\.bin"):
        load_dataset("stl10", "test", root=tmp_path)


def test_tinyimagenet_fixture_and_cache(tmp_path):
    w = write_tinyimagenet(tmp_path, n_classes=3, n_train_per_class=2, n_val_per_class=2)
    d = tmp_path / "tiny-imagenet-200"
    tr = load_dataset("tinyimagenet", "train", root=tmp_path, download=False)
    te = load_dataset("tinyimagenet", "test", root=tmp_path, download=False)
    assert tr.x.shape == (6, 3, 64, 64) and te.x.shape == (6, 3, 64, 64)
    np.testing.assert_array_equal(tr.y.numpy(), w["y_train"])  # labels follow wnids.txt order
    np.testing.assert_array_equal(te.y.numpy(), w["y_test"])
    assert np.abs(tr.x.numpy().astype(int) - w["x_train"].astype(int)).mean() < 3  # JPEG is lossy
    assert (d / "cache_train.npz").is_file() and (d / "cache_test.npz").is_file()
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    with np.load(d / "cache_train.npz", allow_pickle=False) as z:
        assert list(z["wnids"]) == w["wnids"]
    # Later loads read the cache (proof: the JPEGs are gone) and give identical arrays.
    for p in (d / "train").rglob("*.JPEG"):
        p.write_bytes(b"not a jpeg any more")
    data.clear_cache()
    again = load_dataset("tinyimagenet", "train", root=tmp_path)
    assert torch.equal(again.x, tr.x) and torch.equal(again.y, tr.y)
    # A corrupt cache is rebuilt from the images, and a corrupt image is a clean error.
    (d / "cache_train.npz").write_bytes(b"garbage")
    data.clear_cache()
    with pytest.raises(UserError, match="cannot decode"):
        load_dataset("tinyimagenet", "train", root=tmp_path)
