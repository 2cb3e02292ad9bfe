"""Rows -> recipes, protocols and entries: the grouping every renderer starts from.

A *recipe* is what was trained (``recipe_id``: the training configuration minus the seed); a
*protocol* is how it was measured (``protocol_id``: dataset, setting, suite, probe, kNN, number of
examples, attack versions). An *entry* is one recipe under one protocol, aggregated over its *runs*
(one run = one checkpoint x evaluation seed x probe seed) as mean and sample standard deviation
(ddof = 1). Rows of different recipes are never averaged; which entries are ranked together is
:mod:`.tables`, and what the renderers share besides is :mod:`.context` (see docs/decisions.md,
'Result rows, recipes and protocols').
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UserError
from ..results.rows import KEY_PARAMS, ResultRow, protocol_hash
from .fmt import MISSING
from .metrics import MetricKey, Run, aa_gap, metric_key, metric_name, n_examples, run_of
from .stats import Stat

CONTROL_LABEL = "random-init (control)"


# ============ recipes, statistics, entries ============


@dataclass(frozen=True, order=True)
class Recipe:
    """What was trained: the unit a leaderboard line describes (seeds are aggregated away).

    ``recipe_id`` alone identifies it; the other fields are what the tables show. ``differs`` names
    what sets it apart from other recipes of the same family that its key parameters do not show.
    """

    encoder: str
    pretrain_dataset: str
    loss: str
    key_params: str
    control: bool
    recipe_id: str
    differs: str = field(default="", compare=False)

    @property
    def family(self) -> str:
        """The loss-family column: the preset name, or the control marker."""
        return CONTROL_LABEL if self.control else self.loss

    def label(self, *, encoder: bool = False, dataset: bool = False) -> str:
        """Short human label; encoder/dataset are added only when they vary across the leaderboard."""
        parts = [self.family]
        if self.key_params:
            parts.append(f"[{self.key_params}]")
        extra = [self.differs] if self.differs else []
        extra += [x for x, on in ((self.encoder, encoder), (self.pretrain_dataset, dataset)) if on]
        if extra:
            parts.append(f"({', '.join(extra)})")
        return " ".join(parts)


def _short_hash(obj: Any, n: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


@dataclass
class Entry:
    """One recipe under one protocol (one setting, one evaluated dataset), aggregated over its runs."""

    recipe: Recipe
    protocol_id: str
    protocol: dict[str, Any]
    rows: list[ResultRow]
    stats: dict[str, Stat]
    runs: list[Run]
    # metric -> run -> accuracy, and -> run -> per-example outcomes (base64, see eval.benchmark)
    values: dict[str, dict[Run, float]] = field(default_factory=dict)
    bits: dict[str, dict[Run, str]] = field(default_factory=dict)
    # eps -> how far AutoAttack's FAB-T and Square took accuracy below its APGD attacks (metrics.aa_gap)
    aa_gap: dict[float, Stat] = field(default_factory=dict)
    rank: int = 0
    uid: str = field(init=False)
    # the protocol the entry is ranked and compared under (:func:`merge_aff_readings`): its own
    # protocol_id, except for dual-BN TRADES rows, which rank with the single-BN encoders' AFF
    rank_pid: str = field(init=False)

    def __post_init__(self) -> None:
        # stable across renders and row order: the browser test and deep links rely on it
        self.uid = "e" + _short_hash([self.recipe.recipe_id, self.protocol_id])
        self.rank_pid = self.protocol_id

    @property
    def rank_protocol(self) -> dict[str, Any]:
        """The protocol of :attr:`rank_pid` (without the resolved ``dual_bn`` where it was merged)."""
        return self.protocol if self.rank_pid == self.protocol_id else ranked_protocol(self.protocol)

    @property
    def setting(self) -> str:
        return str(self.protocol["setting"])

    @property
    def dataset(self) -> str:
        return str(self.protocol["dataset"])

    @property
    def shift(self) -> str | None:
        return self.rows[0].get("shift") or (self.dataset.split("@", 1)[1] if "@" in self.dataset else None)

    @property
    def context(self) -> str:
        """The protocol without its dataset and setting: entries of one context can share a table
        row (the in-domain table's transfer columns, the shift table's variants)."""
        return protocol_context(self.protocol)

    @property
    def n_examples(self) -> int:
        """The number of test examples every run of this entry was measured on."""
        return min((n_examples(r) for r in self.rows), default=0)

    def stat(self, name: str) -> Stat:
        return self.stats.get(name, Stat(None, None, 0))

    def failures(self) -> list[tuple[ResultRow, list[str]]]:
        """(row, failed checks) for every row of this entry whose ``sanity_ok`` is false."""
        return [(r, failed_checks(r)) for r in self.rows if r.get("sanity_ok") is False]


def failed_checks(row: Mapping[str, Any]) -> list[str]:
    """The sanity checks a row failed (``sanity_failed``, else its false ``sanity_*`` flags)."""
    named = row.get("sanity_failed")
    if isinstance(named, str) and named:
        return named.split(",")
    flags = [k.removeprefix("sanity_") for k, v in row.items() if k.startswith("sanity_") and v is False]
    return sorted(f for f in flags if f != "ok") or ["unspecified"]


def validate_rows(rows: Sequence[Mapping[str, Any]], source: Any = None) -> list[ResultRow]:
    """Type every row (a one-line ``UserError`` naming the first that cannot be rendered)."""
    at = f" in {source}" if source else ""
    if not rows:
        raise UserError(
            f"no result rows{at}; produce some with `robustbench-nacl eval CHECKPOINT --out DIR` first"
        )
    return [ResultRow.from_json(r, source=source) for r in rows]


def protocol_context(protocol: Mapping[str, Any]) -> str:
    """A hash of the protocol without its dataset and setting."""
    return _short_hash({k: v for k, v in protocol.items() if k not in ("dataset", "setting")})


def ranked_protocol(protocol: Mapping[str, Any]) -> dict[str, Any]:
    """``protocol`` without AFF's resolved ``dual_bn``: AFF as the authors and the RobustSSL
    benchmark run it is dual-BN TRADES on a dual-BN encoder and TRADES otherwise (``dual_bn
    auto``), one protocol whose tables rank both kinds of encoder together; the rows keep the
    resolution in their identity (another computation, another row id), and with it the BatchNorm
    momentum dual-BN TRADES trains its branches at (``bn_momentum``)."""
    ft = protocol.get("finetune")
    if not isinstance(ft, Mapping) or ft.get("dual_bn") != "on":
        return dict(protocol)
    return {**protocol, "finetune": {k: v for k, v in ft.items() if k not in ("dual_bn", "bn_momentum")}}


def merge_aff_readings(entries: Sequence[Entry]) -> None:
    """Set each entry's :attr:`Entry.rank_pid`: dual-BN TRADES entries (``dual_bn: on``) rank with
    the AFF entries of the same protocol otherwise (:func:`ranked_protocol`), unless the same recipe
    was also measured there with ``dual_bn off`` (``--aff-dual-bn off``): then its two readings stay
    in tables of their own, as before, rather than one recipe twice in one ranking."""
    merged = {e.uid: protocol_hash(ranked_protocol(e.protocol)) for e in entries}
    count = Counter((e.recipe.recipe_id, merged[e.uid]) for e in entries)
    for e in entries:
        e.rank_pid = merged[e.uid] if count[(e.recipe.recipe_id, merged[e.uid])] == 1 else e.protocol_id


def _recipe(r: ResultRow) -> Recipe:
    return Recipe(r.encoder, r.pretrain_dataset or "", r.loss, r.key_params, r.control, r.recipe_id)


def aggregate(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Entry], int]:
    """Group rows into entries by (recipe_id, protocol_id); returns them and the number of duplicate
    rows ignored (a second row for the same run and metric under one protocol: the newest is kept)."""
    typed = [ResultRow.from_json(r) for r in rows]
    groups: dict[tuple[str, str], list[ResultRow]] = defaultdict(list)
    for r in typed:
        groups[(r.recipe_id, r.protocol_id)].append(r)
    recipes = _with_differences({r.recipe_id: r for r in typed})
    entries, dropped = [], 0
    for (rid, pid), grp in groups.items():
        kept, n_dup = _dedupe(grp)
        dropped += n_dup
        entries.append(_entry(recipes[rid], pid, kept))
    entries.sort(key=lambda e: (e.recipe, e.setting, e.dataset, e.protocol_id))
    merge_aff_readings(entries)
    return entries, dropped


def _dedupe(grp: list[ResultRow]) -> tuple[list[ResultRow], int]:
    # preference order (stable sorts, last key first): newest, then row id
    grp = sorted(grp, key=lambda r: r.row_id)
    grp.sort(key=lambda r: str(r.get("created_at") or ""), reverse=True)
    seen: set[tuple[Run, MetricKey]] = set()
    kept = []
    for r in grp:
        key = (run_of(r), metric_key(r))
        if key not in seen:
            seen.add(key)
            kept.append(r)
    kept.sort(key=lambda r: (r.checkpoint_id, str(r.seed), str(run_of(r)[2]), metric_key(r)))
    return kept, len(grp) - len(kept)


def _entry(recipe: Recipe, pid: str, rows: list[ResultRow]) -> Entry:
    values: dict[str, dict[Run, float]] = defaultdict(dict)
    bits: dict[str, dict[Run, str]] = defaultdict(dict)
    for r in rows:
        name, run = metric_name(*metric_key(r)), run_of(r)
        values[name][run] = r.robust_acc
        values["clean"].setdefault(run, r.clean_acc)
        for metric, key in ((name, "robust_bits"), ("clean", "clean_bits")):
            if isinstance(r.get(key), str):
                bits[metric].setdefault(run, r[key])
    runs = sorted(values["clean"], key=str)
    n = min(n_examples(r) for r in rows)
    stats = {name: Stat.of((v[run] for run in runs if run in v), n) for name, v in values.items()}
    gaps: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        if (g := aa_gap(r)) is not None:
            gaps[metric_key(r)[2]].append(g)
    gap = {eps: Stat.of(v, n) for eps, v in gaps.items()}
    return Entry(recipe, pid, rows[0].protocol, rows, stats, runs, dict(values), dict(bits), gap)


# ============ what differs between recipes of one family ============


def flat_leaves(obj: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Nested mappings flattened to path -> leaf (an empty mapping has none: {} and {"width": 8}
    differ in width only)."""
    if isinstance(obj, Mapping):
        out: dict[tuple[str, ...], Any] = {}
        for k, v in obj.items():
            out |= flat_leaves(v, (*path, str(k)))
        return out
    return {path: obj}


