"""Device classes (issue 46, item 4): a row records the class of device it was computed on (absent on
a CPU, so every CPU row keeps its id; ``cuda:<card name>`` on a GPU), a zoo run counts only rows of its
own device's class as done unless asked (``--any-device``), and the rows of two classes rank in one
table and each card lists its classes. A GPU's rows are made here on the CPU by patching what
``utils.device_class`` says of the device: no test needs a GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_zoo_completeness import tiny_entry

from robustbench_nacl import cli, pipeline
from robustbench_nacl.eval import evaluate as ev
from robustbench_nacl.hub.cards import card_of_rows
from robustbench_nacl.results.rows import DEVICE_CLASS, load_rows, protocol_of, row_id

pytestmark = pytest.mark.usefixtures("single_thread")
GPU = "cuda:Fake GPU 80GB"


def _rows(board: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (board / "rows").glob("*.json")]


def test_a_gpus_row_is_another_row_and_counts_only_where_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    e = tiny_entry(tmp_path / "zoo", "simclr")
    ck, board = tmp_path / "ck", tmp_path / "board"
    run = ["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress"]
    run += ["--no-controls"]
    cpu_class = ev.device_class
    monkeypatch.setattr(ev, "device_class", lambda dev: GPU)  # what a GPU's evaluation records
    assert cli.main(run) == 0
    gpu_rows = _rows(board)
    assert gpu_rows and {r[DEVICE_CLASS] for r in gpu_rows} == {GPU}
    assert all(row_id(r) == r["row_id"] for r in gpu_rows)  # the class is part of the id
    monkeypatch.setattr(ev, "device_class", cpu_class)
    gpu_only = tmp_path / "gpu-only"
    shutil.copytree(board, gpu_only)
    # on the CPU, the GPU's rows are not this run's: not done, yet not superseded either
    assert not pipeline.is_complete(e, pipeline.rows_done(board))
    assert pipeline.is_complete(e, pipeline.rows_done(board, device=pipeline.ANY_DEVICE))
    assert pipeline.superseded_rows([e], board, controls=False, ckpts=ck) == []
    capsys.readouterr()
    assert cli.main(run) == 0
    assert "1 evaluations" in capsys.readouterr().out
    rows = _rows(board)
    cpu_rows = [r for r in rows if DEVICE_CLASS not in r]
    assert len(cpu_rows) == len(gpu_rows) == len(rows) // 2
    # each CPU row has the id it would have had before device classes (no key, same hash) ...
    sha = cpu_rows[0]["checkpoint_sha256"]
    planned = ev.planned_identities(e.dataset, **pipeline.eval_arguments(e), loss=e.loss)
    planned = {row_id({**i, "checkpoint_sha256": sha}) for i in planned}
    assert {r["row_id"] for r in cpu_rows} == planned
    # ... and its GPU twin measures the same protocol: one table, each row showing its class
    twin = {pipeline.row_key(r): r for r in gpu_rows}
    assert all(protocol_of(r) == protocol_of(twin[pipeline.row_key(r)]) for r in cpu_rows)
    card = card_of_rows(load_rows(board))
    assert card["devices"] == ["cpu", GPU]
    # --any-device: a GPU's complete rows count on a CPU run, so nothing is evaluated again
    capsys.readouterr()
    argv = [*run[:6], "--leaderboard", str(gpu_only), "--no-progress", "--no-controls", "--any-device"]
    assert cli.main(argv) == 0
    assert "0 evaluations" in capsys.readouterr().out and len(_rows(gpu_only)) == len(gpu_rows)
