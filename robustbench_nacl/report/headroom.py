"""The reference leaderboard's headroom: where each family's SLF in-domain accuracy lies between the
random-init control of the same encoder and budget (0 %) and the supervised baseline (the same
encoder and budget trained with the labels: 100 %), read from what is committed: the result rows
(SLF in-domain clean accuracy, AutoAttack accuracy at the headline ε, the control's probe fit) and
the checkpoints' manifests (kNN accuracy at initialisation and after training).

Per seed pair s (seed s of the family, of the control and of the supervised baseline) the headroom
is ``(family_s - control_s) / (supervised_s - control_s) x 100``; the section gives its mean over the
pairs and a 95 % Student-t interval over them, the board's interval for what varies between
training runs. A ratio is only as good as its denominator: for a metric where, in some seed pair,
the supervised baseline is not above the control by at least :data:`MIN_Z` standard errors of that
difference (:func:`span_floor`), no ratio is given, and the section says which pair fell short; the
points above the control are given for every metric.

:func:`headroom` reads it, :func:`scale` does the arithmetic, :func:`headroom_markdown` writes the
leaderboard README's section (between :data:`BEGIN` and :data:`END`) and :func:`pilot_markdown` the
pilot's learning curves' gains beside it (what more training of the same encoder gave), so every
number there comes from this code.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..results.rows import PROBE_UNDERFIT_GAP
from .fmt import MISSING, fmt_diff, fmt_points, pct
from .fmt import splice as splice_between
from .metrics import n_examples
from .stats import t_interval

BEGIN, END = "<!-- headroom:begin -->", "<!-- headroom:end -->"
SUPERVISED = "supervised"  # the family trained with the labels: the scale's 100 % end
HEADLINE_EPS = 0.032  # the board's headline L∞ ε (readme.MAIN_METRICS)
#: the section's metrics: clean accuracy, and AutoAttack's robust accuracy at the headline ε
METRICS = {"clean": "SLF clean", "autoattack": f"AutoAttack@{HEADLINE_EPS:g}"}
#: standard errors the supervised baseline must clear above the control, in every seed pair, for a
#: ratio: below about two, the denominator is within the noise of 500 test examples
MIN_Z = 2.0


@dataclass(frozen=True)
class Point:
    """One seed's SLF in-domain accuracies (fractions) on ``n`` test examples; ``autoattack`` is None
    without an AutoAttack row at the headline ε."""

    clean: float
    autoattack: float | None
    n: int

    def value(self, metric: str) -> float | None:
        """The accuracy named by ``metric`` (a key of :data:`METRICS`)."""
        return self.clean if metric == "clean" else self.autoattack


@dataclass(frozen=True)
class Family:
    """One family's checkpoints: their kNN accuracy before and after training (means over seeds,
    from the manifests, a ++ entry's before being its parent's; None for the control, which has
    none) and their accuracies per seed."""

    name: str
    seeds: int
    knn_init: float | None
    knn_final: float | None
    by_seed: dict[int, Point]

    @property
    def knn_gain(self) -> float | None:
        """Points of kNN accuracy gained by training."""
        if self.knn_init is None or self.knn_final is None:
            return None
        return 100 * (self.knn_final - self.knn_init)

    def values(self, metric: str) -> dict[int, float]:
        """Seed -> the accuracy named by ``metric``, for the seeds that measured it."""
        return {s: v for s, p in self.by_seed.items() if (v := p.value(metric)) is not None}


@dataclass(frozen=True)
class Span:
    """supervised - control of one metric per seed pair (fractions), and each pair's noise floor."""

    seeds: list[int]
    spans: list[float]
    floors: list[float]

    @property
    def ok(self) -> bool:
        """True when every seed pair's span clears its floor (and 0, where the floor is 0: both at 0
        or 1 accuracy): a ratio over it means something."""
        return bool(self.seeds) and all(
            s >= f and s > 0 for s, f in zip(self.spans, self.floors, strict=True)
        )


@dataclass(frozen=True)
class Scaled:
    """One family's metric against the control: the mean over seed pairs of the points above it
    (fractions) and of the headroom (percent), each with its 95 % t-interval (None with one pair);
    the headroom is None where the span does not allow a ratio."""

    pairs: int
    above: float
    above_ci: tuple[float, float] | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None


