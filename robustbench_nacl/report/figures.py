"""The NaCl figures as PNG bytes (matplotlib on an Agg canvas: no display, no global pyplot state).

``standard_vs_robust.png`` (NaCl Fig. 1), ``robust_vs_eps.png`` (Fig. S1, one panel per in-domain
table) and ``ablation_M.png`` / ``ablation_lam.png`` (Fig. S2, only where such a grid exists).
"""

from __future__ import annotations

import copy
import io
import json
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..eval.rows import eps_label
from .aggregate import Context, Entry, Recipe, Stat, join, metric_key, metric_name

# Fixed pixel sizes (inches x dpi) so the figures are comparable between renders; tests check them.
DPI = 100
LEGEND_IN = 3.5  # width of the legend strip right of the panels
FIGSIZE = {
    "standard_vs_robust.png": (12.0, 4.5),  # 1200 x 450 px
    "robust_vs_eps.png": (5.5, 4.5),  # per in-domain table panel, + legend strip: 900 x 450 px for one
    "ablation": (11.0, 4.0),  # 1100 x 400 px
}
MARKERS = "osD^vP*<>p"  # cycled after the 10 tab10 colours, so up to 100 recipes stay distinct
# Figure S2: the loss parameters whose grids get an ablation plot, with their axis labels.
ABLATIONS = {"M": "number of positives M", "lam": "mixup coefficient λ"}


