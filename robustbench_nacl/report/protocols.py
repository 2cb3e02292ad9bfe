"""The finetuning protocols side by side: SLF / ALF / AFF clean and robust accuracy per loss family.

The shape of the RobustSSL benchmark's tables. Entries of one recipe are put on one line when they
were measured under protocols that differ only in the finetuning protocol (same dataset, setting,
suite, probe and examples); they stay separate tables for ranking (their protocol ids differ). The
robust column is AutoAttack where every protocol of the group has it, else the worst case, both at
the headline L∞ ε where all of them measured it, else at the largest L∞ ε they all measured; the
header says which. Nothing here is drawn or written
unless the rows hold more than one protocol, so an SLF-only leaderboard is byte-identical to before.

An ALF cell is marked when one of its runs' clean accuracy is more than :data:`ALF_CLEAN_GAP` below
the SLF run of the same checkpoint and evaluation seed in the same table (:func:`alf_gaps`), and the
runs are listed under the table: the rows' own ``alf_underfit`` flag compares training accuracies,
this compares what the table shows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..results.finetune import PROTOCOLS, AffConfig, AlfConfig, read_identity
from .aggregate import Entry, _short_hash
from .context import Context
from .fmt import fmt_stat
from .metrics import metric_key, metric_label, metric_name

FIGURE = "robust_by_protocol.png"
DEFAULTS = {"alf": AlfConfig, "aff": AffConfig}
# (setting, dataset, protocol context without the finetuning protocol; a named recipe is part of it)
Group = tuple[str, str, str]
# An ALF run whose clean test accuracy is more than this below SLF's on the same encoder and test
# examples is marked: the RobustSSL benchmark's gap is 2-3 points (ACL 78.2 -> 75.5); most fitted
# heads of the reference board lose 6-10 (docs/decisions.md, 'Fitted ALF heads')
ALF_CLEAN_GAP = 0.10
GAP_MARK = "↓"


def protocol_of(e: Entry) -> str:
    """``slf``, ``alf`` or ``aff``: the entry's finetuning protocol."""
    ft = e.protocol.get("finetune")
    return str(ft.get("protocol")) if isinstance(ft, dict) else "slf"


def recipe_name(e: Entry) -> str:
    """The named finetuning recipe of the entry's protocol (eval/finetune_recipes.py): ``uniform``
    for rows without one (every row before recipes existed)."""
    ft = e.protocol.get("finetune")
    recipe = ft.get("recipe") if isinstance(ft, dict) else None
    return str(recipe.get("name")) if isinstance(recipe, dict) else "uniform"


#: identity keys no column names: ``dual_bn`` and ``bn_momentum`` are how AFF resolved on the encoder
#: (not a choice of settings), a named recipe's settings are the recipe's (its tables say which)
_NOT_SHOWN = ("dual_bn", "bn_momentum", "recipe")


def column_of(e: Entry) -> str:
    """The entry's column: ``SLF``, ``ALF``, ``AFF``, with the settings that differ from the
    defaults when they do (``ALF (epochs 200)``, ``ALF (fit off)``), so two ALF recipes never share
    a column; a named recipe's columns show only a training subset (``max_train``)."""
    name = protocol_of(e)
    ft = e.protocol.get("finetune")
    if not isinstance(ft, dict) or (name not in DEFAULTS and "recipe" not in ft):
        return name.upper()
    default = {"max_train": None} if "recipe" in ft else DEFAULTS[name]().identity()
    # a row older than a late setting shows what it computed where today's default differs (an ALF
    # row without ``fit``: "fit off"), so that it never shares a column with a default row
    shown = read_identity(ft) if "recipe" not in ft else {k: v for k, v in ft.items() if k == "max_train"}
    diff = [
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in shown.items()
        if default.get(k) != v and k not in _NOT_SHOWN
    ]
    return name.upper() + (f" ({', '.join(diff)})" if diff else "")


def _order(column: str) -> tuple[int, str]:
    return PROTOCOLS.index(column.split(" ", 1)[0].lower()), column


def has_protocols(ctx: Context) -> bool:
    """True when the rows hold more than one finetuning protocol."""
    return len({protocol_of(e) for e in ctx.entries}) > 1