@dataclass(frozen=True)
class Headroom:
    """The section's inputs: the trained families (the supervised baseline among them), the control,
    and the control's probe fit ``(seed, probe train accuracy, kNN accuracy)``."""

    families: list[Family]
    control: Family
    control_fit: list[tuple[int, float, float]]

    @property
    def supervised(self) -> Family | None:
        """The supervised baseline, when the manifests hold it."""
        return next((f for f in self.families if f.name == SUPERVISED), None)

    def span(self, metric: str) -> Span:
        """supervised - control of ``metric`` per seed pair, beside :func:`span_floor`."""
        sup = self.supervised.by_seed if self.supervised else {}
        ctl = self.control.by_seed
        got = [
            (s, a, b, min(sup[s].n, ctl[s].n))
            for s in sorted(set(sup) & set(ctl))
            if (a := sup[s].value(metric)) is not None and (b := ctl[s].value(metric)) is not None
        ]
        return Span(
            [s for s, *_ in got], [a - b for _, a, b, _ in got], [span_floor(a, b, n) for _, a, b, n in got]
        )

    def scaled(self, f: Family, metric: str) -> Scaled | None:
        """``f``'s ``metric`` against the control (:func:`scale`); None without a seed pair."""
        sup = self.supervised.values(metric) if self.supervised and self.span(metric).ok else None
        return scale(f.values(metric), self.control.values(metric), sup)


def span_floor(supervised: float, control: float, n: int) -> float:
    """:data:`MIN_Z` binomial standard errors of supervised - control on ``n`` test examples, the
    two accuracies taken as independent (on the same examples they are usually positively
    correlated, so this floor is the stricter one)."""
    return MIN_Z * math.sqrt((supervised * (1 - supervised) + control * (1 - control)) / n)


def _ci(values: Sequence[float]) -> tuple[float, float] | None:
    return t_interval(values) if len(values) >= 2 else None


def scale(
    family: Mapping[int, float], control: Mapping[int, float], supervised: Mapping[int, float] | None
) -> Scaled | None:
    """The arithmetic, per seed pair (the seeds in ``family`` and ``control``, and in ``supervised``
    for the ratio): family - control, and ``(family - control) / (supervised - control) x 100``;
    their means with a 95 % Student-t interval over the pairs. ``supervised`` None: no ratio (the
    caller passes it only over a span that clears its floor, :meth:`Headroom.span`). None when the
    family and the control share no seed."""
    seeds = sorted(set(family) & set(control))
    if not seeds:
        return None
    above = [family[s] - control[s] for s in seeds]
    ratio = ratio_ci = None
    if supervised is not None:
        both = [s for s in seeds if s in supervised]
        ratios = [100 * (family[s] - control[s]) / (supervised[s] - control[s]) for s in both]
        if ratios:
            ratio, ratio_ci = sum(ratios) / len(ratios), _ci(ratios)
    return Scaled(len(seeds), sum(above) / len(above), _ci(above), ratio, ratio_ci)


def read_manifests(folder: str | Path) -> list[dict[str, Any]]:
    """Every ``<id>/manifest.json`` under ``folder`` (a zoo's checkpoints or published models)."""
    paths = sorted(Path(folder).glob("*/manifest.json"))
    if not paths:
        raise UserError(f"no checkpoint manifests (*/manifest.json) under {folder}")
    return [json.loads(p.read_text()) for p in paths]


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def _points(rows: Iterable[Mapping[str, Any]], dataset: str) -> dict[str, tuple[Mapping[str, Any], Point]]:
    """Checkpoint sha256 -> (one of its SLF in-domain rows, its :class:`Point`): the clean accuracy
    (the same in each of its rows) and the robust accuracy of its AutoAttack row at the headline ε,
    the attack the board's in-domain headline is taken over (LEADERBOARD.md's AutoAttack column)."""
    first: dict[str, Mapping[str, Any]] = {}
    aa: dict[str, float] = {}
    for r in rows:
        if r["setting"] != "in-domain" or r["dataset"] != dataset or r.get("finetune"):
            continue
        sha = str(r["checkpoint_sha256"])
        first.setdefault(sha, r)
        if (
            r["attack"] == "autoattack"
            and r["norm"] == "Linf"
            and math.isclose(float(r["eps"]), HEADLINE_EPS)
        ):
            aa[sha] = float(r["robust_acc"])
    return {sha: (r, Point(float(r["clean_acc"]), aa.get(sha), n_examples(r))) for sha, r in first.items()}


