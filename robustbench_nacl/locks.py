"""Advisory locks on work in a shared output folder: two processes never compute the same thing at once.

A lock is a file (``<folder>/.locks/<key>.lock``) held with ``fcntl.flock`` while the work runs; it
holds the holder's pid, host and start time, and is removed on release. The kernel drops a flock when
its process dies (kill -9 included), so a lock left by a killed process never blocks anyone: the next
process takes it at once, and the file still there tells it who died holding it. A second process that
finds the lock held by a live process waits for it, then looks again at what is on disk (the caller
re-reads what the first one wrote, and computes only what is still missing).

Where ``fcntl`` does not exist (Windows) the lock is a no-op: the work is still correct (rows are
content-addressed and written atomically), only possibly done twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCKS_DIR = ".locks"


def lock_path(folder: str | Path, key: str) -> Path:
    """Where the lock named ``key`` of an output folder lives."""
    return Path(folder) / LOCKS_DIR / f"{key}.lock"


def _holder(f: Any) -> dict[str, Any] | None:
    f.seek(0)
    try:
        data = json.loads(f.read() or "null")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})"


def _acquire(path: Path, what: str, quiet: bool) -> Any:
    """The open lock file of ``path``, flocked by this process (waiting while a live one holds it)."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        except FileNotFoundError:  # the folder was removed by the last holder just now
            continue
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(
                    f"waiting for {_describe(_holder(f))}, which is computing {what} ({path})",
                    file=sys.stderr,
                )
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks until the holder finishes or dies
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its holder removed while we waited: ours
            return f
        f.close()


@contextlib.contextmanager
def advisory_lock(folder: str | Path, key: str, what: str, *, quiet: bool = False) -> Iterator[None]:
    """Hold the lock ``key`` of ``folder`` while the body runs; wait (saying so on stderr) while another
    live process holds it; take over, saying so, one that a killed process left. ``what`` names the work."""
    path = lock_path(folder, key)
    if fcntl is None:
        yield
        return
    with _held(_acquire(path, what, quiet), path, what, quiet):
        yield


@contextlib.contextmanager
def exclusive_lock(folder: str | Path, key: str, what: str) -> Iterator[None]:
    """:func:`advisory_lock`, but a lock a live process holds is refused at once, in one line naming
    it, instead of waited for: for work a second process must not redo in the same folder (a second
    ``train`` into a busy ``--out`` would overwrite the first's checkpoint as it is written)."""
    path = lock_path(folder, key)
    if fcntl is None:
        yield
        return
    created = not Path(folder).exists()
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_holder(f))
            f.close()
            from .errors import UserError  # here: this module is also run as a file (test_locks)

            raise UserError(
                f"{holder} is {what} in {folder}; wait for it to end, or choose another --out"
            ) from None
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder removed just now: ours
            break
        f.close()
    try:
        with _held(f, path, what, quiet=False):
            yield
    finally:
        if created:  # a run that failed before writing anything leaves no empty folder behind
            with contextlib.suppress(OSError):
                Path(folder).rmdir()


@contextlib.contextmanager
def _held(f: Any, path: Path, what: str, quiet: bool) -> Iterator[None]:
    """The body of a lock held through open file ``f``: its holder written in, removed on release."""
    try:
        stale = _holder(f)  # a released lock is removed: a holder here died while holding it
        if stale and not quiet:
            print(
                f"took over the lock of {_describe(stale)}, which ended without releasing it ({what})",
                file=sys.stderr,
            )
        f.seek(0)
        f.truncate()
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}))
        f.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # before unlocking: a waiter that gets this file sees it is gone, and retries
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the last lock of the folder: leave no empty .locks behind
        f.close()  # releases the flock


def remove_temporaries(folder: str | Path, names: Iterable[str] | None = None) -> int:
    """Remove what a writer killed mid-write left of ``names`` (None: of any file) in ``folder``
    (``io.atomic_open``'s ``.<name>.<random>.tmp`` files); how many. Call it holding the lock of the
    work that writes them, so that no live writer's temporary is among them."""
    prefixes = (".",) if names is None else tuple(f".{n}." for n in names)
    if not prefixes:
        return 0
    try:
        found = [
            e.path for e in os.scandir(folder) if e.name.endswith(".tmp") and e.name.startswith(prefixes)
        ]
    except FileNotFoundError:
        return 0
    for path in found:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return len(found)


def sweep(folder: str | Path) -> int:
    """Remove the locks of ``folder`` that no live process holds (left by killed ones whose work was
    then finished by another process without taking them over); how many."""
    base = Path(folder) / LOCKS_DIR
    if fcntl is None or not base.is_dir():
        return 0
    removed = 0
    for path in base.glob("*.lock"):
        try:
            f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: live work
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # while holding it: a waiter that then gets this file sees it is gone
                removed += 1
    with contextlib.suppress(OSError):
        base.rmdir()
    return removed
