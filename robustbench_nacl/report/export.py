"""Flat outputs: results.csv and leaderboard.json (one record per entry) and rows.csv (every raw row)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..results.eps import eps_label
from .aggregate import Entry
from .context import Context, distinct, provenance
from .fmt import round6
from .metrics import metric_key, metric_name, n_examples


def _metric_names(entries: list[Entry]) -> list[str]:
    keys = sorted({metric_key(r) for e in entries for r in e.rows})
    return ["clean"] + [metric_name(*k) for k in keys]


def display_order(ctx: Context) -> list[Entry]:
    """Entries as the tables list them: table by table, then dataset (shift variant), then rank."""
    position = {id(e): i for i, t in enumerate(ctx.tables) for e in t.entries}
    return sorted(ctx.entries, key=lambda e: (position[id(e)], e.dataset, e.rank))


def records(ctx: Context) -> list[dict[str, Any]]:
    """One flat, numeric record per entry (the lines of results.csv and leaderboard.json)."""
    metrics = _metric_names(ctx.entries)
    # corruption columns only when some entry has them: boards without corruptions are unchanged
    corrupted = any(e.setting == "corruption" for e in ctx.entries)
    out = []
    for e in display_order(ctx):
        rec: dict[str, Any] = {
            "setting": e.setting,
            "dataset": e.dataset,
            "shift": e.shift,
            **({k: e.rows[0].get(k) for k in ("corruption", "severity")} if corrupted else {}),
            "rank": e.rank,
            "label": ctx.label(e.recipe),
            "encoder": e.recipe.encoder,
            "loss": e.recipe.loss,
            "key_params": e.recipe.key_params,
            "differs": e.recipe.differs,
            "pretrain_dataset": e.recipe.pretrain_dataset,
            "control": e.recipe.control,
            "n_seeds": len(e.runs),
            "n_examples": min((n_examples(r) for r in e.rows), default=0),
        }
        for name in metrics:
            s = e.stat(name)
            rec |= {f"{name}_mean": round6(s.mean), f"{name}_std": round6(s.std), f"{name}_n": s.n}
            rec |= {f"{name}_lo": round6(s.lo), f"{name}_hi": round6(s.hi), f"{name}_interval": s.interval}
        rec |= _ranking_fields(ctx, e)
        fails = e.failures()
        rec["sanity_ok"] = not fails
        rec["sanity_failed"] = ",".join(distinct(c for _, checks in fails for c in checks))
        rec |= {"recipe_id": e.recipe.recipe_id, "protocol_id": e.protocol_id, "entry_id": e.uid}
        out.append(rec)
    return out


def _ranking_fields(ctx: Context, e: Entry) -> dict[str, Any]:
    """The entry's ranking metric and its comparison with the table's baseline (None where none)."""
    table = ctx.table_of(e)
    c = ctx.comparisons.get(e.uid)
    is_base = ctx.baselines.get(table.key) == e.uid
    rec: dict[str, Any] = {"rank_by": table.rank_metric, "rank_by_label": table.rank_label}
    rec["baseline"] = ctx.baseline_family if table.key in ctx.baselines else None
    rec["is_baseline"] = is_base
    for k in ("diff", "lo", "hi"):
        rec[f"vs_baseline_{k}"] = round6(getattr(c, k)) if c else None
    rec |= {f"vs_baseline_{k}": getattr(c, k) if c else None for k in ("interval", "b", "c", "n_pairs")}
    rec |= {f"vs_baseline_{k}": _round_p(getattr(c, k)) if c else None for k in ("p", "p_holm")}
    rec["vs_baseline_pairing"] = c.pairing if c else None
    return rec


def _round_p(p: float | None) -> float | None:
    # p-values keep their magnitude (a fixed 6 decimals would turn 3e-9 into 0)
    return None if p is None else float(f"{p:.6g}")


def to_csv(table: Sequence[Mapping[str, Any]], columns: list[str]) -> bytes:
    """CSV bytes with the given columns (None -> empty, floats with 6 decimals, dicts as JSON)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for rec in table:
        w.writerow(["" if rec.get(c) is None else _cell(rec[c]) for c in columns])
    return buf.getvalue().encode()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6f}" if v == 0 or abs(v) >= 1e-4 else f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


RAW_FIRST = (
    "row_id",
    "recipe_id",
    "protocol_id",
    "checkpoint_id",
    "setting",
    "dataset",
    "attack",
    "norm",
    "eps",
    "eps_label",
    "seed",
    "clean_acc",
    "robust_acc",
    "n_examples",
    "sanity_ok",
    "sanity_failed",
)


def flatten_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A raw row with ``loss_params`` expanded to ``param_*`` columns (other dicts stay JSON strings)."""
    flat = {k: v for k, v in r.items() if k != "loss_params"}
    flat |= {f"param_{k}": v for k, v in (r.get("loss_params") or {}).items()}
    return flat


def rows_csv(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Every raw row, flattened; fixed leading columns, the rest sorted; rows in a stable order."""
    ordered = sorted(
        rows,
        key=lambda r: (
            str(r["checkpoint_id"]),
            r["setting"],
            r["dataset"],
            *metric_key(r),
            str(r.get("seed")),
            str(r["row_id"]),
        ),
    )
    flat = [flatten_row(r) for r in ordered]
    rest = sorted({k for f in flat for k in f} - set(RAW_FIRST))
    return to_csv(flat, [*RAW_FIRST, *rest])


def results_csv(recs: list[dict[str, Any]]) -> bytes:
    """results.csv: the records, columns in record order."""
    return to_csv(recs, list(recs[0]) if recs else [])


@dataclass(frozen=True)
class RenderMeta:
    """How one render was made (written into LEADERBOARD.md's legend and leaderboard.json)."""

    title: str
    command: str | None  # the command line that rendered it, if any
    dropped: int  # duplicate rows ignored
    figures: Mapping[str, str]  # file name -> caption of each plot drawn
    skipped: Mapping[str, str]  # file name -> why a plot was not drawn


def leaderboard_json(ctx: Context, recs: list[dict[str, Any]], meta: RenderMeta) -> bytes:
    """leaderboard.json: the render's metadata, provenance, protocol notes and every record."""
    prov = provenance(ctx.rows)
    prov["checkpoints"] = [list(c) for c in prov["checkpoints"]]
    prov["suites"] = [list(c) for c in prov["suites"]]
    data = {
        "title": meta.title,
        "command": meta.command,
        "headline_eps": ctx.headline_eps,
        "headline_eps_label": eps_label(ctx.headline_eps),
        "rank_by": ctx.rank_by,
        "rank_metrics": {t.key: t.rank_metric for t in ctx.tables},
        "baseline": ctx.baseline_family,
        "comparison_notes": ctx.compare_notes,
        "left_out": ctx.left_out,
        "n_rows": len(ctx.rows),
        "duplicates_ignored": meta.dropped,
        "provenance": prov,
        "protocol_notes": {t.key: t.note for t in ctx.tables if t.note},
        "figures": dict(meta.figures),
        "skipped": dict(meta.skipped),
        "results": recs,
    }
    return (json.dumps(data, indent=1) + "\n").encode()
