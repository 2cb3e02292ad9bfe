"""The label-free protocol's table and its reading beside SLF AutoAttack (no torch).

Label-free rows (results/label_free.py) are left out of the ranked SLF / ALF / AFF tables: their
numbers are not accuracies of a classifier. They get a section of their own: per dataset and
protocol, each recipe's measures at the largest eps the rows share (mean over seeds with a 95 %
t-interval; one seed: Wilson over examples for a fraction, t over examples for a mean; each
interval clipped to its measure's range), then a paragraph generated from the rows: Spearman's rho
between each measure and SLF AutoAttack at that eps across recipes, with a seed-bootstrap interval
(each recipe's runs resampled with replacement, the label-free and the AutoAttack reading of a run
kept together), and the recipes whose ranks differ most. The reference README's ``label-free``
section is the same text (report/readme.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..results.label_free import MEASURES, is_label_free, per_example
from ..results.rows import ResultRow, protocol_name
from .aggregate import Recipe, aggregate
from .fmt import MISSING, fmt_stat
from .stats import Stat

MARKERS = ("<!-- label-free:begin -->", "<!-- label-free:end -->")
#: the head-based number the measures are read against: SLF AutoAttack (L-inf) in-domain
REFERENCE = ("autoattack", "Linf")
#: the eps of the reading when the rows have it (the board's headline), else their largest
HEADLINE = 0.032
BOOTSTRAP = 2000  # seed-bootstrap resamples
BOOTSTRAP_SEED = 0

Run = tuple[str, int]  # (checkpoint sha256, evaluation seed): a label-free run and its SLF partner


@dataclass
class Line:
    """One recipe's label-free runs (measure -> run -> value) and its SLF AutoAttack per run."""

    recipe: Recipe
    values: dict[str, dict[Run, float]] = field(default_factory=dict)
    n_examples: int = 0
    per_example: dict[str, list[np.ndarray]] = field(default_factory=dict)  # one run: the examples
    reference: dict[Run, float] = field(default_factory=dict)


def _run(r: Mapping[str, Any]) -> Run:
    return (str(r["checkpoint_sha256"]), int(r["seed"]))


def _eps_of(rows: Sequence[ResultRow]) -> float:
    """The headline eps when every recipe measured it, else the largest they share."""
    by: dict[str, set[float]] = defaultdict(set)
    for r in rows:
        by[r.recipe_id].add(round(float(r.eps), 12))
    common = set.intersection(*by.values()) if by else set()
    hit = [e for e in common if math.isclose(e, HEADLINE, abs_tol=1e-9)]
    return hit[0] if hit else max(common, default=HEADLINE)


def lines(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[float, list[Line]]]:
    """(dataset, protocol id) -> (eps read, one :class:`Line` per recipe) of the label-free rows,
    each line with the in-domain SLF AutoAttack of its runs at that eps where the rows hold it."""
    typed = [ResultRow.from_json(r) for r in rows]
    lf = [r for r in typed if is_label_free(r)]
    entries, _ = aggregate(lf) if lf else ([], 0)
    # (dataset, recipe id, eps) -> run -> SLF AutoAttack in-domain
    reference: dict[tuple[str, str, float], dict[Run, float]] = defaultdict(dict)
    for r in typed:
        if protocol_name(r) == "slf" and r.setting == "in-domain" and (r.attack, r.norm) == REFERENCE:
            key = (r.dataset, r.recipe_id, round(float(r.eps), 12))
            reference[key].setdefault(_run(r), r.robust_acc)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for e in entries:
        groups[(e.dataset, e.protocol_id)].append(e)
    out: dict[tuple[str, str], tuple[float, list[Line]]] = {}
    for group_key, group in groups.items():
        eps = _eps_of([r for e in group for r in e.rows])
        found = []
        for e in group:
            line = Line(e.recipe, n_examples=e.n_examples)
            at_eps = [r for r in e.rows if math.isclose(float(r.eps), eps, abs_tol=1e-12)]
            for name in MEASURES:
                measure = MEASURES.get(name)
                for r in (r for r in at_eps if r.attack == measure.attack):
                    value = measure.read(r)
                    if value is None:
                        continue
                    line.values.setdefault(name, {})[_run(r)] = value
                    if measure.key is not None:
                        vals = per_example(r, measure.key)
                        line.per_example.setdefault(name, []).append(vals[~np.isnan(vals)])
            line.reference = dict(reference.get((e.dataset, e.recipe.recipe_id, round(eps, 12)), {}))
            found.append(line)
        out[group_key] = (eps, sorted(found, key=lambda x: x.recipe.label()))
    return out


def stat(line: Line, name: str) -> Stat:
    """A measure's statistics over a recipe's runs (see the module docstring for one run)."""
    measure = MEASURES.get(name)
    values = list(line.values.get(name, {}).values())
    if not values:
        return Stat(None, None, 0)
    if measure.fraction:
        return Stat.of(values, line.n_examples)
    if len(values) > 1:
        return Stat.of(values, bounds=measure.bounds)
    mean = float(np.mean(values))
    examples = line.per_example.get(name, [])
    if examples and len(examples[0]) > 1:
        over_examples = Stat.of(examples[0], bounds=measure.bounds)
        return Stat(mean, None, 1, over_examples.lo, over_examples.hi, "t over examples")
    return Stat(mean, None, 1)


