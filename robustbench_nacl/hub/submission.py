"""Verify an outside author's submission (``zoo verify-submission DIR``; CONTRIBUTING.md).

A submission folder holds ``card.json`` (its model card), ``checkpoint/`` (the ``manifest.json``
and ``weights.safetensors`` that ``train`` wrote; the weights may instead be downloaded from the
card's ``weights_url``), ``rows/`` (its result rows under the reference protocol) and ``heads/``
(the linear heads its rows attacked: ``eval --save-heads``). The check: the card names the
weights' sha256, every row was measured on those weights and is consistent with its own
per-example bits, and the rows of a sample of settings (in-domain first) are recomputed from the
weights and heads and compared example by example: clean outcomes exactly, attacked outcomes
within ``tolerance`` per 200 examples (0 by default: exact).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..io import sha256_file, write_json_atomic
from ..models.checkpoint import WEIGHTS, read_manifest
from ..results.bits import decode_bits
from ..results.rows import DEVICE_CLASS, ResultRow, load_rows, row_id, write_row
from ..untrusted import safe_name
from .cards import card_schema
from .download import cached_download, check_url, sha_folder

Group = tuple[str, str]  # (setting, dataset)


@dataclass
class SubmissionReport:
    """What the check found: one line per step, and the failures (the first one names the row)."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    summary: str = ""


#: The largest file a submission may hold besides its weights (a row is a few kB; a card less): a
#: bigger one is refused before it is read, so a hostile row cannot fill the memory.
MAX_SMALL_FILE = 16 << 20
#: The folders a submission must have (CONTRIBUTING.md): its rows, and the heads they attacked.
REQUIRED_DIRS = ("checkpoint", "rows", "heads")


def check_tree(folder: Path) -> None:
    """Refuse a submission that could make the check read outside it or without end: a symbolic link
    anywhere (even one pointing inside: a link can be re-aimed between the check and the read), a
    file that is not a regular file (a FIFO, a device such as /dev/zero), a row or card over
    :data:`MAX_SMALL_FILE`, anything in ``rows/`` but row files, or a missing ``checkpoint/``,
    ``rows/`` or ``heads/``."""
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: pass the submission folder (CONTRIBUTING.md)")
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise UserError(f"{path} is a symbolic link: a submission holds its own files, copy them in")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UserError(f"{path} is not a regular file (a device, FIFO or socket): remove it")
            if Path(root) == folder / "rows" and not name.endswith(".json"):
                # eval writes one JSON file per row; a packed or compressed file could unpack to any size
                raise UserError(f"{path}: rows/ holds the *.json row files `eval` writes, nothing else")
            is_weights = path.suffix == ".safetensors" and Path(root).name == "checkpoint"
            if stat.S_ISREG(mode) and not is_weights and path.lstat().st_size > MAX_SMALL_FILE:
                raise UserError(
                    f"{path} is over {MAX_SMALL_FILE >> 20} MB: no row, card or head is that large"
                )
    missing = [d for d in REQUIRED_DIRS if not (folder / d).is_dir()]
    if missing:
        raise UserError(
            f"{folder} has no {', '.join(f'{d}/' for d in missing)}: a submission holds checkpoint/, rows/ "
            "(`eval --out`) and heads/ (`eval --save-heads`), the heads its rows attacked (CONTRIBUTING.md)"
        )


def _read_card(folder: Path) -> dict[str, Any]:
    path = folder / "card.json"
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{path}: no readable model card ({' '.join(str(e).split())[:100]})") from None
    if not isinstance(card, dict):
        raise UserError(f"{path}: a model card is a JSON object")
    try:
        import jsonschema
    except ImportError:  # the schema check needs jsonschema; the fields the check uses are read below
        sha_folder(card.get("weights_sha256"))  # a malformed pin is refused all the same
        return card
    errors = sorted(jsonschema.Draft202012Validator(card_schema()).iter_errors(card), key=str)
    if errors:
        where = "/".join(map(str, errors[0].absolute_path)) or "the card"
        raise UserError(f"{path}: {where}: {' '.join(errors[0].message.split())[:160]}")
    sha_folder(card["weights_sha256"])  # 64 hex digits: it names the cache folder
    return card


