"""Per-example outcomes (clean / robust, one boolean per test example) as compact base64 text."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UserError


def encode_bits(mask: Any | np.ndarray | Sequence[bool]) -> str:
    """Per-example booleans as base64 text: ``numpy.packbits(mask, bitorder="little")``.

    ``mask``: a torch tensor (any device), an array or a sequence of booleans. Example ``i`` is bit
    ``i % 8`` (least significant first) of byte ``i // 8``; the padding bits of the last byte are
    0. 10,000 examples take 1,668 characters.
    """
    if hasattr(mask, "detach"):  # a torch tensor, told apart without importing torch
        mask = mask.detach().cpu()
    arr = np.asarray(mask, dtype=bool).ravel()
    return base64.b64encode(np.packbits(arr, bitorder="little").tobytes()).decode("ascii")


def decode_bits(text: str, n: int) -> np.ndarray:
    """The ``n`` booleans :func:`encode_bits` packed into ``text`` (a one-line UserError if malformed)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise UserError(f"per-example bits {str(text)[:40]!r} are not base64 text") from None
    if n < 0 or len(raw) != (n + 7) // 8:
        raise UserError(f"per-example bits hold {len(raw)} bytes; {n} examples need {(n + 7) // 8}")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little").astype(bool)
    if bits[n:].any():
        raise UserError(f"per-example bits have set padding bits beyond example {n}: not {n} examples")
    return bits[:n]