def groups(ctx: Context) -> dict[Group, dict[str, dict[str, Entry]]]:
    """(setting, dataset, context) -> recipe id -> column -> entry, for groups of >1 protocol: a
    named finetuning recipe's entries get groups (tables) of their own."""
    found: dict[Group, dict[str, dict[str, list[Entry]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for e in ctx.entries:
        rest = {k: v for k, v in e.protocol.items() if k not in ("dataset", "setting", "finetune")}
        if recipe_name(e) != "uniform":  # the uniform recipe's groups keep their keys
            rest["finetune_recipe"] = recipe_name(e)
        found[(e.setting, e.dataset, _short_hash(rest))][e.recipe.recipe_id][column_of(e)].append(e)
    out: dict[Group, dict[str, dict[str, Entry]]] = {}
    for g, by in found.items():
        out[g] = {
            rid: {_column_name(col, e, es): e for col, es in columns.items() for e in es}
            for rid, columns in by.items()
        }
    return {g: by for g, by in out.items() if len({p for v in by.values() for p in v}) > 1}


def _reading(e: Entry) -> str:
    """``dual-BN`` or ``single-BN``: how AFF ran on the encoder."""
    ft = e.protocol.get("finetune")
    return "dual-BN" if isinstance(ft, dict) and ft.get("dual_bn") == "on" else "single-BN"


def _column_name(column: str, e: Entry, sharing: list[Entry]) -> str:
    """``column``, or when several entries of one recipe share it (AFF measured under both readings,
    ``--aff-dual-bn off`` beside ``auto``: ``dual_bn`` is not shown by :func:`column_of`) the
    column with the reading, or the protocol id where the readings agree, so no entry overwrites
    another's cell."""
    if len(sharing) == 1:
        return column
    readings = [_reading(x) for x in sharing]
    tag = _reading(e) if len(set(readings)) == len(readings) else f"protocol {e.protocol_id[:8]}"
    return f"{column[:-1]}, {tag})" if column.endswith(")") else f"{column} ({tag})"


def robust_metric(entries: Iterable[Entry], headline: float | None = None) -> tuple[str, str] | None:
    """(metric, header) of the robust column: AutoAttack, else the worst case, at the headline L∞ ε
    where every entry measured it, else at the largest L∞ ε they all measured; None when they share
    no L∞ attack."""
    common: set[tuple[str, str, float]] | None = None
    for e in entries:
        keys = {metric_key(r) for r in e.rows if r["attack"] != "clean"}
        common = keys if common is None else common & keys
    for attack in ("autoattack", "worst_case"):
        eps = [k[2] for k in common or () if k[0] == attack and k[1] == "Linf"]
        if eps:
            hit = [e for e in eps if headline is not None and abs(e - headline) < 1e-12]
            key = (attack, "Linf", hit[0] if hit else max(eps))
            return metric_name(*key), metric_label(metric_name(*key), [key])
    return None


def alf_gaps(by: dict[str, dict[str, Entry]]) -> dict[tuple[str, str], list[tuple[Any, float, float]]]:
    """(recipe id, ALF column) -> [(evaluation seed, SLF clean, ALF clean)] of one group's runs whose
    ALF clean accuracy is more than :data:`ALF_CLEAN_GAP` below the SLF run of the same checkpoint and
    evaluation seed (the probe seeds of the two protocols need not agree)."""
    out: dict[tuple[str, str], list[tuple[Any, float, float]]] = {}
    for recipe_id, columns in by.items():
        slf = columns.get("SLF")
        if slf is None:
            continue
        reference = {run[:2]: acc for run, acc in slf.values.get("clean", {}).items()}
        for column, e in columns.items():
            if protocol_of(e) != "alf":
                continue
            # accuracies are multiples of 1/n: the 1e-9 keeps a gap of exactly 10 points unmarked
            found = [
                (run[1], reference[run[:2]], acc)
                for run, acc in sorted(e.values.get("clean", {}).items(), key=str)
                if run[:2] in reference and reference[run[:2]] - acc > ALF_CLEAN_GAP + 1e-9
            ]
            if found:
                out[(recipe_id, column)] = found
    return out


def _gap_note(ctx: Context, by: dict[str, dict[str, Entry]], gaps: dict) -> list[str]:
    """The lines under a table that name the marked ALF runs, one per recipe (none when nothing is
    marked); the ALF column is named when the table has more than one."""
    if not gaps:
        return []
    several = len({column for _, column in gaps}) > 1 or any(
        sum(protocol_of(e) == "alf" for e in columns.values()) > 1 for columns in by.values()
    )
    lines = []
    for (recipe_id, column), found in gaps.items():
        label = ctx.label(_recipe(by[recipe_id])) + (f", {column}" if several else "")
        runs = ", ".join(f"seed {s}: {100 * slf:.1f} → {100 * alf:.1f}" for s, slf, alf in sorted(found))
        lines.append(f"- {label} ({runs})")
    return [
        f"{GAP_MARK} ALF clean accuracy more than {100 * ALF_CLEAN_GAP:g} points below SLF's on the same "
        "encoder and test examples (SLF → ALF; the RobustSSL benchmark's gap is 2–3 points):",
        "",
        *sorted(lines),
        "",
    ]


def _header(setting: str, dataset: str, recipe: str, protos: list[str], robust: str) -> list[str]:
    heads = ["family"] + [f"{p} {what}" for p in protos for what in ("clean", robust)]
    title = f"### {setting} · {dataset}" + ("" if recipe == "uniform" else f" · finetune recipe {recipe}")
    return [title, "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]


def markdown_section(ctx: Context) -> list[str]:
    """The Markdown lines of the side-by-side tables (none when only one protocol is present)."""
    if not has_protocols(ctx):
        return []
    md = [
        "## Finetuning protocols side by side",
        "",
        "SLF: linear head on clean features; ALF: linear head trained on PGD examples through the frozen "
        "encoder; AFF: encoder and head trained with TRADES (docs/decisions.md, 'Finetuning protocols'). "
        "Accuracies in %, 95 % intervals; each protocol is ranked in its own table above.",
        "",
    ]
    for (setting, dataset, _), by in groups(ctx).items():
        recipe = _recipe_name(by)
        protos = sorted({c for v in by.values() for c in v}, key=_order)
        chosen = robust_metric((e for v in by.values() for e in v.values()), ctx.headline_eps)
        if chosen is None:
            continue
        metric, label = chosen
        gaps = alf_gaps(by)
        md += _header(setting, dataset, recipe, protos, label)
        for recipe_id in sorted(by, key=lambda r: ctx.label(_recipe(by[r]))):
            cells = [ctx.label(_recipe(by[recipe_id]))]
            for p in protos:
                e = by[recipe_id].get(p)
                if e is None:
                    cells += ["–", "–"]
                    continue
                mark = f" {GAP_MARK}" if (recipe_id, p) in gaps else ""
                cells += [fmt_stat(e.stat("clean")) + mark, fmt_stat(e.stat(metric))]
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
        md += _gap_note(ctx, by, gaps)
    return md


BAR_IN = 0.15  # inches per bar: 7-point tick labels one group apart never touch
GROUP_GAP = 0.5  # bars' worth of space between two recipes
LEGEND_COLS = 2  # protocol names with their parameters are long: two per legend line fit 6.5 inches


def figure(ctx: Context) -> tuple[bytes, str] | None:
    """PNG bytes and caption of robust and clean accuracy per protocol (one panel per group), or None."""
    from .canvas import png_bytes

    fig = draw(ctx)
    if fig is None:
        return None
    return png_bytes(fig), (
        "Robust accuracy per finetuning protocol (SLF / ALF / AFF), one panel per setting: bars with "
        "95 % intervals, clean accuracy as black ticks, recipes in the order of the first protocol"
    )


def draw(ctx: Context) -> Any:
    """The matplotlib Figure of :func:`figure`: per group, a horizontal bar per recipe and protocol
    (its robust accuracy with its 95 % interval, its clean accuracy as a tick on the bar's line);
    a protocol a recipe was not measured under has no bar, and says so. None without protocols."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from .canvas import new_figure, set_margins
    from .plotstyle import PALETTE, styles

    if not has_protocols(ctx):
        return None
    panels = []
    for (setting, dataset, _), by in groups(ctx).items():
        recipe = _recipe_name(by)
        chosen = robust_metric((e for v in by.values() for e in v.values()), ctx.headline_eps)
        if chosen is not None:
            title = dataset if recipe == "uniform" else f"{dataset} · {recipe}"
            panels.append(
                (setting, title, by, sorted({c for v in by.values() for c in v}, key=_order), chosen)
            )
    if not panels:
        return None
    bars = max(len(by) * (len(protos) + GROUP_GAP) for _, _, by, protos, _ in panels)
    columns = sorted({c for *_, protos, _ in panels for c in protos}, key=_order)
    legend_rows = math.ceil((len(columns) + 2) / LEGEND_COLS)
    bottom = 0.7 + 0.22 * legend_rows
    fig, axes = new_figure((6.5 * len(panels), 0.45 + bottom + BAR_IN * bars), 1, len(panels))
    set_margins(fig, 1, len(panels), lrbt=(2.4, 0.3, bottom, 0.45), gaps=(2.7, 0.0))
    color = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(columns)}
    style = styles(e.recipe for e in ctx.entries)
    for ax, (setting, dataset, by, protos, (metric, header)) in zip(axes, panels, strict=True):
        _panel(ax, by, protos, metric, {r: style[_recipe(by[r])].label for r in by}, color)
        ax.set_title(f"{setting} · {dataset}", fontsize=9)
        ax.set_xlabel(f"accuracy [%]: bars {header}, ticks clean", fontsize=8)
    handles = [Patch(color=color[c], label=c) for c in columns]
    handles.append(Line2D([], [], ls="none", marker="|", ms=8, color="black", label="clean accuracy"))
    handles.append(Line2D([], [], color="black", lw=0.8, label="95 % interval"))
    fig.legend(handles=handles, loc="lower left", ncol=LEGEND_COLS, fontsize=8, frameon=False)
    return fig


def _recipe_name(by: dict[str, dict[str, Entry]]) -> str:
    """The finetuning recipe of a group's entries (one per group: it is part of the group's key)."""
    return recipe_name(next(iter(next(iter(by.values())).values())))


def _recipe(by_column: dict[str, Entry]) -> Any:
    """The recipe of one line's entries (one per column, all of one recipe)."""
    return next(iter(by_column.values())).recipe


def _panel(
    ax: Any,
    by: dict[str, dict[str, Entry]],
    protos: list[str],
    metric: str,
    labels: dict[str, str],
    color: dict[str, str],
) -> None:
    from .canvas import pct

    def order(recipe_id: str) -> tuple[bool, float, str]:  # the first protocol's ranking, best on top
        e = by[recipe_id].get(protos[0])
        mean = e.stat(metric).mean if e is not None else None
        return mean is None, -(mean or 0.0), labels[recipe_id]

    recipes = sorted(by, key=order)
    step = len(protos) + GROUP_GAP
    for i, recipe_id in enumerate(recipes):
        for j, column in enumerate(protos):
            y, e = i * step + j, by[recipe_id].get(column)
            gid = f"{column}:{e.uid if e is not None else recipe_id}"
            if e is None:
                what = f"{column.split(' ', 1)[0]}: not measured"  # the legend gives the parameters
                ax.text(1, y, what, fontsize=6, va="center", color="0.45", gid=f"none:{gid}")
                continue
            robust, clean = e.stat(metric), e.stat("clean")
            ax.barh(y, pct(robust.mean), 0.85, color=color[column], gid=f"bar:{gid}")
            if robust.lo is not None and robust.hi is not None:
                ax.plot(
                    [pct(robust.lo), pct(robust.hi)], [y, y], color="black", lw=0.8, gid=f"interval:{gid}"
                )
            if clean.mean is not None:
                ax.plot(
                    [pct(clean.mean)], [y], ls="none", marker="|", ms=7, color="black", gid=f"clean:{gid}"
                )
    ax.set_yticks([i * step + (len(protos) - 1) / 2 for i in range(len(recipes))])
    ax.set_yticklabels([labels[r] for r in recipes], fontsize=7)
    ax.set_ylim(len(recipes) * step - GROUP_GAP, -1 + GROUP_GAP / 2)  # the first recipe on top
    ax.set_xlim(0, 100)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.25)
