"""The leaderboard figures as PNG bytes (matplotlib on an Agg canvas: no display, no global pyplot state).

- ``standard_vs_robust.png`` (NaCl Fig. 1): clean (x) against robust accuracy (y), one column per
  table (in-domain, transfer, shift: each protocol its own point set) and two panels in it, FGSM at
  the headline ε (the paper's measure) above and the table's ranking metric below; 95 % intervals on
  both axes, a y = x line, every point labelled directly; filled markers follow the board's rule
  (Holm p < 0.05 and a seed interval excluding 0, :func:`established`).
- ``robust_vs_eps.png`` (Fig. S1): the ranking attack against a numeric ε axis (ε = 0: clean) with
  95 % interval bands, one panel per in-domain and transfer table, every line labelled at its end.
- ``ablation_M.png`` / ``ablation_lam.png`` (Fig. S2), only where such a grid exists.

Every recipe keeps one (colour, marker, line style) in every figure (:mod:`.plotstyle`).
"""

from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..results.eps import eps_label
from .aggregate import Entry
from .canvas import DPI, new_figure, pct, png_bytes, set_margins
from .compare import Comparison, protocol_comparisons, with_holm
from .context import Context, join
from .eps_figure import EPS_CAPTION, draw_robust_vs_eps, eps_figure_size
from .metrics import ATTACK_NAMES, MetricKey, metric_name
from .plotstyle import FONT, Style, label_points, styles
from .stats import Stat
from .tables import Table, panel_note

# Fixed sizes in inches (x canvas.DPI) so the figures are comparable between renders; tests check them.
PANEL_IN = (5.4, 4.8)  # standard_vs_robust: one panel (axes, ticks, labels)
PANEL_COLS = 3  # panels per row
SVR_TITLE_IN = 1.05  # standard_vs_robust: the title above the panels
SVR_KEY_IN = 0.95  # standard_vs_robust: the key below them
ABLATION_IN = (11.0, 4.0)
# Figure S2: the loss parameters whose grids get an ablation plot, with their axis labels.
ABLATIONS = {"M": "number of positives M", "lam": "mixup coefficient λ"}
SIGNIFICANT = 0.05  # Holm-adjusted p below which (with a seed interval excluding 0) a point is filled
PAPER_EPS = 0.002  # the NaCl paper's FGSM ε (Fig. 1)


def figure_size(name: str, n: int) -> tuple[int, int]:
    """The pixel size of a figure of ``n`` tables (Fig. 1) or panels (the others): what tests and
    the page expect."""
    if name == "standard_vs_robust.png":
        rows, cols = _svr_grid(n)
        return round(cols * PANEL_IN[0] * DPI), round((rows * PANEL_IN[1] + SVR_TITLE_IN + SVR_KEY_IN) * DPI)
    if name == "robust_vs_eps.png":
        return eps_figure_size(n)
    return round(ABLATION_IN[0] * DPI), round(ABLATION_IN[1] * DPI)


# ============ standard vs robust (Fig. 1) ============


@dataclass(frozen=True)
class _Point:
    """One recipe in one panel: its clean and robust accuracy over seeds (shift: per-run means over
    the variants)."""

    entry: Entry
    clean: Stat
    robust: Stat


def established(c: Comparison | None) -> bool:
    """The board's rule for a difference from the baseline: Holm-adjusted p < 0.05 **and** a seed
    interval of the difference that excludes 0 (so at least two seed pairs: one checkpoint pair's
    interval over test examples says nothing about training runs)."""
    if c is None or c.p_holm is None or c.lo is None or c.hi is None:
        return False
    return c.p_holm < SIGNIFICANT and c.interval == "t over seeds" and (c.lo > 0 or c.hi < 0)


def _over_variants(entries: list[Entry], metric: str) -> Stat:
    # per run, the mean over the shift variants that measured it in every variant; then over runs
    runs = set.intersection(*(set(e.values.get(metric, {})) for e in entries))
    return Stat.of(sum(e.values[metric][r] for e in entries) / len(entries) for r in sorted(runs, key=str))


