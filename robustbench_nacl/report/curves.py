"""Learning curves (NaCl Fig. S3 shape) from the trainer's ``log.jsonl``: kNN and quick-probe test
accuracy against training epochs, one line per family (the mean over its seeds, with a band from the
lowest to the highest seed), epoch 0 being the encoder at random initialisation.

``learning_curves.png`` is drawn on an Agg canvas (no display, no global pyplot state) with the
leaderboard figures' palette and direct line labels (:mod:`.plotstyle`); ``learning_curves.csv``
holds every logged point of every run, so each number in the figure can be read back.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import atomic_open
from .plotstyle import FONT, MARKERS, PALETTE, label_line_ends

PNG = "learning_curves.png"
CSV = "learning_curves.csv"
#: the log.jsonl fields the CSV carries (empty where an epoch did not log one)
FIELDS = ("train_loss", "test_knn_acc", "train_probe_acc", "test_probe_acc", "wall_s")
#: the figure's panels: the log field each plots, and its axis label
PANELS = (
    ("test_knn_acc", "weighted kNN test accuracy [%]"),
    ("test_probe_acc", "quick linear probe, test accuracy [%]"),
)
DPI = 100
PANEL_IN = (6.2, 4.6)  # one panel, with the column of line labels on its right (as robust_vs_eps)
LABELS_IN = 1.6


@dataclass(frozen=True)
class CurveRun:
    """One training run's log: ``label`` names its line (the seeds of one recipe share it)."""

    id: str
    label: str
    seed: int
    log: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class CurvePoint:
    """One point of one line: the mean over the seeds that logged ``epoch``, and their range."""

    epoch: int
    mean: float
    lo: float
    hi: float
    n: int


def read_log(path: str | Path) -> tuple[dict[str, Any], ...]:
    """The rows of one ``log.jsonl``; a line that is not a JSON object is a one-line error."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
            raise UserError(f"{path}:{i} is not a log row of the trainer (a JSON object with an epoch)")
        rows.append(row)
    return tuple(rows)


def curve(runs: Sequence[CurveRun], field: str) -> list[CurvePoint]:
    """Mean, lowest and highest value of ``field`` over ``runs`` at each epoch any of them logged it."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for row in run.log:
            if isinstance(row.get(field), (int, float)):
                by_epoch[row["epoch"]].append(float(row[field]))
    return [CurvePoint(e, sum(v) / len(v), min(v), max(v), len(v)) for e, v in sorted(by_epoch.items())]


def lines(runs: Sequence[CurveRun], field: str) -> dict[str, list[CurvePoint]]:
    """One curve per label (sorted by label), for the labels that logged ``field`` at all."""
    groups: dict[str, list[CurveRun]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    out = {label: curve(groups[label], field) for label in sorted(groups)}
    return {label: points for label, points in out.items() if points}


def curve_csv(runs: Sequence[CurveRun]) -> str:
    """Every logged row of every run: id, label, seed, epoch and :data:`FIELDS` (empty when absent)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "label", "seed", "epoch", *FIELDS])
    for run in sorted(runs, key=lambda r: (r.label, r.seed, r.id)):
        for row in run.log:
            writer.writerow([run.id, run.label, run.seed, row["epoch"], *(row.get(f, "") for f in FIELDS)])
    return buf.getvalue()


def _panel(ax: Any, curves: dict[str, list[CurvePoint]], styles: dict[str, int], ylabel: str) -> list[Any]:
    """Draw one panel's lines and bands; returns the line ends to label."""
    ends = []
    for label, points in curves.items():
        i = styles[label]
        color, marker = PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]
        xs = [p.epoch for p in points]
        ax.fill_between(xs, [100 * p.lo for p in points], [100 * p.hi for p in points], color=color,
                        alpha=0.15, lw=0, gid=f"band:{label}")  # fmt: skip
        ax.plot(xs, [100 * p.mean for p in points], color=color, marker=marker, ms=4, lw=1.2,
                gid=f"line:{label}")  # fmt: skip
        ends.append((xs[-1], 100 * points[-1].mean, label, color))
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlabel("training epoch (0: the encoder at random initialisation)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, lw=0.5)
    return ends


def draw_learning_curves(runs: Sequence[CurveRun], title: str = "") -> bytes:
    """``learning_curves.png``: one panel per :data:`PANELS` entry, every line labelled at its end."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(len(PANELS) * PANEL_IN[0], PANEL_IN[1]), dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PANELS), squeeze=False).ravel().tolist()
    w = fig.get_figwidth()
    fig.subplots_adjust(left=0.6 / w, right=1 - LABELS_IN / w, bottom=0.55 / PANEL_IN[1], top=0.8)
    fig.subplots_adjust(wspace=(0.6 + LABELS_IN) / (PANEL_IN[0] - 0.6 - LABELS_IN))
    styles = {label: i for i, label in enumerate(sorted({r.label for r in runs}))}
    seeds = sorted({len([r for r in runs if r.label == label]) for label in styles})
    fig.suptitle(
        (title + "\n" if title else "") + f"mean over {'/'.join(map(str, seeds))} seed(s) per line; "
        "band: lowest to highest seed",
        fontsize=9,
    )
    renderer = canvas.get_renderer()
    for ax, (field, ylabel) in zip(axes, PANELS, strict=True):
        curves = lines(runs, field)
        ends = _panel(ax, curves, styles, ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not curves:  # an honest empty panel rather than a missing one
            ax.text(0.5, 0.5, f"no run logged {field}\n(train with --monitor-probe)", ha="center",
                    va="center", fontsize=FONT + 1, transform=ax.transAxes)  # fmt: skip
        label_line_ends(ax, ends, renderer)
    buf = io.BytesIO()
    # no Software (version) metadata: drawing unchanged logs again writes identical bytes
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def render_curves(runs: Sequence[CurveRun], out: str | Path, title: str = "") -> dict[str, Path]:
    """Write :data:`PNG` and :data:`CSV` into ``out``; returns their paths by name."""
    if not runs:
        raise UserError("no training log to draw: none of the runs asked for has a log.jsonl")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {PNG: draw_learning_curves(runs, title), CSV: curve_csv(runs).encode()}
    for name, data in files.items():
        with atomic_open(out / name, "wb") as f:
            f.write(data)
    return {name: out / name for name in files}
