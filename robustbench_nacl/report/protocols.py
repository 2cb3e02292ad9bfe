"""The finetuning protocols side by side: SLF / ALF / AFF clean and robust accuracy per loss family.

The shape of the RobustSSL benchmark's tables. Entries of one recipe are put on one line when they
were measured under protocols that differ only in the finetuning protocol (same dataset, setting,
suite, probe and examples); they stay separate tables for ranking (their protocol ids differ). The
robust column is AutoAttack where every protocol of the group has it, else the worst case, both at
the headline L∞ ε where all of them measured it, else at the largest L∞ ε they all measured; the
header says which. Nothing here is drawn or written
unless the rows hold more than one protocol, so an SLF-only leaderboard is byte-identical to before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..results.finetune import PROTOCOLS, AffConfig, AlfConfig
from .aggregate import Context, Entry, _short_hash
from .fmt import fmt_stat
from .metrics import metric_key, metric_label, metric_name

FIGURE = "robust_by_protocol.png"
DEFAULTS = {"alf": AlfConfig, "aff": AffConfig}
Group = tuple[str, str, str]  # (setting, dataset, protocol context without the finetuning protocol)


def protocol_of(e: Entry) -> str:
    """``slf``, ``alf`` or ``aff``: the entry's finetuning protocol."""
    ft = e.protocol.get("finetune")
    return str(ft.get("protocol")) if isinstance(ft, dict) else "slf"


def column_of(e: Entry) -> str:
    """The entry's column: ``SLF``, ``ALF``, ``AFF``, with the settings that differ from the
    defaults when they do (``ALF (epochs 200)``), so two ALF recipes never share a column."""
    name = protocol_of(e)
    ft = e.protocol.get("finetune")
    if not isinstance(ft, dict) or name not in DEFAULTS:
        return name.upper()
    default = DEFAULTS[name]().identity()
    diff = [
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in ft.items() if default.get(k) != v
    ]
    return name.upper() + (f" ({', '.join(diff)})" if diff else "")


def _order(column: str) -> tuple[int, str]:
    return PROTOCOLS.index(column.split(" ", 1)[0].lower()), column


def has_protocols(ctx: Context) -> bool:
    """True when the rows hold more than one finetuning protocol."""
    return len({protocol_of(e) for e in ctx.entries}) > 1


def groups(ctx: Context) -> dict[Group, dict[str, dict[str, Entry]]]:
    """(setting, dataset, context) -> recipe id -> column -> entry, for groups of >1 protocol."""
    out: dict[Group, dict[str, dict[str, Entry]]] = defaultdict(lambda: defaultdict(dict))
    for e in ctx.entries:
        rest = {k: v for k, v in e.protocol.items() if k not in ("dataset", "setting", "finetune")}
        out[(e.setting, e.dataset, _short_hash(rest))][e.recipe.recipe_id][column_of(e)] = e
    return {g: dict(by) for g, by in out.items() if len({p for v in by.values() for p in v}) > 1}


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


def _header(setting: str, dataset: str, protos: list[str], robust: str) -> list[str]:
    heads = ["family"] + [f"{p} {what}" for p in protos for what in ("clean", robust)]
    return [f"### {setting} · {dataset}", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]


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
        protos = sorted({c for v in by.values() for c in v}, key=_order)
        chosen = robust_metric((e for v in by.values() for e in v.values()), ctx.headline_eps)
        if chosen is None:
            continue
        metric, label = chosen
        md += _header(setting, dataset, protos, label)
        for recipe_id in sorted(by, key=lambda r: ctx.label(next(iter(by[r].values())).recipe)):
            cells = [ctx.label(next(iter(by[recipe_id].values())).recipe)]
            for p in protos:
                e = by[recipe_id].get(p)
                cells += ["–", "–"] if e is None else [fmt_stat(e.stat("clean")), fmt_stat(e.stat(metric))]
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
    return md


def figure(ctx: Context) -> tuple[bytes, str] | None:
    """PNG bytes and caption of robust accuracy per protocol (one panel per group), or None."""
    from .canvas import new_figure, png_bytes

    found = groups(ctx)
    if not has_protocols(ctx) or not found:
        return None
    fig, axes = new_figure((5.0 * len(found), 3.6), 1, len(found))
    for ax, ((setting, dataset, _), by) in zip(axes, found.items(), strict=True):
        _panel(ax, ctx, setting, dataset, by)
    fig.subplots_adjust(bottom=0.3, top=0.88, wspace=0.3)
    return png_bytes(fig), "Robust accuracy per finetuning protocol (SLF / ALF / AFF), one panel per setting"


def _panel(ax: Any, ctx: Context, setting: str, dataset: str, by: dict[str, dict[str, Entry]]) -> None:
    protos = sorted({c for v in by.values() for c in v}, key=_order)
    chosen = robust_metric((e for v in by.values() for e in v.values()), ctx.headline_eps)
    recipes = sorted(by, key=lambda r: ctx.label(next(iter(by[r].values())).recipe))
    width = 0.8 / len(protos)
    for j, p in enumerate(protos):
        ys = [100 * (by[r][p].stat(chosen[0]).mean or 0.0) if chosen and p in by[r] else 0.0 for r in recipes]
        ax.bar([i + j * width for i in range(len(recipes))], ys, width, label=p)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(recipes))])
    ax.set_xticklabels(
        [ctx.label(next(iter(by[r].values())).recipe) for r in recipes], rotation=30, ha="right"
    )
    ax.set_ylabel(f"{chosen[1] if chosen else 'robust'} (%)")
    ax.set_title(f"{setting} · {dataset}", fontsize=9)
    ax.legend(fontsize=8)
