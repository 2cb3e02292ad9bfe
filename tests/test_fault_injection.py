"""Fault injection: a `zoo run` killed (SIGKILL) at random points, resumed each time, ends where an
uninterrupted run ends: the same rows, weights and leaderboard.

Five kills in one resumed chain, each at a random point (from a seeded generator) inside one phase:
training (a random time after the start), row writing (when a random number of the rows exist; then
inside a row write: the process holds there, its temporary written, through a hook of the row writer,
so the kill never misses the window) and rendering (a random time after the first leaderboard file is
written, twice). Today's code failed it on temporaries the killed writers left behind. What is compared:
- weights.safetensors and the figures, LEADERBOARD.md, results.csv, leaderboard.json: byte for byte;
- rows, manifests, logs, rows.csv and index.html: byte for byte once the wall-clock fields are left out
  (when a row was written and how long it took: they differ between any two runs, killed or not).
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _models import one_thread
from test_zoo_completeness import tiny_entry

from robustbench_nacl import cli
from robustbench_nacl.results.rows import HOLD_ROW_WRITE_ENV

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kills with SIGKILL (POSIX)")

LOSSES = ("simclr", "debiased", "nca")
#: 3 entries + 1 random-init control (one seed) x 5 rows (quick suite, in-domain)
TOTAL_ROWS = 20
#: provenance that measures the clock, not the computation
CLOCK = {"created_at", "created", "wall_s", "probe_wall_s", "setup_wall_s", "elapsed", "train_wall_s"}
ARGS = ["zoo", "run", "--zoo", "t", "--out", "ck", "--leaderboard", "board", "--no-progress"]
EXACT = ("LEADERBOARD.md", "results.csv", "leaderboard.json", "standard_vs_robust.png", "robust_vs_eps.png")


def _without_clock(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_clock(v) for k, v in obj.items() if k not in CLOCK}
    if isinstance(obj, list):
        return [_without_clock(v) for v in obj]
    return obj


def _snapshot(root: Path) -> dict[str, Any]:
    """Every output file, compared as the module docstring says."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if not path.is_file() or rel.startswith("ck/.jobs"):
            continue
        if path.suffix == ".json" or path.name.endswith(".jsonl"):
            lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
            out[rel] = [_without_clock(json.loads(ln)) for ln in lines]
        elif path.name == "rows.csv":
            with path.open() as f:
                out[rel] = [{k: v for k, v in r.items() if k not in CLOCK} for r in csv.DictReader(f)]
        elif path.name == "index.html":
            html = path.read_text()
            data = re.search(
                r'<script type="application/json" id="leaderboard-data">(.*?)</script>', html, re.S
            )
            assert data is not None
            out[rel] = (html.replace(data.group(1), ""), _without_clock(json.loads(data.group(1))))
        else:
            out[rel] = path.read_bytes()
    for name in EXACT:  # byte for byte, whatever their format
        out[f"board/{name} (bytes)"] = (root / "board" / name).read_bytes()
    return out


def _rows(board: Path) -> int:
    return len(list((board / "rows").glob("*.json")))


def _writing(folder: Path) -> bool:
    """A file is being written there (atomic_open's temporary exists)."""
    try:
        return any(e.name.endswith(".tmp") for e in os.scandir(folder))
    except FileNotFoundError:
        return False


def _board_written_since(board: Path, t0: float) -> bool:
    return any(p.stat().st_mtime >= t0 for p in board.glob("*") if p.is_file())


def _kill_in(phase: str, proc: subprocess.Popen[str], board: Path, rng: random.Random, hold: Path) -> None:
    """SIGKILL ``proc`` at a random point of ``phase`` (if it is still running by then); ``hold``: the
    file a row write held by ``HOLD_ROW_WRITE_ENV`` creates."""
    t0 = time.time()
    if phase == "training":
        when = lambda: time.time() - t0 >= delay  # noqa: E731
        delay = rng.uniform(0.5, 3.0)
    elif phase == "rows":  # once a random number of rows exist
        target = (
            rng.randint(_rows(board) + 1, TOTAL_ROWS - 1) if _rows(board) < TOTAL_ROWS - 1 else TOTAL_ROWS
        )
        when = lambda: _rows(board) >= target  # noqa: E731
    elif phase == "row write":  # inside a row write: the process holds there (rows.HOLD_ROW_WRITE_ENV)
        when = lambda: hold.exists()  # noqa: E731
    else:  # rendering: after the first board file of this run appears, a random fraction of a second
        delay = rng.uniform(0.0, 0.4)
        when = lambda: _board_written_since(board, t0)  # noqa: E731
    while proc.poll() is None and not when():
        time.sleep(0.002)
    if phase == "rendering":
        time.sleep(delay)
    if phase == "row write":  # the kill lands while the row's temporary file exists, every time
        assert proc.poll() is None and _writing(board / "rows"), "the row write did not hold"
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(60)


@pytest.mark.slow
def test_a_zoo_run_killed_at_random_points_ends_as_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_env: dict[str, str]
) -> None:
    for loss in LOSSES:
        tiny_entry(tmp_path / "zoo", loss)
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    cli_env["ROBUSTBENCH_NACL_ZOO"] = str(tmp_path / "zoo")
    cli_env["OMP_NUM_THREADS"] = "1"
    for d in ("once", "killed"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "once")  # relative paths: the rows name ck/<id>, the same in both
    with one_thread():  # the subprocesses' OMP_NUM_THREADS=1: the same float kernels, the same bits
        assert cli.main(ARGS) == 0
    assert _rows(tmp_path / "once" / "board") == TOTAL_ROWS

    rng = random.Random(23)
    board = tmp_path / "killed" / "board"
    landed = []
    hold = tmp_path / "holding-a-row-write"
    for phase in ("training", "rows", "row write", "rendering", "rendering"):
        cmd = [sys.executable, "-m", "robustbench_nacl", *ARGS]
        env = {**cli_env, HOLD_ROW_WRITE_ENV: str(hold)} if phase == "row write" else cli_env
        proc = subprocess.Popen(cmd, cwd=tmp_path / "killed", env=env, text=True, stderr=subprocess.PIPE)
        _kill_in(phase, proc, board, rng, hold)
        landed.append((phase, proc.returncode, _rows(board)))
    final = subprocess.run(
        [sys.executable, "-m", "robustbench_nacl", *ARGS],
        cwd=tmp_path / "killed",
        env=cli_env,
        capture_output=True,
    )
    assert final.returncode == 0, final.stderr
    # every kill hit a running process (a kill after the process ended would test nothing)
    print("kills (phase, exit code, rows on disk after):", landed)
    assert [code for _, code, _ in landed] == [-signal.SIGKILL] * 5, landed
    got, want = _snapshot(tmp_path / "killed"), _snapshot(tmp_path / "once")
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
