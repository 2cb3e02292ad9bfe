"""Each recipe against a baseline on the same test examples: difference, interval, McNemar, Holm.

Pairing (see docs/decisions.md, 'Paired significance'): two entries are compared only under one
protocol (same dataset, setting, suite, probe and number of test examples, so the same examples in
the same order), and run s of the candidate is paired with run s of the baseline by (training
seed, evaluation seed, probe seed). Where the two share no seed, runs are paired in sorted seed
order, and the comparison says so. Per pair, McNemar's exact test counts the discordant examples
(``b``: the baseline right and the candidate wrong; ``c``: the reverse); over pairs they are pooled
into one exact test (:func:`.stats.mcnemar_combined`). Rows without per-example outcomes (written
before rows stored them) get a difference and, over two or more seed pairs, its interval, but no
p-value. Holm's correction runs over the comparisons of one leaderboard table, or over every
comparison of one ``compare`` call.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..results.bits import decode_bits
from ..results.rows import SETTINGS, protocol_name
from .aggregate import CONTROL_LABEL, Entry, aggregate, validate_rows
from .context import Context
from .fmt import MISSING, fmt_diff, fmt_p
from .metrics import Run, metric_key, metric_label, metric_name, run_of
from .stats import holm, mcnemar_combined, paired_difference, t_interval
from .tables import Table

NO_BITS = "no per-example outcomes in these rows (written before rows stored them)"


@dataclass(frozen=True)
class Comparison:
    """One candidate against the baseline on one metric under one protocol (accuracies in [0, 1])."""

    setting: str
    dataset: str
    protocol_id: str
    metric: str  # "clean" or an attack_norm_eps stem
    metric_label: str
    baseline: str
    baseline_recipe_id: str
    candidate: str
    candidate_recipe_id: str
    entry_id: str  # the candidate entry's uid (the leaderboard's row id)
    n_examples: int
    n_pairs: int
    pairing: str  # "by seed", or how else the runs were paired
    diff: float | None  # candidate minus baseline accuracy, mean over seed pairs
    lo: float | None
    hi: float | None
    interval: str  # "t over seeds", "wald over examples" or ""
    b: int | None
    c: int | None
    p: float | None
    p_holm: float | None = None
    note: str = ""  # why there is no p-value
    diffs: tuple[float, ...] = ()  # the per-pair differences behind diff (TOST needs them)

    def to_json(self) -> dict[str, Any]:
        """A flat JSON record (None for what could not be computed)."""
        return dataclasses.asdict(self) | {"diffs": list(self.diffs)}  # a list, as JSON reads it back


# ============ outcomes and pairing ============


def outcome(e: Entry, metric: str, run: Run) -> np.ndarray | None:
    """The per-example outcomes of one run on one metric, checked against its accuracy; None if absent."""
    text = e.bits.get(metric, {}).get(run)
    if text is None:
        return None
    n = e.n_examples
    bits = decode_bits(text, n)
    acc = e.values[metric][run]
    if abs(int(bits.sum()) - acc * n) > 0.5:
        raise UserError(
            f"{e.recipe.label()} ({e.setting} {e.dataset}, {metric}, checkpoint sha256 {run[0][:12]}): its "
            f"per-example outcomes count {int(bits.sum())} of {n} but its accuracy is {acc:g}; the row is "
            "corrupt: delete it and re-run its evaluation"
        )
    return bits


def _seed_keys(e: Entry, metric: str) -> dict[tuple, Run]:
    # (training seed, evaluation seed, probe seed) -> run, for the runs that measured the metric
    measured = e.values.get(metric, {})
    keys = {(r.get("train_seed"), r["seed"], r["probe_config"].get("seed")): run_of(r) for r in e.rows}
    return {k: run for k, run in keys.items() if run in measured}


def _seed_text(keys: Iterable[tuple]) -> str:
    keys = sorted(keys, key=str)
    if len({k[1:] for k in keys}) <= 1:  # one evaluation and probe seed: the training seeds say it
        return ", ".join(str(k[0]) for k in keys)
    return ", ".join("/".join(map(str, k)) for k in keys) + " (training/evaluation/probe seed)"


def pair_runs(base: Entry, cand: Entry, metric: str) -> tuple[list[tuple[Run, Run]], str]:
    """(baseline run, candidate run) pairs and how they were paired: by seed, else in sorted seed order."""
    bk, ck = _seed_keys(base, metric), _seed_keys(cand, metric)
    common = sorted(set(bk) & set(ck), key=str)
    if common:
        pairs = [(bk[k], ck[k]) for k in common]
        rest = {who: set(keys) - set(common) for who, keys in (("baseline", bk), ("candidate", ck))}
        lone = [f"{who} {_seed_text(keys)}" for who, keys in rest.items() if keys]
        return pairs, "by seed" + (f"; unpaired seeds: {'; '.join(lone)}" if lone else "")
    bs, cs = sorted(bk, key=str), sorted(ck, key=str)
    pairs = [
        (bk[a], ck[b]) for a, b in zip(bs, cs, strict=False)
    ]  # the longer list's extra runs stay unpaired
    how = f"by sorted seed order (seeds differ: baseline {_seed_text(bs)}; candidate {_seed_text(cs)})"
    return pairs, how if pairs else "no runs to pair"


# ============ one comparison ============


def _difference(
    diffs: list[float], outs: list[tuple[np.ndarray, np.ndarray]] | None
) -> tuple[float | None, float | None, float | None, str]:
    if not diffs:
        return None, None, None, ""
    if len(diffs) >= 2:
        lo, hi = t_interval(diffs)
        return float(np.mean(diffs)), max(-1.0, lo), min(1.0, hi), "t over seeds"
    if outs:
        d, lo, hi, how = paired_difference(outs)
        return d, max(-1.0, lo), min(1.0, hi), how
    return diffs[0], None, None, ""


def compare_entries(base: Entry, cand: Entry, metric: str, label: str = "") -> Comparison:
    """The candidate entry against the baseline entry (same protocol) on one metric."""
    pairs, how = pair_runs(base, cand, metric)
    diffs = [cand.values[metric][c] - base.values[metric][b] for b, c in pairs]
    outs = [(outcome(base, metric, b), outcome(cand, metric, c)) for b, c in pairs]
    have = [(x, y) for x, y in outs if x is not None and y is not None]
    bits = have if pairs and len(have) == len(pairs) else None
    diff, lo, hi, interval = _difference(diffs, bits)
    test = mcnemar_combined(bits) if bits else None
    return Comparison(
        setting=cand.setting,
        dataset=cand.dataset,
        protocol_id=cand.rank_pid,  # the protocol compared under (AFF readings merged, aggregate)
        metric=metric,
        metric_label=label or metric,
        baseline=base.recipe.label(),
        baseline_recipe_id=base.recipe.recipe_id,
        candidate=cand.recipe.label(),
        candidate_recipe_id=cand.recipe.recipe_id,
        entry_id=cand.uid,
        n_examples=cand.n_examples,
        n_pairs=len(pairs),
        pairing=how,
        diff=diff,
        lo=lo,
        hi=hi,
        interval=interval,
        b=None if test is None else test.b,
        c=None if test is None else test.c,
        p=None if test is None else test.p,
        note="" if test is not None else NO_BITS if pairs else how,
        diffs=tuple(diffs),
    )


def with_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with Holm-adjusted p-values over those that have a p-value."""
    adjusted = holm([math.nan if c.p is None else c.p for c in comparisons])
    return [
        dataclasses.replace(c, p_holm=None if math.isnan(a) else a)
        for c, a in zip(comparisons, adjusted, strict=True)
    ]


