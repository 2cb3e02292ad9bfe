"""Which metric ranks a table, and the ranks.

By default a table is ranked by the worst case at the largest ε its suite measured: an example
counts as robust only if every attack of the suite failed on it at that ε or a smaller one. At
the headline ε (0.002 = 0.51/255) robust accuracy sits within an example or two of clean
accuracy on small images, so a ranking there is a clean-accuracy ranking; at the suite's largest
ε the recipes separate (see docs/decisions.md, 'Leaderboard ranking'). ``--rank-by`` picks
another metric: ``clean`` or ``ATTACK[_NORM]@EPS`` with EPS a number, ``k/255`` or ``max``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import UserError
from .aggregate import Entry
from .metrics import MetricKey, metric_label, metric_name
from .tables import Table

DEFAULT_RANK_BY = "worst_case@max"
_SPEC = re.compile(r"^(?P<attack>[A-Za-z][\w.]*?)(?:_(?P<norm>Linf|L2))?(?:@(?P<eps>[^@]+))?$")


@dataclass(frozen=True)
class RankBy:
    """A ranking metric as asked for: ``attack`` ("clean" for clean accuracy), ``norm`` (None: L∞
    where measured, else the only norm) and ``eps`` (None: the largest ε measured in the table)."""

    attack: str
    norm: str | None = None
    eps: float | None = None
    text: str = DEFAULT_RANK_BY

    def resolve(self, keys: Iterable[MetricKey]) -> str | None:
        """The metric name this asks for among ``keys`` (a table's measurements), or None."""
        if self.attack == "clean":
            return "clean"
        cands = [k for k in keys if k[0] == self.attack and (self.norm is None or k[1] == self.norm)]
        norms = {k[1] for k in cands}
        if self.norm is None and len(norms) > 1:
            cands = [k for k in cands if k[1] == "Linf"] if "Linf" in norms else []
        if self.eps is None:
            cands = [max(cands, key=lambda k: k[2])] if cands else []
        else:
            cands = [k for k in cands if math.isclose(k[2], self.eps, rel_tol=1e-9, abs_tol=1e-12)]
        return metric_name(*cands[0]) if len(cands) == 1 else None


def _eps(text: str, spec: str) -> float | None:
    if text == "max":
        return None
    num, slash, den = text.partition("/")
    try:
        value = float(num) / 255 if slash and den == "255" else math.nan if slash else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UserError(f"--rank-by {spec!r}: ε must be a number, k/255 or max, not {text!r}")
    return value


def parse_rank_by(text: str | None) -> RankBy | None:
    """``clean`` | ``ATTACK[_NORM][@EPS|@max]`` (e.g. ``worst_case@max``, ``fgsm@0.002``,
    ``pgd_L2@0.5``, ``fgsm@8/255``) -> RankBy; None for the default (one-line UserError if malformed)."""
    if text is None:
        return None
    spec = text.strip()
    m = _SPEC.match(spec)
    if not spec or m is None:
        raise UserError(
            f"--rank-by {text!r}: expected clean or ATTACK@EPS, e.g. worst_case@max, fgsm@0.002, pgd@8/255"
        )
    if m["attack"] == "clean":
        return RankBy("clean", text=spec)
    return RankBy(m["attack"], m["norm"], _eps(m["eps"] or "max", spec), text=spec)


def default_metric(keys: set[MetricKey]) -> str:
    """The default ranking metric of a table: the worst case at its largest ε; failing that (rows of
    an older suite without worst-case rows) the attack at the largest ε (L∞ first), else clean."""
    for rb in (RankBy("worst_case"), RankBy("fgsm")):
        name = rb.resolve(keys)
        if name is not None:
            return name
    attacks = sorted(keys, key=lambda k: (k[1] == "Linf", k[2], k[0]))
    return metric_name(*attacks[-1]) if attacks else "clean"


def metric_rank_key(metric: str) -> Callable[[Entry], tuple]:
    """Sort key: the metric (higher first), then clean accuracy, then the label (a total order)."""

    def key(e: Entry) -> tuple:
        f, c = e.stat(metric).mean, e.stat("clean").mean
        return (f is None, -tie(f), c is None, -tie(c), e.recipe.label(), e.recipe.recipe_id)

    return key


def tie(x: float | None) -> float:
    """A mean rounded so that equal example counts tie (the float sums of two orders of seeds differ
    in the last bit; a rank must not)."""
    return round(x or 0.0, 9)


def _resolve(table: Table, wanted: RankBy | None) -> tuple[str, str]:
    """(metric, note) for one table: the metric asked for, or the default with a note why."""
    keys = table.metric_keys
    if wanted is None:
        return default_metric(keys), ""
    name = wanted.resolve(keys)
    if name is not None:
        return name, ""
    fallback = default_metric(keys)
    label = metric_label(fallback, keys)
    return fallback, f"`--rank-by {wanted.text}` was not measured in this table; ranked by {label}"


def rank_tables(tables: list[Table], rank_by: str | None = None) -> None:
    """Resolve each table's ranking metric and rank its entries 1..n within each protocol.

    A shift table's entries are ranked within their variant (its Markdown table ranks recipes by
    the metric averaged over the variants). An explicit ``rank_by`` that no table measured is a
    one-line UserError naming what was measured.
    """
    wanted = parse_rank_by(rank_by)
    resolved = [_resolve(t, wanted) for t in tables]
    if wanted is not None and tables and all(note for _, note in resolved):
        measured = sorted({k for t in tables for k in t.metric_keys})
        names = ", ".join(["clean", *(f"{a}{'' if n == 'Linf' else '_' + n}@{e:g}" for a, n, e in measured)])
        raise UserError(f"--rank-by {wanted.text}: no table measured it; measured: {names}")
    for table, (metric, note) in zip(tables, resolved, strict=True):
        table.rank_metric, table.rank_note = metric, note
        table.rank_label = metric_label(metric, table.metric_keys)
        by_protocol: dict[str, list[Entry]] = defaultdict(list)
        for e in table.entries:
            by_protocol[e.rank_pid].append(e)
        for group in by_protocol.values():
            for i, e in enumerate(sorted(group, key=metric_rank_key(metric)), 1):
                e.rank = i
