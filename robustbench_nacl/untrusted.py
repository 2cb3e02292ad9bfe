"""Reading what someone else wrote: the one rule for names that become paths, regular files only,
bounded reads and decompression, and numbers checked at the door (docs/decisions.md, 'Untrusted
input: names, bounds and refusals').

Every id or name read from a file (a row's, recipe's or protocol's id, a checkpoint or card id, a
manifest's ``id``, ``weights`` or ``pseudo_labels``, a suite name) passes :func:`safe_name` before
it is joined to a folder; every file a user or a submission names is opened by
:func:`read_regular` or :func:`open_regular`, which refuse a FIFO, a device or a socket before
reading a byte (a FIFO would block for ever, ``/dev/zero`` never ends); compressed input is
inflated by :func:`gunzip_bounded` up to a cap, never whole. Each refusal is one ``UserError`` line.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path
from typing import IO

from .errors import UserError

#: A single path component that is safe on every file system the project runs on: it starts with a
#: letter or digit (so never ``.``, ``..``, a hidden file or an option), holds no separator, no NUL
#: and no space, and is short enough for any file system's name limit once a suffix is added.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@-]{0,127}")

#: Decompressed row packs, and any JSON read whole, stop here (the published packs inflate to 48 MB).
MAX_INFLATED = 1 << 30
#: A zip member of a checkpoint may inflate this many times its stored size: ``torch.save`` stores
#: its members uncompressed (ratio 1), so anything far above is a decompression bomb.
MAX_ZIP_RATIO = 20
#: The largest file read whole (a checkpoint's weights, a suite, a row): above, it is no such file.
MAX_FILE = 8 << 30
#: Seeds are 64-bit integers everywhere they end up (numpy, torch generators).
MAX_SEED = (1 << 63) - 1
#: the largest magnitude a float setting may have: what float32 holds (beyond it a weight is inf)
MAX_FLOAT = 3.0e38


def safe_name(value: object, what: str) -> str:
    """``value`` when it can be used as one path component (a file or folder name); else a one-line
    ``UserError`` naming ``what`` (e.g. ``"row_id"``, ``"manifest field 'id'"``)."""
    if isinstance(value, str) and _SAFE_NAME.fullmatch(value) and ".." not in value:
        return value
    shown = " ".join(str(value).split())[:80]
    raise UserError(
        f"{what} {shown!r} is not a plain name (letters, digits and . _ + = @ -, at most 128, starting "
        "with a letter or digit): an id never names a path"
    )


def _refuse_special(path: Path, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UserError(
            f"{what} {path} is not a regular file (a FIFO, device or socket), which could block or never "
            "end: pass a file"
        )


def check_regular(path: str | Path, what: str = "") -> Path:
    """``path`` if it is a regular file (links followed); a one-line ``UserError`` for a FIFO, a
    device, a socket or a folder. A missing path is returned as is: its reader says it is missing."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError:
        return p
    _refuse_special(p, mode, what or "the file")
    return p


@contextlib.contextmanager
def open_regular(path: str | Path, what: str = "", limit: int = MAX_FILE) -> IO[bytes]:
    """Open ``path`` for binary reading when it is a regular file of at most ``limit`` bytes.

    The check is made on the opened file (``fstat``), opened without blocking, so a FIFO swapped in
    after a check cannot hang the reader. Missing or unreadable files raise ``OSError`` as ``open``
    does (each caller words its own "cannot read" line).
    """
    p = Path(path)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        _refuse_special(p, st.st_mode, what or "the file")
        if st.st_size > limit:
            raise UserError(f"{what or 'the file'} {p} is {st.st_size} bytes, over the {limit}-byte limit")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_regular(path: str | Path, what: str = "", limit: int = MAX_FILE) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``; see :func:`open_regular`)."""
    with open_regular(path, what, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew since fstat
        raise UserError(f"{what or 'the file'} {path} is over the {limit}-byte limit")
    return data


def gunzip_bounded(data: bytes, limit: int | None = None, what: str = "the file") -> bytes:
    """Inflate gzip ``data`` (every member) to at most ``limit`` bytes; beyond, a one-line
    ``UserError`` (``limit`` None: :data:`MAX_INFLATED`): a few MB of hostile gzip can inflate to
    many GB, which is never allocated here.
    A damaged stream raises ``zlib.error`` or ``EOFError`` for the caller to word."""
    limit = MAX_INFLATED if limit is None else limit
    out: list[bytes] = []
    size = 0
    rest = data
    while rest:
        d = zlib.decompressobj(wbits=31)  # one gzip member
        chunk = d.decompress(rest, limit - size + 1)
        while True:
            size += len(chunk)
            if size > limit:
                raise UserError(
                    f"{what} inflates to more than {limit} bytes: refused (a decompression bomb?)"
                )
            out.append(chunk)
            if d.eof or not d.unconsumed_tail:
                break
            chunk = d.decompress(d.unconsumed_tail, limit - size + 1)
        if not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        rest = d.unused_data.lstrip(b"\x00")  # members may be padded with zeros
    return b"".join(out)


def check_zip_sizes(data: bytes, what: str, limit: int = MAX_FILE) -> None:
    """Refuse a zip archive (a ``torch.save`` file) by the sizes its directory declares, before any
    member is inflated: a member that inflates over :data:`MAX_ZIP_RATIO` times its stored size, or
    members over ``limit`` bytes in all. Not a zip: nothing to check (the reader words its error)."""
    import io

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return
    total = sum(i.file_size for i in infos)
    packed = [i for i in infos if i.compress_type != zipfile.ZIP_STORED]
    bomb = any(i.file_size > MAX_ZIP_RATIO * max(i.compress_size, 1) + 4096 for i in packed)
    if bomb or total > limit:
        raise UserError(
            f"{what} declares {total} bytes inside {len(data)}: refused as a decompression bomb "
            "(torch.save stores its tensors uncompressed)"
        )


def finite(value: float, what: str, *, positive: bool = False, nonneg: bool = False) -> float:
    """``value`` when it is a finite number (and > 0 or >= 0 where asked); else a one-line error."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and positive and not value > 0:
        raise UserError(f"{what} {value!r}: must be > 0")
    if ok and nonneg and not value >= 0:
        raise UserError(f"{what} {value!r}: must be >= 0")
    if not ok:
        raise UserError(f"{what} {value!r}: must be a finite number")
    return value


def int64(value: int, what: str, *, low: int = -(1 << 63)) -> int:
    """``value`` when it is an integer in [``low``, 2**63 - 1]; else a one-line error (a 23-digit
    seed or example count would overflow numpy and torch far from where it was typed)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SEED:
        raise UserError(f"{what} {str(value)[:40]!r}: must be an integer in [{low}, 2**63 - 1]")
    return value
