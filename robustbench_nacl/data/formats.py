"""The on-disk formats the loaders read: a restricted unpickler for the CIFAR python batches and a
reader for IDX ubyte files (MNIST, Fashion-MNIST); both turn damaged or hostile files into one-line
UserErrors."""

from __future__ import annotations

import math
import pickle
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import UserError, one_line
from ..untrusted import gunzip_bounded, open_regular, read_regular

__all__ = ["read_idx", "restricted_unpickle"]


def _reconstruct_function() -> Callable[..., Any]:
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


def _latin1_encode(text: str = "", encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3 protocol-2 pickles use it for bytes, and nothing more."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("refusing _codecs.encode with anything but (str, 'latin1')")
    return text.encode("latin1")


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild plain numpy arrays and builtin containers, and nothing else.

    A dataset file is untrusted input: ``pickle.load`` on it would run any callable it names.
    """

    _ALLOWED: ClassVar[dict[tuple[str, str], Any]] = {
        # The real CIFAR files (Python 2 / numpy 1) name numpy.core; numpy 2 writes numpy._core.
        # Returning the function directly also avoids importing the deprecated numpy.core shim.
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct_function(),
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct_function(),
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # Python 3 writes bytes in protocol 2 as _codecs.encode(str, "latin1").
        ("_codecs", "encode"): _latin1_encode,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def restricted_unpickle(path: str | Path) -> Any:
    """Load a pickle that may only contain builtin containers and numpy arrays (``encoding="bytes"``).

    Anything else (a callable, a class, a malformed stream) is a one-line UserError naming the file.
    """
    path = Path(path)
    try:
        with open_regular(path, "dataset file") as f:
            return _RestrictedUnpickler(f, encoding="bytes").load()
    except pickle.UnpicklingError as e:
        raise UserError(
            f"{path} is not a plain data pickle ({one_line(str(e))}); delete it and re-download"
        ) from e
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from e
    except Exception as e:  # a damaged stream fails in many ways (EOFError, ValueError, struct.error, ...)
        raise UserError(
            f"{path} is corrupt or truncated ({type(e).__name__}); delete it and re-download"
        ) from e


_IDX_UBYTE = 0x08
#: The largest IDX payload read (Fashion-MNIST's training images are 47 MB).
MAX_IDX = 1 << 30


def _declared_idx_size(path: Path, gz: bytes) -> int:
    """The inflated size a gzipped IDX file's header declares (header included), refused over
    :data:`MAX_IDX` before the payload is inflated; a header that does not parse gets the cap (the
    checks after inflation say what is wrong with it)."""
    d = zlib.decompressobj(wbits=31)
    head = d.decompress(gz, 4 + 4 * 255)
    if len(head) < 4 or head[:3] != b"\x00\x00\x08" or len(head) < 4 + 4 * head[3]:
        return MAX_IDX
    dims = struct.unpack(f">{head[3]}I", head[4 : 4 + 4 * head[3]])
    size = 4 + 4 * len(dims) + math.prod(dims)
    if size > MAX_IDX:
        raise UserError(f"{path} declares {dims} = {size} bytes, over {MAX_IDX}: no such IDX file; delete it")
    return size


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX ubyte file (gzipped or not, detected by content) into a uint8 array.

    The header is ``00 00 08 ndim`` then ``ndim`` big-endian uint32 sizes; the payload must have
    exactly their product in bytes. Anything else is a one-line UserError naming the file.
    """
    path = Path(path)
    try:
        raw = read_regular(path, "IDX file")
        if raw[:2] == b"\x1f\x8b":
            # inflated up to the size its header declares (checked first), never whole: a few MB of
            # gzip can hold GBs
            raw = gunzip_bounded(raw, _declared_idx_size(path, raw), f"{path}")
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(
            f"cannot read {path}: {one_line(str(e) or type(e).__name__)}; delete it and re-download"
        ) from e
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != _IDX_UBYTE:
        raise UserError(f"{path} is not an IDX ubyte file (bad magic number); delete it and re-download")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise UserError(f"{path} is truncated (incomplete IDX header); delete it and re-download")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    need = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != need:
        raise UserError(
            f"{path} is truncated or corrupt: header says {dims} = {need} bytes, "
            f"file has {len(raw) - header}; delete it and re-download"
        )
    # copy(): frombuffer over bytes is read-only, which torch.from_numpy warns about.
    return np.frombuffer(raw, dtype=np.uint8, count=need, offset=header).reshape(dims).copy()
