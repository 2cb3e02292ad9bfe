"""Publish a trained and evaluated zoo as a set of loadable reference models (``zoo publish``).

Copies, for every entry of the zoo whose rows are complete: its checkpoint (manifest and
safetensors weights, sha256 re-checked), a model card built from its rows, the linear heads its
rows attacked, and the rows themselves (with the random-init controls' rows, which the leaderboard
shows beside them; one row pack, ``rows.jsonl.gz``; label-free rows stay on the board, see
:func:`_entry_rows`), into ``files/published/<zoo>/`` of the
package; and ``coverage.json``, the presets and seeds the set covers, so that a preset added later
reads as "not published yet" instead of a missing model (see :mod:`.catalog`). Each entry's zoo
manifest is then pinned to the published weights (``weights_sha256``), which ``zoo verify`` checks.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..eval.heads import HEADS_DIR, head_key, head_path
from ..io import sha256_file, write_json_atomic
from ..models.checkpoint import (
    WEIGHTS,
    pinned_file_problem,
    pinned_files,
    portable_manifest,
    read_manifest,
)
from ..packaged import published_dir
from ..pipeline import control_id, expected_rows
from ..results.label_free import is_label_free
from ..results.rows import ROWS_DIR, ResultRow, load_rows, write_row_pack
from ..zoo import ZooEntry, checkpoint_dir, write_entry
from .cards import bn_branch, card_of_rows, write_card
from .catalog import CARD, HEAD_PINS, MODELS_DIR
from .load import head_pins, head_problem
from .portable import Published, portable_row, published_index

#: The trainer's per-epoch log (kNN and quick-probe accuracy): published beside the weights.
LOG = "log.jsonl"

#: Written into every card of a published zoo model.
AUTHORS = "robustbench-nacl (trained from the shipped zoo manifests)"


def _entry_rows(rows: list[ResultRow], checkpoint_id: str, entry: ZooEntry) -> list[ResultRow]:
    """The entry's rows that ship (checked complete first): the label-free ones stay on the board.

    Label-free rows carry float32 values per example (about 60 kB per encoder gzipped, 4.5 MB for the
    reference zoo), more than the package's size budget has room for; they have no head and no card
    line, and ``leaderboard --rows leaderboard/rows`` reads them from the repository's board."""
    mine = [r for r in rows if r["checkpoint_id"] == checkpoint_id]
    if len(mine) < expected_rows(entry):
        raise UserError(
            f"{checkpoint_id}: {len(mine)} of {expected_rows(entry)} rows under the board; run "
            "`zoo run` to finish it before publishing"
        )
    return [r for r in mine if not is_label_free(r)]


def _head_sources(rows: list[ResultRow], board: Path, target: Path) -> dict[str, tuple[Path, ResultRow]]:
    """Where each head the rows attacked comes from (head key -> file, a row that attacked it); writes
    nothing, so a missing head stops ``zoo publish`` before it has changed the set.

    A head the board does not hold is taken from the set's previous publication when that copy
    matches its pin and was fitted on the same weights: a regeneration that keeps some entries'
    checkpoints and rows (and so their heads) need not fit them again."""
    keys = {
        head_key(r["checkpoint_sha256"], r["setting"], r["dataset"], dict(r["probe_config"])): r for r in rows
    }
    old_pins = head_pins(target)
    sources = {}
    for key, r in sorted(keys.items()):
        src = head_path(board / HEADS_DIR, key)
        if not src.is_file():
            src = head_path(target / HEADS_DIR, key)
            fitted_on = old_pins.get(key, {}).get("checkpoint_sha256")
            if fitted_on != r["checkpoint_sha256"] or head_problem(target, key, old_pins):
                raise UserError(
                    f"{head_path(board / HEADS_DIR, key)} is missing (and the set holds no pinned copy): "
                    "re-evaluate with `zoo eval` (it saves the fitted heads)"
                )
        sources[key] = (src, r)
    return sources


def _copy_heads(sources: dict[str, tuple[Path, ResultRow]], target: Path) -> None:
    """Copy the heads and pin each one's sha256 in ``heads.json`` (a flipped byte in a head changes a
    logit as silently as one in the weights: load_model and `zoo verify` check it). The heads folder
    is written anew beside the old one and swapped in, so heads no row attacks any more leave the set."""
    old, new = target / HEADS_DIR, target / f"{HEADS_DIR}.new"
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    pins = {}
    for key, (src, r) in sources.items():
        shutil.copyfile(src, head_path(new, key))
        pins[key] = pin_head(new, key, r)
    shutil.rmtree(old, ignore_errors=True)
    new.rename(old)
    write_json_atomic(target / HEAD_PINS, pins)


