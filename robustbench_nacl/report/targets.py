"""The reference leaderboard's training targets, read from what is committed: the checkpoints'
manifests (kNN accuracy at initialisation and after training) and the result rows (SLF in-domain
clean accuracy and the probe's fit). docs/decisions.md, "Reference leaderboard":

- every trained family's kNN accuracy at least ``GAIN`` points above its value at initialisation;
- every trained family's SLF in-domain clean accuracy at least ``GAIN`` points above the
  random-init control's (whose probe is fitted: next point);
- the control's linear probe fitted: its train accuracy within ``GAIN`` points of the kNN accuracy
  on the same features.

:func:`targets` computes them, :func:`targets_markdown` writes the leaderboard README's section
(between :data:`BEGIN` and :data:`END`) and :func:`pilot_markdown` the pilot's gains
(:func:`pilot_runs`) beside it
(what more training of the same encoder gave), so every number there comes from this code.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from .fmt import pct
from .fmt import splice as splice_between

GAIN = 10.0  # points
BEGIN, END = "<!-- targets:begin -->", "<!-- targets:end -->"


@dataclass(frozen=True)
class FamilyTarget:
    """One trained family's means over its seeds (accuracies as fractions)."""

    family: str
    seeds: int
    knn_init: float
    knn_final: float
    clean: float | None  # SLF in-domain clean accuracy; None: no such rows yet

    @property
    def knn_gain(self) -> float:
        """Points of kNN accuracy gained by training."""
        return 100 * (self.knn_final - self.knn_init)


@dataclass(frozen=True)
class Targets:
    """The three targets' inputs and verdicts."""

    families: list[FamilyTarget]
    control_clean: float | None  # the controls' mean SLF in-domain clean accuracy
    control_fit: list[tuple[int, float, float]]  # (seed, probe train acc, kNN acc) per control

    def above_control(self, f: FamilyTarget) -> float | None:
        """Points of SLF in-domain clean accuracy above the control's."""
        if f.clean is None or self.control_clean is None:
            return None
        return 100 * (f.clean - self.control_clean)


def read_manifests(folder: str | Path) -> list[dict[str, Any]]:
    """Every ``<id>/manifest.json`` under ``folder`` (a zoo's checkpoints or published models)."""
    paths = sorted(Path(folder).glob("*/manifest.json"))
    if not paths:
        raise UserError(f"no checkpoint manifests (*/manifest.json) under {folder}")
    return [json.loads(p.read_text()) for p in paths]


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def _slf_in_domain(rows: Iterable[Mapping[str, Any]], dataset: str) -> list[Mapping[str, Any]]:
    """One SLF in-domain row per checkpoint (clean accuracy and probe fit are the same in each)."""
    first: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if r["setting"] == "in-domain" and r["dataset"] == dataset and not r.get("finetune"):
            first.setdefault(str(r["checkpoint_sha256"]), r)
    return list(first.values())


def targets(manifests: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> Targets:
    """The targets of the trained checkpoints ``manifests`` describe, measured by ``rows``."""
    datasets = {str(m["dataset"]) for m in manifests}
    if len(datasets) != 1:
        raise UserError(f"the manifests span {len(datasets)} pretraining datasets; give one zoo's")
    slf = _slf_in_domain(rows, datasets.pop())
    clean_of = {str(r["checkpoint_sha256"]): float(r["clean_acc"]) for r in slf if not r["control"]}
    by_family: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for m in manifests:
        by_family[str(m["loss"])].append(m)
    fams = []
    for family, ms in sorted(by_family.items()):
        cleans = [clean_of[m["weights_sha256"]] for m in ms if m["weights_sha256"] in clean_of]
        fams.append(
            FamilyTarget(
                family,
                len(ms),
                _mean(float(m["knn_acc_init"]) for m in ms),
                _mean(float(m["knn_acc"]) for m in ms),
                _mean(cleans) if len(cleans) == len(ms) else None,
            )
        )
    controls = sorted((r for r in slf if r["control"]), key=lambda r: int(r["seed"]))
    return Targets(
        fams,
        _mean(float(r["clean_acc"]) for r in controls) if controls else None,
        [  # rows written before probes recorded their fit carry neither field: no verdict for them
            (int(r["seed"]), float(r["probe_train_acc"]), float(r["knn_acc"]))
            for r in controls
            if r.get("probe_train_acc") is not None and r.get("knn_acc") is not None
        ],
    )


def _mark(ok: bool | None) -> str:
    return "–" if ok is None else ("yes" if ok else "**no**")


def targets_markdown(t: Targets) -> str:
    """The leaderboard README's targets section: one table line per family, then the control."""
    lines = [
        f"| family | seeds | kNN at init | kNN trained | gain (points) | ≥ {GAIN:g}? | SLF clean in-domain "
        f"| above the control (points) | ≥ {GAIN:g}? |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in t.families:
        above = t.above_control(f)
        gap, ok = ("–", None) if above is None else (f"{above:+.1f}", above >= GAIN)
        lines.append(
            f"| {f.family} | {f.seeds} | {pct(f.knn_init)} | {pct(f.knn_final)} | {f.knn_gain:+.1f} | "
            f"{_mark(f.knn_gain >= GAIN)} | {pct(f.clean)} | {gap} | {_mark(ok)} |"
        )
    n_knn = sum(f.knn_gain >= GAIN for f in t.families)
    measured = [a for f in t.families if (a := t.above_control(f)) is not None]
    n_clean = sum(a >= GAIN for a in measured)
    out = [
        "\n".join(lines),
        "",
        f"kNN gain of at least {GAIN:g} points: {n_knn} of {len(t.families)} families; SLF in-domain clean "
        f"accuracy at least {GAIN:g} points above the control's "
        f"({pct(t.control_clean) if t.control_clean is not None else '–'}): {n_clean} of {len(measured)} "
        "families measured.",
    ]
    if t.control_fit:
        fits = "; ".join(
            f"seed {s}: probe train {pct(train)}, kNN {pct(knn)} ({100 * (train - knn):+.1f})"
            for s, train, knn in t.control_fit
        )
        ok = all(knn - train <= GAIN / 100 for _, train, knn in t.control_fit)
        out += [
            "",
            f"The control's probe is fitted (train accuracy within {GAIN:g} points of kNN on the same "
            f"features, or above it): {_mark(ok)}; {fits}.",
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
    gives, beside the targets above."""
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
    """``text`` with what lies between the targets markers replaced by ``section``."""
    return splice_between(text, section, BEGIN, END)
