"""Provenance fit to ship: rows, manifests and cards that name a checkpoint without a path of the
machine that made them (docs/decisions.md, 'Untrusted input: names, bounds and refusals').

What a row that ships calls its ``checkpoint`` (:func:`checkpoint_reference`):

- a published model (its name is a published model's and its weights are that model's, by sha256):
  its path inside the package's published sets, ``<set>/models/<name>``;
- a random-init control: the control's own id (its weights come from the seed; its recipe records
  what it took from the checkpoint it was drawn like);
- any other checkpoint: its folder's name (a zoo entry's id).

New rows follow the first two (``eval/recipe.py``); a checkpoint of the user's own keeps the path
given there, so that a row alone reproduces itself on the machine that made it.

A DeACL row's ``loss_params.extra.teacher`` path becomes ``{id, weights_sha256}``
(:func:`~robustbench_nacl.models.checkpoint.portable_loss_params`), from the ``teacher`` block of
the published manifest of the row's own checkpoint. Manifests go through
:func:`~robustbench_nacl.models.checkpoint.portable_manifest`, cards' loss parameters through the
same rule. Nothing that enters an id, a hash or a pin changes: each row's ``row_id``, ``recipe_id``
and ``protocol_id`` are recomputed from the rewritten row and must equal the stored ones (else the
row is refused and nothing is written), a manifest's ``id``, ``weights_sha256``, ``config_sha256``,
``recipe_sha256`` and ``training_config`` must come out as they went in.

``python -m robustbench_nacl.hub.portable PATH...`` rewrites, atomically and in place, a folder of
row files (``leaderboard``), a published set (its row pack, manifests and cards) or a folder with a
row pack; run again, it rewrites nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any

from ..errors import CheckpointError, UserError
from ..io import REFERENCE_ENV, refuse_reference_dir, write_json_atomic
from ..models.checkpoint import MANIFEST, portable_loss_params, portable_manifest, read_manifest
from ..results.rows import (
    ROW_PACK,
    ROWS_DIR,
    ResultRow,
    protocol_id,
    read_row,
    read_row_pack,
    recipe_id,
    row_id,
    write_row_pack,
)
from ..untrusted import read_regular
from .catalog import CARD, MODELS_DIR, published_models

#: What a manifest keeps, byte for byte, when made portable: its identity and pins.
MANIFEST_PINS = ("id", "weights", "weights_sha256", "config_sha256", "recipe_sha256", "training_config")
#: What a card keeps when made portable.
CARD_PINS = ("name", "weights_sha256", "dataset", "headline")


@dataclass(frozen=True)
class Published:
    """A published model as provenance names it: its set, folder and weights' sha256."""

    name: str
    set: str
    folder: Path
    weights_sha256: str

    @property
    def reference(self) -> str:
        """Its path inside the package's published sets (what ``eval --model`` rows record)."""
        return f"{self.set}/{MODELS_DIR}/{self.name}"


def published_index(root: str | Path | None = None) -> dict[str, Published]:
    """Every published model by name (the package's, or those under ``root``)."""
    return {m.name: Published(m.name, m.set, m.folder, m.weights_sha256) for m in published_models(root=root)}


def _name(path: str) -> str:
    # the last component, whichever machine wrote it (a Windows path too)
    return PureWindowsPath(path).name if "\\" in path else Path(path).name


def published_reference(name: str | None, sha256: str | None, index: Mapping[str, Published]) -> str | None:
    """``<set>/models/<name>`` when ``name`` is a published model with weights ``sha256``, else None."""
    model = index.get(name) if name else None
    return model.reference if model is not None and model.weights_sha256 == sha256 else None


def checkpoint_reference(row: Mapping[str, Any], index: Mapping[str, Published]) -> str:
    """What a row that ships calls its ``checkpoint`` (the module docstring's rule)."""
    if row.get("control"):
        return str(row["checkpoint_id"])
    name = _name(str(row.get("checkpoint") or row["checkpoint_id"]))
    found = published_reference(name, row["checkpoint_sha256"], index)
    return found or published_reference(row["checkpoint_id"], row["checkpoint_sha256"], index) or name