def _svr_points(table: Table, metric: str) -> list[_Point]:
    """The points of one panel; shift: one per recipe, over its variants."""
    if table.setting != "shift":
        pts = [_Point(e, e.stat("clean"), e.stat(metric)) for e in table.entries]
    else:
        groups: dict[str, list[Entry]] = defaultdict(list)
        for e in table.entries:
            groups[e.recipe.recipe_id].append(e)
        pts = [
            _Point(es[0], _over_variants(es, "clean"), _over_variants(es, metric)) for es in groups.values()
        ]
    return [p for p in pts if p.clean.mean is not None and p.robust.mean is not None]


def _panel_comparisons(ctx: Context, table: Table, metric: str) -> dict[str, Comparison]:
    """Entry uid -> its comparison with the table's baseline on ``metric``, Holm over the panel (the
    ranking metric's are the Δ column's; others are made here the same way)."""
    base = next((e for e in table.entries if e.uid == ctx.baselines.get(table.key)), None)
    if base is None:
        return {}
    if metric == table.rank_metric:
        return {e.uid: ctx.comparisons[e.uid] for e in table.entries if e.uid in ctx.comparisons}
    comps = with_holm(protocol_comparisons(table.entries, base, [metric], table.metric_keys))
    return {c.entry_id: c for c in comps}


def measure_text(metric: str, keys: Iterable[MetricKey]) -> str:
    """What a panel plots, e.g. ``FGSM at ε = 0.002 (0.51/255)``."""
    for attack, norm, eps in keys:
        if metric_name(attack, norm, eps) == metric:
            what = "worst case over the suite" if attack == "worst_case" else ATTACK_NAMES.get(attack, attack)
            return f"{what} at ε = {eps:g} ({eps_label(eps) if norm == 'Linf' else norm})"
    return metric


def _measures(ctx: Context, table: Table) -> tuple[str, str | None]:
    """The upper panel's metric (FGSM at the headline ε) and the lower one's (the ranking metric;
    None where it is the same or clean accuracy)."""
    rank = table.rank_metric
    return ctx.fgsm, (None if rank in (ctx.fgsm, "clean") else rank)


def _draw_point(ax: Any, p: _Point, st: Style, filled: bool) -> tuple[float, float, bool]:
    """The marker and its two interval bars; a point outside the panel (a control far below the
    trained recipes) sits on the panel's edge without bars. Returns where it was drawn and whether
    it is off scale."""
    x, y, uid = pct(p.clean.mean), pct(p.robust.mean), p.entry.uid
    (xlo, xhi), (ylo, yhi) = ax.get_xlim(), ax.get_ylim()
    inset = 0.012 * (xhi - xlo), 0.012 * (yhi - ylo)
    at = min(max(x, xlo + inset[0]), xhi - inset[0]), min(max(y, ylo + inset[1]), yhi - inset[1])
    off = not (xlo <= x <= xhi and ylo <= y <= yhi)
    bar = {"color": st.color, "lw": 0.6, "alpha": 0.4, "zorder": 1}
    if p.robust.lo is not None and not off:
        ax.plot([x, x], [pct(p.robust.lo), pct(p.robust.hi)], **bar, gid=f"yinterval:{uid}")
    if p.clean.lo is not None and not off:
        ax.plot([pct(p.clean.lo), pct(p.clean.hi)], [y, y], **bar, gid=f"xinterval:{uid}")
    # hollow markers are see-through and drawn over filled ones, so a marker under another stays visible
    ax.plot([at[0]], [at[1]], ls="none", marker=st.marker, ms=6, mfc=st.color if filled else "none",
            mec=st.color, mew=1.1, zorder=3 if filled else 4, gid=f"point:{uid}")  # fmt: skip
    return at[0], at[1], off


