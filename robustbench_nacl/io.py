"""Atomic file output and hashing: nothing half-written is ever left behind.

Files are created with the permissions ``open`` would give them (0666 less the process umask), so
that results and checkpoints are as readable as any other file the user writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import UserError


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success fsync and rename it over ``path``.

    On any error the temporary file is removed and ``path`` is untouched. OSErrors (read-only
    directory, disk full, vanished directory) become a one-line ``UserError``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write {path}: {_reason(e)}; choose a writable --out directory") from e
    try:
        with os.fdopen(fd, mode) as f:
            # mkstemp creates 0600 whatever the umask: give the file the mode `open` would have
            # given it, before it appears under its name (the rename stays the only visible change)
            if hasattr(os, "fchmod"):  # POSIX; elsewhere mkstemp's mode is the platform's default
                os.fchmod(f.fileno(), 0o666 & ~current_umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os_error = _os_error_in_chain(e) if isinstance(e, Exception) else None  # not KeyboardInterrupt
        if os_error is not None:
            raise UserError(f"cannot write {path}: {_reason(os_error)}; nothing was written") from e
        raise
    _fsync_dir(path.parent)


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status).

    Elsewhere it is read by setting and restoring it, under a lock so that two writer threads of
    this module never see each other's temporary value.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _os_error_in_chain(e: BaseException) -> OSError | None:
    """The OSError behind ``e``, if any: writers such as ``torch.save`` wrap a failed write (disk
    full) in a RuntimeError whose context is the OSError."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _reason(e: OSError) -> str:
    """An OSError as a short phrase on one line ("No space left on device")."""
    return " ".join(str(e.strerror or e).split())


def _fsync_dir(directory: Path) -> None:
    # Persist the rename itself (a crash right after it must not lose the directory entry). Best
    # effort: some filesystems cannot open or fsync a directory, and the file is complete either way.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_writable_dir(path: str | Path) -> None:
    """Fail early, with a one-line ``UserError``, if files cannot be created in directory ``path``.

    Creates nothing that stays: the nearest existing ancestor must be a directory in which a
    temporary file can be created (read-only filesystems and permissions are caught, a path whose
    parent is a file too). Called before expensive work, so that it is not lost at the first write.
    """
    path = Path(path)
    probe = path
    try:
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise UserError(f"cannot write to {path}: {probe} is not a directory; choose another --out")
        fd, tmp = tempfile.mkstemp(prefix=".robustbench-nacl-write-test.", suffix=".tmp", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"cannot write to {path}: {_reason(e)}; choose a writable --out directory") from e


#: Folders of the repository that hold published reference results: user output never goes there.
REFERENCE_DIRS = ("leaderboard",)
#: Set to 1 by whoever regenerates the repository's reference results on purpose.
REFERENCE_ENV = "ROBUSTBENCH_NACL_WRITE_REFERENCE"


def repository_root() -> Path | None:
    """The source checkout this package is imported from (an editable install), else None."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "robustbench_nacl").is_dir() else None


def refuse_reference_dir(path: str | Path, option: str = "--out") -> None:
    """A one-line ``UserError`` when ``path`` is, or lies inside, a reference folder of the checkout.

    The repository's ``leaderboard/`` is the published reference; a user's rows written into it
    would mix with it and dirty the clone. ``$ROBUSTBENCH_NACL_WRITE_REFERENCE=1`` lifts the check
    for a deliberate regeneration of the reference.
    """
    root = repository_root()
    if root is None or os.environ.get(REFERENCE_ENV, "").strip() == "1":
        return
    target = Path(path).expanduser().resolve()
    for name in REFERENCE_DIRS:
        ref = (root / name).resolve()
        if target == ref or ref in target.parents:
            raise UserError(
                f"{option} {path} is inside the repository's reference {name}/ folder, which your results "
                f"must not mix with; write them to a folder of your own (the default is under "
                f"robustbench_out/)"
            )


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def canonical_json(obj: Any) -> str:
    """The one canonical JSON of the project (sorted keys, no spaces, no NaN): what hashes are taken of."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()
