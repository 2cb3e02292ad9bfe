"""What a row measured, named: runs, metric keys and names (``fgsm_Linf_0.002``) and their labels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..results.eps import eps_label

Run = tuple[str, Any, Any]  # (checkpoint sha256, evaluation seed, probe seed)
MetricKey = tuple[str, str, float]  # (attack, norm, eps)


def metric_name(attack: str, norm: str, eps: float) -> str:
    """Column stem of one attack metric, e.g. ``fgsm_Linf_0.002``."""
    return f"{attack}_{norm}_{eps:g}"


def run_of(r: Mapping[str, Any]) -> Run:
    """The run a row belongs to: (checkpoint sha256, evaluation seed, probe seed)."""
    return (r["checkpoint_sha256"], r["seed"], r["probe_config"].get("seed"))


def n_examples(r: Mapping[str, Any]) -> int:
    """The number of test examples a row was measured on."""
    return int(r.get("n_examples_evaluated") or r.get("n_examples") or 0)


def metric_key(r: Mapping[str, Any]) -> MetricKey:
    return (r["attack"], r["norm"], round(float(r["eps"]), 12))


ATTACK_NAMES = {"fgsm": "FGSM", "pgd": "PGD", "worst_case": "worst case", "autoattack": "AutoAttack"}


def metric_label(name: str, keys: Iterable[MetricKey] = ()) -> str:
    """Display name of a metric name (``clean`` or an ``attack_norm_eps`` stem among ``keys``),
    e.g. ``worst case@0.032 (8.16/255)``; an L2 metric names its norm."""
    for attack, norm, eps in keys:
        if metric_name(attack, norm, eps) == name:
            what = ATTACK_NAMES.get(attack, attack) + ("" if norm == "Linf" else f" {norm}")
            return f"{what}@{eps:g}" + (f" ({eps_label(eps)})" if norm == "Linf" else "")
    return name


def aa_gap(r: Mapping[str, Any]) -> float | None:
    """How far AutoAttack's components after its APGD ones (FAB-T, Square) lowered a row's accuracy
    below what APGD left, as a fraction of the row's examples: what the full version adds to its
    gradient attacks. None for a row without components after APGD (not an AutoAttack row, or a
    custom version of APGD only)."""
    names = [c for c in str(r.get("aa_components") or "").split(",") if c]
    apgd = [c for c in names if c.startswith("apgd")]
    if not apgd or names[-1] == apgd[-1]:
        return None
    after = r.get(f"aa_robust_acc_after_{apgd[-1].replace('-', '_')}")
    return None if after is None else float(after) - float(r["robust_acc"])
