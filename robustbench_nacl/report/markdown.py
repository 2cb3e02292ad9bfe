"""LEADERBOARD.md: a legend saying how the numbers were produced, then one table per protocol."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tabulate import tabulate

from ..eval.rows import SETTINGS, eps_label
from .aggregate import (
    CONTROL_LABEL,
    MISSING,
    Context,
    Entry,
    Recipe,
    Stat,
    Table,
    distinct,
    fmt_with_n,
    join,
    provenance,
)


def _table_md(headers: list[str], body: list[list[str]], align: list[str]) -> str:
    return tabulate(body, headers=headers, tablefmt="github", colalign=align, disable_numparse=True)


def _show_differs(entries: list[Entry]) -> bool:
    return any(e.recipe.differs for e in entries)


def _ident_cols(ctx: Context, e: Entry, differs: bool) -> list[str]:
    cols = [str(e.rank), e.recipe.family, e.recipe.key_params or MISSING]
    if differs:
        cols.append(e.recipe.differs or MISSING)
    if ctx.show_encoder:
        cols.append(e.recipe.encoder)
    if ctx.show_dataset and e.setting != "in-domain":
        cols.append(e.recipe.pretrain_dataset)
    return cols


def _ident_headers(ctx: Context, setting: str, differs: bool) -> tuple[list[str], list[str]]:
    heads = ["rank", "loss family", "key parameters"]
    if differs:
        heads.append("differs")
    if ctx.show_encoder:
        heads.append("encoder")
    if ctx.show_dataset and setting != "in-domain":
        heads.append("pretrained on")
    return heads, ["right"] + ["left"] * (len(heads) - 1)


def _heading(text: str, table: Table) -> list[str]:
    # a table whose dataset is also measured under another protocol says how its protocol differs
    if not table.note:
        return [text, ""]
    return [f"{text} — protocol: {table.note}", "", f"> Not ranked with the other {table.dataset} tables: "
            f"their protocols differ ({table.note} here).", ""]  # fmt: skip


# ============ one renderer per setting ============


def _table_in_domain(ctx: Context, table: Table) -> list[str]:
    group = sorted(table.entries, key=lambda e: e.rank)
    ids = {(e.recipe.recipe_id, e.context) for e in group}
    targets = distinct(
        t.dataset for t in ctx.entries if t.setting == "transfer" and (t.recipe.recipe_id, t.context) in ids
    )
    differs = _show_differs(group)
    heads, align = _ident_headers(ctx, "in-domain", differs)
    heads += ["n", "clean", f"FGSM@{ctx.eps_text}", f"PGD@{ctx.eps_text}"]
    heads += [h for h, _ in ctx.strong_cols]
    for t in targets:
        heads += [f"→ {t} clean", f"→ {t} FGSM"]
    heads.append("sanity")
    align += ["right"] * (len(heads) - len(align) - 1) + ["left"]
    body = []
    for e in group:
        n = len(e.runs)
        line = [*_ident_cols(ctx, e, differs), str(n), fmt_with_n(e.stat("clean"), n)]
        line += [fmt_with_n(e.stat(ctx.fgsm), n), fmt_with_n(e.stat(ctx.pgd), n)]
        line += [fmt_with_n(e.stat(m), n) for _, m in ctx.strong_cols]
        for t in targets:
            te = ctx.partner(e, "transfer", t)
            line += [fmt_with_n(te.stat(m), n) if te else MISSING for m in ("clean", ctx.fgsm)]
        line.append(ctx.flag([e]))
        body.append(line)
    return [*_heading(f"## In-domain: probe on {table.dataset}", table), _table_md(heads, body, align), ""]


def _table_transfer(ctx: Context, table: Table) -> list[str]:
    group = sorted(table.entries, key=lambda e: e.rank)
    sources = join(e.recipe.pretrain_dataset for e in group)
    differs = _show_differs(group)
    heads, align = _ident_headers(ctx, "transfer", differs)
    strong = ctx.strong_cols
    heads += ["n", "clean", f"FGSM@{ctx.eps_text}", f"PGD@{ctx.eps_text}", *(h for h, _ in strong)]
    heads.append("sanity")
    align += ["right"] * (4 + len(strong)) + ["left"]
    body = []
    for e in group:
        n = len(e.runs)
        stats = [fmt_with_n(e.stat(m), n) for m in ("clean", ctx.fgsm, ctx.pgd, *(m for _, m in strong))]
        body.append([*_ident_cols(ctx, e, differs), str(n), *stats, ctx.flag([e])])
    title = f"## Transfer: probe on {table.dataset} (encoders pretrained on {sources})"
    return [*_heading(title, table), _table_md(heads, body, align), ""]


def _avg(cells: Mapping[str, Entry], metric: str) -> float | None:
    vals = [c.stat(metric).mean for c in cells.values() if c.stat(metric).mean is not None]
    return sum(vals) / len(vals) if vals else None


def _table_shift(ctx: Context, table: Table) -> list[str]:
    # ArCL-style: one column per shift variant (clean / FGSM means; spreads are in results.csv),
    # ranked by FGSM averaged over the variants a recipe was evaluated on.
    shifts = distinct(e.shift or e.dataset for e in table.entries)
    by_recipe: dict[Recipe, dict[str, Entry]] = defaultdict(dict)
    for e in table.entries:
        by_recipe[e.recipe][e.shift or e.dataset] = e

    def key(item: tuple[Recipe, dict[str, Entry]]) -> tuple:
        f, c = _avg(item[1], ctx.fgsm), _avg(item[1], "clean")
        return (f is None, -(f or 0.0), c is None, -(c or 0.0), item[0].label(), item[0].recipe_id)

    differs = _show_differs(table.entries)
    heads, align = _ident_headers(ctx, "shift", differs)
    heads += ["n", *shifts, f"mean FGSM@{ctx.eps_text}", "sanity"]
    align += ["right"] * (len(shifts) + 2) + ["left"]
    body = []
    for rank, (_, cells) in enumerate(sorted(by_recipe.items(), key=key), 1):
        ident = _ident_cols(ctx, next(iter(cells.values())), differs)
        ident[0] = str(rank)
        line = [*ident, str(max(len(c.runs) for c in cells.values()))]
        for s in shifts:
            c = cells.get(s)
            line.append(_pair(c.stat("clean"), c.stat(ctx.fgsm)) if c else MISSING)
        mean_f = _avg(cells, ctx.fgsm)
        line += [MISSING if mean_f is None else f"{100 * mean_f:.2f}", ctx.flag(list(cells.values()))]
        body.append(line)
    what = f"cells: clean / FGSM@{ctx.eps_text}, mean over seeds"
    title = f"## Shift: probe on shifted {table.dataset} ({what})"
    return [*_heading(title, table), _table_md(heads, body, align), ""]


def _pair(clean: Stat, fgsm: Stat) -> str:
    fmt = [MISSING if s.mean is None else f"{100 * s.mean:.2f}" for s in (clean, fgsm)]
    return " / ".join(fmt)


TABLES: dict[str, Callable[[Context, Table], list[str]]] = {
    "in-domain": _table_in_domain,
    "transfer": _table_transfer,
    "shift": _table_shift,
}


# ============ legend ============


def _attack_params_text(rows: Sequence[Mapping[str, Any]], attack: str, eps: float) -> str:
    params = distinct(
        json.dumps(r.get("attack_params") or {}, sort_keys=True)
        for r in rows
        if r["attack"] == attack and math.isclose(float(r["eps"]), eps)
    )
    texts = [", ".join(f"{k}={v}" for k, v in json.loads(p).items()) for p in params]
    return "; ".join(t for t in texts if t)


def legend(ctx: Context, command: str | None, dropped: int) -> tuple[str, list[tuple[str, str]]]:
    """How the numbers were produced: a lead sentence and (term, explanation) items (Markdown inline)."""
    p = provenance(ctx.rows)
    suites = ", ".join(f"`{name or '?'}` (sha256 `{sha[:12] or '?'}`)" for name, sha in p["suites"])
    recipes = {e.recipe.recipe_id for e in ctx.entries}
    runs = {(e.recipe.recipe_id, run) for e in ctx.entries for run in e.runs}
    pkg = ", ".join(f"{k} {'/'.join(v)}" for k, v in p["versions"].items() if k != "python") or "unknown"
    pgd = _attack_params_text(ctx.rows, "pgd", ctx.headline_eps)
    lead = f"Rendered from {p['n_rows']} result rows ({len(runs)} runs of {len(recipes)} recipes)"
    lead = f"{lead}; produced by `{command}`." if command else f"{lead}."
    items = [
        (
            "Evaluation",
            f"first {join(p['n_examples'])} test examples per dataset; training seeds "
            f"{join(p['train_seeds'])}; evaluation seeds {join(p['eval_seeds'])}; "
            f"suite {suites or 'unknown'}.",
        ),
        ("Software", f"{pkg}; devices: {join(p['devices'])}."),
        (
            "Numbers",
            "accuracy in %, mean ± sample standard deviation (ddof = 1) over the n seeds of a recipe (one "
            "seed = one trained checkpoint × evaluation seed); `± –` means a single seed, `(n=k)` a metric "
            "measured on fewer seeds than the recipe has, `–` not measured.",
        ),
        (
            "ε",
            f"in [0,1] pixel units, L∞; the headline ε = {ctx.headline_eps:g} is "
            f"{eps_label(ctx.headline_eps)}. FGSM and PGD{f' ({pgd})' if pgd else ''} attack the encoder and "
            "its linear probe end to end.",
        ),
        (
            "Ranking",
            f"by FGSM@{ctx.headline_eps:g}, ties by clean accuracy (shift: FGSM averaged over the shift "
            "variants).",
        ),
        *_optional_items(ctx, dropped),
    ]
    return lead, items


def _optional_items(ctx: Context, dropped: int) -> list[tuple[str, str]]:
    items = [
        (
            CONTROL_LABEL,
            "an untrained encoder of the same architecture, probed and attacked the same way. Where its "
            "clean accuracy is close to a trained recipe's, clean accuracy alone does not separate them; "
            "robust accuracy does.",
        ),
        (
            "sanity",
            "`⚠ k` marks an entry with a failed sanity check, listed under its table; its robust accuracy "
            "may be overstated.",
        ),
    ]
    if any(e.recipe.differs for e in ctx.entries):
        items.append(
            (
                "differs",
                "what sets a recipe apart from the other recipes of its loss family beyond the key "
                "parameters (`name=–`: not set, the default); each recipe is its own line, different "
                "recipes are never averaged.",
            )
        )
    if any(t.note for t in ctx.tables):
        items.append(
            (
                "Protocols",
                "rows measured under different protocols (suite, probe, kNN, number of examples, attack "
                "versions) are never ranked together: such tables are separate, headed by what differs.",
            )
        )
    if dropped:
        items.append(
            (
                "Duplicates",
                f"{dropped} rows repeated a (checkpoint, seed, attack, ε) already present under the same "
                "protocol; the newest was kept.",
            )
        )
    return items


def render_markdown(
    ctx: Context,
    *,
    title: str,
    command: str | None,
    dropped: int,
    figures: Mapping[str, str],
    skipped: Mapping[str, str],
) -> str:
    """The whole LEADERBOARD.md."""
    lead, items = legend(ctx, command, dropped)
    md = [f"# {title}", "", lead, "", *(f"- **{k}**: {v}" for k, v in items), ""]
    for setting in SETTINGS:
        for table in (t for t in ctx.tables if t.setting == setting):
            before = len(ctx.notes)
            md += TABLES[setting](ctx, table)
            if len(ctx.notes) > before:
                md += [f"- ⚠ {i}: {ctx.notes[i - 1]}" for i in range(before + 1, len(ctx.notes) + 1)]
                md.append("")
    md += ["## Figures", "", *(f"- [{cap}]({name})" for name, cap in figures.items())]
    md += [f"- `{name}` not drawn: {why}" for name, why in skipped.items()]
    return "\n".join(md) + "\n"
