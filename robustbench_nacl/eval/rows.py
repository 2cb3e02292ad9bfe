"""Result rows: the only thing that leaves an evaluation.

One flat JSON file per row, content-addressed by the fields that determine its numbers, written
atomically. Re-running an evaluation whose rows exist is a no-op, and any number of workers can
write into one directory without coordination (same address -> same content).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..attack.threat import eps_label  # noqa: F401  (re-exported for renderers)
from ..errors import UserError
from ..io import write_json_atomic

ROWS_DIR = "rows"

# The fields that determine a row's numbers; everything else in a row is provenance.
IDENTITY = (
    "checkpoint_sha256",
    "setting",
    "dataset",
    "attack",
    "norm",
    "attack_params",
    "eps",
    "seed",
    "n_examples",
    "probe_config",
    "suite_sha256",
)

# Every row carries these besides its identity; a row lacking one is incomplete.
RESULT_KEYS = ("row_id", "clean_acc", "robust_acc", "n_examples_evaluated", "sanity_ok")


def row_id(identity: dict[str, Any]) -> str:
    """The content address: sha256 of the canonical JSON of the identity fields."""
    missing = [k for k in IDENTITY if k not in identity]
    if missing:
        raise ValueError(f"row identity lacks {missing}")
    canon = json.dumps({k: identity[k] for k in IDENTITY}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:24]


def row_path(out: str | Path, rid: str) -> Path:
    """Where the row with this id lives under an output directory."""
    return Path(out) / ROWS_DIR / f"{rid}.json"


def write_row(out: str | Path, row: dict[str, Any]) -> Path:
    """Write one row atomically at its content address; returns the path."""
    path = row_path(out, row["row_id"])
    write_json_atomic(path, row)
    return path


def read_row(path: str | Path) -> dict[str, Any]:
    """Parse one row file (a one-line UserError if it is not a JSON object)."""
    try:
        row = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
        raise UserError(f"cannot read result row {path}: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(row, dict):
        raise UserError(f"result row {path} is not a JSON object")
    return row


def read_valid_row(path: str | Path, rid: str) -> dict[str, Any] | None:
    """The row stored at ``path`` if it is complete and is the row ``rid``; None if it is missing,
    unreadable, truncated or foreign (such a row is recomputed, never trusted)."""
    try:
        row = read_row(path)
    except UserError:
        return None
    if row.get("row_id") != rid or any(k not in row for k in (*IDENTITY, *RESULT_KEYS)):
        return None
    return row


def load_rows(directory: str | Path) -> list[dict[str, Any]]:
    """Every row under ``directory`` (its ``rows/`` subfolder if present), in a stable order."""
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"rows directory {d} does not exist; run `robustbench-nacl eval ... --out {d}` first")
    base = d / ROWS_DIR if (d / ROWS_DIR).is_dir() else d
    rows = [read_row(p) for p in sorted(base.glob("*.json"))]
    return sorted(
        rows,
        key=lambda r: (
            str(r.get("checkpoint_id")),
            str(r.get("setting")),
            str(r.get("dataset")),
            str(r.get("attack")),
            r.get("eps", 0),
        ),
    )
