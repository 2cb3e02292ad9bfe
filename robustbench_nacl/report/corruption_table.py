"""The corruption table: per recipe, accuracy under common corruptions averaged over the
corruptions at each severity (the CIFAR-10-C reading: mean corruption accuracy per severity).

Every (corruption, severity) of a recipe is its own entry (its own protocol); this table averages
the entries' means (over seeds) across the corruptions of one severity, for clean accuracy on the
corrupted images and for the table's ranking metric, and ranks recipes by the ranking metric
averaged over every corruption and severity (ties: mean clean accuracy).
"""

from __future__ import annotations

from collections import defaultdict

from .aggregate import Entry, Recipe
from .context import Context
from .fmt import pct
from .ranking import tie
from .table_layout import heading, ident_cols, ident_headers, show_differs, table_md
from .tables import Table


def _mean(entries: list[Entry], metric: str) -> float | None:
    vals = [e.stat(metric).mean for e in entries if e.stat(metric).mean is not None]
    return sum(vals) / len(vals) if vals else None


def corruption_means(table: Table) -> list[tuple[Recipe, dict[int, list[Entry]]]]:
    """Recipes with their entries per severity, ranked by the ranking metric over all of them."""
    by_recipe: dict[Recipe, dict[int, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for e in table.entries:
        by_recipe[e.recipe][int(e.rows[0]["severity"])].append(e)

    def key(item: tuple[Recipe, dict[int, list[Entry]]]) -> tuple:
        every = [e for es in item[1].values() for e in es]
        f, c = _mean(every, table.rank_metric), _mean(every, "clean")
        return (f is None, -tie(f), c is None, -tie(c), item[0].label(), item[0].recipe_id)

    return sorted(((r, dict(s)) for r, s in by_recipe.items()), key=key)


def table_corruption(ctx: Context, table: Table) -> list[str]:
    """The Markdown lines of one corruption table (see the module docstring)."""
    severities = sorted({int(e.rows[0]["severity"]) for e in table.entries})
    names = sorted({str(e.rows[0]["corruption"]) for e in table.entries})
    metric, label = table.rank_metric, table.rank_label
    differs = show_differs(table.entries)
    heads, align = ident_headers(ctx, "corruption", differs)
    heads += ["n", *(f"s{s} clean" for s in severities), *(f"s{s} {label}" for s in severities)]
    heads += ["mean clean", f"mean {label} ▼", "sanity"]
    align += ["right"] * (2 * len(severities) + 3) + ["left"]
    body = []
    for rank, (_, per_sev) in enumerate(corruption_means(table), 1):
        every = [e for es in per_sev.values() for e in es]
        ident = ident_cols(ctx, every[0], differs)
        ident[0] = str(rank)
        line = [*ident, str(max(len(e.runs) for e in every))]
        line += [pct(_mean(per_sev.get(s, []), "clean")) for s in severities]
        line += [pct(_mean(per_sev.get(s, []), metric)) for s in severities]
        line += [pct(_mean(every, "clean")), pct(_mean(every, metric)), ctx.flag(every)]
        body.append(line)
    title = (
        f"## Corruptions: the {table.dataset} probe on corrupted test images "
        f"(cells: mean over {len(names)} corruptions per severity: {', '.join(names)})"
    )
    what = f"{label} averaged over corruptions and severities"
    caption = (
        "Cells: accuracy in %, the mean over the corruptions of each corruption's mean over seeds "
        "(no interval: results.csv has every corruption and severity with its interval). "
        "▼: the ranking column; ties by mean clean accuracy."
    )
    return [*heading(title, table, what), table_md(heads, body, align), "", caption, ""]
