"""A CPU proxy for counting host syncs: the calls that, on a GPU, make the host wait for the device.

``torch.cuda.set_sync_debug_mode`` only exists on CUDA; on the CPU the same places are found by
counting the Python-level calls that read a value back (``.item()``, ``bool()``, ``float()``,
``int()``, ``.tolist()``), ``nonzero`` and indexing with a boolean tensor (the result's size depends on
the data, so the device must count the mask first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

READS = ("item", "__bool__", "__float__", "__int__", "tolist", "nonzero")
INDEXING = ("__getitem__", "__setitem__")


def _has_bool_index(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class SyncCounter:
    """Counts syncing calls by name while :attr:`active`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.active = True

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Not counted: code whose reads are of CPU-resident values even on a GPU (Adam's step count)."""
        self.active = False
        try:
            yield
        finally:
            self.active = True


@contextmanager
def count_syncs() -> Iterator[SyncCounter]:
    """Count the syncing calls made inside the block."""
    counter, monkeypatch = SyncCounter(), pytest.MonkeyPatch()
    for name in READS:
        real = getattr(torch.Tensor, name)

        def wrapped(self: torch.Tensor, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            if counter.active:
                counter.counts[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    for name in INDEXING:
        real = getattr(torch.Tensor, name)

        def indexed(self: torch.Tensor, index: Any, *a: Any, _real: Any = real, _name: str = name) -> Any:
            if counter.active and _has_bool_index(index):
                counter.counts[f"{_name}[bool]"] += 1
            return _real(self, index, *a)

        monkeypatch.setattr(torch.Tensor, name, indexed)
    try:
        yield counter
    finally:
        monkeypatch.undo()
