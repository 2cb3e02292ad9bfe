"""Rows from several directories: yours ranked beside a reference's where the protocols match.

``leaderboard --rows mine --rows leaderboard/rows``: the first directory holds your rows, every later
one is a reference. Your rows of a setting and dataset that the reference also measured are kept
only under a protocol the reference used for it (same suite, probe, number of test examples,
attack versions); the others are left out and one line says which and why (see docs/decisions.md,
'Your rows beside the reference'). Rows of a setting and dataset the reference never measured are
kept: there is nothing to mismatch, and they get their own table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..results.rows import ResultRow, load_rows
from .aggregate import validate_rows
from .tables import table_key

DirRows = list[tuple[str, list[ResultRow]]]


def load_dirs(dirs: Sequence[str | Path] | str | Path) -> DirRows:
    """(directory, its validated rows) for each directory, in the order given."""
    if isinstance(dirs, (str, Path)):
        dirs = [dirs]
    if not dirs:
        raise UserError("no rows directory given; pass --rows DIR (the --out of `robustbench-nacl eval`)")
    out = []
    for d in dirs:
        rows = load_rows(d) if Path(d).exists() else published_rows(str(d))
        out.append((str(d), validate_rows(rows, source=d)))
    return out


def published_rows(name: str) -> list[ResultRow]:
    """The committed rows of a published set (``demo``) or model (its name), for ``--rows NAME``."""
    from ..hub.catalog import find_model, model_rows, published_sets
    from ..packaged import published_dir

    if name in published_sets():
        return load_rows(published_dir() / name)
    try:
        return model_rows(find_model(name))
    except UserError as e:
        raise UserError(
            f"--rows {name}: no such directory, published set ({', '.join(published_sets())}) or model ({e})"
        ) from None


def pooled(dir_rows: DirRows) -> list[ResultRow]:
    """Every row once (a row present in two directories is one row: rows are content-addressed)."""
    seen: dict[str, ResultRow] = {}
    for _, rows in dir_rows:
        for r in rows:
            seen.setdefault(r.row_id, r)
    return list(seen.values())


def _flat(obj: Any, path: str = "") -> dict[str, str]:
    if isinstance(obj, Mapping):
        out: dict[str, str] = {}
        for k, v in obj.items():
            out |= _flat(v, f"{path} {k}".strip())
        return out
    return {path: str(obj)}


def protocol_difference(mine: ResultRow, ref: ResultRow) -> str:
    """What differs between two rows' protocols, e.g. ``n_examples 50 vs 200; suite quick vs paper``."""
    a, b = (
        _flat({k: v for k, v in r.protocol.items() if k not in ("dataset", "setting")}) for r in (mine, ref)
    )
    parts = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            name, va, vb = k, a.get(k, "–"), b.get(k, "–")
            if k == "suite_sha256":
                name, va, vb = (
                    "suite",
                    f"{mine.get('suite', '?')} ({va[:8]})",
                    f"{ref.get('suite', '?')} ({vb[:8]})",
                )
            parts.append(f"{name} {va} vs {vb}")
    return "; ".join(parts)


def match_protocols(dir_rows: DirRows) -> tuple[list[ResultRow], list[str]]:
    """(rows to render, one-line notices): the first directory's rows that the reference directories
    measured under another protocol are left out, and a notice says which and why."""
    if len(dir_rows) <= 1:
        return pooled(dir_rows), []
    (name, mine), refs = dir_rows[0], dir_rows[1:]
    reference = pooled(refs)
    tables = {table_key(r) for r in reference}
    example: dict[tuple[str, str], ResultRow] = {}
    for r in reference:
        example.setdefault(table_key(r)[:2], r)
    kept, left = [], defaultdict(list)
    for r in mine:
        key = table_key(r)
        if key in tables or key[:2] not in example:
            kept.append(r)
        else:
            left[key[:2]].append(r)
    if not left:
        return pooled([(name, kept), *refs]), []
    where = ", ".join(f"{s} {d}" for s, d in sorted(left))
    why = sorted({protocol_difference(rows[0], example[k]) for k, rows in left.items()})
    n = sum(len(v) for v in left.values())
    notice = (
        f"left out {n} of {len(mine)} rows of {name} ({where}): their protocol differs from the reference "
        f"rows of {', '.join(d for d, _ in refs)} ({'; '.join(why)}), so they are not ranked with them"
    )
    return pooled([(name, kept), *refs]), [notice]
