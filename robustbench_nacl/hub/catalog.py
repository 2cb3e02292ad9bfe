"""What a published set holds, read without torch: its models and their cards, its rows, its coverage.

A published set is a folder of the package's ``files/published/`` (one per zoo, e.g. ``demo``)::

    <set>/models/<name>/manifest.json       the trainer's checkpoint manifest
    <set>/models/<name>/weights.safetensors  the encoder's weights (sha256 pinned by the card)
    <set>/models/<name>/card.json            its model card (hub/cards.py; schema files/schemas/)
    <set>/models/<name>/log.jsonl            its learning curve, where the trainer logged one
    <set>/heads/<key>.safetensors            the fitted linear heads of the committed rows (eval/heads.py)
    <set>/heads.json                         each head's sha256 and the weights it was fitted on
    <set>/rows.jsonl.gz                      the committed result rows in one pack (controls' rows too)
    <set>/coverage.json                      the presets and seeds this set covers

Loading a model (its weights and heads, each sha256-checked) is :mod:`.load`; this module only
reads JSON and rows, so the torch-free renderer can take ``--rows NAME`` of a published set.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..packaged import published_dir
from ..results.rows import ResultRow, load_rows

MODELS_DIR, CARD = "models", "card.json"
#: a set's pins of its linear heads: {key: {"sha256": ..., "checkpoint_sha256": ...}}
HEAD_PINS = "heads.json"


@dataclass(frozen=True)
class PublishedModel:
    """One published encoder: its name (the zoo entry id), its set and its card."""

    name: str
    set: str
    folder: Path  # <set>/models/<name>
    card: dict[str, Any]

    @property
    def set_folder(self) -> Path:
        """The published set's folder (heads/, rows/, coverage.json)."""
        return self.folder.parents[1]

    @property
    def weights_sha256(self) -> str:
        """The sha256 every weights file of this model must have."""
        return str(self.card["weights_sha256"])


def published_sets(root: str | Path | None = None) -> list[str]:
    """Names of the published sets (folders holding models/)."""
    base = Path(root) if root else published_dir()
    return sorted(p.name for p in base.iterdir() if (p / MODELS_DIR).is_dir()) if base.is_dir() else []


def published_models(dataset: str | None = None, root: str | Path | None = None) -> list[PublishedModel]:
    """Every published model (of one pretraining dataset: ``digits`` or ``digits:0-4``), sorted by name."""
    base = Path(root) if root else published_dir()
    out = []
    for s in published_sets(base):
        for card_file in sorted((base / s / MODELS_DIR).glob(f"*/{CARD}")):
            card = json.loads(card_file.read_text())
            if dataset is None or dataset in (card["dataset"], card["dataset"].split(":")[0]):
                out.append(PublishedModel(card_file.parent.name, s, card_file.parent, card))
    return out


def find_model(name: str, dataset: str | None = None, root: str | Path | None = None) -> PublishedModel:
    """A published model by name; a one-line error with close names otherwise."""
    models = {m.name: m for m in published_models(dataset, root)}
    if name not in models:
        close = difflib.get_close_matches(name, models, n=3)
        where = f" on {dataset}" if dataset else ""
        hint = f"; did you mean {', '.join(close)}?" if close else "; `robustbench-nacl models` lists them"
        raise UserError(f"no published model {name!r}{where}{hint}")
    return models[name]


def coverage(set_name: str, root: str | Path | None = None) -> dict[str, Any]:
    """What a published set declares it covers (``presets``, ``seeds``, ``zoo``)."""
    return json.loads(((Path(root) if root else published_dir()) / set_name / "coverage.json").read_text())


def model_rows(model: PublishedModel) -> list[ResultRow]:
    """The committed rows of one published model."""
    return [r for r in load_rows(model.set_folder) if r["checkpoint_sha256"] == model.weights_sha256]