def _figure(size: tuple[float, float], ncols: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # no Software (version) metadata: re-rendering unchanged rows rewrites identical bytes
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _styles(recipes: Iterable[Recipe]) -> dict[Recipe, dict[str, Any]]:
    """A colour and marker per recipe, the same in every figure; controls are grey crosses."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    unique = sorted(set(recipes))
    trained = [r for r in unique if not r.control]
    styles = {
        r: {"color": cmap(i % 10), "marker": MARKERS[(i // 10) % len(MARKERS)]} for i, r in enumerate(trained)
    }
    styles |= {r: {"color": "0.45", "marker": "X"} for r in unique if r.control}
    return styles


def _legend_right(fig: Any, handles: dict[str, Any]) -> None:
    # one figure-level legend in a fixed-width strip: panels keep their size however long the labels are;
    # fixed margins (inches) rather than tight_layout, which costs a second draw per figure
    w, h, n = fig.get_figwidth(), fig.get_figheight(), len(fig.axes)
    left, right, gap = 0.7, w - LEGEND_IN - 0.1, 0.9  # inches
    panel = (right - left - (n - 1) * gap) / n
    fig.subplots_adjust(left=left / w, right=right / w, bottom=0.8 / h, top=1 - 0.75 / h, wspace=gap / panel)
    frac = LEGEND_IN / w
    if handles:
        labels = [textwrap.fill(label, 46, subsequent_indent="  ") for label in handles]
        fig.legend(
            list(handles.values()),
            labels,
            loc="center left",
            bbox_to_anchor=(1 - frac + 0.01, 0.5),
            fontsize=7,
            frameon=False,
        )


def _pct(s: Stat) -> tuple[float, float]:
    return 100 * (s.mean or 0.0), 100 * (s.std or 0.0)


def plot_standard_vs_robust(ctx: Context) -> bytes:
    """NaCl Fig. 1: clean (x) vs FGSM@headline (y), one point per recipe; in-domain and transfer panels."""
    fig, axes = _figure(FIGSIZE["standard_vs_robust.png"], 2)
    styles = _styles(e.recipe for e in ctx.entries)
    handles: dict[str, Any] = {}
    for ax, setting in zip(axes, ("in-domain", "transfer"), strict=True):
        pts = [e for e in ctx.entries if e.setting == setting and e.stat(ctx.fgsm).mean is not None]
        for e in sorted(pts, key=lambda e: e.rank):
            (x, xs), (y, ys) = _pct(e.stat("clean")), _pct(e.stat(ctx.fgsm))
            st = styles[e.recipe]
            h = ax.errorbar(x, y, xerr=xs, yerr=ys, fmt=st["marker"], color=st["color"], ms=7, capsize=3)
            handles.setdefault(ctx.label(e.recipe), h)
        ax.set_title(f"{setting}: {join((e.dataset for e in pts), 'no rows')}", fontsize=10)
        ax.set_xlabel("standard (clean) accuracy [%]")
        ax.set_ylabel(f"FGSM accuracy, ε = {ctx.eps_text} [%]")
        ax.grid(alpha=0.3)
        if not pts:
            ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
    title = "Standard vs robust accuracy (mean ± std over seeds; grey X = random-init control)"
    fig.suptitle(title, fontsize=10)
    _legend_right(fig, handles)
    return _png(fig)


def plot_robust_vs_eps(ctx: Context) -> bytes:
    """Fig. S1: in-domain robust accuracy vs eps (FGSM sweep lines with a seed-std band, PGD squares)."""
    tables = [t for t in ctx.tables if t.setting == "in-domain"]
    groups = [(t.dataset + (f"\n{t.note}" if t.note else ""), t.entries) for t in tables]
    groups = groups or [("no in-domain rows", [])]
    w, h = FIGSIZE["robust_vs_eps.png"]
    fig, axes = _figure((w * len(groups) + LEGEND_IN, h), len(groups))
    styles = _styles(e.recipe for e in ctx.entries)
    handles: dict[str, Any] = {}
    for ax, (dataset, group) in zip(axes, groups, strict=True):
        all_eps: set[float] = set()
        for e in sorted(group, key=lambda e: e.rank):
            color = styles[e.recipe]["color"]
            for attack, marker in (("fgsm", "o"), ("pgd", "s")):
                pts = sorted(
                    (eps, e.stat(name))
                    for name, eps in _metric_eps(e, attack)
                    if eps > 0 and e.stat(name).mean is not None
                )
                if not pts:
                    continue
                all_eps.update(p[0] for p in pts)
                xs = [p[0] for p in pts]
                m = np.array([100 * p[1].mean for p in pts])
                s = np.array([100 * (p[1].std or 0.0) for p in pts])
                ls = ("--" if e.recipe.control else "-") if attack == "fgsm" else "none"
                (line,) = ax.plot(xs, m, marker=marker, color=color, ms=4, ls=ls)
                if attack == "fgsm":
                    ax.fill_between(xs, m - s, m + s, color=color, alpha=0.15, lw=0)
                    handles.setdefault(ctx.label(e.recipe), line)
        if all_eps:
            ticks = sorted(all_eps)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:g}\n{eps_label(t)}" for t in ticks], fontsize=7)
            ax.minorticks_off()
        else:
            ax.text(0.5, 0.5, "no FGSM rows", transform=ax.transAxes, ha="center", va="center", color="0.5")
        ax.set_title(f"in-domain: {dataset}\n(lines: FGSM ± std over seeds; squares: PGD)", fontsize=9)
        ax.set_xlabel("ε ([0,1] pixel units; /255 below)")
        ax.set_ylabel("robust accuracy [%]")
        ax.grid(alpha=0.3)
    _legend_right(fig, handles)
    return _png(fig)


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


def plot_ablation(ctx: Context, param: str, grids: dict[str, list[tuple[float, Entry]]]) -> bytes:
    """Fig. S2: clean and FGSM@headline vs one loss parameter, one line per loss family."""
    from matplotlib import colormaps

    fig, axes = _figure(FIGSIZE["ablation"], 2)
    cmap = colormaps["tab10"]
    handles: dict[str, Any] = {}
    panels = (("clean", "clean accuracy"), (ctx.fgsm, f"FGSM@{ctx.eps_text}"))
    for ax, (metric, what) in zip(axes, panels, strict=True):
        values: set[float] = set()
        for i, (label, pts) in enumerate(grids.items()):
            xs = [v for v, _ in pts]
            values.update(xs)
            ms = [_pct(e.stat(metric)) for _, e in pts]
            h = ax.errorbar(
                xs, [m for m, _ in ms], yerr=[s for _, s in ms], fmt="-o", color=cmap(i % 10), capsize=3, ms=4
            )
            handles.setdefault(label, h)
        ax.set_xticks(sorted(values), [f"{v:g}" for v in sorted(values)])
        ax.set_xlabel(ABLATIONS[param])
        ax.set_ylabel(f"{what} [%]")
        ax.set_title(f"in-domain {what} vs {param}", fontsize=9)
        ax.grid(alpha=0.3)
    _legend_right(fig, handles)
    return _png(fig)


def render_figures(ctx: Context) -> tuple[dict[str, bytes], dict[str, str], dict[str, str]]:
    """(file name -> PNG bytes, file name -> caption, skipped file name -> why not drawn)."""
    files = {
        "standard_vs_robust.png": plot_standard_vs_robust(ctx),
        "robust_vs_eps.png": plot_robust_vs_eps(ctx),
    }
    captions = {
        "standard_vs_robust.png": "Standard vs robust accuracy (NaCl Fig. 1)",
        "robust_vs_eps.png": "Robust accuracy vs ε, in-domain (Fig. S1)",
    }
    skipped: dict[str, str] = {}
    for param in ABLATIONS:
        name = f"ablation_{param}.png"
        grids = find_grids(ctx.entries, param)
        if grids:
            files[name] = plot_ablation(ctx, param, grids)
            captions[name] = f"Ablation over {param} (Fig. S2): {'; '.join(grids)}"
        else:
            skipped[name] = f"no {param} grid (no loss family has recipes that differ only in {param})"
    return files, captions, skipped
