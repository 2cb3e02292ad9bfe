"""The registry of foreign key layouts (:data:`FORMATS`, in detection order), detection and conversion
to torchvision's ResNet keys."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ...errors import CheckpointError
from ...registry import Registry, unknown_choice
from . import lightly, ours, plain, robustssl, solo
from .layout import Layout, strip_wrappers
from .reading import clean


def _formats() -> Registry[Layout]:
    formats: Registry[Layout] = Registry("checkpoint format")
    # registration order is detection order: the most specific layouts first
    for layout, description in (
        *ours.LAYOUTS,
        *lightly.LAYOUTS,
        *solo.LAYOUTS,
        *robustssl.LAYOUTS,
        *plain.LAYOUTS,
    ):
        formats.add(layout.name, layout, description=description)
    return formats


FORMATS = _formats()


def check_format(fmt: str) -> None:
    """A one-line error for a format that is neither "auto" nor registered."""
    if fmt != "auto" and fmt not in FORMATS:
        raise unknown_choice("checkpoint format", fmt, ["auto", *FORMATS.names()])


def detect_format(state: Mapping[str, Tensor]) -> str:
    """The name of the first registered layout that recognises ``state`` (wrapper prefixes ignored)."""
    stripped = strip_wrappers(state)
    for name in FORMATS:
        if FORMATS.get(name).detect(stripped):
            return name
    shown = ", ".join(clean(k) for k in list(stripped)[:5]) or "none"
    raise CheckpointError(
        f"cannot tell the layout of this state dict (first keys: {shown}); "
        f"pass --format, one of: {', '.join(FORMATS.names())}"
    )


def convert_state_dict(state: Mapping[str, Tensor], fmt: str) -> dict[str, Tensor]:
    """Convert a foreign state dict of layout ``fmt`` (or "auto") to torchvision's ResNet backbone keys."""
    check_format(fmt)
    if fmt == "auto":
        fmt = detect_format(state)
    return FORMATS.get(fmt).convert(strip_wrappers(state))
