"""``robust_vs_eps.png`` (Fig. S1): each table's ranking attack against a numeric ε axis (ε = 0: clean
accuracy) with 95 % interval bars, one panel per in-domain and transfer table, every line labelled at
its right end, in the recipe's own (colour, marker, line style) (:mod:`.plotstyle`)."""

from __future__ import annotations

from typing import Any

from .aggregate import Entry
from .canvas import DPI, new_figure, pct, set_margins
from .context import Context
from .metrics import ATTACK_NAMES, metric_key, metric_name
from .plotstyle import Style, label_line_ends, styles
from .tables import Table, panel_note

EPS_PANEL_IN = (7.0, 5.2)  # one panel, with the column of line labels on its right
LABELS_IN = 1.6  # the width of that column
EPS_CAPTION = (
    "Robust accuracy vs ε, in-domain and transfer (Fig. S1): each table's ranking attack over its suite's "
    "ε on a linear axis (ε = 0: clean accuracy), means over seeds with 95 % interval bars"
)


def eps_figure_size(n_panels: int) -> tuple[int, int]:
    """The pixel size of Fig. S1 with ``n_panels`` panels."""
    return round(n_panels * EPS_PANEL_IN[0] * DPI), round(EPS_PANEL_IN[1] * DPI)


def _sweep_attack(table: Table) -> str:
    """The attack whose ε sweep the panel draws: the ranking metric's, else FGSM."""
    keys = table.metric_keys
    for attack, norm, eps in keys:
        swept = sum(k[0] == attack and k[1] == norm for k in keys) >= 2
        if metric_name(attack, norm, eps) == table.rank_metric and swept:
            return attack
    return "fgsm"


def _eps_line(ax: Any, e: Entry, attack: str, st: Style) -> tuple[float, float] | None:
    """One recipe's line (ε = 0: clean accuracy) with its 95 % interval bars (bands of 17 recipes
    would blend into one grey); its right end."""
    stats = [(0.0, e.stat("clean"))] + [
        (eps, e.stat(name)) for name, eps in _metric_eps(e, attack) if eps > 0
    ]
    pts = sorted((eps, s) for eps, s in stats if s.mean is not None)
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [pct(p[1].mean) for p in pts]
    if all(s.lo is not None for _, s in pts):
        # the bar from lo to hi, drawn around its middle: errorbar refuses a mean outside its
        # interval, and Wilson's lower bound at 0 % comes out 1e-18 above 0 in floating point
        lo, hi = [pct(s.lo) for _, s in pts], [pct(s.hi) for _, s in pts]
        mid, half = (
            [(a + b) / 2 for a, b in zip(lo, hi, strict=True)],
            [(b - a) / 2 for a, b in zip(lo, hi, strict=True)],
        )
        bars = ax.errorbar(
            xs, mid, yerr=half, fmt="none", ecolor=st.color, elinewidth=0.8, alpha=0.5, capsize=2
        )
        bars.lines[2][0].set_gid(f"interval:{e.uid}")
    ax.plot(
        xs, ys, marker=st.marker, color=st.color, ms=4, lw=1.1, ls=st.linestyle, zorder=2, gid=f"line:{e.uid}"
    )
    return xs[-1], ys[-1]


def _eps_panel(ctx: Context, ax: Any, table: Table, style: dict[Any, Style], renderer: Any) -> None:
    attack = _sweep_attack(table)
    ends = []
    for e in sorted(table.entries, key=lambda e: e.rank):
        st = style[e.recipe]
        end = _eps_line(ax, e, attack, st)
        if end is not None:
            ends.append((*end, st.label, st.color))
    measured = sorted({eps for e in table.entries for _, eps in _metric_eps(e, attack) if eps > 0})
    name = "worst case" if attack == "worst_case" else ATTACK_NAMES.get(attack, attack)
    if measured:
        ax.set_xlim(-0.02 * measured[-1], 1.03 * measured[-1])
        ax.set_xticks(measured, minor=True)  # where ε was measured; the labelled ticks are a plain scale
        top = ax.secondary_xaxis("top", functions=(lambda x: x * 255, lambda x: x / 255))
        top.set_xlabel("ε × 255", fontsize=8)
        top.tick_params(labelsize=7)
    else:
        ax.text(0.5, 0.5, f"no {attack} rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
    note = f" ({panel_note(table, ctx.tables)})" if table.note else ""
    what = f"{name} accuracy vs ε (mean over seeds, 95 % interval)"
    ax.set_title(f"{table.setting}: {table.dataset}{note}\n{what}", fontsize=9)
    ax.set_xlabel("ε, L∞, in [0,1] pixel units (0: clean accuracy; minor ticks: the suite's ε)", fontsize=8)
    ax.set_ylabel(f"{name} accuracy [%]", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)
    label_line_ends(ax, ends, renderer)


def draw_robust_vs_eps(ctx: Context) -> Any:
    """Fig. S1 (a matplotlib Figure): robust accuracy vs a numeric ε axis with 95 % interval bars,
    one panel per in-domain and transfer table, lines labelled at their right end."""
    tables = [t for t in ctx.tables if t.setting in ("in-domain", "transfer")]
    n = max(1, len(tables))
    w, h = eps_figure_size(n)
    fig, axes = new_figure((w / DPI, h / DPI), 1, n)
    set_margins(fig, 1, n, lrbt=(0.65, LABELS_IN, 0.75, 1.0), gaps=(LABELS_IN + 0.65, 0.0))
    style = styles(e.recipe for e in ctx.entries)
    renderer = fig.canvas.get_renderer()
    for ax, table in zip(axes, tables, strict=False):
        _eps_panel(ctx, ax, table, style, renderer)
    if not tables:
        axes[0].text(
            0.5, 0.5, "no in-domain or transfer rows", transform=axes[0].transAxes, ha="center", va="center",
            color="0.5",
        )  # fmt: skip
    return fig


def _metric_eps(e: Entry, attack: str) -> list[tuple[str, float]]:
    keys = {metric_key(r) for r in e.rows if r["attack"] == attack and r["norm"] == "Linf"}
    return [(metric_name(*k), k[2]) for k in sorted(keys)]