def _weights(folder: Path, card: dict[str, Any]) -> Path:
    """The submission's weights file (downloaded from weights_url if absent), beside its manifest.

    A download goes to the cache under the card's sha256, with a name chosen here (never the
    manifest's ``weights``, which read_manifest has checked is a plain file name), from an http(s)
    URL only, and is kept only when it has that sha256.
    """
    ckpt = folder / "checkpoint"
    manifest = read_manifest(ckpt)
    path = ckpt / manifest["weights"]
    if not path.is_file() and card.get("weights_url"):
        url = check_url(str(card["weights_url"]), "card.json: weights_url")
        sha = str(card["weights_sha256"])
        fix = "check the card's weights_url and weights_sha256"
        path = cached_download(url, sha, f"checkpoint/{WEIGHTS}", fix)
        write_json_atomic(path.parent / "manifest.json", {**manifest, "weights": WEIGHTS})
        return path
    if not path.is_file():
        raise UserError(f"{path} is missing and the card has no weights_url: add the weights or their URL")
    return path


def _consistent(row: ResultRow) -> str | None:
    """Why a row disagrees with its own bits (None when it agrees)."""
    n = int(row["n_examples_evaluated"])
    clean, robust = decode_bits(row["clean_bits"], n), decode_bits(row["robust_bits"], n)
    if (robust & ~clean).any():
        return "an example is robust but not clean-correct"
    if abs(row["clean_acc"] - clean.mean()) > 1e-9 or abs(row["robust_acc"] - robust.mean()) > 1e-9:
        return "its accuracies are not those of its per-example bits"
    return None


def _check_bits(rows: list[ResultRow]) -> None:
    """Every row carries decodable per-example outcomes: they are what the check compares."""
    for r in rows:
        try:
            n = int(r["n_examples_evaluated"])
            decode_bits(r["clean_bits"], n), decode_bits(r["robust_bits"], n)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"row {r.row_id} ({r['setting']} {r['dataset']} {r['attack']}) has no readable per-example "
                f"outcomes ({' '.join(str(e).split())[:80]}): re-run `eval`, which writes clean_bits and "
                "robust_bits"
            ) from None


def _sample(groups: list[Group], k: int, seed: str) -> list[Group]:
    first = [g for g in groups if g[0] == "in-domain"][:1]
    rest = [g for g in groups if g not in first]
    return first + random.Random(seed).sample(rest, max(0, min(k - len(first), len(rest))))


def _packaged_suite(row: ResultRow) -> Any:
    """The rows' suite, a packaged one by name whose sha256 is the rows' (a submission never names a
    file to read: a path could be /dev/zero or a FIFO)."""
    from ..attack.suites import load_suite
    from ..packaged import attacks_dir

    name = safe_name(row["suite"], "the rows' suite")
    path = attacks_dir() / f"{name}.toml"
    if not path.is_file():
        raise UserError(
            f"the rows' suite {name!r} is not one robustbench-nacl ships: evaluate with a named suite"
        )
    suite = load_suite(path)
    if suite.sha256 != row["suite_sha256"]:
        raise UserError(f"the rows' suite {name!r} is not this installation's: update robustbench-nacl")
    return suite


def _probe(row: ResultRow) -> Any:
    """The rows' probe settings, refused in one line when a key is unknown or a budget is over the
    reference protocol's (a submission must not make the check train a probe for ever)."""
    from dataclasses import fields

    from ..eval.probe import ProbeConfig

    given = dict(row["probe_config"])
    known = {f.name for f in fields(ProbeConfig)}
    if unknown := sorted(set(given) - known):
        raise UserError(f"the rows' probe_config has unknown key(s) {', '.join(unknown)[:80]}: re-run `eval`")
    probe = ProbeConfig(**given)
    probe.check()
    reference = ProbeConfig()
    for name in ("epochs", "knn_k"):
        if getattr(probe, name) > getattr(reference, name):
            raise UserError(
                f"the rows' probe_config.{name} {getattr(probe, name)} is over the reference protocol's "
                f"{getattr(reference, name)}: a submission is evaluated under the reference protocol"
            )
    return probe


