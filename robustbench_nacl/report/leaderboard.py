"""Render the leaderboard from result rows: Markdown, CSV, JSON, the NaCl figures and a static HTML page.

Nothing here evaluates anything: the input is result rows (``results.rows.load_rows``), from one
directory or several (yours beside a reference: :mod:`.sources`). Rows are grouped into *recipes*
by ``recipe_id`` (what was trained, seeds aggregated away) and into tables by ``protocol_id`` (how
it was measured); see :mod:`.aggregate`. Every accuracy carries a 95 % interval. Each table is
ranked by a robustness metric, by default the worst case at its suite's largest ε (:mod:`.ranking`),
and every line is compared with a baseline family on the same test examples (McNemar, Holm:
:mod:`.compare`). Random-init controls are ranked like every other recipe, so a reader sees where
clean accuracy alone misleads.

Outputs (all written atomically into ``out``): ``LEADERBOARD.md`` (:mod:`.markdown`),
``results.csv`` and ``leaderboard.json`` (one flat record per recipe x protocol) and ``rows.csv``
(every raw row) (:mod:`.export`), ``standard_vs_robust.png``, ``robust_vs_eps.png``,
``ablation_M.png`` / ``ablation_lam.png`` (:mod:`.figures`) and ``index.html`` (:mod:`.html`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..io import write_bytes_atomic
from ..results.label_free import is_label_free
from . import export, figures, html, markdown, protocols
from .aggregate import aggregate, validate_rows
from .compare import attach_comparisons
from .context import HEADLINE_EPS, Context
from .label_free import markdown_section as label_free_section
from .ranking import rank_tables
from .reported import load_reported
from .reported import markdown_section as reported_section
from .sources import load_dirs, match_protocols

log = logging.getLogger(__name__)


def build_context(
    rows: Sequence[Mapping[str, Any]],
    *,
    headline_eps: float = HEADLINE_EPS,
    rank_by: str | None = None,
    baseline: str | None = None,
    baseline_recipe: str | None = None,
) -> tuple[Context, int]:
    """Rows -> the context every renderer reads (tables ranked, comparisons attached), and the
    number of duplicate rows ignored."""
    typed = validate_rows(rows)
    entries, dropped = aggregate(typed)
    ctx = Context.build(typed, entries, headline_eps)
    ctx.rank_by = rank_by
    rank_tables(ctx.tables, rank_by)
    attach_comparisons(ctx, baseline, baseline_recipe)
    return ctx, dropped


def render_leaderboard(
    rows: Sequence[Mapping[str, Any]],
    out: str | Path,
    *,
    headline_eps: float = HEADLINE_EPS,
    title: str = "robustbench-nacl leaderboard",
    command: str | None = None,
    rank_by: str | None = None,
    baseline: str | None = None,
    baseline_recipe: str | None = None,
    left_out: Sequence[str] = (),
    reported: str | None = None,
) -> dict[str, Path]:
    """Write every leaderboard output into ``out``; returns {file name: path} of the files written.

    ``rows``: ResultRows or their flat JSON dicts (validated here: a one-line UserError names the
    first bad one). ``rank_by``: the ranking metric (:mod:`.ranking`; default: the worst case at
    the suite's largest ε). ``baseline``: the loss family of the Δ column (default: simclr where
    present; ``"none"``: no column), ``baseline_recipe`` picks among several recipes of it.
    ``left_out``: one-line notices about rows not rendered (:func:`.sources.match_protocols`).
    Ablation plots are written only where an M or lambda grid exists; a skipped one is absent from
    the returned dict, logged, and named under "skipped" in leaderboard.json and LEADERBOARD.md.
    ``reported``: a reported set (:mod:`.reported`, e.g. "robustssl") whose published numbers get
    their own section of LEADERBOARD.md beside the matching tables; nothing else changes.
    """
    if reported is not None:
        load_reported(reported)  # an unknown or unreadable set fails before anything is written
    # label-free rows are not accuracies of a classifier: a section of their own, never ranked here
    label_free = label_free_section(validate_rows(rows)) if rows else []
    if label_free and all(is_label_free(r) for r in rows):
        out = Path(out)
        page = f"# {title}\n\n" + (f"`{command}`\n\n" if command else "") + "\n".join(label_free)
        write_bytes_atomic(out / "LEADERBOARD.md", page.encode())
        return {"LEADERBOARD.md": out / "LEADERBOARD.md"}
    rows = [r for r in rows if not is_label_free(r)]
    ctx, dropped = build_context(
        rows, headline_eps=headline_eps, rank_by=rank_by, baseline=baseline, baseline_recipe=baseline_recipe
    )
    ctx.left_out = list(left_out)
    out = Path(out)
    written: dict[str, Path] = {}

    def write(name: str, data: bytes) -> None:
        write_bytes_atomic(out / name, data)
        written[name] = out / name

    pngs, captions, skipped = figures.render_figures(ctx)
    by_protocol = protocols.figure(ctx)  # only when the rows hold more than one finetuning protocol
    if by_protocol is not None:
        pngs[protocols.FIGURE], captions[protocols.FIGURE] = by_protocol
    for name, data in pngs.items():
        write(name, data)
    for name, why in skipped.items():
        log.info("leaderboard: %s skipped: %s", name, why)
        # a plot left over from an earlier render would describe rows that are no longer here
        (out / name).unlink(missing_ok=True)
    meta = export.RenderMeta(title, command, dropped, captions, skipped)
    page = markdown.render_markdown(
        ctx, title=title, command=command, dropped=dropped, figures=captions, skipped=skipped
    )
    if reported is not None:
        page += "\n" + "\n".join(reported_section(ctx, reported))
    if label_free:
        page += "\n" + "\n".join(label_free)
    write("LEADERBOARD.md", page.encode())
    recs = export.records(ctx)
    write("results.csv", export.results_csv(recs))
    write("rows.csv", export.rows_csv(ctx.rows))
    write("leaderboard.json", export.leaderboard_json(ctx, recs, meta))
    lead, items = markdown.legend(ctx, command, dropped)
    columns, table = html.html_table(ctx)
    imgs, extra = list(captions.items()), html.static_section(label_free)
    site = html.render_page(
        title=title, lead=lead, legend=items, columns=columns, rows=table, images=imgs, extra=extra
    )
    write("index.html", site.encode())
    return written


def main_leaderboard(
    rows_dir: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    headline_eps: float = HEADLINE_EPS,
    command: str | None = None,
    rank_by: str | None = None,
    baseline: str | None = None,
    baseline_recipe: str | None = None,
    notify: Callable[[str], None] | None = None,
    reported: str | None = None,
) -> dict[str, Path]:
    """CLI entry: load the rows of one directory or several (the first yours, the others the
    reference: :mod:`.sources`) and render the leaderboard into ``out``. Each one-line notice about
    rows left out for a protocol mismatch is passed to ``notify`` (e.g. print to stderr) and logged."""
    rows, notices = match_protocols(load_dirs(rows_dir))
    for notice in notices:
        log.warning("leaderboard: %s", notice)
        if notify is not None:
            notify(notice)
    return render_leaderboard(
        rows,
        out,
        headline_eps=headline_eps,
        command=command,
        rank_by=rank_by,
        baseline=baseline,
        baseline_recipe=baseline_recipe,
        left_out=notices,
        reported=reported,
    )
