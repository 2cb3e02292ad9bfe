"""Faults: SIGKILL at random points, output failures (read-only, vanished, disk full), concurrent writers.

Nothing may be lost and nothing half-written may be left behind: a killed ``train`` resumes to the
same bits, a killed ``eval`` resumes without recomputing finished rows, and a failed write is one
line on stderr with exit code 2 and no partial file. Disk-full and I/O errors are injected on the
write path (always); a tiny or read-only tmpfs is used where this process may mount one (root).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from _models import one_thread
from _reliability import (
    ROWS_PER_SETTING,
    TINY,
    assert_rows_complete,
    cli,
    eval_args,
    leftovers,
    one_line_error,
    row_files,
    train_args,
)
from conftest import run_cli

from robustbench_nacl import io as rio
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.io import sha256_file, write_bytes_atomic, write_json_atomic
from robustbench_nacl.models.checkpoint import read_manifest
from robustbench_nacl.results import rows as results
from robustbench_nacl.training import loop as trainer
from robustbench_nacl.training import train

QUICK = {"suite": "quick", "n_examples": 40, "probe": ProbeConfig(epochs=30), "progress": False}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny nets: a second intra-op thread only spins, and on a loaded machine it costs 10x."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(TINY, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


@pytest.fixture(scope="module")
def ref_sha(ckpt: Path) -> str:
    """The weights of an uninterrupted in-process run of ``TINY`` (what every faulted run must end at)."""
    return read_manifest(ckpt)["weights_sha256"]


# ============ fault injection on the write path ============


class DiskFault:
    """Make atomic writes of matching files fail with ``err`` at one stage, after ``after`` successes.

    Stages: "create" (the temporary file cannot be created: read-only or vanished directory),
    "write" (half the bytes are written, then the error: disk full), "fsync" (the data cannot be
    flushed: disk full or I/O error), "replace" (the rename fails: the directory vanished).
    Only :mod:`robustbench_nacl.io` sees the faulty ``os`` and ``tempfile``.
    """

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        stage: str,
        *,
        err: int = errno.ENOSPC,
        match: Callable[[str], bool] = lambda name: True,
        after: int = 0,
    ) -> None:
        self.stage, self.err, self.match, self.after = stage, err, match, after
        self.armed = True
        self.seen = 0  # matching writes started
        self.failed: list[str] = []
        self._fds: dict[int, str] = {}  # armed fd -> tmp path
        fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        fake_os.fdopen, fake_os.fsync, fake_os.replace = self._fdopen, self._fsync, self._replace
        monkeypatch.setattr(rio, "os", fake_os)
        monkeypatch.setattr(rio, "tempfile", types.SimpleNamespace(mkstemp=self._mkstemp))

    def _error(self, name: str) -> OSError:
        self.failed.append(name)
        return OSError(self.err, os.strerror(self.err))

    def _mkstemp(self, prefix: str = "", suffix: str = "", dir: str | Path | None = None) -> tuple[int, str]:
        name = prefix[1:-1]  # atomic_open's prefix is ".NAME."
        hit = self.armed and self.match(name)
        if hit:
            self.seen += 1
            hit = self.seen > self.after
        if hit and self.stage == "create":
            raise self._error(name)
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dir)
        self._fds.pop(fd, None)  # the number of a file closed since
        if hit:
            self._fds[fd] = tmp
        return fd, tmp

    def _fdopen(self, fd: int, mode: str = "r", *a, **kw):
        f = os.fdopen(fd, mode, *a, **kw)
        if fd in self._fds and self.stage == "write":
            return _HalfWriter(f, self)
        return f

    def _fsync(self, fd: int) -> None:
        if fd in self._fds and self.stage == "fsync":
            raise self._error(Path(self._fds[fd]).name)
        os.fsync(fd)

    def _replace(self, src, dst) -> None:
        if self.stage == "replace" and str(src) in self._fds.values():
            raise self._error(Path(dst).name)
        os.replace(src, dst)


class _HalfWriter:
    """A file whose first write stores half the bytes and then fails (the disk filled up)."""

    def __init__(self, f, fault: DiskFault) -> None:
        self._f, self._fault = f, fault

    def write(self, data) -> int:
        data = bytes(data) if not isinstance(data, str) else data
        self._f.write(data[: max(1, len(data) // 2)])
        self._f.flush()
        raise self._fault._error(self._f.name if isinstance(self._f.name, str) else "fd")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


WRITE_FAULTS = [
    ("create", errno.EROFS),
    ("create", errno.EACCES),
    ("create", errno.ENOENT),
    ("write", errno.ENOSPC),
    ("fsync", errno.ENOSPC),
    ("fsync", errno.EIO),
    ("replace", errno.ENOENT),
]


@pytest.mark.parametrize(
    ("stage", "err"), WRITE_FAULTS, ids=[f"{s}-{errno.errorcode[e]}" for s, e in WRITE_FAULTS]
)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_failed_atomic_write_leaves_no_partial_file(
    stage: str, err: int, existing: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out" / "row.json"
    if existing:
        write_json_atomic(target, {"old": True})
    before = target.read_bytes() if existing else None
    fault = DiskFault(monkeypatch, stage, err=err)
    with pytest.raises(UserError) as info:
        write_json_atomic(target, {"new": list(range(1000))})
    msg = str(info.value)
    assert "\n" not in msg and str(target) in msg and os.strerror(err) in msg, msg
    assert fault.failed, "the fault was not triggered"
    assert (target.read_bytes() if target.exists() else None) == before  # untouched, never truncated
    assert not leftovers(tmp_path)


def test_disk_full_inside_torch_save_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.save into a real file wraps the failed write in a RuntimeError (its C++ writer, seen on a
    # full tmpfs: "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", whose
    # context is the OSError); it must still read as a disk problem
    DiskFault(monkeypatch, "write")
    with pytest.raises(UserError, match="No space left on device"), rio.atomic_open(tmp_path / "s.pt") as f:
        try:
            f.write(b"x" * 1000)
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    with pytest.raises(UserError, match="No space left on device"), rio.atomic_open(tmp_path / "t.pt") as f:
        torch.save({"w": torch.zeros(10_000)}, f)  # through a Python file object: a plain OSError
    assert not list(tmp_path.iterdir())
    # other errors keep their type (a bug must not be reported as a disk problem)
    with pytest.raises(KeyError), rio.atomic_open(tmp_path / "u.json") as f:
        raise KeyError("bug")
    assert not list(tmp_path.iterdir())


# ============ disk full and I/O errors through the CLI ============


def test_disk_full_during_eval_keeps_finished_rows_and_a_rerun_completes(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lb"
    fault = DiskFault(monkeypatch, "write", match=lambda n: n.endswith(".json"), after=2)
    rc, _, err = cli(eval_args(ckpt, out), capsys)
    one_line_error(rc, err, "No space left on device", "nothing was written", command="eval")
    kept = assert_rows_complete(out, 2)  # the two rows written before the disk filled, intact
    stamps = {p: p.stat().st_mtime_ns for p in row_files(out)}
    fault.armed = False  # space freed
    rc, _, err = cli(eval_args(ckpt, out), capsys)
    assert rc == 0, err
    rows = assert_rows_complete(out, ROWS_PER_SETTING)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished rows not rewritten
    assert all(rows[k] == v for k, v in kept.items())


TRAIN_FAULTS = {
    # the state after each epoch (torch.save: the error arrives wrapped in a RuntimeError)
    "state-ENOSPC": ("write", errno.ENOSPC, "train_state.pt"),
    # the final weights: the state of the last epoch survives, so --resume finishes the run
    "weights-ENOSPC": ("write", errno.ENOSPC, "weights.safetensors"),
    # the manifest is written last: weights exist but the run is not marked complete
    "manifest-EIO": ("fsync", errno.EIO, "manifest.json"),
}


@pytest.mark.parametrize("case", list(TRAIN_FAULTS))
def test_write_failure_during_train_then_resume_reaches_the_same_bits(
    case: str,
    ref_sha: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stage, err, name = TRAIN_FAULTS[case]
    out = tmp_path / "run"
    fault = DiskFault(monkeypatch, stage, err=err, match=lambda n: n == name)
    rc, _, stderr = cli(train_args(out), capsys)
    one_line_error(rc, stderr, name, os.strerror(err), command="train")
    assert fault.failed and not (out / name).exists()
    assert not (out / "manifest.json").exists() and not leftovers(tmp_path)
    if (out / "weights.safetensors").exists():  # written whole, or not at all
        assert len((out / "weights.safetensors").read_bytes()) > 1000
    if (out / "train_state.pt").exists():
        assert torch.load(out / "train_state.pt", weights_only=True)["epoch"] == TINY.epochs
    fault.armed = False
    rc, _, stderr = cli(train_args(out, TINY.epochs, "--resume"), capsys)
    assert rc == 0, stderr
    assert read_manifest(out)["weights_sha256"] == ref_sha == sha256_file(out / "weights.safetensors")
    assert not leftovers(tmp_path)


def test_any_os_error_reaching_the_cli_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last line of defence: an OSError from a write no check anticipated (here: inside the
    trainer) is still one line and exit code 2, not a traceback."""

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/srv/shared/run/log.jsonl")

    # The CLI looks `train` up on the training package (the package attribute, not the function).
    monkeypatch.setattr(importlib.import_module("robustbench_nacl.training"), "train", denied)
    rc, _, err = cli(train_args(tmp_path / "run"), capsys)
    one_line_error(rc, err, "/srv/shared/run/log.jsonl: Permission denied", command="train")