def _svr_panel(
    ctx: Context, ax: Any, table: Table, metric: str, style: dict[Any, Style], renderer: Any
) -> None:
    pts = _svr_points(table, metric)
    comps = _panel_comparisons(ctx, table, metric)
    base = ctx.baselines.get(table.key)
    _square_limits(ax, [p for p in pts if not p.entry.recipe.control] or pts)
    labels, clear, first = [], [], []
    for p in sorted(pts, key=lambda p: p.entry.rank):
        st, uid = style[p.entry.recipe], p.entry.uid
        x, y, off = _draw_point(ax, p, st, established(comps.get(uid)))
        if uid == base:
            ax.plot([x], [y], ls="none", marker="o", ms=12, mfc="none", mec="black", mew=1.0, zorder=2,
                    gid="baseline-ring")  # fmt: skip
        text = st.label + (" (baseline)" if uid == base else "")
        if off:  # its values in the label, since the axes do not show them
            text += f" ({pct(p.clean.mean):.1f}, {pct(p.robust.mean):.1f}: off scale)"
        labels.append((x, y, text, st.color))
        clear.append(8.0 if uid == base else 4.5)  # the baseline's ring is wider than a marker
        first.append(off)
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], ls="--", color="0.6", lw=0.8, zorder=0, gid="y=x")
    what = measure_text(metric, table.metric_keys)
    ax.set_title(f"{_panel_title(table, ctx.tables)}\n{what} vs clean", fontsize=9)
    ax.set_xlabel("clean accuracy [%]", fontsize=8)
    ax.set_ylabel(f"{what} [%]", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)
    if not pts:
        ax.text(0.5, 0.5, f"no {what} rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
    label_points(ax, labels, renderer, clear, first)


def _panel_title(table: Table, tables: list[Table]) -> str:
    what = f"{table.setting}: {table.dataset}"
    if table.setting == "shift":
        what += f" (mean over {join(e.shift or e.dataset for e in table.entries)})"
    return what + (f"\n{panel_note(table, tables)}" if table.note else "")


def _square_limits(ax: Any, pts: list[_Point]) -> None:
    """x limits around the given points' clean accuracies and intervals (the trained recipes: a
    control far below them would squeeze them into a corner); y limits around their robust ones,
    stretched to cover the x range too, so that y = x crosses the panel (above the points: robust
    never exceeds clean)."""
    if not pts:
        return
    xs = [pct(v) for p in pts for v in (p.clean.mean, p.clean.lo, p.clean.hi) if v is not None]
    ys = [pct(v) for p in pts for v in (p.robust.mean, p.robust.lo, p.robust.hi) if v is not None]
    padx = max(1.0, 0.04 * (max(xs) - min(xs)))
    xlo, xhi = max(0.0, min(xs) - padx), min(100.5, max(xs) + padx)
    ylo, yhi = min(*ys, xlo), max(*ys, xhi)
    pady = max(1.0, 0.04 * (yhi - ylo))
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(max(0.0, ylo - pady), min(100.5, yhi + pady))


def _svr_key(ctx: Context, fig: Any) -> None:
    from matplotlib.lines import Line2D

    dot = {"ls": "none", "marker": "o"}
    base = ctx.baseline_family
    handles = [
        Line2D([], [], **dot, mfc="0.3", mec="0.3", label=f"filled: established against {base} (Holm p < "
               "0.05 over the panel's McNemar tests AND a seed interval of the difference excluding 0)"),
        Line2D([], [], **dot, mfc="none", mec="0.3",
               label="hollow: not established, or not tested (one seed; shift panels)"),
        Line2D([], [], **dot, ms=11, mfc="none", mec="black", mew=1.0,
               label=f"black ring: the baseline ({base})"),
        Line2D([], [], ls="--", color="0.6", label="y = x (robust = clean)"),
        Line2D([], [], color="0.3", alpha=0.45,
               label="bars: 95 % intervals over seeds, clean (horizontal) and robust (vertical)"),
    ]  # fmt: skip
    if not ctx.baselines:
        handles = handles[3:]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=FONT, frameon=False)