# ============ the baseline of a protocol ============


def is_family(e: Entry, family: str) -> bool:
    """Whether an entry belongs to a loss family (``random-init`` or the control label: the control)."""
    return (
        e.recipe.loss == family or e.recipe.family == family or (family == CONTROL_LABEL and e.recipe.control)
    )


def select_baseline(
    entries: Sequence[Entry], family: str, recipe: str | None = None, *, where: str = "", strict: bool = True
) -> tuple[Entry | None, str]:
    """The baseline entry among one protocol's entries, and a note on how it was chosen.

    ``recipe`` (a recipe id prefix, or the exact key parameters) picks among several recipes of the
    family; without it, the one recipe with the family's default key parameters is taken and
    named. Several recipes and no way to choose: a one-line UserError naming them (``strict``), or
    no baseline and a note saying why.
    """
    cands = [e for e in entries if is_family(e, family)]
    if recipe is not None:
        cands = [e for e in cands if e.recipe.recipe_id.startswith(recipe) or e.recipe.key_params == recipe]
    if len(cands) <= 1:
        return (cands[0] if cands else None), ""
    plain = [e for e in cands if not e.recipe.key_params]
    if recipe is None and len(plain) == 1:
        chosen = plain[0].recipe.recipe_id
        return plain[0], f"{where}: baseline {family} is its recipe with default key parameters ({chosen})"
    names = "; ".join(
        f"{e.recipe.recipe_id} ({e.recipe.key_params or e.recipe.differs or 'defaults'})" for e in cands
    )
    msg = (
        f"--baseline {family}: {len(cands)} recipes of {family}{where and ' in ' + where}: {names}; "
        "choose one with --baseline-recipe RECIPE_ID (a prefix will do) or its exact key parameters"
    )
    if strict:
        raise UserError(msg)
    return None, msg