# ============ real filesystems: a file in the way, read-only, full, vanished ============


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    """Mount a tmpfs at ``path`` (root only; skips the test where mounting is not allowed)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (the injected-fault tests cover this case)")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def _read_only_dir(path: Path) -> Iterator[Path]:
    """A directory nothing can be created in: chmod 555 for a normal user, a read-only tmpfs for root."""
    if os.geteuid() != 0:
        path.mkdir(parents=True)
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    with _tmpfs(path, "ro,size=64k") as p:
        yield p


@pytest.mark.parametrize("command", ["eval", "train"])
def test_out_below_a_file_is_one_line_exit_2(
    command: str, ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    out = blocker / "sub" / "out"
    args = eval_args(ckpt, out) if command == "eval" else train_args(out)
    rc, _, err = cli(args, capsys)
    one_line_error(rc, err, str(blocker), "not a directory", command=command)
    assert blocker.read_text() == "not a directory" and sorted(tmp_path.iterdir()) == [blocker]


@pytest.mark.parametrize("command", ["eval", "train"])
def test_read_only_out_is_one_line_exit_2_before_any_work(
    command: str, ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    with _read_only_dir(tmp_path / "ro") as ro:
        out = ro / "out"
        # probing or training would be wasted work: the check must come before it
        monkeypatch.setattr(sys.modules["robustbench_nacl.eval.runner"], "_run_setting", _must_not_run)
        monkeypatch.setattr(trainer, "load_dataset", _must_not_run)  # train() checks before loading data
        args = eval_args(ckpt, out) if command == "eval" else train_args(out)
        rc, _, err = cli(args, capsys)
        line = one_line_error(rc, err, str(out), command=command)
        assert "Read-only file system" in line or "Permission denied" in line, line
        assert not out.exists() and not list(ro.iterdir())


def _must_not_run(*args, **kwargs):
    raise AssertionError("expensive work started although the output directory is not writable")


def test_tiny_tmpfs_fills_up_during_eval(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _tmpfs(tmp_path / "small", "size=8k") as small:
        rc, _, err = cli(eval_args(ckpt, small / "lb", "--transfer", "auto"), capsys)
        one_line_error(rc, err, "No space left on device", command="eval")
        rows = assert_rows_complete(small / "lb")  # what was written is whole
        assert len(rows) < 2 * ROWS_PER_SETTING
        subprocess.run(["mount", "-o", "remount,size=4m", str(small)], check=True)  # space freed
        stamps = {p: p.stat().st_mtime_ns for p in row_files(small / "lb")}
        rc, _, err = cli(eval_args(ckpt, small / "lb", "--transfer", "auto"), capsys)
        assert rc == 0, err
        assert_rows_complete(small / "lb", 2 * ROWS_PER_SETTING)
        assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_tiny_tmpfs_fills_up_during_train_then_resume(
    ref_sha: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _tmpfs(tmp_path / "small", "size=64k") as small:
        out = small / "run"
        rc, _, err = cli(train_args(out), capsys)  # the first epoch's state (~600 kB) does not fit
        one_line_error(rc, err, "train_state.pt", "No space left on device", command="train")
        assert not leftovers(small) and not (out / "train_state.pt").exists()
        subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True)
        rc, _, err = cli(train_args(out, TINY.epochs, "--resume"), capsys)
        assert rc == 0, err
        assert read_manifest(out)["weights_sha256"] == ref_sha and not leftovers(small)


def test_out_deleted_during_eval_rows_are_written_again(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lb"
    real = results.write_row
    calls = []

    def write_then_delete(o, row):
        path = real(o, row)
        calls.append(row["row_id"])
        if len(calls) == ROWS_PER_SETTING:  # the first setting is complete: the directory vanishes
            shutil.rmtree(out)
        return path

    monkeypatch.setattr(results, "write_row", write_then_delete)
    rc, stdout, err = cli(eval_args(ckpt, out, "--transfer", "auto"), capsys)
    assert rc == 0, err
    assert f"{ROWS_PER_SETTING} result rows had vanished" in err
    assert_rows_complete(out, 2 * ROWS_PER_SETTING)  # what the run reports is what is on disk
    assert f"{2 * ROWS_PER_SETTING} result rows" in stdout


def test_out_replaced_by_a_file_during_eval_is_one_line_exit_2(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lb"
    real = results.write_row

    def write_then_block(o, row):
        path = real(o, row)
        if out.is_dir():
            shutil.rmtree(out)
            out.write_text("someone else's file")
        return path

    monkeypatch.setattr(results, "write_row", write_then_block)
    rc, _, err = cli(eval_args(ckpt, out), capsys)
    one_line_error(rc, err, "cannot write", str(out), command="eval")
    assert out.read_text() == "someone else's file" and not leftovers(tmp_path)


def test_out_deleted_during_train_loses_nothing(
    ref_sha: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    real = trainer._save_state
    calls = []

    def save_then_delete(path, *args, **kwargs):
        real(path, *args, **kwargs)
        calls.append(path)
        if len(calls) == 1:
            shutil.rmtree(out)

    monkeypatch.setattr(trainer, "_save_state", save_then_delete)
    train(TINY, out, progress=False)
    assert len(calls) == TINY.epochs
    assert read_manifest(out)["weights_sha256"] == ref_sha and not leftovers(tmp_path)
    assert len((out / "log.jsonl").read_text().splitlines()) == TINY.epochs


# ============ SIGKILL ============


def _popen(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "robustbench_nacl", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _epochs_done(out: Path) -> int:
    log = out / "log.jsonl"  # one line appended after each epoch's state is saved
    return len(log.read_text().splitlines()) if log.exists() else 0


def _kill_at(proc: subprocess.Popen, out: Path, epochs_before: int, frac: float) -> None:
    """SIGKILL ``proc`` ``frac`` of an epoch after it finished ``epochs_before`` epochs (0: after
    its output directory appeared, i.e. inside the first epoch). The epoch's length is measured
    from the run's own log where it has one, so the kill lands inside the next epoch on any machine."""
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if (epochs_before == 0 and out.exists()) or (
            epochs_before > 0 and _epochs_done(out) >= epochs_before
        ):
            break
        time.sleep(0.005)
    log = (out / "log.jsonl").read_text().splitlines() if (out / "log.jsonl").exists() else []
    last = json.loads(log[-1]) if log else {}
    epoch_s = last["wall_s"] / last["epoch"] if last.get("epoch") else 0.3
    time.sleep(frac * epoch_s)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before it could be killed"


