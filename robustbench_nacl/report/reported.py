"""The field's published numbers beside measured rows: ``leaderboard --reported robustssl``.

A reported set (read by :mod:`robustbench_nacl.results.reported`) is a data file of
``files/reported/`` (``robustssl.json``: the RobustSSL benchmark's leaderboard, robustssl.github.io,
with each number's repository, file and commit, and flags for cells that are no measurement). Its
entries are never result rows: they carry no interval and no per-example outcomes, so they enter no
ranking, paired test, claim, statistic or ``compare``. They are rendered in their own section of
LEADERBOARD.md, one table per board table of the same datasets and finetuning protocol, with each
measured recipe's AutoAttack accuracy placed among them (docs/decisions.md, 'Reported numbers
beside measured rows').
"""

from __future__ import annotations

import math

from ..results.reported import AA_EPS, BENCHMARK_DATASET, Reported, load_reported, placement
from .aggregate import Entry
from .context import Context
from .fmt import pct
from .protocols import protocol_of

FLAG_TEXT = {"zero": "0 in the source: not a measurement", "hidden": "a column the page does not show"}


def _aa_metric(e: Entry) -> str | None:
    """The entry's AutoAttack Linf 8/255 metric name, if it measured one."""
    for r in e.rows:
        if r["attack"] == "autoattack" and r["norm"] == "Linf" and math.isclose(float(r["eps"]), AA_EPS):
            return f"autoattack_Linf_{round(float(r['eps']), 12):g}"
    return None


def key_of(e: Entry, in_domain: str | None = None) -> tuple[str, str, str] | None:
    """(pretrain dataset, evaluated dataset, protocol) in the benchmark's names, or None where the
    entry is no setting the benchmark reports (a class subset, a shift, another dataset).

    A foreign checkpoint records no pretraining dataset: its in-domain dataset (``in_domain``, the
    dataset of its recipe's in-domain rows) stands for it, as ``eval --dataset`` defines it."""
    if e.setting not in ("in-domain", "transfer"):
        return None
    pretrain = e.recipe.pretrain_dataset or (e.dataset if e.setting == "in-domain" else in_domain)
    pre, ds = BENCHMARK_DATASET.get(str(pretrain)), BENCHMARK_DATASET.get(e.dataset)
    return None if pre is None or ds is None else (pre, ds, protocol_of(e))


def _cell(r: Reported, metric: str) -> str:
    v, flags = r.value(metric), r.flags.get(metric, [])
    marks = "⚑" if any(f.startswith("repeated") for f in flags) else ""
    return ("–" if v is None else f"{v:.2f}") + marks


def _flags_text(r: Reported) -> str:
    """The benchmark's comment, then what is copied or hidden (zeros show as ``–`` already)."""
    parts = [r.comment] if r.comment else []
    parts += [p for p in r.copied.split("; ") if p and not p.startswith("the benchmark's comment")]
    parts += [
        f"{m}: {', '.join(FLAG_TEXT.get(f, f) for f in fs)}" for m, fs in r.flags.items() if "zero" not in fs
    ]
    return "; ".join(parts)


def _table(
    ctx: Context, key: tuple[str, str, str], entries: list[Entry], reported: list[Reported]
) -> list[str]:
    pre, ds, proto = key
    head = "| | method | venue | AutoAttack | clean | corruption | source | flags |"
    lines = [f"### {pre} → {ds} · {proto.upper()}", "", head, "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        metric = _aa_metric(e)
        aa, clean = pct(e.stat(metric).mean) if metric else "–", pct(e.stat("clean").mean)
        lines.append(f"| measured | {ctx.label(e.recipe)} | this board | {aa} | {clean} | – | – | |")
    for r in sorted(reported, key=lambda r: -(r.value("autoattack") or -1)):
        where = f"`{r.source['file']}` row {r.row} @ {r.source['commit'][:7]}"
        cells = [_cell(r, m) for m in ("autoattack", "clean", "corruption")]
        lines.append(
            f"| reported | {r.method} | {r.venue} | {' | '.join(cells)} | {where} | {_flags_text(r)} |"
        )
    lines.append("")
    for e in entries:
        metric = _aa_metric(e)
        mean = e.stat(metric).mean if metric else None
        if mean is None:
            lines.append(
                f"- {ctx.label(e.recipe)}: not placed, no AutoAttack Linf 8/255 rows (`--suite robust-ssl`)."
            )
        else:
            what = f"- {ctx.label(e.recipe)}: AutoAttack {100 * mean:.1f} ({e.n_examples} test examples)"
            lines.append(f"{what}, {placement(100 * mean, reported)}.")
    return [*lines, ""]


def markdown_section(ctx: Context, name: str, finetuning: str = "vanilla") -> list[str]:
    """The LEADERBOARD.md section of reported set ``name`` beside the board's tables."""
    reported = [r for r in load_reported(name) if r.finetuning == finetuning]
    by_key: dict[tuple[str, str, str], list[Entry]] = {}
    in_domain = {e.recipe.recipe_id: e.dataset for e in ctx.entries if e.setting == "in-domain"}
    for e in ctx.entries:
        key = key_of(e, in_domain.get(e.recipe.recipe_id))
        if key is not None and not e.recipe.control:
            by_key.setdefault(key, []).append(e)
    md = [
        f"## Reported by the RobustSSL benchmark ({name}: not measured here)",
        "",
        "> The benchmark's published numbers (robustssl.github.io), rows marked **reported**, as its "
        f"source files give them ({finetuning} fine-tuning): no interval, no paired test; they enter no "
        "ranking, claim, statistic or `compare`. `–`: 0 in the source (no measurement); ⚑: the same value "
        "as another row of its file. The measured rows are this board's, placed among them by AutoAttack "
        "(Linf 8/255).",
        "",
    ]
    tables = 0
    for key, entries in sorted(by_key.items()):
        match = [r for r in reported if (r.pretrain_dataset, r.dataset, r.protocol) == key]
        if match:
            md += _table(ctx, key, entries, match)
            tables += 1
    if not tables:
        md += ["No table of this board has the datasets and protocol of a reported one.", ""]
    return md