def protocol_comparisons(
    entries: Sequence[Entry], baseline: Entry, metrics: Iterable[str], keys: Iterable[tuple] = ()
) -> list[Comparison]:
    """Every other entry of one protocol against the baseline, on each of ``metrics`` both measured."""
    keys = list(keys)
    out = []
    for metric in metrics:
        label = metric_label(metric, keys)
        for e in sorted(entries, key=lambda x: x.recipe.label()):
            if e is not baseline and metric in e.values and metric in baseline.values:
                out.append(compare_entries(baseline, e, metric, label))
    return out


def pairing_notes(comps: Sequence[Comparison], where: str) -> list[str]:
    """One line per way of pairing other than plain "by seed", e.g. ``in-domain digits:0-4: 14 of 16
    comparisons paired by seed; unpaired seeds: baseline 1``."""
    ways: dict[str, list[str]] = defaultdict(list)
    for c in comps:
        if c.pairing != "by seed":
            ways[c.pairing].append(c.candidate)
    out = []
    for how, names in sorted(ways.items()):
        who = f" ({', '.join(names)})" if len(names) <= 3 else ""
        out.append(f"{where}: {len(names)} of {len(comps)} comparisons paired {how}{who}")
    return out


# ============ the leaderboard's column ============

#: The baseline of the leaderboard's Δ column when none is named: SimCLR, the papers' baseline.
AUTO_BASELINE = "simclr"


def attach_comparisons(ctx: Context, baseline: str | None = None, baseline_recipe: str | None = None) -> None:
    """Compare every entry of each in-domain and transfer table with the table's baseline on the
    table's ranking metric (Holm over the table), into ``ctx.comparisons``.

    ``baseline`` None: SimCLR where present, silently absent otherwise; ``"none"``: no column; a
    family named but measured nowhere: a one-line UserError.
    """
    auto = baseline is None
    family = AUTO_BASELINE if auto else str(baseline).strip()
    if family.lower() in ("", "none"):
        return
    if not any(is_family(e, family) for e in ctx.entries):
        if auto:
            return
        have = ", ".join(sorted({e.recipe.loss for e in ctx.entries}))
        raise UserError(f"--baseline {family}: no rows of that loss family; families here: {have}")
    ctx.baseline_family = family
    for t in ctx.tables:
        if t.setting in ("shift", "corruption"):  # ranked by means over variants: `compare` tests each
            continue
        where = f"{t.setting} {t.dataset}" + (f" ({t.note})" if t.note else "")
        base, note = select_baseline(t.entries, family, baseline_recipe, where=where, strict=not auto)
        ctx.compare_notes += [note] if note else []
        if base is None:
            continue
        comps = with_holm(protocol_comparisons(t.entries, base, [t.rank_metric], t.metric_keys))
        ctx.comparisons |= {c.entry_id: c for c in comps}
        ctx.baselines[t.key] = base.uid
        ctx.compare_notes += pairing_notes(comps, where)
    if baseline_recipe is not None and not ctx.baselines:
        raise UserError(f"--baseline-recipe {baseline_recipe}: no recipe of {family} in any table matches it")


def table_delta(ctx: Context, table: Table, e: Entry) -> Comparison | str | None:
    """What the Δ column shows for ``e``: None where its table has no baseline, ``"baseline"`` for
    the baseline itself, ``–`` where nothing was compared, else the comparison."""
    if table.key not in ctx.baselines:
        return None
    if ctx.baselines[table.key] == e.uid:
        return "baseline"
    c = ctx.comparisons.get(e.uid)
    return MISSING if c is None or c.diff is None else c


# ============ robustbench-nacl compare ============


@dataclass
class CompareResult:
    """What ``compare`` found: the comparisons (Holm over all of them) and one-line notes."""

    baseline: str
    comparisons: list[Comparison]
    notes: list[str]
    finetune: dict[str, str] = dataclasses.field(default_factory=dict)  # protocol_id -> slf | alf | aff


def _where(e: Entry) -> str:
    return f"{e.setting} {e.dataset} (protocol {e.rank_pid[:8]})"


