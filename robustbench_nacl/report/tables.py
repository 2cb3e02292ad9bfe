"""Tables: the entries that may be ranked together, one protocol each (for the shift setting, one
protocol up to the shift variant; every corruption and severity of one protocol: one table), in
the order the renderers show them, and the note that tells apart the tables of one dataset. Rows
of different protocols are never ranked together (see docs/decisions.md, 'Result rows, recipes and
protocols')."""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..results.finetune import PROTOCOLS
from ..results.rows import SETTINGS, ResultRow, protocol_hash
from .aggregate import Entry, flat_leaves, fmt_value, protocol_context
from .fmt import MISSING
from .metrics import MetricKey, metric_key


def table_key(r: ResultRow, protocol: Mapping[str, Any] | None = None) -> tuple[str, str, str]:
    """(setting, dataset, protocol) of the table a row is ranked in: shift variants of one
    protocol context share a table, under the dataset they are made from. ``protocol``: the one
    to rank under, where it is not the row's own (:attr:`Entry.rank_protocol`)."""
    p = r.protocol if protocol is None else dict(protocol)
    if r.setting == "shift":
        return (r.setting, r.dataset.split("@", 1)[0], protocol_context(p))
    if r.setting == "corruption":  # every corruption and severity of one protocol: one table
        rest = {k: v for k, v in p.items() if k not in ("corruption", "severity")}
        return (r.setting, r.dataset, protocol_context(rest))
    return (r.setting, r.dataset, r.protocol_id if protocol is None else protocol_hash(p))


@dataclass
class Table:
    """Entries ranked together: one protocol (shift: one protocol up to the shift variant)."""

    setting: str
    dataset: str  # the evaluated dataset (shift: the dataset the variants are made from)
    key: str
    entries: list[Entry]
    note: str = ""  # how this table's protocol differs from the others of the same dataset
    rank_metric: str = "clean"  # the metric this table is ranked by (see .ranking)
    rank_label: str = "clean"
    rank_note: str = ""  # why the table is not ranked by the metric asked for

    @property
    def metric_keys(self) -> set[MetricKey]:
        """Every (attack, norm, eps) measured in this table."""
        return {metric_key(r) for e in self.entries for r in e.rows}


def _table_of(e: Entry) -> tuple[str, str, str]:
    return table_key(e.rows[0], None if e.rank_pid == e.protocol_id else e.rank_protocol)


def build_tables(entries: list[Entry]) -> list[Table]:
    """Entries grouped into tables, in setting order, then dataset, then protocol note."""
    groups: dict[tuple[str, str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        groups[_table_of(e)].append(e)
    tables = [Table(s, d, k, es) for (s, d, k), es in groups.items()]
    siblings: dict[tuple[str, str], list[Table]] = defaultdict(list)
    for t in tables:
        siblings[(t.setting, t.dataset)].append(t)
    for group in siblings.values():
        if len(group) > 1:
            notes = protocol_notes([t.entries for t in group])
            for t, note in zip(group, notes, strict=True):
                t.note = note
    order = {s: i for i, s in enumerate(SETTINGS)}
    return sorted(tables, key=lambda t: (order[t.setting], t.dataset, _protocol_rank(t), t.note, t.key))


def _protocol_rank(t: Table) -> int:
    """SLF tables before ALF before AFF (PROTOCOLS' order) among the tables of one dataset."""
    name = str((t.entries[0].protocol.get("finetune") or {}).get("protocol", "slf"))
    return PROTOCOLS.index(name) if name in PROTOCOLS else len(PROTOCOLS)


def _protocol_view(entries: list[Entry]) -> dict[tuple[str, ...], str]:
    """A table's protocol as display leaves (dataset left out: the shift variants differ in it)."""
    e = entries[0]
    protocol = e.rank_protocol  # a merged AFF table's protocol: without the resolved dual_bn
    leaves = flat_leaves({k: v for k, v in protocol.items() if k not in ("dataset", "setting", "finetune")})
    out = {p: fmt_value(v) for p, v in leaves.items()}
    # the finetuning protocol as one leaf ("SLF", or "ALF (eps 0.0314, steps 10, ...)"): shown only
    # where tables differ in it, so SLF-only leaderboards render as before
    ft = protocol.get("finetune") or {}
    # a named finetuning recipe first, as name/method/dataset (eval/finetune_recipes.py)
    recipe = ft.get("recipe")
    named = [f"recipe {'/'.join(map(str, recipe.values()))}"] if isinstance(recipe, dict) else []
    settings = ", ".join(
        named
        + [
            f"{k} {fmt_value(v)}"
            for k, v in sorted(ft.items())
            if k not in ("protocol", "recipe") and v is not None
        ]
    )
    out[("protocol",)] = f"{str(ft.get('protocol', 'slf')).upper()}" + (f" ({settings})" if settings else "")
    suites = sorted({str(r.get("suite") or "?") for x in entries for r in x.rows})
    out[("suite_sha256",)] = f"`{'/'.join(suites)}` (sha256 `{e.protocol['suite_sha256'][:12]}`)"
    return out


def protocol_notes(tables: list[list[Entry]]) -> list[str]:
    """For tables of one dataset under different protocols: one line each, saying what differs."""
    views = [_protocol_view(es) for es in tables]
    paths = sorted({p for v in views for p in v})
    varying = [p for p in paths if len({v.get(p, MISSING) for v in views}) > 1]
    names = {p: ("suite" if p == ("suite_sha256",) else " ".join(p)) for p in varying}
    return ["; ".join(f"{names[p]} {v.get(p, MISSING)}" for p in varying) for v in views]


_PARAMETER_LIST = re.compile(r" \([^()]*\)")


def panel_note(table: Table, tables: Sequence[Table]) -> str:
    """``table``'s protocol note as a figure panel's title shows it: without its parenthesised
    parameter lists ("protocol ALF"), which are wider than a panel (LEADERBOARD.md gives them), unless
    another table of the same setting and dataset would then read the same: then in full, wrapped."""
    short = _PARAMETER_LIST.sub("", table.note)
    twins = [
        t
        for t in tables
        if t is not table
        and (t.setting, t.dataset) == (table.setting, table.dataset)
        and _PARAMETER_LIST.sub("", t.note) == short
    ]
    return textwrap.fill(table.note, 60) if twins else short