def fmt_measure(name: str, s: Stat) -> str:
    """A fraction in percent (:func:`.fmt.fmt_stat`), a mean to three decimals, each with its interval."""
    if MEASURES.get(name).fraction or s.mean is None:
        return fmt_stat(s)
    ci = f" [{s.lo:.3f}, {s.hi:.3f}]" if s.lo is not None and s.hi is not None else ""
    return f"{s.mean:.3f}{ci}"


# ============ Spearman's rho with a seed-bootstrap interval ============


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho (Pearson on average ranks); nan when either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _rows_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`spearman` of each row pair of two (resamples, recipes) arrays."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra, rb = ra - ra.mean(axis=1, keepdims=True), rb - rb.mean(axis=1, keepdims=True)
    den = np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(axis=1) / np.where(den > 0, den, 1), np.nan)


@dataclass(frozen=True)
class Correlation:
    """One measure against the reference across recipes."""

    measure: str
    rho: float
    lo: float
    hi: float
    n_recipes: int
    # recipe label -> (rank by the measure, rank by the reference), 1 = most robust
    ranks: dict[str, tuple[float, float]]


def _paired(found: list[Line], names: Sequence[str]) -> list[tuple[str, list[np.ndarray]]]:
    """Per recipe whose runs hold every measure of ``names`` and the reference: its label and, over
    those runs (sorted), one array per measure (oriented: higher = more robust), the reference last."""
    out = []
    for line in found:
        runs = sorted(set(line.reference).intersection(*(line.values.get(n, {}) for n in names)))
        if runs:
            cols = [np.array([MEASURES.get(n).sign * line.values[n][r] for r in runs]) for n in names]
            out.append((line.recipe.label(), [*cols, np.array([line.reference[r] for r in runs])]))
    return out


def _resampled_means(paired: list[tuple[str, list[np.ndarray]]], b: int, seed: int) -> list[np.ndarray]:
    """``b`` seed-bootstrap resamples at once: per recipe, its runs drawn with replacement (every
    column of a run together); one (b, recipes) array of resampled means per column."""
    rng = np.random.default_rng(seed)
    out = [np.empty((b, len(paired))) for _ in paired[0][1]]
    for k, (_, cols) in enumerate(paired):
        pick = rng.integers(0, len(cols[0]), (b, len(cols[0])))
        for o, c in zip(out, cols, strict=True):
            o[:, k] = c[pick].mean(axis=1)
    return out


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    draws = draws[~np.isnan(draws)]
    lo, hi = np.percentile(draws, [2.5, 97.5]) if len(draws) else (math.nan, math.nan)
    return float(lo), float(hi)


def correlation(
    found: list[Line], name: str, *, b: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED
) -> Correlation | None:
    """rho between ``name`` (oriented: higher = more robust) and the reference over the recipes
    whose runs have both, with the 2.5 / 97.5 percentiles of ``b`` seed-bootstrap resamples."""
    paired = _paired(found, [name])
    if len(paired) < 3:
        return None
    means = [np.array([cols[k].mean() for _, cols in paired]) for k in (0, 1)]
    rho = spearman(means[0], means[1])
    if math.isnan(rho):
        return None
    lo, hi = _percentiles(_rows_spearman(*_resampled_means(paired, b, seed)))
    rm, ra = (len(paired) + 1 - _ranks(m) for m in means)
    ranks = {label: (float(x), float(y)) for (label, _), x, y in zip(paired, rm, ra, strict=True)}
    return Correlation(name, rho, lo, hi, len(paired), ranks)


def rho_difference(
    found: list[Line], first: str, second: str, *, b: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float, float] | None:
    """rho(``first``) - rho(``second``) against the reference over the recipes whose runs have both
    measures and the reference, with the 2.5 / 97.5 percentiles over ``b`` seed-bootstrap resamples
    that draw the same runs for both measures (a paired interval: the two rhos' own intervals can
    overlap while the interval of their difference excludes 0)."""
    paired = _paired(found, [first, second])
    if len(paired) < 3:
        return None
    m1, m2, ref = ([cols[k].mean() for _, cols in paired] for k in range(3))
    diff = spearman(m1, ref) - spearman(m2, ref)
    if math.isnan(diff):
        return None
    r1, r2, refs = _resampled_means(paired, b, seed)
    lo, hi = _percentiles(_rows_spearman(r1, refs) - _rows_spearman(r2, refs))
    return float(diff), lo, hi


def _rank(x: float) -> str:
    return f"{x:g}"


