"""Model cards: one JSON file per model, RobustBench's fields plus ours (schema: files/schemas/).

RobustBench's model_info files hold ``name``, ``authors``, ``venue``, ``link``, ``architecture``,
``dataset``, ``eps``, ``clean_acc``, ``autoattack_acc``, ``reported``, ``additional_data`` and
``number_forward_passes``, accuracies as percentage strings with two decimals; a card here holds
the same, computed from result rows, plus the loss, recipe and protocol ids, a headline per
evaluation protocol (SLF, and ALF/AFF where measured, else null), the weights' sha256 and the paper's
reported figures, each flagged as reported and with its scale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..io import write_json_atomic
from ..packaged import schema_path
from ..results.eps import eps_label
from ..results.reported import placement_for_card
from ..results.rows import protocol_name

CARD_FORMAT = 1
SCHEMA = "model-card"
WORST_CASE = "worst_case"
AUTOATTACK = "autoattack"


def _percent(acc: float | None) -> str | None:
    return None if acc is None else f"{100 * acc:.2f}"


def headline_row(rows: Iterable[Mapping[str, Any]], norm: str = "Linf") -> Mapping[str, Any]:
    """The row a card headlines: the worst case at AutoAttack's largest ``norm`` epsilon where the
    rows hold AutoAttack (RobustBench's headline), else at the suite's largest epsilon (else the
    weakest attack row there)."""
    rows = [r for r in rows if r["norm"] == norm] or list(rows)
    if not rows:
        raise ValueError("a model card needs at least one result row")
    aa = [r["eps"] for r in rows if r["attack"] == AUTOATTACK]
    top = max(aa) if aa else max(r["eps"] for r in rows)
    at_top = [r for r in rows if r["eps"] == top]
    worst = [r for r in at_top if r["attack"] == WORST_CASE]
    return worst[0] if worst else min(at_top, key=lambda r: r["robust_acc"])


def headline(row: Mapping[str, Any]) -> dict[str, Any]:
    """A card's headline entry from one row."""
    return {
        "clean_acc": row["clean_acc"],
        "robust_acc": row["robust_acc"],
        "metric": row["attack"],
        "norm": row["norm"],
        "eps": row["eps"],
        "eps_label": eps_label(row["eps"]),
        "n_examples": int(row.get("n_examples_evaluated") or row["n_examples"]),
        "dataset": row.get("dataset") or "",
        "setting": row.get("setting"),
        "suite": row.get("suite"),
        "protocol_id": row.get("protocol_id"),
    }


def bn_branch(manifest: Mapping[str, Any]) -> str | None:
    """Which BatchNorm branch a checkpoint is evaluated through: ``"adv"`` or ``"clean"`` for a dual-BN
    encoder (ACL and DynACL evaluate the adversarial one, as their authors do; the other costs them
    points of clean accuracy), None for one BatchNorm per layer."""
    if not manifest.get("dual_bn"):
        return None
    return str(manifest.get("eval_bn_route") or "clean")


def build_card(
    rows: Iterable[Mapping[str, Any]],
    *,
    name: str,
    architecture: str,
    dataset: str,
    weights_sha256: str | None = None,
    bn_branch: str | None = None,
    authors: str = "",
    venue: str = "",
    link: str | None = None,
    paper_reported: list[dict[str, Any]] | None = None,
    reported: float | None = None,
    additional_data: bool = False,
) -> dict[str, Any]:
    """A card from the rows of one model under one protocol (one setting: in-domain for a zoo model).

    ``eps`` and ``autoattack_acc`` are AutoAttack's when the rows hold an AutoAttack row (at its
    largest epsilon), else ``autoattack_acc`` is null and ``eps`` is the headline's. ``bn_branch``:
    the BatchNorm branch a dual-BN encoder was evaluated through (:func:`bn_branch`).
    """
    rows = list(rows)
    top = headline_row(rows)
    aa = [r for r in rows if r["attack"] == AUTOATTACK]
    aa_row = max(aa, key=lambda r: r["eps"]) if aa else None
    first = rows[0]
    loss = first.get("loss")
    return {
        "card_format": CARD_FORMAT,
        "name": name,
        "authors": authors,
        "venue": venue,
        "link": link,
        "architecture": architecture,
        "dataset": dataset,
        "eps": eps_label((aa_row or top)["eps"]),
        "clean_acc": _percent(top["clean_acc"]),
        "autoattack_acc": _percent(aa_row["robust_acc"]) if aa_row else None,
        "reported": _percent(reported),
        "additional_data": additional_data,
        "number_forward_passes": 1,  # a linear probe on a deterministic encoder: one forward pass
        "threat_model": top["norm"],
        "loss": {"family": loss, "params": first.get("loss_params")} if loss else None,
        "encoder": first.get("encoder"),
        "bn_branch": bn_branch,
        "recipe_id": first.get("recipe_id"),
        "protocol_id": top.get("protocol_id"),
        "headline": {"SLF": headline(top), "ALF": None, "AFF": None},
        "weights_sha256": weights_sha256,
        "weights_url": None,
        "paper_reported": list(paper_reported or []),
    }


def card_schema() -> dict[str, Any]:
    """The shipped JSON Schema of a card."""
    import json

    return json.loads(schema_path(SCHEMA).read_text())


def write_card(path: str | Path, card: Mapping[str, Any]) -> Path:
    """Write a card atomically; returns its path."""
    write_json_atomic(path, dict(card))
    return Path(path)


def card_of_rows(rows: Iterable[Mapping[str, Any]], **info: Any) -> dict[str, Any]:
    """The card of one evaluated checkpoint from its result rows: the in-domain setting headlines it,
    under SLF (the card's RobustBench fields and ``headline.SLF``) and under ALF and AFF where the rows
    hold them (``headline.ALF``, ``headline.AFF``).

    ``info`` overrides or adds card fields (authors, venue, link, paper_reported, ...).
    """
    rows = list(rows)
    if not rows:
        raise ValueError("a model card needs at least one result row")
    # the first in-domain row of each protocol; SLF headlines the card (RobustBench's fields), ALF and
    # AFF fill their own headline entries
    first_of: dict[str, Mapping[str, Any]] = {}
    for r in [r for r in rows if r["setting"] == "in-domain"] or rows[:1]:
        first_of.setdefault(protocol_name(r), r)
    main = first_of.get("slf") or next(iter(first_of.values()))
    own = [r for r in rows if r["protocol_id"] == main["protocol_id"]]
    first = own[0]
    recipe = first.get("recipe") or {}
    kwargs = (recipe.get("config") or recipe).get("encoder_kwargs") or {}
    options = ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    fields = {
        "name": first["checkpoint_id"],
        "architecture": f"{first['encoder']}{f' ({options})' if options else ''} + linear probe",
        "dataset": first.get("pretrain_dataset") or first["dataset"],
        "weights_sha256": first["checkpoint_sha256"],
        **info,
    }
    card = build_card(own, **fields)
    # where the numbers were computed: a CPU's and a GPU's rows of one protocol differ in arithmetic
    card["devices"] = sorted({r.get("device_class") or "cpu" for r in rows})
    for name in ("alf", "aff"):
        if name in first_of:
            mine = [r for r in rows if r["protocol_id"] == first_of[name]["protocol_id"]]
            card["headline"][name.upper()] = headline(headline_row(mine))
    # a CIFAR/STL-10 checkpoint: where its AutoAttack 8/255 accuracy falls among the RobustSSL
    # benchmark's reported entries (absent otherwise, so every other card is what it was)
    placement = placement_for_card(rows)
    if placement:
        card["robustssl_placement"] = placement
    return card