def _after_kill(out: Path, epochs: int) -> int:
    """Check what a SIGKILL left; returns the epoch a resume will start from.

    A kill in the middle of an atomic write can leave its ``.NAME.XXXX.tmp``; the real file is
    then the previous complete version (checked here), never a partial one.
    """
    assert not (out / "manifest.json").exists()
    assert all(p.name.startswith(".") and p.suffix == ".tmp" for p in leftovers(out))
    for line in (out / "log.jsonl").read_text().splitlines() if (out / "log.jsonl").exists() else []:
        json.loads(line)
    if not (out / "train_state.pt").exists():
        return 0
    saved = torch.load(out / "train_state.pt", weights_only=True)["epoch"]
    assert 1 <= saved < epochs
    return saved


@pytest.mark.slow
def test_train_sigkill_at_random_points_resumes_bit_identical(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    epochs = 6
    rng = random.Random(20261122)
    # three seeded kill points: after this many finished epochs, then this fraction of an epoch
    # later (0 finished: once the output directory exists, i.e. inside the first epoch). They hit
    # one run in turn: killed, resumed, the resumed run killed again, ... so that every resume
    # must be exact for the run to end at the reference bits.
    plan = [(b, rng.random()) for b in sorted(rng.sample(range(epochs - 1), 3))]
    cfg = dataclasses.replace(TINY, epochs=epochs)
    reference = train(cfg, tmp_path / "ref", progress=False)  # uninterrupted, same seed, one thread
    out = tmp_path / "killed"
    proc, resumed_from = _popen(train_args(out, epochs), cli_env), []
    for before, frac in plan:
        if resumed_from:  # the resumed run must get past where it started before this kill counts
            before = min(max(before, resumed_from[-1] + 1), epochs - 2)
        _kill_at(proc, out, before, frac)
        resumed_from.append(_after_kill(out, epochs))
        proc = _popen([*train_args(out, epochs), "--resume"], cli_env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert read_manifest(out)["weights_sha256"] == read_manifest(reference)["weights_sha256"]
    log, ref_log = (
        [json.loads(x) for x in (d / "log.jsonl").read_text().splitlines()] for d in (out, reference)
    )
    assert [r["train_loss"] for r in log] == [r["train_loss"] for r in ref_log]  # each epoch, bit for bit
    assert not (out / "train_state.pt").exists()
    print(f"kill plan {plan}: resumed from epochs {resumed_from}")


@pytest.mark.slow
def test_eval_sigkill_midway_rerun_completes_without_recomputing(
    ckpt: Path, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    out, total = tmp_path / "lb", 7 * ROWS_PER_SETTING  # in-domain, transfer, five shifts
    args = eval_args(ckpt, out, "--transfer", "auto", "--shift", "all")
    threshold = random.Random(7).randrange(1, total - 2 * ROWS_PER_SETTING)
    proc = _popen(args, cli_env)
    deadline = time.time() + 240
    while proc.poll() is None and len(row_files(out)) < threshold and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "eval finished before it could be killed"
    stale = leftovers(out)  # only if the kill hit a write in flight (then its row is simply missing)
    done = assert_rows_complete(out, stale=stale)  # no row is corrupted
    assert 0 < len(done) < total
    stamps = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in row_files(out)}
    res = run_cli(args, cli_env)
    assert res.returncode == 0, res.stderr
    assert f"{total} result rows" in res.stdout
    assert_rows_complete(out, total, stale=stale)
    for p, (mtime, data) in stamps.items():  # finished rows are neither recomputed nor rewritten
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data, p.name
    print(f"killed after {len(done)} of {total} rows (threshold {threshold})")


def test_truncated_row_is_recomputed_and_the_others_are_kept(ckpt: Path, tmp_path: Path) -> None:
    evaluate(ckpt, out=tmp_path, **QUICK)
    files = row_files(tmp_path)
    stamps = {p: p.stat().st_mtime_ns for p in files}
    victim = files[0]
    victim.write_bytes(victim.read_bytes()[:100])  # e.g. copied by a tool that is not atomic
    rows = evaluate(ckpt, out=tmp_path, **QUICK)
    assert_rows_complete(tmp_path, ROWS_PER_SETTING)
    assert {r["row_id"] for r in rows} == {p.stem for p in files}
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items() if p != victim)


# ============ concurrency ============


@pytest.mark.slow
def test_two_concurrent_evals_share_one_rows_directory(
    ckpt: Path, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    out, total = tmp_path / "lb", 3 * ROWS_PER_SETTING
    args = eval_args(ckpt, out, "--transfer", "auto", "--shift", "flip")
    procs = [_popen(args, cli_env) for _ in range(2)]
    for p in procs:
        stdout, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert f"{total} result rows" in stdout
    assert_rows_complete(out, total)


def test_concurrent_atomic_writers_never_expose_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "rows" / "r.json"
    payloads = [json.dumps({"writer": i, "pad": str(i) * 400_000}).encode() for i in range(2)]
    write_bytes_atomic(target, payloads[0])
    errors: list[BaseException] = []

    def writer(data: bytes) -> None:
        try:
            for _ in range(30):
                write_bytes_atomic(target, data)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(d,)) for d in payloads]
    for t in threads:
        t.start()
    reads = 0
    while any(t.is_alive() for t in threads):
        assert target.read_bytes() in payloads  # a reader sees one whole version or the other
        reads += 1
    for t in threads:
        t.join()
    assert not errors and reads > 0 and target.read_bytes() in payloads
    assert not leftovers(tmp_path)
