"""LEADERBOARD.md: a legend saying how the numbers were produced, then one table per protocol."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..results.eps import eps_label
from ..results.rows import SETTINGS
from . import protocols
from .aggregate import CONTROL_LABEL, Entry, Recipe, family_parameters
from .compare import NO_BITS, table_delta
from .context import Context, distinct, join, provenance
from .corruption_table import table_corruption
from .fmt import MISSING, fmt_points, fmt_with_n, n_clipped, p_label, pct
from .ranking import tie
from .table_layout import heading, ident_cols, ident_headers, show_differs, table_md
from .tables import Table

# ============ cells and lines shared by the tables ============


def _intervals_text(ctx: Context, entries: list[Entry]) -> str:
    """Which intervals a table's cells carry, e.g. ``t over seeds where n ≥ 2, Wilson ...``."""
    kinds = {s.interval for e in entries for s in e.stats.values() if s.interval}
    n = join((e.n_examples for e in entries), "?")
    parts = [
        ("t", "Student-t over seeds where n ≥ 2"),
        ("wilson", f"Wilson over the {n} test examples where n = 1 (test-example sampling only)"),
    ]
    return "; ".join(text for kind, text in parts if kind in kinds) or "none (no seeds, no example counts)"


def _caption(ctx: Context, table: Table) -> list[str]:
    """The line under a table: what its cells mean and how ties are broken."""
    text = f"Cells: accuracy in % [95 % interval: {_intervals_text(ctx, table.entries)}]. ▼: the ranking "
    text += "column; ties by clean accuracy." + (f" ({table.rank_note}.)" if table.rank_note else "")
    return [text, ""]


def _delta_header(ctx: Context, table: Table) -> list[str]:
    return [f"Δ vs {ctx.baseline_family} (p)"] if table.key in ctx.baselines else []


def _delta_cell(ctx: Context, table: Table, e: Entry) -> list[str]:
    """``+4.4 (p=0.012)`` (Holm-adjusted), ``+4.4 (p –)`` without per-example outcomes, ``baseline``."""
    d = table_delta(ctx, table, e)
    if d is None or isinstance(d, str):
        return [] if d is None else [d]
    return [f"{fmt_points(d.diff)} ({p_label(d.p_holm)})"]


def _headline_cols(ctx: Context, table: Table) -> list[tuple[str, str]]:
    """(header, metric) of the headline FGSM and PGD columns, unless one is the ranking metric."""
    cols = [(f"FGSM@{ctx.eps_text}", ctx.fgsm), (f"PGD@{ctx.eps_text}", ctx.pgd)]
    return [(h, m) for h, m in cols if m != table.rank_metric]


def _ranked_heads(
    ctx: Context, table: Table, differs: bool, headline: list[tuple[str, str]], extra: list[str]
) -> tuple[list[str], list[str]]:
    """Headers and alignment of an in-domain or transfer table: who, n, clean, the ranking metric,
    Δ, the headline attacks, ``extra`` and sanity."""
    heads, align = ident_headers(ctx, table.setting, differs)
    heads += ["n", "clean", f"{table.rank_label} ▼", *_delta_header(ctx, table), *(h for h, _ in headline)]
    heads += [*extra, "sanity"]
    return heads, align + ["right"] * (len(heads) - len(align) - 1) + ["left"]


def _ranked_cells(
    ctx: Context, table: Table, e: Entry, differs: bool, headline: list[tuple[str, str]]
) -> list[str]:
    """The cells of one entry under :func:`_ranked_heads` up to the headline attacks."""
    n = len(e.runs)
    line = [*ident_cols(ctx, e, differs), str(n), fmt_with_n(e.stat("clean"), n)]
    line += [fmt_with_n(e.stat(table.rank_metric), n), *_delta_cell(ctx, table, e)]
    return line + [fmt_with_n(e.stat(m), n) for _, m in headline]


def _gap_eps(group: list[Entry]) -> list[float]:
    """The eps at which an entry of the table has AutoAttack rows with FAB-T or Square (Entry.aa_gap)."""
    return sorted({eps for e in group for eps in e.aa_gap})


def _gap_heads(eps: list[float]) -> list[str]:
    return [f"AutoAttack below APGD@{e:g}" for e in eps]


