"""Reading a checkpoint file safely: naming what a file is, ``torch.load`` restricted to tensors (after
refusing the environment override), and the flat state dict inside (docs/decisions.md,
"Loading untrusted checkpoints")."""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.torch_version import TorchVersion

from ...errors import CheckpointError, UserError, one_line
from ...io import sha256_bytes
from ...untrusted import check_zip_sizes, open_regular, read_regular
from ...utils import refuse_unsafe_torch_env
from ..checkpoint import check_finite, load_state

#: Pickled checkpoints are only trusted to torch releases without the known weights_only escapes
#: (CVE-2025-32434 fixed in 2.6, CVE-2026-24747 fixed in 2.10).
_MIN_TORCH = "2.10"

#: Keys under which checkpoints nest their state dict, tried in this order.
#: ``state_dict_dual`` first: the RobustSSL benchmark's ``get_model`` looks there before ``state_dict``.
_CONTAINERS = ("state_dict_dual", "state_dict", "model", "model_state_dict", "encoder", "net")


_EXPECTED = (
    "expected a directory written by `train` (or its manifest.json), a .safetensors file, "
    "or a state dict saved with torch.save (.pt, .pth, .ckpt)"
)


def _looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # a multi-byte character cut by the end of the sample
    return True


def describe_file(head: bytes) -> tuple[bool, str]:
    """(may it be a checkpoint?, what it is) from the first bytes of a file; reads nothing else.

    Checkpoints are safetensors (an 8-byte header length, then JSON), zip archives (torch.save) or
    pickles (legacy torch.save); anything else is named so that the error can say what was passed.
    """
    if not head:
        return False, "an empty file"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 0:
        return True, "a safetensors file"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return True, "a zip archive (the format of torch.save)"
    if head.startswith(b"\x80"):
        return True, "a pickle (legacy torch.save format)"
    if head.startswith(b"\x1f\x8b"):
        return False, "a gzip-compressed file (decompress it first)"
    if len(head) > 262 and head[257:262] == b"ustar":
        return False, "a tar archive (extract the checkpoint from it first)"
    if _looks_like_text(head):
        text = head.decode("utf-8", errors="replace").strip()
        kind = "a JSON file" if text[:1] in ("{", "[") else "a text file"
        return False, f"{kind} (it begins {clean(text, 40)!r})" if text else f"{kind} of blank lines"
    return False, f"a binary file of no checkpoint format (it begins {head[:8].hex(' ')})"


def refuse_non_checkpoint(path: Path, head: bytes) -> None:
    """A one-line CheckpointError saying what ``path`` is, unless it may be a checkpoint."""
    plausible, what = describe_file(head)
    if not plausible:
        raise CheckpointError(f"{path} is {what}, not a checkpoint; {_EXPECTED}")


def read_head(path: Path, n: int = 512) -> bytes:
    try:
        with open_regular(path, "checkpoint") as f:  # a FIFO would block for ever
            return f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or first_line(e)}") from None
    except UserError as e:
        raise CheckpointError(str(e)) from None


