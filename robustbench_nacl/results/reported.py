"""The field's published numbers as data (``robustbench_nacl/files/reported/``): reading a reported
set and placing a measured accuracy among its entries, without torch, so a renderer or a model card
can use them (docs/decisions.md, 'Reported numbers beside measured rows').

A reported entry is never a result row: it has no interval, no seeds and no per-example outcomes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from ..errors import UserError
from ..registry import unknown_choice

#: ``--reported`` names -> their data file under files/reported/
REPORTED_SETS = {"robustssl": "robustssl.json"}
AA_EPS = 8 / 255  # the benchmark's AutoAttack budget (Linf)
#: board datasets -> the benchmark's name for them (its CIFAR -> STL-10 transfer is at 32 pixels)
BENCHMARK_DATASET = {"cifar10": "cifar10", "cifar100": "cifar100", "stl10": "stl10", "stl10-32": "stl10"}


@dataclass(frozen=True)
class Reported:
    """One reported line: a method's numbers for one (pretraining, evaluated dataset, protocol)."""

    method: str
    pretrain_dataset: str
    dataset: str
    protocol: str  # slf | alf | aff
    finetuning: str  # vanilla | autolora
    values: dict[str, float]  # autoattack, corruption, clean (in %)
    source: dict[str, str]  # repository, file, commit
    row: int
    comment: str = ""
    flags: dict[str, list[str]] = field(default_factory=dict)
    copied: str = ""
    venue: str = ""

    def value(self, metric: str) -> float | None:
        """The number as a measurement: None where the source's cell is no measurement (0)."""
        v = self.values.get(metric)
        return None if v is None or "zero" in self.flags.get(metric, []) else v


def load_reported(name: str) -> list[Reported]:
    """The entries of the reported set ``name`` (a one-line UserError for an unknown or bad one)."""
    if name not in REPORTED_SETS:
        raise unknown_choice("reported set", name, REPORTED_SETS)
    path = files("robustbench_nacl") / "files" / "reported" / REPORTED_SETS[name]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        papers = data.get("papers", {})
        return [
            Reported(
                **{k: v for k, v in e.items() if k in Reported.__dataclass_fields__},
                venue=papers.get(e["method"], {}).get("venue", ""),
            )
            for e in data["entries"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"the reported set {name} ({path}) is unreadable: {e}") from None


def placement(value: float, reported: Sequence[Reported]) -> str:
    """Where an AutoAttack accuracy (in %) falls among reported entries, in one sentence part."""
    ranked = sorted(((r.value("autoattack"), r.method) for r in reported), key=lambda t: -(t[0] or -1))
    ranked = [(v, m) for v, m in ranked if v is not None]
    above = [(v, m) for v, m in ranked if v > value]
    below = [(v, m) for v, m in ranked if v <= value]
    where = f"rank {len(above) + 1} of {len(ranked) + 1}"
    if above and below:
        return f"{where}, between {above[-1][1]} ({above[-1][0]:.2f}) and {below[0][1]} ({below[0][0]:.2f})"
    if above:
        return f"{where}, below every reported entry (lowest: {above[-1][1]} {above[-1][0]:.2f})"
    return f"{where}, above every reported entry" + (
        f" (highest: {below[0][1]} {below[0][0]:.2f})" if below else ""
    )


def placement_for_card(rows: Sequence[Mapping[str, Any]], name: str = "robustssl") -> list[str]:
    """For a model card: where each (dataset, protocol) AutoAttack Linf 8/255 accuracy of ``rows``
    (one checkpoint's rows) falls among the reported set's vanilla entries; empty where none match."""
    out = []
    reported = [r for r in load_reported(name) if r.finetuning == "vanilla"]
    in_domain = next((r["dataset"] for r in rows if r["setting"] == "in-domain"), None)
    for row in rows:
        if row["attack"] != "autoattack" or not math.isclose(float(row["eps"]), AA_EPS):
            continue
        ft = row.get("finetune")
        proto = str(ft.get("protocol")) if isinstance(ft, dict) else "slf"
        pre = BENCHMARK_DATASET.get(str(row.get("pretrain_dataset") or in_domain))
        key = (pre, BENCHMARK_DATASET.get(str(row["dataset"])), proto)
        match = [r for r in reported if (r.pretrain_dataset, r.dataset, r.protocol) == key]
        if match:
            value, n = 100 * float(row["robust_acc"]), row.get("n_examples_evaluated")
            what = f"{key[0]} → {key[1]} {proto.upper()}: AutoAttack {value:.1f} ({n} test examples)"
            out.append(f"{what}, {placement(value, match)}")
    return out
