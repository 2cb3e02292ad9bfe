"""The leaderboard figures as PNG bytes (matplotlib on an Agg canvas: no display, no global pyplot state).

- ``standard_vs_robust.png`` (NaCl Fig. 1): clean (x) against the ranking metric (y), one panel per
  table (in-domain, transfer, shift: each protocol its own point set), a y = x line, every point
  labelled directly; filled markers differ significantly from the baseline (McNemar, Holm).
- ``robust_vs_eps.png`` (Fig. S1): the ranking attack against ε, one panel per in-domain table,
  every line labelled at its right end.
- ``ablation_M.png`` / ``ablation_lam.png`` (Fig. S2), only where such a grid exists.

Every recipe keeps one (colour, marker) in every figure (:mod:`.plotstyle`).
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections import defaultdict
from typing import Any

from ..results.eps import eps_label
from .aggregate import Context, Entry, Table, join
from .metrics import metric_key, metric_name
from .plotstyle import FONT, Style, label_line_ends, label_points, styles

# Fixed pixel sizes (inches x dpi) so the figures are comparable between renders; tests check them.
DPI = 100
PANEL_IN = (5.0, 4.6)  # standard_vs_robust: one panel (axes, ticks, labels)
PANEL_COLS = 3  # panels per row
SVR_FRAME_IN = 1.25  # standard_vs_robust: title above and the key below the panels
EPS_PANEL_IN = (6.2, 4.6)  # robust_vs_eps: one panel, with the column of line labels on its right
LABELS_IN = 1.6  # robust_vs_eps: the width of that column
ABLATION_IN = (11.0, 4.0)
# Figure S2: the loss parameters whose grids get an ablation plot, with their axis labels.
ABLATIONS = {"M": "number of positives M", "lam": "mixup coefficient λ"}
SIGNIFICANT = 0.05  # Holm-adjusted p below which a point is drawn filled


def figure_size(name: str, n_panels: int) -> tuple[int, int]:
    """The pixel size of a figure with ``n_panels`` panels (what tests and the page expect)."""
    if name == "standard_vs_robust.png":
        cols, rows = min(n_panels, PANEL_COLS), math.ceil(n_panels / PANEL_COLS)
        return round(cols * PANEL_IN[0] * DPI), round((rows * PANEL_IN[1] + SVR_FRAME_IN) * DPI)
    if name == "robust_vs_eps.png":
        return round(n_panels * EPS_PANEL_IN[0] * DPI), round(EPS_PANEL_IN[1] * DPI)
    return round(ABLATION_IN[0] * DPI), round(ABLATION_IN[1] * DPI)


def _figure(size: tuple[float, float], nrows: int, ncols: int) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def _margins(fig: Any, nrows: int, ncols: int, *, lrbt: tuple[float, ...], gaps: tuple[float, float]) -> None:
    """Fixed margins and gaps in inches (tight_layout would cost a draw and move panels between
    renders): ``lrbt`` = left, right, bottom, top; ``gaps`` = between columns, between rows."""
    w, h = fig.get_figwidth(), fig.get_figheight()
    left, right, bottom, top = lrbt
    ax_w = (w - left - right - (ncols - 1) * gaps[0]) / ncols
    ax_h = (h - bottom - top - (nrows - 1) * gaps[1]) / nrows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h)
    fig.subplots_adjust(wspace=gaps[0] / ax_w, hspace=gaps[1] / ax_h)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # no Software (version) metadata: re-rendering unchanged rows rewrites identical bytes
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _pct(x: float | None) -> float:
    return 100 * (x or 0.0)


# ============ standard vs robust (Fig. 1) ============


def _svr_points(ctx: Context, table: Table) -> list[tuple[Entry, float, float, tuple[float, float] | None]]:
    """(entry, clean %, ranking metric %, its interval %) per point; shift: means over the variants."""
    metric = table.rank_metric
    if table.setting != "shift":
        out = []
        for e in table.entries:
            s = e.stat(metric)
            if s.mean is not None and e.stat("clean").mean is not None:
                ci = None if s.lo is None else (_pct(s.lo), _pct(s.hi))
                out.append((e, _pct(e.stat("clean").mean), _pct(s.mean), ci))
        return out
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in table.entries:
        if e.stat(metric).mean is not None and e.stat("clean").mean is not None:
            groups[e.recipe.recipe_id].append(e)
    return [
        (
            es[0],
            sum(_pct(e.stat("clean").mean) for e in es) / len(es),
            sum(_pct(e.stat(metric).mean) for e in es) / len(es),
            None,
        )
        for es in groups.values()
    ]


def _panel_title(ctx: Context, table: Table) -> str:
    what = f"{table.setting}: {table.dataset}"
    if table.setting == "shift":
        what += f" (mean over {join(e.shift or e.dataset for e in table.entries)})"
    return what + (f"\n{table.note}" if table.note else "")


def _svr_panel(ctx: Context, ax: Any, table: Table, style: dict[Any, Style], renderer: Any) -> None:
    pts = _svr_points(ctx, table)
    base = ctx.baselines.get(table.key)
    labels, clear = [], []
    for e, x, y, ci in sorted(pts, key=lambda p: p[0].rank):
        st = style[e.recipe]
        c = ctx.comparisons.get(e.uid)
        filled = c is not None and c.p_holm is not None and c.p_holm < SIGNIFICANT
        if ci is not None:
            ax.plot([x, x], ci, color=st.color, lw=0.6, alpha=0.35, zorder=1, gid=f"interval:{e.uid}")
        face = st.color if filled else "white"
        ax.plot([x], [y], ls="none", marker=st.marker, ms=7, mfc=face, mec=st.color, mew=1.2, zorder=3,
                gid=f"point:{e.uid}")  # fmt: skip
        if e.uid == base:
            ax.plot([x], [y], ls="none", marker="o", ms=15, mfc="none", mec="black", mew=1.2, zorder=2,
                    gid="baseline-ring")  # fmt: skip
        labels.append((x, y, st.label + (" (baseline)" if e.uid == base else ""), st.color))
        clear.append(11.0 if e.uid == base else 5.0)  # the baseline's ring is wider than a marker
    _square_limits(ax, [(x, y) for _, x, y, _ in pts])
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], ls="--", color="0.6", lw=0.8, zorder=0, gid="y=x")
    ax.set_title(_panel_title(ctx, table), fontsize=9)
    ax.set_xlabel("clean accuracy [%]", fontsize=8)
    ax.set_ylabel(f"{table.rank_label} [%]", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)
    if not pts:
        ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
    label_points(ax, labels, renderer, clear)


def _square_limits(ax: Any, xy: list[tuple[float, float]]) -> None:
    """x limits around the clean accuracies; y limits around the robust ones, stretched to cover the
    x range too, so that y = x crosses the panel (above the points: robust never exceeds clean)."""
    if not xy:
        return
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    padx = max(1.5, 0.1 * (max(xs) - min(xs)))
    xlo, xhi = max(0.0, min(xs) - padx), min(100.5, max(xs) + padx)
    ylo, yhi = min(*ys, xlo), max(*ys, xhi)
    pady = max(1.5, 0.05 * (yhi - ylo))
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(max(0.0, ylo - pady), min(100.5, yhi + pady))


def _svr_key(ctx: Context, fig: Any) -> None:
    from matplotlib.lines import Line2D

    dot = {"ls": "none", "marker": "o"}
    handles = [
        Line2D(
            [],
            [],
            **dot,
            mfc="0.3",
            mec="0.3",
            label="filled: differs from the baseline (McNemar, Holm p < 0.05)",
        ),
        Line2D([], [], **dot, mfc="white", mec="0.3", label="hollow: no significant difference, or untested"),
        Line2D([], [], **dot, ms=11, mfc="none", mec="black", mew=1.2, label="black ring: the baseline"),
        Line2D([], [], ls="--", color="0.6", label="y = x (robust = clean)"),
        Line2D([], [], color="0.3", alpha=0.35, label="95 % interval"),
    ]
    if not ctx.baselines:
        handles = handles[3:]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT, frameon=False)


def draw_standard_vs_robust(ctx: Context) -> Any:
    """NaCl Fig. 1 (a matplotlib Figure): clean vs the ranking metric, one panel per table (in
    order), points labelled directly."""
    tables = [t for t in ctx.tables if t.setting in ("in-domain", "transfer", "shift")]
    n = max(1, len(tables))
    w, h = figure_size("standard_vs_robust.png", n)
    cols, rows = min(n, PANEL_COLS), math.ceil(n / PANEL_COLS)
    fig, axes = _figure((w / DPI, h / DPI), rows, cols)
    _margins(fig, rows, cols, lrbt=(0.65, 0.25, 0.8, 0.85), gaps=(0.9, 1.05))
    style = styles(e.recipe for e in ctx.entries)
    renderer = fig.canvas.get_renderer()
    for ax, table in zip(axes, tables, strict=False):
        _svr_panel(ctx, ax, table, style, renderer)
    for ax in axes[len(tables) :]:
        ax.set_axis_off()
    fig.suptitle(
        "Standard vs robust accuracy (mean over seeds; grey crosses: random-init controls)",
        fontsize=10,
        y=1 - 0.15 / (h / DPI),
    )
    _svr_key(ctx, fig)
    return fig


# ============ robust accuracy vs eps (Fig. S1) ============


def _sweep_attack(table: Table) -> str:
    """The attack whose ε sweep the panel draws: the ranking metric's, else FGSM."""
    keys = table.metric_keys
    for attack, norm, eps in keys:
        swept = sum(k[0] == attack and k[1] == norm for k in keys) >= 2
        if metric_name(attack, norm, eps) == table.rank_metric and swept:
            return attack
    return "fgsm"