def clean(text: Any, limit: int = 80) -> str:
    """One line, bounded: names from an untrusted file must not break the one-line error contract."""
    return one_line(text, limit)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its class name if empty), bounded."""
    lines = str(e).strip().splitlines()
    return clean(lines[0] if lines else type(e).__name__, 200)


def _unsafe_globals(data: bytes) -> list[str]:
    """GLOBALs the restricted unpickler would refuse, by static disassembly (nothing is executed)."""
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is None:
        return []
    try:
        return sorted(finder(io.BytesIO(data)))
    except Exception:  # legacy (non-zip) pickles and corrupt archives: nothing to report
        return []


def _torch_load(data: bytes, origin: Path) -> Any:
    """``torch.load`` restricted to tensors and plain containers; any refusal is a one-line error."""
    try:
        refuse_unsafe_torch_env()
    except UserError as e:
        raise CheckpointError(f"refusing to read {origin}: {e}") from None
    if TorchVersion(torch.__version__) < _MIN_TORCH:
        raise CheckpointError(
            f"torch {torch.__version__} has known weights_only escapes; upgrade to torch>={_MIN_TORCH} "
            f"or convert {origin} to safetensors where you trust it"
        )
    try:
        # weights_only=True passed explicitly, so no environment variable or default can flip it.
        # The loader's warnings (e.g. about an unusual pickle protocol) would break the CLI's
        # one-line error contract; whether the file is usable is reported by the error, if any.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        if "TorchScript" in str(e):
            raise CheckpointError(
                f"{origin} is a TorchScript archive (code, not just weights) and was refused; "
                "save its state_dict instead"
            ) from None
        unsafe = _unsafe_globals(data)
        if unsafe or isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
            named = f" ({', '.join(clean(g) for g in unsafe[:5])})" if unsafe else ""
            raise CheckpointError(
                f"{origin} holds Python objects beyond tensors{named} and was refused, since loading it "
                "could run code; re-save only its state dict (or convert it to safetensors) where trusted"
            ) from None
        raise CheckpointError(f"{origin} is not a readable torch checkpoint ({first_line(e)})") from None


def _is_tensor_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items())
    )


def _unwrap(obj: Any, origin: Path, depth: int = 0) -> dict[str, Tensor]:
    """The flat name -> tensor dict inside a loaded checkpoint (top level, or under a container key)."""
    if _is_tensor_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping) and depth < 3:
        for key in _CONTAINERS:
            inner = obj.get(key)
            if not isinstance(inner, Mapping):
                continue
            # inside a container, non-tensor leaves (counters, metadata) are ignored
            tensors = {k: v for k, v in inner.items() if isinstance(k, str) and isinstance(v, Tensor)}
            if tensors:
                return tensors
            try:
                return _unwrap(inner, origin, depth + 1)
            except CheckpointError:
                continue
        if len(obj) == 1 and _is_tensor_dict(next(iter(obj.values()))):
            # a state dict under a name of the user's choosing, as lightly's tutorial saves it
            # ({"resnet18_parameters": backbone.state_dict()})
            return dict(next(iter(obj.values())))
    found = (
        f"top-level keys: {', '.join(clean(k, 40) for k in list(obj)[:6])}"
        if isinstance(obj, Mapping)
        else f"a {type(obj).__name__}"
    )
    raise CheckpointError(
        f"{origin} holds no state dict ({found}); expected a name -> tensor dict, "
        f"possibly under one of: {', '.join(_CONTAINERS)}"
    )


def read_checkpoint(path: str | Path) -> tuple[dict[str, Tensor], str]:
    """(flat state dict, sha256 of the file's bytes), read once so the hash is of what was loaded."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(
            f"checkpoint file {p} not found" + (" (it is a directory)" if p.is_dir() else "")
        )
    try:
        data = read_regular(p, "checkpoint")
    except OSError as e:
        raise CheckpointError(f"cannot read {p}: {e.strerror or first_line(e)}") from None
    except UserError as e:  # a FIFO or a device named as the checkpoint
        raise CheckpointError(str(e)) from None
    refuse_non_checkpoint(p, data[:512])
    sha = sha256_bytes(data)
    if p.suffix == ".safetensors":
        # load_state re-reads the file; the expected sha256 makes sure it is the same bytes we hashed
        state = load_state(p, expected_sha256=sha)
    else:
        try:  # a deflated member could inflate to any size inside torch.load
            check_zip_sizes(data, str(p))
        except UserError as e:
            raise CheckpointError(str(e)) from None
        state = _unwrap(_torch_load(data, p), p)
        check_finite(state, p)
    return state, sha


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a checkpoint file as a flat name -> tensor dict (safetensors, or a weights-only pickle).

    Raises ``CheckpointError`` (one line) for missing, corrupt, unsafe or non-finite files.
    """
    return read_checkpoint(path)[0]
