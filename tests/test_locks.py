"""Advisory locks: the second waits, then reuses the rows; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from robustbench_nacl import locks
from robustbench_nacl.eval import evaluate as ev
from robustbench_nacl.eval import runner
from robustbench_nacl.eval.probe import ProbeConfig

pytestmark = pytest.mark.skipif(locks.fcntl is None, reason="advisory locks need fcntl (POSIX)")

# the lock module alone, loaded from its file: a holder process starts in milliseconds (no torch)
HOLD = f"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("locks", {locks.__file__!r})
locks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(locks)
with locks.advisory_lock(sys.argv[1], "k", "test work"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(folder: Path, seconds: float) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_process_waits_for_a_live_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _holder(tmp_path, 1.0)
    t0 = time.perf_counter()
    with locks.advisory_lock(tmp_path, "k", "test work"):
        waited = time.perf_counter() - t0
    p.wait(10)
    assert waited > 0.5  # it did not compute beside the holder
    err = capsys.readouterr().err
    assert f"waiting for pid {p.pid}" in err and "which is computing test work" in err
    assert not (tmp_path / locks.LOCKS_DIR).exists()  # released: nothing left behind


def test_a_lock_left_by_a_killed_process_is_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _holder(tmp_path, 60)
    p.kill()  # kill -9 while holding: the file stays, naming a pid that is gone
    p.wait(10)
    left = json.loads(locks.lock_path(tmp_path, "k").read_text())
    assert left["pid"] == p.pid
    t0 = time.perf_counter()
    with locks.advisory_lock(tmp_path, "k", "test work"):
        assert json.loads(locks.lock_path(tmp_path, "k").read_text())["pid"] == os.getpid()
    assert time.perf_counter() - t0 < 1.0  # not waited for
    err = capsys.readouterr().err
    assert f"took over the lock of pid {p.pid}" in err and "ended without releasing it" in err


def test_concurrent_evaluations_compute_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two evaluations of one module into one folder (threads hold separate flocks, as processes do):
    the second, started while the first computes, waits and returns the first one's rows."""
    computing = threading.Event()
    slow = runner._run_setting

    def run_setting(*a: Any, **k: Any) -> Any:
        computing.set()
        time.sleep(1.0)  # long enough for the second evaluation to reach the lock
        return slow(*a, **k)

    monkeypatch.setattr(runner, "_run_setting", run_setting)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8))
    kw: dict[str, Any] = {"dataset": "digits:0-4", "suite": "quick", "n_examples": 10, "progress": False}
    kw |= {"probe": ProbeConfig(epochs=2, max_train=60), "out": tmp_path}
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(ev.evaluate(net, **kw)))
    first.start()
    assert computing.wait(60)
    second = ev.evaluate(net, **kw)  # blocks on the lock until the first has written its rows
    first.join(60)
    assert results and results[0].computed == len(second)
    assert (second.computed, second.reused) == (0, len(second))
    assert len(list((tmp_path / "rows").glob("*.json"))) == len(second)