def _recompute(
    ckpt: Path, folder: Path, rows: list[ResultRow], chosen: list[Group], device: str, out: Path
) -> None:
    """Evaluate the chosen settings into ``out``, a fresh folder that first gets the other rows (so
    only the chosen ones are computed; each row file is named by its checked content address)."""
    from ..eval.evaluate import evaluate

    first = rows[0]
    suite, probe = _packaged_suite(first), _probe(first)
    for r in rows:
        if (r["setting"], r["dataset"]) not in chosen:
            write_row(out, r)
    indomain = [r["dataset"] for r in rows if r["setting"] == "in-domain"]
    shifts = {r["shift"] for r in rows if r["setting"] == "shift" and (r["setting"], r["dataset"]) in chosen}
    evaluate(
        ckpt,
        dataset=indomain[0] if indomain else first["pretrain_dataset"],
        transfer=[d for s, d in chosen if s == "transfer"],
        shift=sorted(shifts),
        suite=suite,
        out=out,
        n_examples=first["n_examples"],
        seed=first["seed"],
        probe=probe,
        heads=folder / "heads",
        device=device,
        progress=False,
    )


def _key(row: ResultRow) -> str:
    """A row's id without its device class: rows a GPU measured are recomputed here on this device
    and compared example by example (``--tolerance`` covers what the arithmetic moves)."""
    return row_id({**row.to_json(), DEVICE_CLASS: None})


def _compare(mine: ResultRow, theirs: ResultRow, tolerance: int) -> str | None:
    """Why a recomputed row disagrees with the submitted one (None when it agrees)."""
    n = int(theirs["n_examples_evaluated"])
    label = (
        f"row {theirs.row_id} ({theirs['setting']} {theirs['dataset']} {theirs['attack']} {theirs['norm']} "
    )
    label += f"eps {theirs['eps_label']})"
    for kind, allowed in (("clean", 0), ("robust", tolerance * n // 200)):
        a = decode_bits(mine[f"{kind}_bits"], n)
        b = decode_bits(theirs[f"{kind}_bits"], n)
        differ = np.flatnonzero(a != b)
        if len(differ) > allowed:
            shown = ", ".join(map(str, differ[:5].tolist()))
            return f"{label}: {len(differ)} of {n} {kind} outcomes differ from the recomputed ones ({shown})"
    return None


def verify_submission(
    folder: str | Path, *, settings: int = 2, tolerance: int = 0, device: str = "cpu"
) -> SubmissionReport:
    """Check a submission folder; the report's ``failures`` is empty when it is accepted."""
    folder = Path(folder)
    check_tree(folder)
    report = SubmissionReport()
    card = _read_card(folder)
    weights = _weights(folder, card)
    ckpt = weights.parent
    sha = sha256_file(weights)
    if sha != card["weights_sha256"]:
        raise UserError(f"{weights}: sha256 {sha[:12]}... but the card says {card['weights_sha256']}")
    rows = load_rows(folder / "rows")
    if not rows:
        raise UserError(f"{folder / 'rows'} holds no result rows: write them with `eval --out {folder}`")
    _check_bits(rows)
    report.lines.append(f"card ok; weights sha256 {sha[:12]}... match it; {len(rows)} rows")
    for r in rows:
        why = "measured on other weights" if r["checkpoint_sha256"] != sha else _consistent(r)
        if why:
            report.failures.append(f"row {r.row_id} ({r['setting']} {r['dataset']} {r['attack']}): {why}")
    by_group: dict[Group, list[ResultRow]] = defaultdict(list)
    for r in rows:
        by_group[(r["setting"], r["dataset"])].append(r)
    chosen = _sample(sorted(by_group), settings, sha)
    out = Path(tempfile.mkdtemp(prefix="rbn-verify-"))
    try:  # removed on every way out (a refusal, a failed evaluation, an interrupt)
        _recompute(ckpt, folder, rows, chosen, device, out)
        recomputed = {_key(r): r for r in load_rows(out) if (r["setting"], r["dataset"]) in chosen}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    for g in chosen:
        for theirs in by_group[g]:
            mine = recomputed.get(_key(theirs))
            why = (
                f"row {theirs.row_id}: not reproduced under this installation's protocol"
                if mine is None
                else _compare(mine, theirs, tolerance)
            )
            if why:
                report.failures.append(why)
    n = sum(len(by_group[g]) for g in chosen)
    report.lines.append(f"recomputed {n} rows of {len(chosen)} of {len(by_group)} settings: {chosen}")
    report.summary = f"{n} recomputed rows agree example by example; {len(rows)} rows consistent"
    return report