def _seed_of(r: Mapping[str, Any]) -> int:
    return int(r.get("train_seed", r["seed"]))


def _by_seed(points: Iterable[tuple[int, Point]]) -> dict[int, Point]:
    """Seed -> Point; two checkpoints of one family and seed (two settings of its parameters, as in
    the tests' small board) are averaged, so each seed pairs once."""
    grouped: dict[int, list[Point]] = defaultdict(list)
    for s, p in points:
        grouped[s].append(p)
    out = {}
    for s, ps in sorted(grouped.items()):
        aas = [p.autoattack for p in ps]
        aa = None if any(a is None for a in aas) else _mean(a for a in aas if a is not None)
        out[s] = Point(_mean(p.clean for p in ps), aa, min(p.n for p in ps))
    return out


def headroom(manifests: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> Headroom:
    """The headroom of the trained checkpoints ``manifests`` describe, measured by ``rows``."""
    datasets = {str(m["dataset"]) for m in manifests}
    if len(datasets) != 1:
        raise UserError(f"the manifests span {len(datasets)} pretraining datasets; give one zoo's")
    points = _points(rows, datasets.pop())
    by_family: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for m in manifests:
        by_family[str(m["loss"])].append(m)
    by_id = {str(m["id"]): m for m in manifests if "id" in m}

    def knn_init(m: Mapping[str, Any]) -> float:
        # a ++ entry starts from its parent's trained weights and records no kNN of its own before:
        # its "before training" is its parent's, the same random initialisation
        if "knn_acc_init" not in m and m.get("post"):
            name = str(m["parent"]["id"])
            if name not in by_id:
                raise UserError(f"{m['id']} is post-processed from {name}: give its manifest too")
            return knn_init(by_id[name])
        return float(m["knn_acc_init"])

    fams = [
        Family(
            family,
            len(ms),
            _mean(knn_init(m) for m in ms),
            _mean(float(m["knn_acc"]) for m in ms),
            _by_seed(
                (int(m["seed"]), points[m["weights_sha256"]][1]) for m in ms if m["weights_sha256"] in points
            ),
        )
        for family, ms in sorted(by_family.items())
    ]
    controls = sorted((r for r, _ in points.values() if r["control"]), key=_seed_of)
    control = Family(
        str(controls[0]["loss"]) if controls else "random-init",
        len(controls),
        None,
        None,
        _by_seed((_seed_of(r), points[str(r["checkpoint_sha256"])][1]) for r in controls),
    )
    return Headroom(
        fams,
        control,
        [  # rows written before probes recorded their fit carry neither field: no verdict for them
            (_seed_of(r), float(r["probe_train_acc"]), float(r["knn_acc"]))
            for r in controls
            if r.get("probe_train_acc") is not None and r.get("knn_acc") is not None
        ],
    )


def _mark(ok: bool | None) -> str:
    return MISSING if ok is None else ("yes" if ok else "**no**")


def _accuracy(f: Family, metric: str) -> str:
    """The mean over seeds, with ``(n=k)`` where fewer of the family's seeds measured it."""
    v = list(f.values(metric).values())
    if not v:
        return MISSING
    return pct(_mean(v)) + (f" (n={len(v)})" if len(v) < f.seeds else "")


def _cells(h: Headroom, f: Family, metric: str) -> list[str]:
    """(accuracy, points above the control, headroom) of one family and metric."""
    if f is h.control:
        return [_accuracy(f, metric), MISSING, "0" if h.span(metric).ok else MISSING]
    s = h.scaled(f, metric)
    if s is None:
        return [_accuracy(f, metric), MISSING, MISSING]
    above = fmt_diff(s.above, *(s.above_ci or (None, None)))
    if s.ratio is None:
        ratio = MISSING
    elif f is h.supervised:
        ratio = "100"  # by construction: each seed pair's ratio is 1
    else:
        lo_hi = f" [{s.ratio_ci[0]:.0f}, {s.ratio_ci[1]:.0f}]" if s.ratio_ci else ""
        ratio = f"{s.ratio:.0f}{lo_hi}"
    return [_accuracy(f, metric), above, ratio]


def _knn(f: Family) -> str:
    if f.knn_init is None or f.knn_final is None or f.knn_gain is None:
        return MISSING
    return f"{pct(f.knn_init)} → {pct(f.knn_final)} ({f.knn_gain:+.1f})"


def _span_line(h: Headroom, metric: str) -> str:
    """Why a metric has a ratio or not: supervised - control per seed pair beside its floor."""
    sp = h.span(metric)
    name = METRICS[metric]
    if not sp.seeds:
        return f"{name}: no seed with both the supervised baseline and the control measured, so no ratio."
    pairs = ", ".join(
        f"seed {s} {fmt_points(d)} (floor {100 * f:.1f})"
        for s, d, f in zip(sp.seeds, sp.spans, sp.floors, strict=True)
    )
    head = f"{name}: supervised − control in points, per seed pair: {pairs}"
    if sp.ok:
        return f"{head}; every pair above its floor, so the ratio is given."
    short = [str(s) for s, d, f in zip(sp.seeds, sp.spans, sp.floors, strict=True) if d < f]
    which = f"seed pair {short[0]} is" if len(short) == 1 else f"seed pairs {', '.join(short)} are"
    return (
        f"{head}; {which} below the floor, so no ratio is given (it would divide by noise): read the "
        "points above the control."
    )


def _extremes(h: Headroom, metric: str) -> str | None:
    """The trained families' (the supervised baseline apart) lowest and highest headroom, or points
    above the control where no ratio is given; None when none is measured."""
    got = [
        (s, f.name) for f in h.families if f is not h.supervised and (s := h.scaled(f, metric)) is not None
    ]
    if not got:
        return None
    if all(s.ratio is not None for s, _ in got):
        (lo, lo_name), (hi, hi_name) = (
            min(got, key=lambda g: g[0].ratio or 0.0),
            max(got, key=lambda g: g[0].ratio or 0.0),
        )
        return f"{METRICS[metric]} headroom from {lo.ratio:.0f} % ({lo_name}) to {hi.ratio:.0f} % ({hi_name})"
    (lo, lo_name), (hi, hi_name) = min(got, key=lambda g: g[0].above), max(got, key=lambda g: g[0].above)
    return (
        f"{METRICS[metric]} from {fmt_points(lo.above)} ({lo_name}) to {fmt_points(hi.above)} ({hi_name}) "
        "points above the control"
    )


def headroom_markdown(h: Headroom) -> str:
    """The leaderboard README's headroom section: the control and the supervised baseline (the scale's
    ends), then one line per trained family; each metric's span against its floor; the control's fit."""
    heads = ["family", "seeds", "kNN: init → trained (gain)"]
    for name in METRICS.values():
        heads += [name, "above the control (points)", "headroom (%)"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    sup = h.supervised
    ordered = [(h.control, f"{h.control.name} control (0 %)")]
    ordered += [(sup, f"{sup.name} (100 %)")] if sup else []
    ordered += [(f, f.name) for f in h.families if f is not sup]
    for f, label in ordered:
        cells = [label, str(f.seeds), _knn(f)]
        for metric in METRICS:
            cells += _cells(h, f, metric)
        lines.append("| " + " | ".join(cells) + " |")
    n = {p.n for f in [h.control, *h.families] for p in f.by_seed.values()}
    legend = (
        "Accuracies in %, means over seeds. Points above the control and headroom: per seed pair (seed s of "
        "the family, of the control and of the supervised baseline), their mean and 95 % Student-t "
        "interval over the pairs; headroom = (family − control) / (supervised − control) × 100. A metric "
        f"gets a headroom only where the supervised baseline is above the control by at least {MIN_Z:g} "
        "standard errors of that difference in every seed pair (its floor: binomial, on the "
        f"{' or '.join(str(x) for x in sorted(n)) or '–'} test examples, the two accuracies taken as "
        "independent)."
    )
    out = ["\n".join(lines), "", legend, ""]
    out += [f"- {_span_line(h, m)}" for m in METRICS]
    ranges = [e for m in METRICS if (e := _extremes(h, m)) is not None]
    if ranges:
        trained = sum(f is not sup for f in h.families)
        out += [
            "",
            f"The {trained} trained families (the supervised baseline apart): " + "; ".join(ranges) + ".",
        ]
    if h.control_fit:
        fits = "; ".join(
            f"seed {s}: probe train {pct(train)}, kNN {pct(knn)} ({100 * (train - knn):+.1f})"
            for s, train, knn in h.control_fit
        )
        ok = all(knn - train <= PROBE_UNDERFIT_GAP for _, train, knn in h.control_fit)
        out += [
            "",
            f"The control's probe is fitted (train accuracy within {100 * PROBE_UNDERFIT_GAP:g} points of "
            f"kNN on the same features, or above it): {_mark(ok)}; {fits}.",
        ]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class PilotRun:
    """One pilot learning curve: (value at initialisation, best value after it, its epoch) of kNN
    and of the quick probe (test accuracies, fractions)."""

    name: str
    epochs: int
    knn: tuple[float, float, int]
    probe: tuple[float, float, int]

    @property
    def gains(self) -> tuple[float, float]:
        """Points gained over initialisation at the best epoch: (kNN, quick probe)."""
        return 100 * (self.knn[1] - self.knn[0]), 100 * (self.probe[1] - self.probe[0])


_CURVE_FIELDS = ("test_knn_acc", "test_probe_acc")


def _best(curve: Sequence[Mapping[str, Any]], key: str) -> tuple[float, float, int]:
    """(value at initialisation, best value after it, the epoch of the best) of ``key``."""
    top = max((r for r in curve[1:] if r.get(key) is not None), key=lambda r: float(r[key]))
    return float(curve[0][key]), float(top[key]), int(top["epoch"])


def pilot_runs(folder: str | Path) -> list[PilotRun]:
    """The pilot runs under ``folder`` (``*/log.jsonl``, the trainer's learning curves, read by
    :func:`.curves.read_log`); a log that does not run from initialisation to a later epoch with kNN
    and the quick probe is a one-line error."""
    from ..training.epoch_log import LOG
    from .curves import read_log

    paths = sorted(Path(folder).glob(f"*/{LOG}"))
    if not paths:
        raise UserError(f"no learning curves (*/{LOG}) under {folder}")
    runs = []
    for path in paths:
        curve = read_log(path)
        ends = (curve[0], curve[-1]) if len(curve) >= 2 else ()
        if not ends or curve[0]["epoch"] != 0 or any(k not in r for k in _CURVE_FIELDS for r in ends):
            raise UserError(
                f"{path} is not a learning curve from initialisation to a later epoch with kNN and the "
                "quick probe (train --knn-every 1 --monitor-probe)"
            )
        runs.append(PilotRun(path.parent.name, curve[-1]["epoch"], *(_best(curve, k) for k in _CURVE_FIELDS)))
    return runs


def pilot_markdown(folder: str | Path) -> str:
    """The pilot runs' table (:func:`pilot_runs`): how far kNN and the quick probe rose above their
    values at initialisation, at their best epoch. It says what more training of the same encoder
    gives, beside the headroom above."""
    lines = [
        "| pilot run | epochs | kNN at init | best kNN (epoch) | gain (points) | quick probe at init "
        "| best quick probe (epoch) | gain (points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs = pilot_runs(folder)
    for r in runs:
        (k0, k1, ke), (p0, p1, pe), (gk, gp) = r.knn, r.probe, r.gains
        lines.append(
            f"| {r.name} | {r.epochs} | {pct(k0)} | {pct(k1)} ({ke}) | {gk:+.1f} | {pct(p0)} | "
            f"{pct(p1)} ({pe}) | {gp:+.1f} |"
        )
    best_knn, best_probe = (max(r.gains[i] for r in runs) for i in (0, 1))
    return "\n".join(lines) + (
        f"\n\nThe largest gains over initialisation in the pilot: kNN {best_knn:+.1f} points, quick "
        f"probe {best_probe:+.1f} points (the trainer's monitor: accuracy on the whole test split).\n"
    )


def splice(text: str, section: str) -> str:
    """``text`` with what lies between the headroom markers replaced by ``section``."""
    return splice_between(text, section, BEGIN, END)
