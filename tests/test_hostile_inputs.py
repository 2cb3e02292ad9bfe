"""Hostile and careless input, one case per finding of the second reliability pass (names that become
paths, unbounded downloads and decompression, special files, values, rows that are no measurement,
leftovers, machine paths): each exits 2 with one line, writes nothing outside its output and cache
folders (the temporary root is listed before and after; the temporary-file folder must end empty),
and ends within a watchdog's time. The CLI runs in this process, as in test_reliability_inputs.py.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from _models import one_thread
from _reliability import TINY, cli, eval_args, one_line_error, train_args
from fixtures import write_cifar10, write_idx
from safetensors.torch import load_file, save_file
from test_hub_security import NAME, _submission

from robustbench_nacl.errors import UserError
from robustbench_nacl.hub import download
from robustbench_nacl.io import sha256_file
from robustbench_nacl.locks import exclusive_lock
from robustbench_nacl.models.checkpoint import portable_manifest, read_manifest
from robustbench_nacl.packaged import published_dir
from robustbench_nacl.results.rows import ROW_PACK, load_rows, stamp_ids
from robustbench_nacl.training import train
from robustbench_nacl.untrusted import gunzip_bounded, safe_name

DEACL = "convnet_small.deacl_digits-0-4_s0"  # a published model distilled from a teacher
WATCHDOG_S = 20


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-epoch TINY checkpoint (about a second)."""
    import dataclasses

    return train(dataclasses.replace(TINY, epochs=1), tmp_path_factory.mktemp("ckpt") / "run", progress=False)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A case's temporary root: ``in/`` (the hostile input, made before the listing), ``out/`` and
    ``cache/`` (the only folders a command may write) and ``tmp/`` (the temporary-file folder, which
    must end empty: no ``rbn-verify-*`` or download left behind). A watchdog ends a hung case."""
    for d in ("in", "tmp"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("ROBUSTBENCH_NACL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    def timeout(*_: object) -> None:
        raise TimeoutError(f"the case ran past its {WATCHDOG_S} s watchdog (a hang)")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(WATCHDOG_S)
    try:
        yield tmp_path
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@contextlib.contextmanager
def _writes_only_out_and_cache(root: Path) -> Iterator[None]:
    before = _listing(root)
    yield
    new = _listing(root) - before
    outside = sorted(p for p in new if p.split(os.sep)[0] not in ("out", "cache"))
    assert not outside, f"written outside out/ and cache/: {outside}"
    assert not list((root / "tmp").iterdir()), "temporary files left behind"


def _refused(root: Path, argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """Run ``argv``; exit 2 with one line holding ``fragments``, and nothing written but out/, cache/."""
    with _writes_only_out_and_cache(root):
        rc, _, err = cli(argv, capsys)
    return one_line_error(rc, err, *fragments)


# ============ names that become paths ============


def test_one_name_rule() -> None:
    for ok in ("convnet_small.dynacl++_fashion-mnist-0-4_s0", "a", "0f" * 12, "x=1@y"):
        assert safe_name(ok, "id") == ok
    for bad in ("", ".", "..", "../x", "/abs", "a/b", "a\\b", ".hidden", "a..b", "a b", "a\nb", "x" * 129, 7):
        with pytest.raises(UserError, match="is not a plain name"):
            safe_name(bad, "id")


def _forged_row(edit: Callable[[dict], None], restamp: bool = False) -> dict:
    row = load_rows(published_dir() / "demo")[0].to_json()
    edit(row)
    return stamp_ids(row) if restamp else row


def test_a_submission_row_id_cannot_name_a_path(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sub = _submission(root / "in" / "sub")
    victim = root / "in" / "victim"
    path = next((sub / "rows").glob("*.json"))
    row = json.loads(path.read_text())
    row["row_id"] = f"{victim.parent}/../{victim.parent.name}/victim"
    path.write_text(json.dumps(row))
    _refused(root, ["zoo", "verify-submission", str(sub)], capsys, "row_id")
    assert not victim.with_suffix(".json").exists()


@pytest.mark.parametrize(
    "case",
    [
        "suite /dev/zero",
        "suite a FIFO",
        "probe epochs 10**9",
        "unknown probe key",
        "robust above clean",
        "pseudo_labels a path",
    ],
)
def test_a_submission_cannot_steer_reads_or_compute(
    case: str, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sub = _submission(root / "in" / "sub")
    fragments: tuple[str, ...]
    if case == "pseudo_labels a path":
        manifest = sub / "checkpoint" / "manifest.json"
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "post": {"pseudo_labels": "../../../x"}}))
        fragments = ("post.pseudo_labels", "not a plain name")
    else:
        fifo = root / "in" / "fifo.toml"
        os.mkfifo(fifo)
        edits: dict[str, tuple[Callable[[dict], None], bool, tuple[str, ...]]] = {
            "suite /dev/zero": (lambda r: r.update(suite="/dev/zero"), False, ("suite", "not a plain name")),
            "suite a FIFO": (lambda r: r.update(suite=str(fifo)), False, ("suite", "not a plain name")),
            "probe epochs 10**9": (
                lambda r: r["probe_config"].update(epochs=10**9),
                True,
                ("probe_config.epochs", "reference protocol"),
            ),
            "unknown probe key": (lambda r: r["probe_config"].update(x=1), True, ("unknown key(s) x",)),
            "robust above clean": (
                lambda r: r.update(robust_acc=1.0, clean_acc=0.0),
                False,
                ("above clean accuracy",),
            ),
        }
        edit, restamp, fragments = edits[case]
        for path in (sub / "rows").glob("*.json"):
            row = json.loads(path.read_text())
            edit(row)
            path.write_text(json.dumps(stamp_ids(row) if restamp else row))
    _refused(root, ["zoo", "verify-submission", str(sub)], capsys, *fragments)


def test_card_and_train_ids_cannot_name_a_path(
    ckpt: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = root / "in" / "ckpt"
    shutil.copytree(ckpt, forged)
    manifest = json.loads((forged / "manifest.json").read_text())
    (forged / "manifest.json").write_text(json.dumps({**manifest, "id": "../../x"}))
    _refused(root, eval_args(forged, root / "out", "--card"), capsys, "field 'id'", "not a plain name")
    _refused(root, train_args(root / "out", 1, "--id", "../../x"), capsys, "--id", "not a plain name")


# ============ bounded downloads ============


class _Hostile(http.server.BaseHTTPRequestHandler):
    """``/forever/...``: bytes without end; ``/slow/...``: one byte every 0.3 s, never finished."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        with contextlib.suppress(OSError):
            while True:
                self.wfile.write(b"\0" * (1 << 16) if self.path.startswith("/forever") else b"\0")
                self.wfile.flush()
                if self.path.startswith("/slow"):
                    time.sleep(0.3)


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(("where", "fragment"), [("forever", "byte limit"), ("slow", "took more than")])
def test_a_download_has_a_size_cap_and_a_deadline(
    where: str,
    fragment: str,
    hostile_server: str,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(download, "MAX_DOWNLOAD", 4 << 20)
    monkeypatch.setattr(download, "DOWNLOAD_DEADLINE_S", 1.0)
    argv = [
        "eval",
        "--model",
        NAME,
        "--weights-from",
        f"{hostile_server}/{where}",
        "--out",
        str(root / "out"),
    ]
    t0 = time.monotonic()
    _refused(root, argv, capsys, "cannot download", fragment)
    assert time.monotonic() - t0 < 10
    assert not [p for p in (root / "cache").rglob("*") if p.is_file()]  # the .part file removed


# ============ decompression bombs ============


def _gzip_bomb(path: Path, inflated: int) -> None:
    """A valid gzip of ``inflated`` newlines (a few kB on disk)."""
    c = __import__("zlib").compressobj(9, wbits=31)
    block = b"\n" * (1 << 20)
    path.write_bytes(b"".join(c.compress(block) for _ in range(inflated >> 20)) + c.flush())


@pytest.mark.parametrize("command", ["leaderboard", "compare"])
def test_a_row_pack_bomb_is_refused_before_it_is_inflated(
    command: str, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("robustbench_nacl.untrusted.MAX_INFLATED", 2 << 20)
    _gzip_bomb(root / "in" / ROW_PACK, 8 << 20)
    out = ["--out", str(root / "out")] if command == "leaderboard" else []
    _refused(root, [command, "--rows", str(root / "in"), *out], capsys, "inflates")


def test_idx_and_torch_zip_bombs_are_refused_by_their_declared_sizes(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = root / "in" / "data"
    write_idx(data, layout="plain")
    header = bytes([0, 0, 8, 3]) + (60000).to_bytes(4, "big") + (28000).to_bytes(4, "big") * 2
    (data / "fashion-mnist" / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header))
    argv = ["train", "--loss", "simclr", "--dataset", "fashion-mnist", "--data-root", str(data)]
    _refused(root, [*argv, "--epochs", "1", "--out", str(root / "out")], capsys, "declares", "no such IDX")
    bomb = root / "in" / "bomb.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data/0", b"\0" * (64 << 20))
    _refused(root, eval_args(bomb, root / "out", "--arch", "convnet_small"), capsys, "decompression bomb")
    with pytest.raises(UserError, match="inflates to more than"):
        gunzip_bounded(gzip.compress(b"\0" * (1 << 20)), 1000)


# ============ special files ============


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("where", ["suite", "checkpoint", "teacher", "a row"])
def test_special_files_are_refused_wherever_a_path_is_opened(
    where: str, special: str, ckpt: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = root / "in" / "x.json"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    out = root / "out"
    argv = {
        "suite": eval_args(ckpt, out, "--suite", str(path)),
        "checkpoint": eval_args(path, out),
        "teacher": ["train", "--loss", "deacl", "--set", f"teacher={path}", "--out", str(out)],
        "a row": ["leaderboard", "--rows", str(root / "in"), "--out", str(out)],
    }[where]
    _refused(root, argv, capsys)
    with pytest.raises(UserError):  # a zoo's overrides.teacher is read the same way
        read_manifest(path)


# ============ values checked at the door ============


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--lr", "1e300"], "--lr"),
        (["--seed", "1" * 23], "--seed"),
        (["--set", "t=nan"], "t=nan"),
        (["--knn-k", "0"], "kNN k"),
        (["--knn-t", "inf"], "--knn-t"),
    ],
)
def test_train_values_are_checked_before_any_work(
    extra: list[str], fragment: str, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(root, train_args(root / "out", 1, *extra), capsys, fragment)
    assert not (root / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["leaderboard", "--headline-eps", "nan"],
        ["eval", "x", "--n-examples", "1" * 20],
        ["eval", "x", "--seed", "-1"],
        ["eval", "x", "--probe-lr", "nan"],
    ],
)
def test_cli_numbers_are_range_checked_as_they_are_parsed(
    argv: list[str], root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(root, [*argv, "--out", str(root / "out")], capsys, "argument")


def test_weights_of_a_non_float_dtype_are_refused(
    ckpt: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = root / "in" / "ckpt"
    shutil.copytree(ckpt, forged)
    weights = forged / "weights.safetensors"
    save_file({k: v.to(dtype=__import__("torch").int32) for k, v in load_file(weights).items()}, weights)
    manifest = json.loads((forged / "manifest.json").read_text())
    (forged / "manifest.json").write_text(json.dumps({**manifest, "weights_sha256": sha256_file(weights)}))
    _refused(root, eval_args(forged, root / "out"), capsys, "dtype torch.int32", "not a floating-point")


def test_labels_that_are_not_integers_and_npz_arrays_are_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = root / "in" / "data"
    write_cifar10(data, py2_style=False)
    batch = data / "cifar-10-batches-py" / "data_batch_1"
    content = pickle.loads(batch.read_bytes())
    content[b"labels"] = [v + 0.5 for v in content[b"labels"]]
    batch.write_bytes(pickle.dumps(content, protocol=2))
    argv = ["train", "--loss", "simclr", "--dataset", "cifar10", "--data-root", str(data), "--epochs", "1"]
    _refused(root, [*argv, "--out", str(root / "out")], capsys, "integer labels")
    # a released corruption set whose .npy is an .npz archive, or whose labels are floats
    from robustbench_nacl.data.released import _open_released

    released = root / "in" / "released"
    released.mkdir()
    np.save(released / "labels.npy", np.zeros(50, dtype=np.int64))
    np.savez(released / "gaussian_noise.npy", x=np.zeros(3))
    shutil.move(released / "gaussian_noise.npy.npz", released / "gaussian_noise.npy")
    with pytest.raises(UserError, match=r"an \.npz archive"):
        _open_released(released, "gaussian_noise", 1)
    np.save(released / "labels.npy", np.zeros(50))
    np.save(released / "gaussian_noise.npy", np.zeros((50, 32, 32, 3), dtype=np.uint8))
    with pytest.raises(UserError, match="float64 labels, not integers"):
        _open_released(released, "gaussian_noise", 1)


# ============ rows that cannot be a measurement ============


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda r: r.update(n_examples_evaluated=0), "n_examples_evaluated 0"),
        (lambda r: r.update(robust_acc=1.0, clean_acc=0.0), "above clean accuracy"),
        (lambda r: r.update(n_examples=10**20), "n_examples"),
        (lambda r: r.update(row_id="../../x"), "row_id"),
    ],
    ids=["no example evaluated", "robust above clean", "a 20-digit n_examples", "a row id path"],
)
def test_rows_that_cannot_be_a_measurement_are_refused(
    edit: Callable[[dict], None], fragment: str, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (root / "in" / "rows").mkdir()
    (root / "in" / "rows" / "r.json").write_text(json.dumps(_forged_row(edit)))
    argv = ["leaderboard", "--rows", str(root / "in"), "--reported", "robustssl", "--out", str(root / "out")]
    _refused(root, argv, capsys, fragment)


# ============ clean exits ============


def test_a_second_train_into_a_busy_out_is_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = root / "out"
    with exclusive_lock(out, "train", "training"):
        line = _refused(root, train_args(out, 1), capsys, "is training in", "choose another --out")
    assert f"pid {os.getpid()}" in line
    assert not out.exists()  # the lock's folder went with it: nothing is left of the refused run


# ============ no machine paths in what ships or what eval --model writes ============


def test_provenance_names_a_teacher_by_id_and_sha256_never_by_path(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = read_manifest(published_dir() / "demo" / "models" / DEACL)
    shipped = json.dumps(portable_manifest(manifest))
    assert '"/' not in shipped, "an absolute path in a manifest made fit to ship"
    assert portable_manifest(manifest)["teacher"]["weights_sha256"] == manifest["teacher"]["weights_sha256"]
    argv = ["eval", "--model", DEACL, "--suite", "quick", "--n-examples", "20", "--probe-epochs", "2"]
    with _writes_only_out_and_cache(root):
        rc, _, err = cli([*argv, "--out", str(root / "out"), "--no-progress"], capsys)
    assert rc == 0, err
    for row in load_rows(root / "out"):
        text = json.dumps(row.to_json())
        assert '"/' not in text and str(published_dir()) not in text, row.row_id
        assert (
            row["loss_params"]["extra"]["teacher"]["weights_sha256"] == manifest["teacher"]["weights_sha256"]
        )