def pin_head(heads: Path, key: str, row: ResultRow) -> dict[str, str]:
    """The pin of one published head (read from the folder ``heads``): its sha256, and the weights (id
    and sha256) it was fitted on."""
    sha = sha256_file(head_path(heads, key))
    return {
        "sha256": sha,
        "checkpoint_id": row["checkpoint_id"],
        "checkpoint_sha256": row["checkpoint_sha256"],
    }


def publish_model(entry: ZooEntry, ckpts: Path, rows: list[ResultRow], target: Path) -> dict[str, Any]:
    """Copy one entry's checkpoint and write its card; returns the card. The weights are not checked
    here: :func:`publish_zoo` checks every entry before it writes anything."""
    src = checkpoint_dir(entry, ckpts)
    manifest = read_manifest(src)
    dest = target / MODELS_DIR / entry.id
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / manifest["weights"], dest / WEIGHTS)
    if (src / LOG).is_file():  # the learning curve (`zoo curves --out <set>/models` draws it)
        shutil.copyfile(src / LOG, dest / LOG)
    copy_pinned_files(src, dest, manifest)
    # the teacher and parent by id and sha256: no path of the machine that trained it ships
    write_json_atomic(dest / "manifest.json", portable_manifest({**manifest, "weights": WEIGHTS}))
    reported = json.loads((published_dir() / "paper_reported.json").read_text()).get(entry.loss, [])
    card = card_of_rows(
        rows,
        name=entry.id,
        authors=AUTHORS,
        venue="",
        link=None,
        paper_reported=reported,
        bn_branch=bn_branch(manifest),
    )
    write_card(dest / CARD, card)
    return card


def copy_pinned_files(src: Path, dest: Path, manifest: dict[str, Any]) -> None:
    """Copy the files the manifest pins besides the weights (:func:`~..models.checkpoint.pinned_files`)
    from ``src`` to ``dest``, each checked first (a one-line UserError naming it when missing or
    different)."""
    if problem := pinned_file_problem(src, manifest):
        raise UserError(f"{problem}; re-run `zoo train`")
    for name in pinned_files(manifest):
        shutil.copyfile(src / name, dest / name)


def publish_zoo(entries: list[ZooEntry], ckpts: str | Path, board: str | Path, name: str) -> Path:
    """Publish every entry (and its control's rows) into the package's ``files/published/<name>``."""
    target, board = published_dir() / name, Path(board)
    all_rows = load_rows(board)
    # everything is checked before anything is written: a refusal leaves the set as it was
    by_entry: list[tuple[ZooEntry, list[ResultRow], str]] = []
    for e in entries:
        rows = _entry_rows(all_rows, e.id, e)
        src = checkpoint_dir(e, ckpts)
        manifest = read_manifest(src)
        sha = sha256_file(src / manifest["weights"])
        if sha != manifest["weights_sha256"]:
            raise UserError(f"{src}: the weights do not match their manifest; retrain {e.id}")
        if rows[0]["checkpoint_sha256"] != sha:
            raise UserError(f"the rows of {e.id} were measured on other weights than {src}")
        if problem := pinned_file_problem(src, manifest):
            raise UserError(f"{problem}; re-run `zoo train`")
        by_entry.append((e, rows, sha))
    keep = [r for _, rows, _ in by_entry for r in rows]
    for cid in sorted({control_id(e) for e in entries}):
        keep += [r for r in all_rows if r["checkpoint_id"] == cid and not is_label_free(r)]
    heads = _head_sources(keep, board, target)
    # the path of the machine that measured them means nothing to a reader: the rows name their
    # checkpoint in the package and a DeACL teacher by id and sha256, as `eval --model` rows do
    # (each entry's teacher block is read from the checkpoint about to be published)
    index = published_index(target.parent) | {
        e.id: Published(e.id, name, checkpoint_dir(e, ckpts), sha) for e, _, sha in by_entry
    }
    packed = [ResultRow.from_json(portable_row(r, index)) for r in keep]
    for e, rows, _ in by_entry:
        publish_model(e, Path(ckpts), rows, target)
    _copy_heads(heads, target)
    write_row_pack(target, packed)
    shutil.rmtree(target / ROWS_DIR, ignore_errors=True)  # one file per row, as sets were published before
    for e, _, sha in by_entry:  # the zoo manifests now name the weights their entries published
        write_entry(replace(e, weights_sha256=sha))
    cover = {
        "zoo": name,
        "presets": sorted({e.loss for e in entries}),
        "seeds": sorted({e.seed for e in entries}),
        "models": sorted(e.id for e in entries),
    }
    write_json_atomic(target / "coverage.json", cover)
    print(json.dumps({"published": len(entries), "rows": len(keep), "into": str(target)}))
    return target