def _gap_cells(e: Entry, eps: list[float]) -> list[str]:
    """Points by which AutoAttack's FAB-T and Square lowered accuracy below its APGD attacks."""
    return [fmt_with_n(e.aa_gap[x], len(e.runs)) if x in e.aa_gap else MISSING for x in eps]


def _no_p_note(ctx: Context, table: Table) -> list[str]:
    # a footnote where some Δ of this table has no p-value for want of per-example outcomes
    ids = {e.uid for e in table.entries}
    if any(c.entry_id in ids and c.p is None and c.diff is not None for c in ctx.comparisons.values()):
        return [f"- p –: {NO_BITS}; re-run their evaluation for McNemar's test.", ""]
    return []


# ============ one renderer per setting ============


def _table_in_domain(ctx: Context, table: Table) -> list[str]:
    group = sorted(table.entries, key=lambda e: e.rank)
    ids = {(e.recipe.recipe_id, e.context) for e in group}
    targets = distinct(
        t.dataset for t in ctx.entries if t.setting == "transfer" and (t.recipe.recipe_id, t.context) in ids
    )
    differs = show_differs(group)
    metric, headline = table.rank_metric, _headline_cols(ctx, table)
    to_targets = [f"→ {t} clean / {table.rank_label}" for t in targets]
    gaps = _gap_eps(group)
    heads, align = _ranked_heads(ctx, table, differs, headline, [*_gap_heads(gaps), *to_targets])
    body = []
    for e in group:
        line = [*_ranked_cells(ctx, table, e, differs, headline), *_gap_cells(e, gaps)]
        for t in targets:
            te = ctx.partner(e, "transfer", t)
            line.append(" / ".join(pct(te.stat(m).mean) for m in ("clean", metric)) if te else MISSING)
        line.append(ctx.flag([e]))
        body.append(line)
    title = heading(f"## In-domain: probe on {table.dataset}", table, table.rank_label)
    return [*title, table_md(heads, body, align), "", *_caption(ctx, table)]


def _table_transfer(ctx: Context, table: Table) -> list[str]:
    group = sorted(table.entries, key=lambda e: e.rank)
    sources = join(e.recipe.pretrain_dataset for e in group)
    differs = show_differs(group)
    headline = _headline_cols(ctx, table)
    gaps = _gap_eps(group)
    heads, align = _ranked_heads(ctx, table, differs, headline, _gap_heads(gaps))
    body = [
        [*_ranked_cells(ctx, table, e, differs, headline), *_gap_cells(e, gaps), ctx.flag([e])] for e in group
    ]
    title = f"## Transfer: probe on {table.dataset} (encoders pretrained on {sources})"
    return [
        *heading(title, table, table.rank_label),
        table_md(heads, body, align),
        "",
        *_caption(ctx, table),
    ]


def _avg(cells: Mapping[str, Entry], metric: str) -> float | None:
    vals = [c.stat(metric).mean for c in cells.values() if c.stat(metric).mean is not None]
    return sum(vals) / len(vals) if vals else None


def shift_ranking(table: Table) -> list[tuple[Recipe, dict[str, Entry]]]:
    """A shift table's recipes with their variants, ranked by the ranking metric averaged over the
    variants a recipe was evaluated on (ties: mean clean accuracy)."""
    by_recipe: dict[Recipe, dict[str, Entry]] = defaultdict(dict)
    for e in table.entries:
        by_recipe[e.recipe][e.shift or e.dataset] = e

    def key(item: tuple[Recipe, dict[str, Entry]]) -> tuple:
        f, c = _avg(item[1], table.rank_metric), _avg(item[1], "clean")
        return (f is None, -tie(f), c is None, -tie(c), item[0].label(), item[0].recipe_id)

    return sorted(by_recipe.items(), key=key)