def _teacher_block(row: Mapping[str, Any], teacher: str, index: Mapping[str, Published]) -> dict[str, Any]:
    """The ``teacher`` block of the published manifest of the row's own checkpoint (the weights the
    row measured: same id and sha256); a one-line error where there is none or it names another."""
    model = index.get(row["checkpoint_id"])
    if model is None or model.weights_sha256 != row["checkpoint_sha256"]:
        raise UserError(
            f"row {row['row_id']}: its checkpoint {row['checkpoint_id']} is not a published model with "
            f"these weights, so its teacher {_name(teacher)} cannot be named by sha256; publish it first"
        )
    try:
        block = read_manifest(model.folder / MANIFEST).get("teacher")
    except CheckpointError as e:
        raise UserError(str(e)) from None
    if not isinstance(block, dict) or block.get("id") != _name(teacher) or not block.get("weights_sha256"):
        raise UserError(
            f"row {row['row_id']}: the manifest of {model.reference} names no teacher {_name(teacher)!r} "
            "with a sha256"
        )
    return block


def portable_row(row: Mapping[str, Any], index: Mapping[str, Published]) -> dict[str, Any]:
    """``row`` (a row's flat JSON) with its provenance fit to ship: ``checkpoint`` by
    :func:`checkpoint_reference`, a DeACL teacher path by id and sha256. Refused in one line if the
    row is not valid as it is, or if anything but provenance would change or an id would not hold."""
    data = row.to_json() if isinstance(row, ResultRow) else dict(row)
    ResultRow.from_json(data)  # a row that is not valid as it stands is not rewritten
    out = {**data, "checkpoint": checkpoint_reference(data, index)}
    params = data.get("loss_params")
    extra = params.get("extra") if isinstance(params, dict) else None
    if isinstance(extra, dict) and isinstance(extra.get("teacher"), str):
        block = _teacher_block(data, extra["teacher"], index)
        out["loss_params"] = portable_loss_params(data["loss_params"], block)
    for name, now in (
        ("row_id", row_id(out)),
        ("recipe_id", recipe_id(out["recipe"])),
        ("protocol_id", protocol_id(out)),
    ):
        if now != data[name]:
            raise UserError(f"row {data['row_id']}: its {name} would become {now}, not {data[name]}: refused")
    ResultRow.from_json(out)  # valid as rewritten; returned in the row's own key order
    return out


def _kept(before: Mapping[str, Any], after: Mapping[str, Any], keys: Sequence[str], what: str) -> None:
    moved = [k for k in keys if before.get(k) != after.get(k)]
    if moved:
        raise UserError(f"{what}: {', '.join(moved)} would change: refused")


