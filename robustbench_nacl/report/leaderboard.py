"""Render the leaderboard from result rows: Markdown, CSV, JSON, the NaCl figures and a static HTML page.

Nothing here evaluates anything: the input is result rows (``results.load_rows``). Rows are grouped
into *recipes* (encoder + loss + key parameters + pretraining dataset + control) and aggregated per
setting and evaluated dataset over *runs* (one run = one checkpoint x evaluation seed) as mean and
sample standard deviation (ddof = 1). Random-init controls are ranked like every other recipe, so a
reader sees where clean accuracy alone misleads.

Outputs (all written atomically into ``out``): ``LEADERBOARD.md``, ``results.csv`` and
``leaderboard.json`` (one flat record per recipe x setting x dataset), ``rows.csv`` (every raw row),
``standard_vs_robust.png`` (NaCl Fig. 1), ``robust_vs_eps.png`` (Fig. S1), ``ablation_M.png`` /
``ablation_lam.png`` (Fig. S2, only where such a grid exists) and ``index.html``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from ..errors import UserError
from ..eval.rows import eps_label, load_rows
from ..io import write_bytes_atomic

log = logging.getLogger(__name__)

HEADLINE_EPS = 0.002
SETTINGS = ("in-domain", "transfer", "shift")
CONTROL_LABEL = "random-init (control)"
MISSING = "–"

# Keys a row must carry to be placed in a table; everything else is optional provenance.
REQUIRED = (
    "row_id",
    "checkpoint_id",
    "encoder",
    "loss",
    "key_params",
    "control",
    "pretrain_dataset",
    "setting",
    "dataset",
    "attack",
    "norm",
    "eps",
    "clean_acc",
    "robust_acc",
)
NUMERIC = ("eps", "clean_acc", "robust_acc")

# Fixed pixel sizes (inches x dpi) so the figures are comparable between renders; tests check them.
DPI = 100
LEGEND_IN = 3.5  # width of the legend strip right of the panels
FIGSIZE = {
    "standard_vs_robust.png": (12.0, 4.5),  # 1200 x 450 px
    "robust_vs_eps.png": (5.5, 4.5),  # per in-domain dataset panel, + legend strip: 900 x 450 px for one
    "ablation": (11.0, 4.0),  # 1100 x 400 px
}
MARKERS = "osD^vP*<>p"  # cycled after the 10 tab10 colours, so up to 100 recipes stay distinct
# Figure S2: the loss parameters whose grids get an ablation plot, with their axis labels.
ABLATIONS = {"M": "number of positives M", "lam": "mixup coefficient λ"}

Run = tuple[str, Any]  # (checkpoint sha256 or id, evaluation seed)
MetricKey = tuple[str, str, float]  # (attack, norm, eps)


# ============ rows -> recipes and entries ============


@dataclass(frozen=True, order=True)
class Recipe:
    """What was trained: the unit a leaderboard line describes (seeds are aggregated away)."""

    encoder: str
    pretrain_dataset: str
    loss: str
    key_params: str
    control: bool

    @property
    def family(self) -> str:
        """The loss-family column: the preset name, or the control marker."""
        return CONTROL_LABEL if self.control else self.loss

    def label(self, *, encoder: bool = False, dataset: bool = False) -> str:
        """Short human label; encoder/dataset are added only when they vary across the leaderboard."""
        parts = [self.family]
        if self.key_params:
            parts.append(f"[{self.key_params}]")
        extra = [x for x, on in ((self.encoder, encoder), (self.pretrain_dataset, dataset)) if on]
        if extra:
            parts.append(f"({', '.join(extra)})")
        return " ".join(parts)


@dataclass(frozen=True)
class Stat:
    """Mean and sample std (None for a single run) of one metric over runs."""

    mean: float | None
    std: float | None
    n: int

    @staticmethod
    def of(values: Iterable[float]) -> Stat:
        v = np.asarray(list(values), dtype=float)
        if v.size == 0:
            return Stat(None, None, 0)
        return Stat(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else None, int(v.size))


@dataclass
class Entry:
    """One recipe in one setting on one evaluated dataset, aggregated over its runs."""

    recipe: Recipe
    setting: str
    dataset: str
    shift: str | None
    rows: list[dict[str, Any]]
    stats: dict[str, Stat]
    runs: list[Run]
    rank: int = 0
    uid: str = field(init=False)

    def __post_init__(self) -> None:
        # stable across renders and row order: the browser test and deep links rely on it
        key = json.dumps([self.setting, self.dataset, *map(str, vars(self.recipe).values())])
        self.uid = "e" + hashlib.sha256(key.encode()).hexdigest()[:10]

    def stat(self, name: str) -> Stat:
        return self.stats.get(name, Stat(None, None, 0))

    def failures(self) -> list[tuple[dict[str, Any], list[str]]]:
        """(row, failed checks) for every row of this entry whose ``sanity_ok`` is false."""
        return [(r, failed_checks(r)) for r in self.rows if r.get("sanity_ok") is False]


def metric_name(attack: str, norm: str, eps: float) -> str:
    """Column stem of one attack metric, e.g. ``fgsm_Linf_0.002``."""
    return f"{attack}_{norm}_{eps:g}"


def failed_checks(row: dict[str, Any]) -> list[str]:
    """The sanity checks a row failed (``sanity_failed``, else its false ``sanity_*`` flags)."""
    named = row.get("sanity_failed")
    if isinstance(named, str) and named:
        return named.split(",")
    flags = [k.removeprefix("sanity_") for k, v in row.items() if k.startswith("sanity_") and v is False]
    return sorted(f for f in flags if f != "ok") or ["unspecified"]


def _where(row: dict[str, Any], i: int | None = None) -> str:
    rid = row.get("row_id")
    return f"result row {rid}" if rid else f"result row #{i} (checkpoint_id={row.get('checkpoint_id')!r})"


def validate_rows(rows: list[dict[str, Any]], source: str | Path | None = None) -> None:
    """Raise a one-line ``UserError`` naming the first row that cannot be rendered."""
    at = f" in {source}" if source else ""
    if not rows:
        raise UserError(
            f"no result rows{at}; produce some with `robustbench-nacl eval CHECKPOINT --out DIR` first"
        )
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise UserError(f"result row #{i}{at} is not a JSON object")
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise UserError(f"{_where(r, i)}{at} lacks required key(s) {', '.join(missing)}")
        for k in NUMERIC:
            if isinstance(r[k], bool) or not isinstance(r[k], (int, float)) or not math.isfinite(r[k]):
                raise UserError(f"{_where(r, i)}{at}: {k} must be a finite number, got {r[k]!r}")
        if r["setting"] not in SETTINGS:
            valid = ", ".join(SETTINGS)
            raise UserError(f"{_where(r, i)}{at}: unknown setting {r['setting']!r}; valid: {valid}")
        if not isinstance(r["control"], bool):
            raise UserError(f"{_where(r, i)}{at}: control must be true or false, got {r['control']!r}")


def _recipe(r: dict[str, Any]) -> Recipe:
    pretrain, key = str(r["pretrain_dataset"] or ""), r["key_params"] or ""
    return Recipe(r["encoder"], pretrain, r["loss"], key, r["control"])


def _run(r: dict[str, Any]) -> Run:
    return (r.get("checkpoint_sha256") or r["checkpoint_id"], r.get("seed"))


def _n_examples(r: dict[str, Any]) -> int:
    return int(r.get("n_examples") or r.get("n_examples_evaluated") or 0)


def _shift(r: dict[str, Any]) -> str | None:
    return r.get("shift") or (r["dataset"].split("@", 1)[1] if "@" in r["dataset"] else None)


def _metric_key(r: dict[str, Any]) -> MetricKey:
    return (r["attack"], r["norm"], round(float(r["eps"]), 12))


def aggregate(rows: list[dict[str, Any]]) -> tuple[list[Entry], int]:
    """Group rows into entries; returns them and the number of duplicate rows that were ignored.

    A duplicate is a second row for the same run, attack, norm and eps (two suites, or two
    ``n_examples``): the row with the most examples wins, then the newest, so the choice is stable.
    """
    groups: dict[tuple[Recipe, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(_recipe(r), r["setting"], r["dataset"])].append(r)
    entries, dropped = [], 0
    for (recipe, setting, dataset), grp in sorted(groups.items(), key=lambda kv: kv[0]):
        # preference order (stable sorts, last key first): most examples, then newest, then row id
        grp.sort(key=lambda r: str(r["row_id"]))
        grp.sort(key=lambda r: str(r.get("created_at") or ""), reverse=True)
        grp.sort(key=lambda r: -_n_examples(r))
        values: dict[str, dict[Run, float]] = defaultdict(dict)
        kept = []
        for r in grp:
            run, name = _run(r), metric_name(*_metric_key(r))
            if run in values[name]:
                dropped += 1
                continue
            kept.append(r)
            values[name][run] = float(r["robust_acc"])
            values["clean"].setdefault(run, float(r["clean_acc"]))
        kept.sort(key=lambda r: (str(r["checkpoint_id"]), str(r.get("seed")), _metric_key(r)))
        runs = sorted(values["clean"], key=str)
        stats = {name: Stat.of(v[run] for run in runs if run in v) for name, v in values.items()}
        entries.append(Entry(recipe, setting, dataset, _shift(kept[0]), kept, stats, runs))
    return entries, dropped


def _rank_key(fgsm: str) -> Callable[[Entry], tuple]:
    # robust accuracy first, clean accuracy breaks ties, the label keeps the order total
    def key(e: Entry) -> tuple:
        f, c = e.stat(fgsm).mean, e.stat("clean").mean
        return (f is None, -(f or 0.0), c is None, -(c or 0.0), e.recipe.label())

    return key


def rank_entries(entries: list[Entry], headline_eps: float) -> None:
    """Rank entries 1..n within each (setting, dataset) by FGSM at the headline eps, ties by clean."""
    by_table: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        by_table[(e.setting, e.dataset)].append(e)
    key = _rank_key(metric_name("fgsm", "Linf", headline_eps))
    for group in by_table.values():
        for i, e in enumerate(sorted(group, key=key), 1):
            e.rank = i


# ============ formatting helpers ============


def fmt_stat(s: Stat) -> str:
    """Percent with seed spread: ``95.83 ± 0.41``; ``95.83 ± –`` for one run; ``–`` when absent."""
    if s.mean is None:
        return MISSING
    spread = MISSING if s.std is None else f"{100 * s.std:.2f}"
    return f"{100 * s.mean:.2f} ± {spread}"


def _fmt_with_n(s: Stat, n_runs: int) -> str:
    # a metric measured on fewer runs than the recipe has must say so, or its spread misleads
    text = fmt_stat(s)
    return f"{text} (n={s.n})" if s.mean is not None and s.n != n_runs else text


def _distinct(values: Iterable[Any]) -> list[Any]:
    return sorted({v for v in values if v is not None and v != ""}, key=lambda v: (str(type(v)), v))


def _join(values: Iterable[Any], empty: str = "unknown") -> str:
    vals = _distinct(values)
    return ", ".join(map(str, vals)) if vals else empty


@dataclass
class Context:
    """Everything a table or figure renderer needs besides its own entries."""

    entries: list[Entry]
    rows: list[dict[str, Any]]
    headline_eps: float
    show_encoder: bool
    show_dataset: bool
    notes: list[str] = field(default_factory=list)  # sanity footnotes, numbered across the document
    note_of: dict[str, int] = field(default_factory=dict)
    index: dict[tuple[Recipe, str, str], Entry] = field(init=False)

    def __post_init__(self) -> None:
        self.index = {(e.recipe, e.setting, e.dataset): e for e in self.entries}

    @property
    def fgsm(self) -> str:
        return metric_name("fgsm", "Linf", self.headline_eps)

    @property
    def pgd(self) -> str:
        return metric_name("pgd", "Linf", self.headline_eps)

    @property
    def strong_eps(self) -> float | None:
        """The largest FGSM L∞ eps in the rows, when above the headline: a column that separates
        recipes where the headline budget barely moves accuracy (e.g. 0.51/255 on 8x8 digits)."""
        eps = [float(r["eps"]) for r in self.rows if r["attack"] == "fgsm" and r["norm"] == "Linf"]
        top = max(eps, default=None)
        return top if top is not None and top > self.headline_eps else None

    @property
    def strong_cols(self) -> list[tuple[str, str]]:
        """(header, metric) of the strong-eps column, if any."""
        e = self.strong_eps
        return [] if e is None else [(f"FGSM@{e:g} ({eps_label(e)})", metric_name("fgsm", "Linf", e))]

    @property
    def eps_text(self) -> str:
        """The headline eps in both units, e.g. ``0.002 (0.51/255)``."""
        return f"{self.headline_eps:g} ({eps_label(self.headline_eps)})"

    def label(self, recipe: Recipe) -> str:
        return recipe.label(encoder=self.show_encoder, dataset=self.show_dataset)

    def find(self, recipe: Recipe, setting: str, dataset: str) -> Entry | None:
        return self.index.get((recipe, setting, dataset))

    def flag(self, entries: list[Entry]) -> str:
        """A footnote marker for entries with failed sanity checks ("ok" otherwise)."""
        fails = [(e, r, f) for e in entries for r, f in e.failures()]
        if not fails:
            return "ok"
        marks = []
        for e, r, checks in fails:
            text = (
                f"{e.recipe.family}, {e.setting} {e.dataset}: `{r['checkpoint_id']}` seed {r.get('seed')}, "
                f"{r['attack']} {r['norm']} ε={float(r['eps']):g}: failed {', '.join(checks)}"
            )
            if text not in self.note_of:
                self.notes.append(text)
                self.note_of[text] = len(self.notes)
            marks.append(self.note_of[text])
        return "⚠ " + ",".join(map(str, sorted(set(marks))))


def _table_md(headers: list[str], body: list[list[str]], align: list[str]) -> str:
    return tabulate(body, headers=headers, tablefmt="github", colalign=align, disable_numparse=True)


def _ident_cols(ctx: Context, e: Entry) -> list[str]:
    cols = [str(e.rank), e.recipe.family, e.recipe.key_params or MISSING]
    if ctx.show_encoder:
        cols.append(e.recipe.encoder)
    if ctx.show_dataset and e.setting != "in-domain":
        cols.append(e.recipe.pretrain_dataset)
    return cols


def _ident_headers(ctx: Context, setting: str) -> tuple[list[str], list[str]]:
    heads = ["rank", "loss family", "key parameters"]
    if ctx.show_encoder:
        heads.append("encoder")
    if ctx.show_dataset and setting != "in-domain":
        heads.append("pretrained on")
    return heads, ["right"] + ["left"] * (len(heads) - 1)


def _by_dataset(entries: list[Entry], setting: str, key: Callable[[Entry], str] = lambda e: e.dataset):
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.setting == setting:
            groups[key(e)].append(e)
    return sorted(groups.items())


# ============ Markdown tables, one renderer per setting ============


def _table_in_domain(ctx: Context) -> list[str]:
    out = []
    for dataset, group in _by_dataset(ctx.entries, "in-domain"):
        group.sort(key=lambda e: e.rank)
        recipes = {e.recipe for e in group}
        targets = _distinct(t.dataset for t in ctx.entries if t.setting == "transfer" and t.recipe in recipes)
        heads, align = _ident_headers(ctx, "in-domain")
        heads += ["n", "clean", f"FGSM@{ctx.eps_text}", f"PGD@{ctx.eps_text}"]
        heads += [h for h, _ in ctx.strong_cols]
        for t in targets:
            heads += [f"→ {t} clean", f"→ {t} FGSM"]
        heads.append("sanity")
        align += ["right"] * (len(heads) - len(align) - 1) + ["left"]
        body = []
        for e in group:
            n = len(e.runs)
            line = [*_ident_cols(ctx, e), str(n), _fmt_with_n(e.stat("clean"), n)]
            line += [_fmt_with_n(e.stat(ctx.fgsm), n), _fmt_with_n(e.stat(ctx.pgd), n)]
            line += [_fmt_with_n(e.stat(m), n) for _, m in ctx.strong_cols]
            for t in targets:
                te = ctx.find(e.recipe, "transfer", t)
                line += [_fmt_with_n(te.stat(m), n) if te else MISSING for m in ("clean", ctx.fgsm)]
            line.append(ctx.flag([e]))
            body.append(line)
        out += [f"## In-domain: probe on {dataset}", "", _table_md(heads, body, align), ""]
    return out


def _table_transfer(ctx: Context) -> list[str]:
    out = []
    for dataset, group in _by_dataset(ctx.entries, "transfer"):
        group.sort(key=lambda e: e.rank)
        sources = _join(e.recipe.pretrain_dataset for e in group)
        heads, align = _ident_headers(ctx, "transfer")
        strong = ctx.strong_cols
        heads += ["n", "clean", f"FGSM@{ctx.eps_text}", f"PGD@{ctx.eps_text}", *(h for h, _ in strong)]
        heads.append("sanity")
        align += ["right"] * (4 + len(strong)) + ["left"]
        body = []
        for e in group:
            n = len(e.runs)
            stats = [_fmt_with_n(e.stat(m), n) for m in ("clean", ctx.fgsm, ctx.pgd, *(m for _, m in strong))]
            body.append([*_ident_cols(ctx, e), str(n), *stats, ctx.flag([e])])
        title = f"## Transfer: probe on {dataset} (encoders pretrained on {sources})"
        out += [title, "", _table_md(heads, body, align), ""]
    return out


def _table_shift(ctx: Context) -> list[str]:
    # ArCL-style: one column per shift variant (clean / FGSM means; spreads are in results.csv),
    # ranked by FGSM averaged over the variants a recipe was evaluated on.
    out = []
    for base, group in _by_dataset(ctx.entries, "shift", key=lambda e: e.dataset.split("@", 1)[0]):
        shifts = _distinct(e.shift or e.dataset for e in group)
        by_recipe: dict[Recipe, dict[str, Entry]] = defaultdict(dict)
        for e in group:
            by_recipe[e.recipe][e.shift or e.dataset] = e

        def avg(cells: dict[str, Entry], metric: str) -> float | None:
            vals = [c.stat(metric).mean for c in cells.values() if c.stat(metric).mean is not None]
            return sum(vals) / len(vals) if vals else None

        def key(item: tuple[Recipe, dict[str, Entry]]) -> tuple:
            f, c = avg(item[1], ctx.fgsm), avg(item[1], "clean")
            return (f is None, -(f or 0.0), c is None, -(c or 0.0), item[0].label())

        heads, align = _ident_headers(ctx, "shift")
        heads += ["n", *shifts, f"mean FGSM@{ctx.eps_text}", "sanity"]
        align += ["right"] * (len(shifts) + 2) + ["left"]
        body = []
        for rank, (_, cells) in enumerate(sorted(by_recipe.items(), key=key), 1):
            first = next(iter(cells.values()))
            ident = _ident_cols(ctx, first)
            ident[0] = str(rank)
            n = max(len(c.runs) for c in cells.values())
            line = [*ident, str(n)]
            for s in shifts:
                c = cells.get(s)
                line.append(_pair(c.stat("clean"), c.stat(ctx.fgsm)) if c else MISSING)
            mean_f = avg(cells, ctx.fgsm)
            line += [MISSING if mean_f is None else f"{100 * mean_f:.2f}", ctx.flag(list(cells.values()))]
            body.append(line)
        title = f"## Shift: probe on shifted {base} (cells: clean / FGSM@{ctx.eps_text}, mean over seeds)"
        out += [title, "", _table_md(heads, body, align), ""]
    return out


def _pair(clean: Stat, fgsm: Stat) -> str:
    fmt = [MISSING if s.mean is None else f"{100 * s.mean:.2f}" for s in (clean, fgsm)]
    return " / ".join(fmt)


TABLES: dict[str, Callable[[Context], list[str]]] = {
    "in-domain": _table_in_domain,
    "transfer": _table_transfer,
    "shift": _table_shift,
}


# ============ provenance ============


def provenance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Distinct provenance values over rows (for headers and the per-entry detail view)."""
    versions: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        for k, v in (r.get("versions") or {}).items():
            versions[k].append(str(v))
    return {
        "n_rows": len(rows),
        "checkpoints": sorted({(str(r["checkpoint_id"]), str(r.get("checkpoint_sha256", ""))) for r in rows}),
        "train_seeds": _distinct(r.get("train_seed") for r in rows),
        "eval_seeds": _distinct(r.get("seed") for r in rows),
        "n_examples": _distinct(_n_examples(r) or None for r in rows),
        "suites": sorted({(str(r.get("suite", "")), str(r.get("suite_sha256", ""))) for r in rows}),
        "versions": {k: _distinct(v) for k, v in sorted(versions.items())},
        "devices": _distinct(r.get("device") for r in rows),
    }


