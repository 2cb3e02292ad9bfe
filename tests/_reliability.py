"""Helpers shared by the ``test_reliability_*`` files: a tiny checkpoint, the CLI run in-process,
and the checks that a rows directory is complete and that nothing half-written was left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from robustbench_nacl.cli import main
from robustbench_nacl.results import rows as results
from robustbench_nacl.training import TrainConfig

# convnet_small of width 8 on digits 0-4: a checkpoint in about a second
TINY = TrainConfig(
    loss="simclr",
    dataset="digits:0-4",
    encoder="convnet_small",
    encoder_kwargs={"width": 8},
    epochs=2,
    batch_size=64,
    lr=3e-3,
    knn_every=0,
)
# rows of one setting under the quick suite: FGSM at 2 eps, PGD at 1, worst case at 2
ROWS_PER_SETTING = 5
# what every row must carry besides its identity (results.IDENTITY) and results.RESULT_KEYS
PROVENANCE = (
    "checkpoint_id",
    "checkpoint",
    "versions",
    "device",
    "created_at",
    "eps_label",
    "probe_test_acc",
)


def train_args(out: Path | str, epochs: int = TINY.epochs, *extra: str) -> list[str]:
    """``train`` flags equal to ``TINY`` (with ``epochs``)."""
    return [
        "train",
        "--loss",
        TINY.loss,
        "--dataset",
        TINY.dataset,
        "--encoder",
        TINY.encoder,
        "--encoder-arg",
        "width=8",
        "--epochs",
        str(epochs),
        "--batch-size",
        str(TINY.batch_size),
        "--lr",
        str(TINY.lr),
        "--knn-every",
        "0",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def eval_args(checkpoint: Path | str, out: Path | str, *extra: str) -> list[str]:
    """A cheap ``eval``: quick suite, 40 test examples, 30 probe epochs."""
    return [
        "eval",
        str(checkpoint),
        "--suite",
        "quick",
        "--n-examples",
        "40",
        "--probe-epochs",
        "30",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the CLI's ``main`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        rc = main(args)
    except SystemExit as e:  # argparse usage errors
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, *fragments: str, command: str = "") -> str:
    """Assert exit code 2 and exactly one stderr line (no traceback) holding every fragment."""
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"robustbench-nacl {command}".rstrip()), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def leftovers(root: Path) -> list[Path]:
    """Temporary files of interrupted atomic writes (``.NAME.XXXX.tmp``) anywhere under ``root``."""
    return sorted(p for p in root.rglob(".*.tmp")) if root.exists() else []


def row_files(out: Path) -> list[Path]:
    return sorted((out / results.ROWS_DIR).glob("*.json")) if (out / results.ROWS_DIR).is_dir() else []


def assert_rows_complete(out: Path, n: int | None = None, stale: Any = ()) -> dict[str, dict[str, Any]]:
    """Every row file under ``out`` is valid JSON holding every key, stored at its content address,
    and no temporary file is left but ``stale`` ones (a SIGKILL mid-write can leave one; it is never
    taken for a row)."""
    rows = {}
    for p in row_files(out):
        row = json.loads(p.read_text())  # raises on a truncated or corrupt file
        assert isinstance(row, dict)
        missing = [k for k in (*results.IDENTITY, *results.RESULT_KEYS, *PROVENANCE) if k not in row]
        assert not missing, (p.name, missing)
        assert p.stem == row["row_id"] == results.row_id(row), p.name
        rows[row["row_id"]] = row
    if n is not None:
        assert len(rows) == n, (len(rows), n)
    assert set(leftovers(out)) <= set(stale), leftovers(out)
    return rows
