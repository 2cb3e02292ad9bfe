"""Render the leaderboard from result rows: Markdown, CSV, JSON, the NaCl figures and a static HTML page.

Nothing here evaluates anything: the input is result rows (``eval.rows.load_rows``). Rows are
grouped into *recipes* by ``recipe_id`` (what was trained, seeds aggregated away) and into tables
by ``protocol_id`` (how it was measured); see :mod:`.aggregate`. Random-init controls are ranked
like every other recipe, so a reader sees where clean accuracy alone misleads.

Outputs (all written atomically into ``out``): ``LEADERBOARD.md`` (:mod:`.markdown`),
``results.csv`` and ``leaderboard.json`` (one flat record per recipe x protocol) and ``rows.csv``
(every raw row) (:mod:`.export`), ``standard_vs_robust.png``, ``robust_vs_eps.png``,
``ablation_M.png`` / ``ablation_lam.png`` (:mod:`.figures`) and ``index.html`` (:mod:`.html`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..eval.rows import load_rows
from ..io import write_bytes_atomic
from . import export, figures, html, markdown
from .aggregate import HEADLINE_EPS, Context, aggregate, rank_entries, validate_rows

log = logging.getLogger(__name__)


def render_leaderboard(
    rows: Sequence[Mapping[str, Any]],
    out: str | Path,
    *,
    headline_eps: float = HEADLINE_EPS,
    title: str = "robustbench-nacl leaderboard",
    command: str | None = None,
) -> dict[str, Path]:
    """Write every leaderboard output into ``out``; returns {file name: path} of the files written.

    ``rows``: ResultRows or their flat JSON dicts (validated here: a one-line UserError names the
    first bad one). Ablation plots are written only where an M or lambda grid exists; a skipped one
    is absent from the returned dict, logged, and named under "skipped" in leaderboard.json and
    LEADERBOARD.md.
    """
    typed = validate_rows(rows)
    out = Path(out)
    entries, dropped = aggregate(typed)
    rank_entries(entries, headline_eps)
    ctx = Context.build(typed, entries, headline_eps)
    written: dict[str, Path] = {}

    def write(name: str, data: bytes) -> None:
        write_bytes_atomic(out / name, data)
        written[name] = out / name

    pngs, captions, skipped = figures.render_figures(ctx)
    for name, data in pngs.items():
        write(name, data)
    for name, why in skipped.items():
        log.info("leaderboard: %s skipped: %s", name, why)
        # a plot left over from an earlier render would describe rows that are no longer here
        (out / name).unlink(missing_ok=True)
    page = markdown.render_markdown(
        ctx, title=title, command=command, dropped=dropped, figures=captions, skipped=skipped
    )
    write("LEADERBOARD.md", page.encode())
    recs = export.records(ctx)
    write("results.csv", export.results_csv(recs))
    write("rows.csv", export.rows_csv(typed))
    meta = {"title": title, "command": command, "dropped": dropped, "figures": captions, "skipped": skipped}
    write("leaderboard.json", export.leaderboard_json(ctx, recs, **meta))
    lead, items = markdown.legend(ctx, command, dropped)
    columns, table = html.html_table(ctx)
    site = html.render_page(
        title=title, lead=lead, legend=items, columns=columns, rows=table, images=list(captions.items())
    )
    write("index.html", site.encode())
    return written


def main_leaderboard(
    rows_dir: str | Path, out: str | Path, *, headline_eps: float = HEADLINE_EPS, command: str | None = None
) -> dict[str, Path]:
    """CLI entry: load the rows under ``rows_dir`` and render the leaderboard into ``out``."""
    rows = load_rows(rows_dir)
    validate_rows(rows, source=rows_dir)
    return render_leaderboard(rows, out, headline_eps=headline_eps, command=command)