def paragraph(found: list[Line], eps: float, dataset: str) -> str:
    """The generated reading: which measure ranks the recipes most like SLF AutoAttack, and where
    the two disagree. Every number is computed here from the rows."""
    corr = [c for m in MEASURES if (c := correlation(found, m)) is not None]
    if not corr:
        return (
            f"No correlation with SLF AutoAttack at {eps:g} on {dataset}: fewer than 3 recipes have both "
            "readings (label-free rows and SLF AutoAttack rows of the same checkpoints and seeds)."
        )
    corr.sort(key=lambda c: (-c.rho, c.measure))
    best = corr[0]
    label = MEASURES.get(best.measure).label
    text = (
        f"Across the {best.n_recipes} recipes with both readings on {dataset}, the label-free measure at "
        f"ε = {eps:g} that ranks them most like SLF AutoAttack at {eps:g} is {label}: Spearman's "
        f"ρ = {best.rho:.2f} [{best.lo:.2f}, {best.hi:.2f}] (95 % seed-bootstrap interval, {BOOTSTRAP} "
        "resamples of each recipe's seeds)."
    )
    if len(corr) > 1:
        rest = "; ".join(
            f"{MEASURES.get(c.measure).label} {c.rho:.2f} [{c.lo:.2f}, {c.hi:.2f}]" for c in corr[1:]
        )
        text += f" The others, by ρ: {rest}."
        apart, close = [], []
        for c in corr[1:]:
            d = rho_difference(found, best.measure, c.measure)
            if d is None:
                continue
            cell = f"{MEASURES.get(c.measure).label} ({d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}])"
            (apart if d[1] > 0 else close).append(cell)
        if close:
            text += (
                f" Paired on the same resamples, {label}'s ρ is not told apart (the 95 % interval of the "
                f"difference reaches 0) from {'; '.join(close)}"
            )
            text += f"; it is above {'; '.join(apart)}." if apart else "."
        elif apart:
            text += (
                f" Paired on the same resamples, {label}'s ρ is above every other's (the 95 % interval "
                f"of each difference excludes 0): {'; '.join(apart)}."
            )
    gaps = {k: v[1] - v[0] for k, v in best.ranks.items()}  # > 0: better in the representation
    up = max(gaps, key=lambda k: (gaps[k], k))
    down = min(gaps, key=lambda k: (gaps[k], k))
    if gaps[up] <= 0 and gaps[down] >= 0:
        return text + f" The two rank every recipe alike ({label} against SLF AutoAttack)."
    n = best.n_recipes
    if gaps[up] > 0:
        m, a = best.ranks[up]
        text += (
            f" Where they disagree most: {up} ranks {_rank(m)} of {n} by {label} but {_rank(a)} by SLF "
            "AutoAttack (robust in the representation, not through the probe)"
        )
    if gaps[down] < 0:
        m, a = best.ranks[down]
        joint = "; " if gaps[up] > 0 else " Where they disagree most: "
        text += (
            f"{joint}{down} ranks {_rank(m)} by {label} but {_rank(a)} by SLF AutoAttack (robust "
            "through the probe, not in the representation)"
        )
    return text + "."


def markdown_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Markdown of the label-free section (none without label-free rows)."""
    found = lines(rows)
    if not found:
        return []
    label_free = [r for r in rows if is_label_free(r)]
    n_runs = len({str(r["checkpoint_sha256"]) for r in label_free})
    md = [
        "## Label-free robustness (the representation attacked, no head)",
        "",
        "Sign-PGD on the frozen encoder's embedding (docs/decisions.md, 'Label-free robustness'): "
        "self-retrieval, impersonation and no-overlap in % of examples, the others means per example; "
        "95 % intervals (t over seeds; one seed: Wilson or t over examples), clipped to each measure's "
        "range (cosine to [-1, 1], quantile and breakaway to [0, 1]). Higher is more robust "
        f"except for distance, quantile and breakaway. From {len(label_free)} label-free rows of {n_runs} "
        f"encoder{'s' if n_runs != 1 else ''}, apart from the rows of the accuracy tables.",
        "",
    ]
    for (dataset, _), (eps, group) in found.items():
        names = [m for m in MEASURES if any(m in line.values for line in group)]
        md += [f"### label-free · {dataset} · ε = {eps:g}", ""]
        md.append("| family | " + " | ".join(MEASURES.get(m).label for m in names) + " | runs |")
        md.append("|" + "---|" * (len(names) + 2))
        for line in group:
            cells = [fmt_measure(m, stat(line, m)) if m in line.values else MISSING for m in names]
            n = max((len(v) for v in line.values.values()), default=0)
            md.append(f"| {line.recipe.label()} | " + " | ".join(cells) + f" | {n} |")
        md += ["", paragraph(group, eps, dataset), ""]
    return md


def readme_section(rows: Sequence[Mapping[str, Any]]) -> str:
    """The reference README's ``label-free`` section: :func:`markdown_section` without its heading,
    or one line saying the board has no label-free rows yet."""
    md = markdown_section(rows)
    if not md:
        return (
            "The board has no label-free rows yet: `robustbench-nacl zoo eval --zoo fashion-mnist "
            "--protocol label-free` adds them (see 'Regenerating it').\n"
        )
    return "\n".join(md[2:]).rstrip() + "\n"