def _eps_panel(ctx: Context, ax: Any, table: Table, style: dict[Any, Style], renderer: Any) -> None:
    attack = _sweep_attack(table)
    all_eps: set[float] = set()
    ends = []
    for e in sorted(table.entries, key=lambda e: e.rank):
        pts = sorted(
            (eps, e.stat(name).mean)
            for name, eps in _metric_eps(e, attack)
            if eps > 0 and e.stat(name).mean is not None
        )
        if not pts:
            continue
        st = style[e.recipe]
        xs, ys = [p[0] for p in pts], [_pct(p[1]) for p in pts]
        all_eps.update(xs)
        dash = "--" if e.recipe.control else "-"
        ax.plot(xs, ys, marker=st.marker, color=st.color, ms=4, lw=1.1, ls=dash, gid=f"line:{e.uid}")
        ends.append((xs[-1], ys[-1], st.label, st.color))
    if all_eps:
        ticks = sorted(all_eps)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{t:g}\n{eps_label(t)}" for t in ticks], fontsize=7)
        ax.minorticks_off()
    else:
        ax.text(0.5, 0.5, f"no {attack} rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
    name = {"worst_case": "worst case", "fgsm": "FGSM", "pgd": "PGD"}.get(attack, attack)
    note = f" ({table.note})" if table.note else ""
    ax.set_title(f"in-domain: {table.dataset}{note}\n{name} accuracy vs ε (mean over seeds)", fontsize=9)
    ax.set_xlabel("ε ([0,1] pixel units; /255 below)", fontsize=8)
    ax.set_ylabel(f"{name} accuracy [%]", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.25)
    label_line_ends(ax, ends, renderer)


def draw_robust_vs_eps(ctx: Context) -> Any:
    """Fig. S1 (a matplotlib Figure): in-domain robust accuracy vs ε, one panel per in-domain table,
    lines labelled at their right end."""
    tables = [t for t in ctx.tables if t.setting == "in-domain"]
    n = max(1, len(tables))
    w, h = figure_size("robust_vs_eps.png", n)
    fig, axes = _figure((w / DPI, h / DPI), 1, n)
    _margins(fig, 1, n, lrbt=(0.65, LABELS_IN, 0.75, 0.55), gaps=(LABELS_IN + 0.65, 0.0))
    style = styles(e.recipe for e in ctx.entries)
    renderer = fig.canvas.get_renderer()
    for ax, table in zip(axes, tables, strict=False):
        _eps_panel(ctx, ax, table, style, renderer)
    if not tables:
        axes[0].text(
            0.5, 0.5, "no in-domain rows", transform=axes[0].transAxes, ha="center", va="center", color="0.5"
        )
    return fig


def _metric_eps(e: Entry, attack: str) -> list[tuple[str, float]]:
    keys = {metric_key(r) for r in e.rows if r["attack"] == attack and r["norm"] == "Linf"}
    return [(metric_name(*k), k[2]) for k in sorted(keys)]


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
    fig, axes = _figure(ABLATION_IN, 1, 2)
    _margins(fig, 1, 2, lrbt=(0.7, 0.2, 0.6, 0.45), gaps=(0.9, 0.0))
    style = styles(e.recipe for e in ctx.entries)
    metric = ctx.table_of(next(iter(grids.values()))[0][1]).rank_metric
    label = ctx.table_of(next(iter(grids.values()))[0][1]).rank_label
    for ax, (m, what) in zip(axes, (("clean", "clean accuracy"), (metric, label)), strict=True):
        values: set[float] = set()
        for name, pts in grids.items():
            xs = [v for v, _ in pts]
            values.update(xs)
            st = style[pts[0][1].recipe]
            ys = [_pct(e.stat(m).mean) for _, e in pts]
            lo = [
                y - _pct(e.stat(m).lo) if e.stat(m).lo is not None else 0
                for y, (_, e) in zip(ys, pts, strict=True)
            ]
            hi = [
                _pct(e.stat(m).hi) - y if e.stat(m).hi is not None else 0
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


def render_figures(ctx: Context) -> tuple[dict[str, bytes], dict[str, str], dict[str, str]]:
    """(file name -> PNG bytes, file name -> caption, skipped file name -> why not drawn)."""
    files = {
        "standard_vs_robust.png": _png(draw_standard_vs_robust(ctx)),
        "robust_vs_eps.png": _png(draw_robust_vs_eps(ctx)),
    }
    captions = {
        "standard_vs_robust.png": "Standard vs robust accuracy, one panel per table (NaCl Fig. 1)",
        "robust_vs_eps.png": "Robust accuracy vs ε, in-domain (Fig. S1)",
    }
    skipped: dict[str, str] = {}
    for param in ABLATIONS:
        name = f"ablation_{param}.png"
        grids = find_grids(ctx.entries, param)
        if grids:
            files[name] = _png(draw_ablation(ctx, param, grids))
            captions[name] = f"Ablation over {param} (Fig. S2): {'; '.join(grids)}"
        else:
            skipped[name] = f"no {param} grid (no loss family has recipes that differ only in {param})"
    return files, captions, skipped