def compare(rows: Sequence[Any], baseline: str, *, baseline_recipe: str | None = None) -> CompareResult:
    """Every recipe against ``baseline`` (a loss family) under each protocol, on clean accuracy and
    on every attack and ε both measured; Holm-adjusted over all the comparisons returned."""
    entries, _ = aggregate(validate_rows(rows))
    if not any(is_family(e, baseline) for e in entries):
        families = sorted({e.recipe.loss for e in entries})
        raise UserError(
            f"--baseline {baseline}: no rows of that loss family; families here: {', '.join(families)}"
        )
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.rank_pid].append(e)
    order = {s: i for i, s in enumerate(SETTINGS)}
    comps, notes = [], []
    for group in sorted(groups.values(), key=lambda g: (order[g[0].setting], g[0].dataset, g[0].rank_pid)):
        base, note = select_baseline(group, baseline, baseline_recipe, where=_where(group[0]))
        notes += [note] if note else []
        if base is None:
            which = " of that recipe" if baseline_recipe else ""
            notes.append(f"{_where(group[0])}: no {baseline} rows{which}; not compared")
            continue
        keys = sorted({metric_key(r) for e in group for r in e.rows})
        comps += protocol_comparisons(group, base, ["clean", *(metric_name(*k) for k in keys)], keys)
    if baseline_recipe is not None and not comps:
        raise UserError(f"--baseline-recipe {baseline_recipe}: no recipe of {baseline} matches it")
    comps = with_holm(comps)
    for pid in dict.fromkeys(c.protocol_id for c in comps):
        group = [c for c in comps if c.protocol_id == pid]
        notes += pairing_notes(group, f"{group[0].setting} {group[0].dataset} (protocol {pid[:8]})")
    names = {e.rank_pid: protocol_name(e.rows[0]) for e in entries}
    return CompareResult(baseline, comps, notes, names)


# ============ output ============


def format_compare(result: CompareResult) -> str:
    """The comparisons as a text table with a legend and notes (what ``compare`` prints)."""
    from tabulate import tabulate

    m = sum(c.p is not None for c in result.comparisons)
    head = [
        f"Each recipe against {result.baseline} on the same test examples, per protocol.",
        "Δ: candidate minus baseline accuracy in points, with its 95 % interval (t over seed pairs where "
        "there are two or more, Wald over the test examples for one).",
        "p: McNemar's exact test, discordant examples pooled over seed pairs; p (Holm): adjusted over "
        f"the {m} tests below; * p (Holm) < 0.05; –: {NO_BITS}.",
        "",
    ]
    body = [
        [c.setting, c.dataset, c.metric_label, c.candidate, str(c.n_pairs), fmt_diff(c.diff, c.lo, c.hi),
         fmt_p(c.p), fmt_p(c.p_holm) + (" *" if c.p_holm is not None and c.p_holm < 0.05 else "")]
        for c in result.comparisons
    ]  # fmt: skip
    heads = ["setting", "dataset", "metric", "candidate", "seed pairs", "Δ [95 % interval]", "p", "p (Holm)"]
    if set(result.finetune.values()) - {"slf"}:  # several finetuning protocols: say which line is which
        heads.insert(2, "protocol")
        for line, c in zip(body, result.comparisons, strict=True):
            line.insert(2, result.finetune.get(c.protocol_id, "slf").upper())
    table = (
        tabulate(body, headers=heads, tablefmt="github", disable_numparse=True)
        if body
        else "(nothing compared)"
    )
    return (
        "\n".join([*head, table, *([""] + [f"- {n}" for n in result.notes] if result.notes else [])]) + "\n"
    )


def compare_json(result: CompareResult) -> dict[str, Any]:
    """The comparisons as JSON: each with its discordant counts ``b``, ``c`` and ``p``."""
    return {
        "baseline": result.baseline,
        "n_tests": sum(c.p is not None for c in result.comparisons),
        "comparisons": [c.to_json() for c in result.comparisons],
        "protocols": result.finetune,  # protocol_id -> slf | alf | aff: which comparison is which
        "notes": result.notes,
    }


def main_compare(
    rows_dirs: Sequence[str | Path] | str | Path,
    baseline: str,
    *,
    baseline_recipe: str | None = None,
    as_json: bool = False,
) -> str:
    """CLI entry: load the rows of every directory and return what ``compare`` prints."""
    import json

    from .sources import load_dirs, pooled

    rows = pooled(load_dirs(rows_dirs))
    result = compare(rows, baseline, baseline_recipe=baseline_recipe)
    return json.dumps(compare_json(result), indent=1) + "\n" if as_json else format_compare(result)