def _table_shift(ctx: Context, table: Table) -> list[str]:
    # ArCL-style: one column per shift variant (the ranking metric with its interval; clean
    # accuracy per variant is in results.csv), ranked by the metric averaged over the variants
    shifts = distinct(e.shift or e.dataset for e in table.entries)
    metric = table.rank_metric
    differs = show_differs(table.entries)
    heads, align = ident_headers(ctx, "shift", differs)
    heads += ["n", *shifts, "mean clean", f"mean {table.rank_label} ▼", "sanity"]
    align += ["right"] * (len(shifts) + 3) + ["left"]
    body = []
    for rank, (_, cells) in enumerate(shift_ranking(table), 1):
        ident = ident_cols(ctx, next(iter(cells.values())), differs)
        ident[0] = str(rank)
        n = max(len(c.runs) for c in cells.values())
        line = [*ident, str(n)]
        line += [fmt_with_n(cells[s].stat(metric), n) if s in cells else MISSING for s in shifts]
        line += [pct(_avg(cells, "clean")), pct(_avg(cells, metric)), ctx.flag(list(cells.values()))]
        body.append(line)
    what = f"{table.rank_label} averaged over the variants"
    title = f"## Shift: probe on shifted {table.dataset} (cells: {table.rank_label} per variant)"
    return [*heading(title, table, what), table_md(heads, body, align), "", *_caption(ctx, table)]


TABLES: dict[str, Callable[[Context, Table], list[str]]] = {
    "in-domain": _table_in_domain,
    "transfer": _table_transfer,
    "shift": _table_shift,
    "corruption": table_corruption,
}


# ============ legend ============


def _attack_params_text(rows: Sequence[Mapping[str, Any]], attack: str) -> str:
    """The attack's parameters; where the suite runs it with several settings, each with its epsilons."""
    by_params: dict[str, list[float]] = {}
    for r in rows:
        if r["attack"] == attack:
            eps = by_params.setdefault(json.dumps(r.get("attack_params") or {}, sort_keys=True), [])
            if not any(math.isclose(float(r["eps"]), e) for e in eps):
                eps.append(float(r["eps"]))
    texts = {p: ", ".join(f"{k}={v}" for k, v in json.loads(p).items()) for p in by_params}
    if len(by_params) == 1:
        return next(iter(texts.values()))
    return "; ".join(
        f"{texts[p]} at {', '.join(eps_label(e) for e in sorted(eps))}"
        for p, eps in by_params.items()
        if texts[p]
    )


def legend(ctx: Context, command: str | None, dropped: int) -> tuple[str, list[tuple[str, str]]]:
    """How the numbers were produced: a lead sentence and (term, explanation) items (Markdown inline)."""
    p = provenance(ctx.rows)
    suites = ", ".join(f"`{name or '?'}` (sha256 `{sha[:12] or '?'}`)" for name, sha in p["suites"])
    recipes = {e.recipe.recipe_id for e in ctx.entries}
    runs = {(e.recipe.recipe_id, run) for e in ctx.entries for run in e.runs}
    pkg = ", ".join(f"{k} {'/'.join(v)}" for k, v in p["versions"].items() if k != "python") or "unknown"
    pgd = _attack_params_text(ctx.rows, "pgd")
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
            "accuracy in %, the mean over the n seeds of a recipe (one seed = one trained checkpoint × "
            "evaluation seed) with its 95 % interval in brackets: a Student-t interval over the seeds where "
            "n ≥ 2, a Wilson score interval over the test examples where n = 1 (it covers which test "
            "examples were drawn, not how a second training run would differ). `(n=k)`: a metric measured "
            "on fewer seeds than the recipe has; `–`: not measured. Standard deviations are in results.csv. "
            + _clipping_text(ctx),
        ),
        (
            "ε",
            f"in [0,1] pixel units, L∞; the headline ε = {ctx.headline_eps:g} is "
            f"{eps_label(ctx.headline_eps)}. FGSM and PGD{f' ({pgd})' if pgd else ''} attack the encoder and "
            "its linear probe end to end; the worst case counts an example as robust only if every attack "
            "of the suite failed on it at that ε or a smaller one.",
        ),
        ("Ranking", _ranking_text(ctx)),
        *_comparison_items(ctx),
        *_optional_items(ctx, dropped),
    ]
    return lead, items


def _clipping_text(ctx: Context) -> str:
    """The interval-clipping note: the rule, and how many bounds of this board it touched."""
    n = n_clipped(s for e in ctx.entries for s in e.stats.values())
    text = (
        "Interval bounds are clipped to [0, 100] in these tables and in results.csv (accuracy cannot "
        "leave that range; a t-interval over few seeds can)"
    )
    if not n:
        return text + "; none of this board's bounds was clipped."
    return (
        f"{text}: {n} bound{'s' if n != 1 else ''} of this board {'were' if n != 1 else 'was'} clipped, and "
        "a bound of 0.0 or 100.0 beside a mean inside is the clip, not the computed interval (the std "
        "and n in results.csv give the unclipped one)."
    )