def _svr_grid(n_tables: int) -> tuple[int, int]:
    """(rows, columns) of Fig. 1: a column per table, two rows (FGSM above, the ranking metric below)
    per group of up to PANEL_COLS tables."""
    n = max(1, n_tables)
    return 2 * math.ceil(n / PANEL_COLS), min(n, PANEL_COLS)


def draw_standard_vs_robust(ctx: Context) -> Any:
    """NaCl Fig. 1 (a matplotlib Figure): clean vs FGSM at the headline ε (upper panel) and vs the
    ranking metric (lower panel), one column per table, points labelled directly."""
    tables = [t for t in ctx.tables if t.setting in ("in-domain", "transfer", "shift")]
    w, h = figure_size("standard_vs_robust.png", len(tables))
    rows, cols = _svr_grid(len(tables))
    fig, axes = new_figure((w / DPI, h / DPI), rows, cols)
    set_margins(fig, rows, cols, lrbt=(0.65, 0.25, SVR_KEY_IN, SVR_TITLE_IN), gaps=(0.9, 1.0))
    style = styles(e.recipe for e in ctx.entries)
    renderer = fig.canvas.get_renderer()
    used = set()
    for i, table in enumerate(tables):
        group, col = divmod(i, cols)
        for k, metric in enumerate(_measures(ctx, table)):
            ax = axes[(2 * group + k) * cols + col]
            used.add(id(ax))
            if metric is None:
                ax.set_axis_off()
                ax.text(
                    0.5, 0.5, "ranked by the metric above", transform=ax.transAxes, ha="center", color="0.5"
                )
            else:
                _svr_panel(ctx, ax, table, metric, style, renderer)
    for ax in axes:
        if id(ax) not in used:
            ax.set_axis_off()
    fig.suptitle(_svr_title(ctx), fontsize=10, y=1 - 0.12 / (h / DPI), va="top")
    _svr_key(ctx, fig)
    return fig


def _svr_title(ctx: Context) -> str:
    paper = ", the NaCl paper's measure" if math.isclose(ctx.headline_eps, PAPER_EPS) else ""
    return (
        "Standard vs robust accuracy (NaCl Fig. 1), means over seeds; grey crosses: random-init controls\n"
        f"upper panels: FGSM at ε = {ctx.eps_text}{paper}; lower panels: each table's ranking metric"
    )


def _loss_params(e: Entry) -> dict[str, Any]:
    lp = e.rows[0].get("loss_params")
    if isinstance(lp, dict):
        return lp
    # rows without the full dict still carry the compact "k=v k=v" description
    return dict(tok.split("=", 1) for tok in e.recipe.key_params.split() if "=" in tok)


def _recipe_without(recipe: dict[str, Any], param: str) -> str:
    """The recipe with one loss parameter left out, as canonical text (what a grid line shares)."""
    rest = copy.deepcopy(recipe)
    for holder in (rest, rest.get("config") or {}):
        if isinstance(holder.get("loss_params"), dict):
            holder["loss_params"].pop(param, None)
    return json.dumps(rest, sort_keys=True, default=str)


def find_grids(entries: list[Entry], param: str) -> dict[str, list[tuple[float, Entry]]]:
    """In-domain recipes that differ only in ``param`` (>= 2 values) under one protocol: label -> points."""
    lines: dict[tuple, list[tuple[float, Entry]]] = defaultdict(list)
    for e in entries:
        if e.setting != "in-domain" or e.recipe.control:
            continue
        try:
            value = float(_loss_params(e)[param])
        except (KeyError, TypeError, ValueError):
            continue
        lines[(e.recipe.loss, e.protocol_id, _recipe_without(e.rows[0].recipe, param))].append((value, e))
    out = {}
    for pts in lines.values():
        if len({v for v, _ in pts}) >= 2:
            e0 = pts[0][1]
            others = " ".join(t for t in e0.recipe.key_params.split() if not t.startswith(f"{param}="))
            label = f"{e0.recipe.loss} [{others}]" if others else e0.recipe.loss
            out[label] = sorted(pts, key=lambda p: p[0])
    return dict(sorted(out.items()))


