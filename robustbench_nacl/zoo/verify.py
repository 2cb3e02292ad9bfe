"""``zoo verify``: recompute each trained entry's weights sha256 against its manifest and its zoo pin."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..io import sha256_file
from ..models.checkpoint import read_manifest
from .entry import ZooEntry, checkpoint_dir, is_trained


def verify_entry(entry: ZooEntry, out: str | Path) -> tuple[str, str]:
    """Recompute the weights' sha256: ("ok" | "untrained" | "changed" | "unpinned-mismatch", detail)."""
    d = checkpoint_dir(entry, out)
    if not is_trained(entry, out):
        return "untrained", str(d)
    try:
        manifest = read_manifest(d)
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
    if entry.weights_sha256 and actual != entry.weights_sha256:
        return (
            "unpinned-mismatch",
            f"{weights}: sha256 {actual[:12]}... != zoo pin {entry.weights_sha256[:12]}...",
        )
    return "ok", actual


@dataclass(frozen=True)
class VerifyReport:
    """What ``zoo verify`` found: a status per entry that has a checkpoint, and the entries without one."""

    out: str
    results: list[tuple[ZooEntry, str, str]]  # (entry, status, detail) as verify_entry returns them
    missing: list[ZooEntry]  # no checkpoint under ``out``: nothing to verify

    @property
    def bad(self) -> list[ZooEntry]:
        """Entries whose weights do not match their manifest or their zoo pin."""
        return [e for e, status, _ in self.results if status != "ok"]

    def summary(self) -> str:
        """One line: how many entries were verified, how many of those failed, how many are missing."""
        n = len(self.results) + len(self.missing)
        return (
            f"verified {len(self.results)} of {n} entries under {self.out}: "
            f"{len(self.results) - len(self.bad)} ok, {len(self.bad)} changed, "
            f"{len(self.missing)} missing (no checkpoint)"
        )


def verify_entries(entries: list[ZooEntry], out: str | Path) -> VerifyReport:
    """:func:`verify_entry` for each entry, with the untrained ones listed apart as missing."""
    results, missing = [], []
    for e in entries:
        status, detail = verify_entry(e, out)
        if status == "untrained":
            missing.append(e)
        else:
            results.append((e, status, detail))
    return VerifyReport(str(out), results, missing)