def portable_card(card: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A model card whose loss parameters name a DeACL teacher by id and sha256 (from ``manifest``)."""
    out = dict(card)
    loss = card.get("loss")
    if isinstance(loss, dict):
        out["loss"] = {**loss, "params": portable_loss_params(loss.get("params"), manifest.get("teacher"))}
    _kept(card, out, CARD_PINS, f"card {card.get('name')}")
    return out


@dataclass
class Tally:
    """What one migration read and rewrote."""

    rows: int = 0
    rows_rewritten: int = 0
    files: int = 0
    files_rewritten: int = 0
    vanished: int = 0  # row files moved away by another process while this one ran

    def line(self, where: str) -> str:
        """One line for the user."""
        gone = f"; {self.vanished} moved away meanwhile, left alone" if self.vanished else ""
        return (
            f"{where}: {self.rows_rewritten} of {self.rows} rows and {self.files_rewritten} of {self.files} "
            f"manifests and cards rewritten (row, recipe and protocol ids unchanged){gone}"
        )


#: A planned write: the file, its new content (JSON, or the rows of a pack), and how many rows change.
Write = tuple[Path, Any, int]


def _rows_folder(base: Path, index: Mapping[str, Published], tally: Tally) -> list[Write]:
    writes: list[Write] = []
    for path in sorted(base.glob("*.json")):
        try:
            data = read_row(path)
        except UserError:
            if not path.exists():  # moved aside by another process (zoo eval's superseded rows)
                tally.vanished += 1
                continue
            raise
        tally.rows += 1
        new = portable_row(data, index)
        if new != data:
            writes.append((path, new, 1))
    return writes


def _pack(folder: Path, index: Mapping[str, Published], tally: Tally) -> list[Write]:
    raw = read_row_pack(folder / ROW_PACK)
    new = [portable_row(r, index) for r in raw]
    tally.rows += len(raw)
    changed = sum(a != b for a, b in zip(raw, new, strict=True))
    return [(folder / ROW_PACK, [ResultRow.from_json(r) for r in new], changed)] if changed else []


def _models(set_folder: Path, tally: Tally) -> list[Write]:
    writes: list[Write] = []
    for folder in sorted((set_folder / MODELS_DIR).iterdir()):
        if not (folder / MANIFEST).is_file():
            continue
        try:
            manifest = read_manifest(folder / MANIFEST)
        except CheckpointError as e:
            raise UserError(str(e)) from None
        shipped = portable_manifest(manifest)
        _kept(manifest, shipped, MANIFEST_PINS, str(folder / MANIFEST))
        tally.files += 1
        if shipped != manifest:
            writes.append((folder / MANIFEST, shipped, 0))
        if (folder / CARD).is_file():
            card = _read_json(folder / CARD)
            tally.files += 1
            if (new := portable_card(card, manifest)) != card:
                writes.append((folder / CARD, new, 0))
    return writes


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_regular(path, "card"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {' '.join(str(e).split())[:200]}") from None


def migrate(path: str | Path, index: Mapping[str, Published] | None = None) -> Tally:
    """Make everything under ``path`` portable: a published set (its row pack, manifests and cards),
    a folder with a row pack, or a folder of row files (the repository's ``leaderboard`` only with
    ``$ROBUSTBENCH_NACL_WRITE_REFERENCE=1``, as for every command that writes there). Everything is
    checked before anything is written; each file is replaced atomically."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p} is not a folder: pass a published set, a leaderboard or a rows folder")
    index = published_index() if index is None else index
    tally = Tally()
    writes: list[Write] = []
    if (p / MODELS_DIR).is_dir():
        writes += _models(p, tally)
    if (p / ROW_PACK).is_file():
        writes += _pack(p, index, tally)
    if (p / ROWS_DIR).is_dir() or not ((p / MODELS_DIR).is_dir() or (p / ROW_PACK).is_file()):
        try:
            refuse_reference_dir(p, "the rows folder")
        except UserError:
            raise UserError(
                f"{p} is the repository's reference board: set {REFERENCE_ENV}=1 to rewrite its rows' "
                "provenance on purpose"
            ) from None
        writes += _rows_folder(p / ROWS_DIR if (p / ROWS_DIR).is_dir() else p, index, tally)
    for target, content, rows in writes:
        if target.name == ROW_PACK:
            write_row_pack(target.parent, content)
        elif rows and not target.exists():  # a row file moved away meanwhile: left where it went
            tally.vanished += 1
            continue
        else:
            write_json_atomic(target, content)
        tally.rows_rewritten += rows
        tally.files_rewritten += not rows
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m robustbench_nacl.hub.portable PATH...``: rewrite each PATH's provenance in place."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any(a.startswith("-") for a in args):
        print(
            "usage: python -m robustbench_nacl.hub.portable PATH... (a published set, e.g. "
            "robustbench_nacl/files/published/demo, or a rows folder, e.g. leaderboard)",
            file=sys.stderr,
        )
        return 2
    index = published_index()
    for a in args:
        try:
            tally = migrate(a, index)
        except UserError as e:
            print(f"portable: {e}", file=sys.stderr)
            return 2
        print(tally.line(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