def draw_ablation(ctx: Context, param: str, grids: dict[str, list[tuple[float, Entry]]]) -> Any:
    """Fig. S2 (a matplotlib Figure): clean and the ranking metric vs one loss parameter, one line
    per loss family."""
    fig, axes = new_figure(ABLATION_IN, 1, 2)
    set_margins(fig, 1, 2, lrbt=(0.7, 0.2, 0.6, 0.45), gaps=(0.9, 0.0))
    style = styles(e.recipe for e in ctx.entries)
    metric = ctx.table_of(next(iter(grids.values()))[0][1]).rank_metric
    label = ctx.table_of(next(iter(grids.values()))[0][1]).rank_label
    for ax, (m, what) in zip(axes, (("clean", "clean accuracy"), (metric, label)), strict=True):
        values: set[float] = set()
        for name, pts in grids.items():
            xs = [v for v, _ in pts]
            values.update(xs)
            st = style[pts[0][1].recipe]
            ys = [pct(e.stat(m).mean) for _, e in pts]
            lo = [
                y - pct(e.stat(m).lo) if e.stat(m).lo is not None else 0
                for y, (_, e) in zip(ys, pts, strict=True)
            ]
            hi = [
                pct(e.stat(m).hi) - y if e.stat(m).hi is not None else 0
                for y, (_, e) in zip(ys, pts, strict=True)
            ]
            ax.errorbar(
                xs, ys, yerr=[lo, hi], fmt="-" + st.marker, color=st.color, capsize=3, ms=5, label=name
            )
        ax.set_xticks(sorted(values), [f"{v:g}" for v in sorted(values)])
        ax.set_xlabel(ABLATIONS[param], fontsize=8)
        ax.set_ylabel(f"{what} [%] (95 % interval)", fontsize=8)
        ax.set_title(f"in-domain {what} vs {param}", fontsize=9)
        ax.grid(alpha=0.25)
        ax.legend(fontsize=FONT, frameon=False)
    return fig


def svr_caption(ctx: Context) -> str:
    """The caption of Fig. 1: what its two rows of panels plot and what a filled marker means."""
    paper = ", the NaCl paper's measure," if math.isclose(ctx.headline_eps, PAPER_EPS) else ""
    filled = (
        f"; filled: established against {ctx.baseline_family} (Holm p < 0.05 and a seed interval "
        "excluding 0), hollow otherwise"
        if ctx.baselines
        else ""
    )
    return (
        f"Standard vs robust accuracy (NaCl Fig. 1): FGSM at ε = {ctx.eps_text}{paper} in the upper "
        f"panels and each table's ranking metric in the lower ones, 95 % intervals on both axes{filled}"
    )


def render_figures(ctx: Context) -> tuple[dict[str, bytes], dict[str, str], dict[str, str]]:
    """(file name -> PNG bytes, file name -> caption, skipped file name -> why not drawn)."""
    files = {
        "standard_vs_robust.png": png_bytes(draw_standard_vs_robust(ctx)),
        "robust_vs_eps.png": png_bytes(draw_robust_vs_eps(ctx)),
    }
    captions = {"standard_vs_robust.png": svr_caption(ctx), "robust_vs_eps.png": EPS_CAPTION}
    skipped: dict[str, str] = {}
    for param in ABLATIONS:
        name = f"ablation_{param}.png"
        grids = find_grids(ctx.entries, param)
        if grids:
            files[name] = png_bytes(draw_ablation(ctx, param, grids))
            captions[name] = f"Ablation over {param} (Fig. S2): {'; '.join(grids)}"
        else:
            skipped[name] = f"no {param} grid (no loss family has recipes that differ only in {param})"
    return files, captions, skipped
