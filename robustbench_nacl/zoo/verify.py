"""``zoo verify``: recompute each trained entry's weights sha256 against its manifest and its zoo pin.

An entry with no checkpoint under ``--out`` is verified from the package's published copy when it
has one (``files/published/<zoo>/models/<id>/``, see :mod:`..hub.catalog`): so on a fresh clone the
committed reference weights are checked against their manifest, their model card and the zoo pin,
and the linear heads published beside them against the set's ``heads.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..io import sha256_file
from ..models.checkpoint import pinned_file_problem, read_manifest
from ..packaged import published_dir
from .entry import ZooEntry, checkpoint_dir, is_trained


def published_copy(entry: ZooEntry) -> Path | None:
    """The package's published checkpoint folder of ``entry`` (None when it is not published)."""
    d = published_dir() / entry.zoo / "models" / entry.id
    return d if (d / "manifest.json").is_file() else None


def _verify_folder(entry: ZooEntry, d: Path) -> tuple[str, str]:
    try:
        manifest = read_manifest(d)
        extra = pinned_file_problem(d, manifest)  # files besides the weights that it pins
    except UserError as e:
        return "changed", str(e)
    weights = d / manifest["weights"]
    if not weights.is_file():
        return "changed", f"{weights} is missing"
    actual = sha256_file(weights)
    if actual != manifest["weights_sha256"]:
        return (
            "changed",
            f"{weights}: sha256 {actual[:12]}... != manifest {manifest['weights_sha256'][:12]}...",
        )
    if extra:  # a ++ checkpoint's pseudo-labels, cited by its manifest
        return "changed", extra
    card = d / "card.json"
    if card.is_file():
        pinned, why = _card_pin(card)
        if why or pinned != actual:
            return "changed", why or f"{weights}: sha256 {actual[:12]}... != model card {str(pinned)[:12]}..."
    if entry.weights_sha256 and actual != entry.weights_sha256:
        return (
            "unpinned-mismatch",
            f"{weights}: sha256 {actual[:12]}... != zoo pin {entry.weights_sha256[:12]}...",
        )
    return "ok", actual


def _card_pin(card: Path) -> tuple[object, str | None]:
    """(the card's weights_sha256, None), or (None, why the card cannot be read): a damaged card is
    what verify exists to report, never a traceback."""
    try:
        data = json.loads(card.read_text())
    except (OSError, ValueError, RecursionError) as e:
        return None, f"{card} is not readable JSON ({' '.join(str(e).split())[:80]})"
    if not isinstance(data, dict):
        return None, f"{card} is not a JSON object"
    return data.get("weights_sha256"), None


def _heads_problem(copy: Path, sha: str) -> str | None:
    """The first published head of this model (or of the random-init controls beside it) that does
    not match its pin in the set's heads.json, or that no pin covers."""
    from ..hub.catalog import MODELS_DIR
    from ..hub.load import head_pins, heads_problems

    set_folder = copy.parents[1]
    pins = head_pins(set_folder)
    shas = {sha} | {  # the controls' heads: fitted on weights that no model folder of the set holds
        p["checkpoint_sha256"]
        for p in pins.values()
        if not (set_folder / MODELS_DIR / str(p.get("checkpoint_id"))).is_dir()
    }
    if not any(p.get("checkpoint_sha256") == sha for p in pins.values()):
        return f"{set_folder / 'heads.json'} pins no linear head of these weights: the heads are unchecked"
    problems = heads_problems(set_folder, shas)
    return (
        f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        if problems
        else None
    )


def verify_entry(entry: ZooEntry, out: str | Path) -> tuple[str, str]:
    """Recompute the weights' sha256: ("ok" | "untrained" | "changed" | "unpinned-mismatch", detail).

    The checkpoint under ``out`` is checked; without one, the published copy (detail says so).
    """
    if is_trained(entry, out):
        return _verify_folder(entry, checkpoint_dir(entry, out))
    if (copy := published_copy(entry)) is not None:
        status, detail = _verify_folder(entry, copy)
        if status == "ok" and (why := _heads_problem(copy, detail)):
            return "changed", why
        return status, f"published copy {copy}: {detail}" if status == "ok" else detail
    return "untrained", str(checkpoint_dir(entry, out))


@dataclass(frozen=True)
class VerifyReport:
    """What ``zoo verify`` found: a status per entry that has a checkpoint, and the entries without one."""

    out: str
    results: list[tuple[ZooEntry, str, str]]  # (entry, status, detail) as verify_entry returns them
    missing: list[ZooEntry]  # no checkpoint under ``out`` and none published: nothing to verify
    published: list[ZooEntry] = field(default_factory=list)  # verified from the package's copy

    @property
    def bad(self) -> list[ZooEntry]:
        """Entries whose weights do not match their manifest or their zoo pin."""
        return [e for e, status, _ in self.results if status != "ok"]

    def summary(self) -> str:
        """One line: how many entries were verified, how many of those failed, how many are missing."""
        n = len(self.results) + len(self.missing)
        where = f" ({len(self.published)} of them from the published copy)" if self.published else ""
        return (
            f"verified {len(self.results)} of {n} entries under {self.out}{where}: "
            f"{len(self.results) - len(self.bad)} ok, {len(self.bad)} changed, "
            f"{len(self.missing)} missing (no checkpoint)"
        )


def verify_entries(entries: list[ZooEntry], out: str | Path) -> VerifyReport:
    """:func:`verify_entry` for each entry, with the untrained ones listed apart as missing."""
    results, missing, published = [], [], []
    for e in entries:
        status, detail = verify_entry(e, out)
        if status == "untrained":
            missing.append(e)
        else:
            results.append((e, status, detail))
            if not is_trained(e, out):
                published.append(e)
    return VerifyReport(str(out), results, missing, published)
