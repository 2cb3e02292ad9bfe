"""Rows -> recipes, protocols, entries and tables: everything the renderers share.

A *recipe* is what was trained (``recipe_id``: the training configuration minus the seed); a
*protocol* is how it was measured (``protocol_id``: dataset, setting, suite, probe, kNN, number of
examples, attack versions). An *entry* is one recipe under one protocol, aggregated over its *runs*
(one run = one checkpoint x evaluation seed x probe seed) as mean and sample standard deviation
(ddof = 1). A *table* holds the entries that may be ranked together: one protocol (for the shift
setting, one protocol up to the shift variant). Rows of different recipes are never averaged and
rows of different protocols are never ranked together (see docs/decisions.md, 'Result rows,
recipes and protocols').
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UserError
from ..results.eps import eps_label
from ..results.finetune import PROTOCOLS
from ..results.rows import KEY_PARAMS, SETTINGS, ResultRow, protocol_hash
from .fmt import MISSING
from .metrics import MetricKey, Run, aa_gap, metric_key, metric_name, n_examples, run_of
from .stats import Stat

HEADLINE_EPS = 0.002
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


def _leaves(obj: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    # nested mappings flattened to their leaves (an empty mapping has none: {} and {"width": 8}
    # differ in width only)
    if isinstance(obj, Mapping):
        out: dict[tuple[str, ...], Any] = {}
        for k, v in obj.items():
            out |= _leaves(v, (*path, str(k)))
        return out
    return {path: obj}


def _fmt_value(v: Any) -> str:
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
    leaves = {rid: _leaves(cfg) for rid, (_, cfg) in recipes.items()}
    out = {rid: "" for rid in recipes}
    for members in families.values():
        paths = sorted({p for rid in members for p in leaves[rid]})
        varying = [p for p in paths if len({_fmt_value(leaves[rid].get(p, MISSING)) for rid in members}) > 1]
        varying = [p for p in varying if not (len(p) >= 2 and p[-2] == "loss_params" and p[-1] in KEY_PARAMS)]
        names = _short_names(varying)
        for rid in members:
            out[rid] = " ".join(f"{names[p]}={_fmt_value(leaves[rid].get(p, MISSING))}" for p in varying)
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


# ============ tables: entries that may be ranked together ============


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
    leaves = _leaves({k: v for k, v in protocol.items() if k not in ("dataset", "setting", "finetune")})
    out = {p: _fmt_value(v) for p, v in leaves.items()}
    # the finetuning protocol as one leaf ("SLF", or "ALF (eps 0.0314, steps 10, ...)"): shown only
    # where tables differ in it, so SLF-only leaderboards render as before
    ft = protocol.get("finetune") or {}
    # a named finetuning recipe first, as name/method/dataset (eval/finetune_recipes.py)
    recipe = ft.get("recipe")
    named = [f"recipe {'/'.join(map(str, recipe.values()))}"] if isinstance(recipe, dict) else []
    settings = ", ".join(
        named
        + [
            f"{k} {_fmt_value(v)}"
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


# ============ formatting helpers shared by the renderers ============


def distinct(values: Iterable[Any]) -> list[Any]:
    """Sorted distinct values, None and "" left out."""
    return sorted({v for v in values if v is not None and v != ""}, key=lambda v: (str(type(v)), v))


def join(values: Iterable[Any], empty: str = "unknown") -> str:
    """Distinct values as ``a, b``."""
    vals = distinct(values)
    return ", ".join(map(str, vals)) if vals else empty


def provenance(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Distinct provenance values over rows (for headers and the per-entry detail view)."""
    versions: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        for k, v in (r.get("versions") or {}).items():
            versions[k].append(str(v))
    return {
        "n_rows": len(rows),
        "checkpoints": sorted({(str(r["checkpoint_id"]), str(r.get("checkpoint_sha256", ""))) for r in rows}),
        "train_seeds": distinct(r.get("train_seed") for r in rows),
        "eval_seeds": distinct(r.get("seed") for r in rows),
        "n_examples": distinct(n_examples(r) or None for r in rows),
        "suites": sorted({(str(r.get("suite", "")), str(r.get("suite_sha256", ""))) for r in rows}),
        "versions": {k: distinct(v) for k, v in sorted(versions.items())},
        "devices": distinct(r.get("device") for r in rows),
    }


