"""The training log ``log.jsonl``: one JSON line per epoch, appended and flushed as each epoch ends,
so that a reader can ``tail -f`` it; a resumed run leaves exactly the lines an uninterrupted one does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..io import atomic_open

LOG = "log.jsonl"


def write_log(path: Path, rows: list[dict[str, Any]], logged: int) -> None:
    """Make ``path`` hold exactly ``rows``, one JSON line each, where it should hold ``rows[:logged]``.

    The new rows are appended in place. Lines beyond ``rows[:logged]`` (a kill between a row and
    the state that records it, in an earlier process) are truncated first. A file that is missing
    or does not begin with ``rows[:logged]`` is rewritten whole, atomically.
    """
    lines = [(json.dumps(r) + "\n").encode() for r in rows]
    head, tail = b"".join(lines[:logged]), b"".join(lines[logged:])
    if not _append(path, head, tail):
        with atomic_open(path, "wb") as f:
            f.write(head + tail)


def _append(path: Path, head: bytes, tail: bytes) -> bool:
    """Append ``tail`` to ``path`` when it begins with ``head`` (cut to ``head`` first); False when it
    does not, or when it cannot be opened or written (the caller then rewrites it whole)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size < len(head) or os.pread(fd, len(head), 0) != head:
            return False
        if size > len(head):
            os.ftruncate(fd, len(head))
        # one write of whole lines: a reader never sees a partial line from a complete call
        if os.write(fd, tail) != len(tail):
            return False
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