def _ranking_text(ctx: Context) -> str:
    labels = join((t.rank_label for t in ctx.tables), "clean")
    if ctx.rank_by:
        how = f"chosen with `--rank-by {ctx.rank_by}`"
    else:
        how = (
            "by default: the worst case at the largest ε the table's suite measured, FGSM there for rows "
            "without worst-case rows. At the headline ε "
            f"({eps_label(ctx.headline_eps)}) robust accuracy stays within a few examples of clean accuracy "
            "on small images, so a ranking there would be a clean-accuracy ranking. `--rank-by ATTACK@EPS` "
            "(e.g. `fgsm@0.002`, `pgd@8/255`) or `--rank-by clean` ranks by another column"
        )
    return (
        f"each table by the metric named in its heading and marked ▼ (here {labels}; {how}); ties by "
        "clean accuracy. Shift tables rank by the metric averaged over their variants."
    )


def _comparison_items(ctx: Context) -> list[tuple[str, str]]:
    """The Δ column and what the differences can and cannot show."""
    items = []
    if ctx.baselines:
        items.append(
            (
                f"Δ vs {ctx.baseline_family} (p)",
                f"the ranking metric minus {ctx.baseline_family}'s, in points, measured on the same test "
                f"examples, run s paired with {ctx.baseline_family}'s run s by seed; p: McNemar's exact test "
                "on the examples the two classify differently (pooled over seed pairs), Holm-adjusted over "
                "the comparisons of the table. The difference's 95 % interval and the raw p are in "
                "results.csv; `robustbench-nacl compare` tests every attack and ε. A large p does not show "
                "that two recipes are equal.",
            )
        )
    items.append(("What the differences can and cannot show", _limits_text(ctx)))
    items += [("Comparisons", note) for note in ctx.compare_notes]
    return items


def _limits_text(ctx: Context) -> str:
    ns = distinct(e.n_examples for e in ctx.entries if e.n_examples)
    one = f" (one example = {100 / min(ns):.2f} points)" if ns else ""
    seeds = distinct(len(e.runs) for e in ctx.entries)
    runs = f"{'–'.join(map(str, sorted({seeds[0], seeds[-1]})))} seed{'' if seeds == [1] else 's'} per recipe"
    single = (
        " Where a recipe has a single seed (n = 1), its intervals and tests cover the choice of test "
        "examples only, not the variation between training runs: a difference between two single "
        "checkpoints can vanish with a second seed."
        if 1 in seeds
        else ""
    )
    return (
        f"every number comes from the first {join(ns, '?')} test examples{one} and {runs}. A difference "
        "whose interval excludes 0, or a small p, shows that on these test examples and seeds one recipe "
        "keeps more examples correct than the other beyond chance. It cannot show that the difference "
        f"carries over to another dataset, architecture, training length or attack.{single} Ranks whose "
        "intervals overlap are not evidence of an order."
    )


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
            "may be overstated"
            + (
                " (in a corruption table, a clean accuracy at chance is listed too: what the corruption "
                "does, not an attack that failed)."
                if any(r.get("corruption") for r in ctx.rows)
                else "."
            ),
        ),
    ]
    shared = family_parameters((r.loss, r.key_params) for r in ctx.rows if not r.control)
    if shared:
        items.append(
            (
                "family parameters",
                "the parameters every recipe of a family on this board shares beyond the NaCl ones (the key "
                "parameters column shows only what tells a family's recipes apart): "
                + "; ".join(f"{f}: `{params}`" for f, params in sorted(shared.items()))
                + ".",
            )
        )
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
    items += [("Left out", notice) for notice in ctx.left_out]
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
            md += _no_p_note(ctx, table)
            if len(ctx.notes) > before:
                md += [f"- ⚠ {i}: {ctx.notes[i - 1]}" for i in range(before + 1, len(ctx.notes) + 1)]
                md.append("")
    md += protocols.markdown_section(ctx)  # SLF / ALF / AFF side by side (nothing for one protocol)
    md += ["## Figures", "", *(f"- [{cap}]({name})" for name, cap in figures.items())]
    md += [f"- `{name}` not drawn: {why}" for name, why in skipped.items()]
    return "\n".join(md) + "\n"