@dataclass
class RunsNote:
    """The footnote of a corruption and severity under which runs' clean accuracy is at chance. It
    collects its runs while a table is flagged and is written after the table, so one note names
    them all."""

    where: str  # "corruption contrast severity 5"
    runs: set[tuple[str, int]] = field(default_factory=set)  # (family, training seed)

    def add(self, family: str, seed: int) -> None:
        """Name a run."""
        self.runs.add((family, seed))

    def __str__(self) -> str:
        n, runs = len(self.runs), ", ".join(f"{f} s{s}" for f, s in sorted(self.runs))
        return (
            f"{self.where}: clean accuracy at chance under this corruption for {n} run{'s' * (n != 1)} "
            f"({runs}): what the corruption does to these encoders, not an attack that "
            "failed, so there is no robustness to read there (a failure of the same run in-domain is "
            "listed under the in-domain table)"
        )


@dataclass
class Context:
    """Everything a table or figure renderer needs besides its own entries."""

    entries: list[Entry]
    rows: list[ResultRow]
    headline_eps: float
    show_encoder: bool
    show_dataset: bool
    tables: list[Table] = field(default_factory=list)
    # sanity footnotes, numbered across the document (a RunsNote is complete once its table is flagged)
    notes: list[str | RunsNote] = field(default_factory=list)
    note_of: dict[str, int] = field(default_factory=dict)
    # entry uid -> its comparison with the table's baseline (.compare.Comparison); table key ->
    # the baseline's label; what the comparisons could not do
    comparisons: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, str] = field(default_factory=dict)
    baseline_family: str | None = None
    compare_notes: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # rows of other directories left out, and why
    rank_by: str | None = None  # the --rank-by asked for (None: the default)

    @staticmethod
    def build(rows: list[ResultRow], entries: list[Entry], headline_eps: float) -> Context:
        """The context of a leaderboard; shows encoder/dataset columns only when they vary."""
        return Context(
            entries=entries,
            rows=rows,
            headline_eps=headline_eps,
            show_encoder=len({e.recipe.encoder for e in entries}) > 1,
            show_dataset=len({e.recipe.pretrain_dataset for e in entries}) > 1,
            tables=build_tables(entries),
        )

    @property
    def fgsm(self) -> str:
        return metric_name("fgsm", "Linf", self.headline_eps)

    @property
    def pgd(self) -> str:
        return metric_name("pgd", "Linf", self.headline_eps)

    @property
    def eps_text(self) -> str:
        """The headline eps in both units, e.g. ``0.002 (0.51/255)``."""
        return f"{self.headline_eps:g} ({eps_label(self.headline_eps)})"

    def label(self, recipe: Recipe) -> str:
        return recipe.label(encoder=self.show_encoder, dataset=self.show_dataset)

    def table_of(self, e: Entry) -> Table:
        """The table an entry is ranked in."""
        return next(t for t in self.tables if any(x is e for x in t.entries))

    def partner(self, e: Entry, setting: str, dataset: str) -> Entry | None:
        """The entry of the same recipe and protocol context in another setting/dataset, if any."""
        for x in self.entries:
            same = x.recipe.recipe_id == e.recipe.recipe_id and x.context == e.context
            if same and x.setting == setting and x.dataset == dataset:
                return x
        return None

    def flag(self, entries: list[Entry]) -> str:
        """A footnote marker for entries with failed sanity checks ("ok" otherwise)."""
        fails = [(e, r, f) for e in entries for r, f in e.failures()]
        if not fails:
            return "ok"
        marks = []
        for e, r, checks in fails:
            if r.get("corruption") and checks == ["clean_above_chance"]:
                # one note per corruption and severity, naming its runs (every attack's row of a run
                # shares its clean accuracy): at chance under a corruption is what that corruption
                # does to the encoder, not a broken attack
                where = f"corruption {r['corruption']} severity {r.get('severity')}"
                key = f"{where} | {e.context}"  # a second corruption table (protocol) has its own notes
                if key not in self.note_of:
                    self.notes.append(RunsNote(where))
                    self.note_of[key] = len(self.notes)
                note = self.notes[self.note_of[key] - 1]
                assert isinstance(note, RunsNote)
                seed = r.get("seed") if r.get("control") else r.get("train_seed")  # a control's: its init
                note.add(e.recipe.family, int(seed or 0))
                marks.append(self.note_of[key])
                continue
            run = f"`{r['checkpoint_id']}` seed {r.get('seed')}"
            text = (
                f"{e.recipe.family}, {e.setting} {e.dataset}: {run}, "
                f"{r['attack']} {r['norm']} ε={float(r['eps']):g}: failed {', '.join(checks)}"
            )
            if text not in self.note_of:
                self.notes.append(text)
                self.note_of[text] = len(self.notes)
            marks.append(self.note_of[text])
        return "⚠ " + ",".join(map(str, sorted(set(marks))))