def _attack_params_text(rows: list[dict[str, Any]], attack: str, eps: float) -> str:
    params = _distinct(
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
    recipes = {e.recipe for e in ctx.entries}
    runs = {(e.recipe, run) for e in ctx.entries for run in e.runs}
    pkg = ", ".join(f"{k} {'/'.join(v)}" for k, v in p["versions"].items() if k != "python") or "unknown"
    pgd = _attack_params_text(ctx.rows, "pgd", ctx.headline_eps)
    lead = f"Rendered from {p['n_rows']} result rows ({len(runs)} runs of {len(recipes)} recipes)"
    lead = f"{lead}; produced by `{command}`." if command else f"{lead}."
    items = [
        (
            "Evaluation",
            f"first {_join(p['n_examples'])} test examples per dataset; training seeds "
            f"{_join(p['train_seeds'])}; evaluation seeds {_join(p['eval_seeds'])}; "
            f"suite {suites or 'unknown'}.",
        ),
        ("Software", f"{pkg}; devices: {_join(p['devices'])}."),
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
    if dropped:
        items.append(
            (
                "Duplicates",
                f"{dropped} rows repeated a (checkpoint, seed, attack, ε) already present (another suite or "
                "n_examples); the one with the most examples was kept.",
            )
        )
    return lead, items


# ============ figures (matplotlib, Agg canvas: no display, no global pyplot state) ============


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
        ax.set_title(f"{setting}: {_join((e.dataset for e in pts), 'no rows')}", fontsize=10)
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
    groups = _by_dataset(ctx.entries, "in-domain") or [("no in-domain rows", [])]
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
    keys = {_metric_key(r) for r in e.rows if r["attack"] == attack and r["norm"] == "Linf"}
    return [(metric_name(*k), k[2]) for k in sorted(keys)]


def _loss_params(e: Entry) -> dict[str, Any]:
    lp = e.rows[0].get("loss_params")
    if isinstance(lp, dict):
        return lp
    # rows without the full dict still carry the compact "k=v k=v" description
    return dict(tok.split("=", 1) for tok in e.recipe.key_params.split() if "=" in tok)


def find_grids(entries: list[Entry], param: str) -> dict[str, list[tuple[float, Entry]]]:
    """In-domain recipes of one loss family that differ only in ``param`` (>= 2 values): label -> points."""
    lines: dict[tuple, list[tuple[float, Entry]]] = defaultdict(list)
    for e in entries:
        if e.setting != "in-domain" or e.recipe.control:
            continue
        lp = _loss_params(e)
        try:
            value = float(lp[param])
        except (KeyError, TypeError, ValueError):
            continue
        rest = json.dumps({k: v for k, v in lp.items() if k != param}, sort_keys=True, default=str)
        family = (e.recipe.encoder, e.recipe.pretrain_dataset, e.recipe.loss, e.dataset, rest)
        lines[family].append((value, e))
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


# ============ flat outputs ============


def _metric_names(entries: list[Entry]) -> list[str]:
    keys = sorted({_metric_key(r) for e in entries for r in e.rows})
    return ["clean"] + [metric_name(*k) for k in keys]


def records(entries: list[Entry], ctx: Context) -> list[dict[str, Any]]:
    """One flat, numeric record per entry (the lines of results.csv and leaderboard.json)."""
    order = {s: i for i, s in enumerate(SETTINGS)}
    metrics = _metric_names(ctx.entries)
    out = []
    for e in sorted(entries, key=lambda e: (order[e.setting], e.dataset, e.rank)):
        rec: dict[str, Any] = {
            "setting": e.setting,
            "dataset": e.dataset,
            "shift": e.shift,
            "rank": e.rank,
            "label": ctx.label(e.recipe),
            "encoder": e.recipe.encoder,
            "loss": e.recipe.loss,
            "key_params": e.recipe.key_params,
            "pretrain_dataset": e.recipe.pretrain_dataset,
            "control": e.recipe.control,
            "n_seeds": len(e.runs),
            "n_examples": min((_n_examples(r) for r in e.rows), default=0),
        }
        for name in metrics:
            s = e.stat(name)
            rec |= {f"{name}_mean": _round(s.mean), f"{name}_std": _round(s.std), f"{name}_n": s.n}
        fails = e.failures()
        rec["sanity_ok"] = not fails
        rec["sanity_failed"] = ",".join(_distinct(c for _, checks in fails for c in checks))
        rec["entry_id"] = e.uid
        out.append(rec)
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _csv(table: list[dict[str, Any]], columns: list[str]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for rec in table:
        w.writerow(["" if rec.get(c) is None else _cell(rec[c]) for c in columns])
    return buf.getvalue().encode()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


RAW_FIRST = (
    "row_id",
    "checkpoint_id",
    "setting",
    "dataset",
    "attack",
    "norm",
    "eps",
    "eps_label",
    "seed",
    "clean_acc",
    "robust_acc",
    "n_examples",
    "sanity_ok",
    "sanity_failed",
)


def flatten_row(r: dict[str, Any]) -> dict[str, Any]:
    """A raw row with ``loss_params`` expanded to ``param_*`` columns (other dicts stay JSON strings)."""
    flat = {k: v for k, v in r.items() if k != "loss_params"}
    flat |= {f"param_{k}": v for k, v in (r.get("loss_params") or {}).items()}
    return flat


def rows_csv(rows: list[dict[str, Any]]) -> bytes:
    """Every raw row, flattened; fixed leading columns, the rest sorted; rows in a stable order."""
    ordered = sorted(
        rows,
        key=lambda r: (
            str(r["checkpoint_id"]),
            r["setting"],
            r["dataset"],
            *_metric_key(r),
            str(r.get("seed")),
            str(r["row_id"]),
        ),
    )
    flat = [flatten_row(r) for r in ordered]
    rest = sorted({k for f in flat for k in f} - set(RAW_FIRST))
    return _csv(flat, [*RAW_FIRST, *rest])


# ============ HTML table data ============


def html_table(entries: list[Entry], ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Columns and rows for the HTML page: every cell has display text and, if numeric, a sort value."""
    metrics = {"clean": "clean", "fgsm": f"FGSM@{ctx.eps_text}", "pgd": f"PGD@{ctx.eps_text}"}
    columns = [
        {"key": "rank", "label": "rank", "numeric": True},
        {"key": "setting", "label": "setting", "numeric": False},
        {"key": "dataset", "label": "dataset", "numeric": False},
        {"key": "family", "label": "loss family", "numeric": False},
        {"key": "key_params", "label": "key parameters", "numeric": False},
        {"key": "encoder", "label": "encoder", "numeric": False},
        {"key": "pretrain", "label": "pretrained on", "numeric": False},
        {"key": "n", "label": "n", "numeric": True},
        *({"key": k, "label": v, "numeric": True} for k, v in metrics.items()),
        {"key": "sanity", "label": "sanity", "numeric": False},
    ]
    order = {s: i for i, s in enumerate(SETTINGS)}
    rows = []
    for e in sorted(entries, key=lambda e: (order[e.setting], e.dataset, e.rank)):
        n = len(e.runs)
        stats = {"clean": e.stat("clean"), "fgsm": e.stat(ctx.fgsm), "pgd": e.stat(ctx.pgd)}
        fails = _distinct(c for _, checks in e.failures() for c in checks)
        cells = {
            "rank": {"text": str(e.rank), "value": e.rank},
            "setting": {"text": e.setting},
            "dataset": {"text": e.dataset},
            "family": {"text": e.recipe.family},
            "key_params": {"text": e.recipe.key_params or MISSING},
            "encoder": {"text": e.recipe.encoder},
            "pretrain": {"text": e.recipe.pretrain_dataset},
            "n": {"text": str(n), "value": n},
            **{k: {"text": _fmt_with_n(s, n), "value": _round(s.mean)} for k, s in stats.items()},
            "sanity": {"text": "⚠ " + ", ".join(fails) if fails else "ok"},
        }
        rows.append(
            {
                "id": e.uid,
                "setting": e.setting,
                "control": e.recipe.control,
                "cells": cells,
                "provenance": _entry_provenance(e),
            }
        )
    return columns, rows


def _entry_provenance(e: Entry) -> dict[str, Any]:
    p = provenance(e.rows)
    created = _distinct(r.get("created_at") for r in e.rows)
    return {
        "checkpoints": [{"id": c, "sha256": s} for c, s in p["checkpoints"]],
        "suites": [{"name": n, "sha256": s} for n, s in p["suites"]],
        "train_seeds": p["train_seeds"],
        "eval_seeds": p["eval_seeds"],
        "n_examples": p["n_examples"],
        "versions": p["versions"],
        "devices": p["devices"],
        "n_rows": len(e.rows),
        "created": [created[0], created[-1]] if created else [],
        "sanity_failed": [
            {
                "checkpoint_id": r["checkpoint_id"],
                "seed": r.get("seed"),
                "attack": r["attack"],
                "norm": r["norm"],
                "eps": r["eps"],
                "failed": checks,
            }
            for r, checks in e.failures()
        ],
    }


# ============ entry points ============


def render_leaderboard(
    rows: list[dict[str, Any]],
    out: str | Path,
    *,
    headline_eps: float = HEADLINE_EPS,
    title: str = "robustbench-nacl leaderboard",
    command: str | None = None,
) -> dict[str, Path]:
    """Write every leaderboard output into ``out``; returns {file name: path} of the files written.

    Ablation plots are written only where an M or lambda grid exists; a skipped one is absent from
    the returned dict, logged, and named under "skipped" in leaderboard.json and LEADERBOARD.md.
    """
    from . import html

    validate_rows(rows)
    out = Path(out)
    entries, dropped = aggregate(rows)
    rank_entries(entries, headline_eps)
    ctx = Context(
        entries=entries,
        rows=rows,
        headline_eps=headline_eps,
        show_encoder=len({e.recipe.encoder for e in entries}) > 1,
        show_dataset=len({e.recipe.pretrain_dataset for e in entries}) > 1,
    )
    written: dict[str, Path] = {}

    def write(name: str, data: bytes) -> None:
        write_bytes_atomic(out / name, data)
        written[name] = out / name

    # ============ figures ============
    figures = {
        "standard_vs_robust.png": "Standard vs robust accuracy (NaCl Fig. 1)",
        "robust_vs_eps.png": "Robust accuracy vs ε, in-domain (Fig. S1)",
    }
    write("standard_vs_robust.png", plot_standard_vs_robust(ctx))
    write("robust_vs_eps.png", plot_robust_vs_eps(ctx))
    skipped: dict[str, str] = {}
    for param in ABLATIONS:
        name = f"ablation_{param}.png"
        grids = find_grids(entries, param)
        if grids:
            write(name, plot_ablation(ctx, param, grids))
            figures[name] = f"Ablation over {param} (Fig. S2): {'; '.join(grids)}"
        else:
            skipped[name] = f"no {param} grid (no loss family has recipes that differ only in {param})"
            log.info("leaderboard: %s skipped: %s", name, skipped[name])
            # a plot left over from an earlier render would describe rows that are no longer here
            (out / name).unlink(missing_ok=True)

    # ============ Markdown ============
    lead, items = legend(ctx, command, dropped)
    md = [f"# {title}", "", lead, "", *(f"- **{k}**: {v}" for k, v in items), ""]
    for setting in SETTINGS:
        before = len(ctx.notes)
        md += TABLES[setting](ctx)
        if len(ctx.notes) > before:
            md += [f"- ⚠ {i}: {ctx.notes[i - 1]}" for i in range(before + 1, len(ctx.notes) + 1)]
            md.append("")
    md += ["## Figures", "", *(f"- [{cap}]({name})" for name, cap in figures.items())]
    md += [f"- `{name}` not drawn: {why}" for name, why in skipped.items()]
    write("LEADERBOARD.md", ("\n".join(md) + "\n").encode())

    # ============ CSV / JSON ============
    recs = records(entries, ctx)
    write("results.csv", _csv(recs, list(recs[0])))
    write("rows.csv", rows_csv(rows))
    prov = provenance(rows)
    prov["checkpoints"] = [list(c) for c in prov["checkpoints"]]
    prov["suites"] = [list(c) for c in prov["suites"]]
    meta = {
        "title": title,
        "command": command,
        "headline_eps": headline_eps,
        "headline_eps_label": eps_label(headline_eps),
        "n_rows": len(rows),
        "duplicates_ignored": dropped,
        "provenance": prov,
        "figures": figures,
        "skipped": skipped,
    }
    write("leaderboard.json", (json.dumps({**meta, "results": recs}, indent=1) + "\n").encode())

    # ============ HTML ============
    columns, table = html_table(entries, ctx)
    page = html.render_page(
        title=title, lead=lead, legend=items, columns=columns, rows=table, images=list(figures.items())
    )
    write("index.html", page.encode())
    return written


def main_leaderboard(
    rows_dir: str | Path, out: str | Path, *, headline_eps: float = HEADLINE_EPS, command: str | None = None
) -> dict[str, Path]:
    """CLI entry: load the rows under ``rows_dir`` and render the leaderboard into ``out``."""
    rows = load_rows(rows_dir)
    validate_rows(rows, source=rows_dir)
    return render_leaderboard(rows, out, headline_eps=headline_eps, command=command)
