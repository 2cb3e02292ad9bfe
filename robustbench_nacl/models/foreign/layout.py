"""What a foreign key layout is (:class:`Layout`), and the key-prefix helpers every layout uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import Tensor

#: Prefixes added by wrappers around the whole network; stripped when every key has one.
_WRAPPERS = ("module.", "model.", "encoder.")


@dataclass(frozen=True)
class Layout:
    """A foreign key layout: how to recognise it and how to convert it to torchvision's ResNet keys.

    ``normalization`` returns the (mean, std) a file of this layout carries, or None (most carry none).
    ``ask_normalization``: where a file of this layout carries none, the user must name it (this text
    says how) rather than get the "cifar10" default; empty: the default applies.
    """

    name: str
    detect: Callable[[Mapping[str, Tensor]], bool]
    convert: Callable[[Mapping[str, Tensor]], dict[str, Tensor]]
    normalization: Callable[[Mapping[str, Tensor]], tuple[list[float], list[float]] | None] = lambda s: None
    ask_normalization: str = ""


def has_prefix(state: Mapping[str, Tensor], prefix: str) -> bool:
    """Whether any key of ``state`` starts with ``prefix``."""
    return any(k.startswith(prefix) for k in state)


def strip_wrappers(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Remove prefixes that every key shares (``module.encoder.conv1.weight`` -> ``conv1.weight``)."""
    out = dict(state)
    while out:
        prefix = next((p for p in _WRAPPERS if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = {k[len(prefix) :]: v for k, v in out.items()}
    return out