def fmt_value(v: Any) -> str:
    """A leaf as a table or note shows it: at most 16 characters."""
    text = f"{v:g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return text if len(text) <= 16 else text[:12] + "…"


def recipe_differences(recipes: Mapping[str, tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """recipe_id -> what differs from the other recipes of its family, e.g. ``width=4 epochs=1``.

    ``recipes``: recipe_id -> (family, recipe dict). Loss parameters shown as key parameters are
    left out (the key-parameter column already tells those recipes apart); empty for a recipe
    alone in its family.
    """
    families: dict[str, list[str]] = defaultdict(list)
    for rid, (family, _) in recipes.items():
        families[family].append(rid)
    leaves = {rid: flat_leaves(cfg) for rid, (_, cfg) in recipes.items()}
    out = {rid: "" for rid in recipes}
    for members in families.values():
        paths = sorted({p for rid in members for p in leaves[rid]})
        varying = [p for p in paths if len({fmt_value(leaves[rid].get(p, MISSING)) for rid in members}) > 1]
        varying = [p for p in varying if not (len(p) >= 2 and p[-2] == "loss_params" and p[-1] in KEY_PARAMS)]
        names = _short_names(varying)
        for rid in members:
            out[rid] = " ".join(f"{names[p]}={fmt_value(leaves[rid].get(p, MISSING))}" for p in varying)
    return out


def _short_names(paths: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    # the last path component, or the last two where the last alone is ambiguous
    last = defaultdict(list)
    for p in paths:
        last[p[-1] if p else ""].append(p)
    return {p: (p[-1] if len(last[p[-1]]) == 1 else ".".join(p[-2:])) if p else "" for p in paths}


def family_parameters(recipes: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(family, key parameters) of each recipe -> per family, the parameters beyond the NaCl ones
    (:data:`KEY_PARAMS`: a robust-SSL family's attack settings, a plugin's own parameters) that every
    recipe of the family shares. They are shown once per board (the legend), not in every cell."""
    tokens: dict[str, list[set[str]]] = defaultdict(list)
    for family, key_params in recipes:
        tokens[family].append({t for t in key_params.split() if t.split("=", 1)[0] not in KEY_PARAMS})
    shared = {f: set.intersection(*ts) for f, ts in tokens.items()}
    return {f: " ".join(sorted(ts, key=lambda t: t.split("=", 1)[0])) for f, ts in shared.items() if ts}


def _with_differences(first_row: Mapping[str, ResultRow]) -> dict[str, Recipe]:
    recipes = {rid: _recipe(r) for rid, r in first_row.items()}
    shared = family_parameters((rec.family, rec.key_params) for rec in recipes.values() if not rec.control)
    recipes = {  # the cell keeps what tells a family's recipes apart; the legend lists the rest
        rid: replace(rec, key_params=" ".join(t for t in rec.key_params.split() if t not in common))
        if (common := set(shared.get(rec.family, "").split())) and not rec.control
        else rec
        for rid, rec in recipes.items()
    }
    differs = recipe_differences({rid: (rec.family, first_row[rid].recipe) for rid, rec in recipes.items()})
    return {rid: replace(rec, differs=differs[rid]) for rid, rec in recipes.items()}
