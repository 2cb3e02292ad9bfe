"""What every renderer shares: the :class:`Context` of a leaderboard (its entries, tables, numbered
sanity footnotes and comparisons), the footnote of runs at chance under a corruption, and the
helpers that list distinct values and provenance."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..results.eps import eps_label
from ..results.rows import ResultRow
from .aggregate import Entry, Recipe
from .metrics import metric_name, n_examples
from .tables import Table, build_tables

HEADLINE_EPS = 0.002


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
