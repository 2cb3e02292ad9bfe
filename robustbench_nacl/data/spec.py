"""Dataset spec strings ``name[:classes][@shift]``: the parsed :class:`DatasetSpec`, its parser and
its canonical form.

- ``name`` is one of :func:`~robustbench_nacl.data.catalog.dataset_names` (``cifar10``,
  ``cifar100``, ``stl10``, ``tinyimagenet``, ``fashion-mnist``, ``mnist``, ``digits``);
- ``classes`` keeps a subset of the original classes and relabels them ``0..k-1`` in the order
  given: ``0-4`` (inclusive range), ``3`` (one class), ``0,2,5`` (a list), or a mix ``0-4,7``;
- ``shift`` applies one of ArCL's five transformations (``grayscale``, ``crop``, ``flip``,
  ``jitter``, ``grayscale+jitter``) deterministically to every image of both splits.

A spec string is parsed once where it enters the library (:func:`parse_spec`); the parsed value is
passed on. ``str(spec)`` is its one spelling, which goes into hashes, ids and rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..registry import did_you_mean
from .catalog import DATASETS, dataset_names
from .shifts import shift_names

__all__ = ["DatasetSpec", "canonical_spec", "normalization", "parse_spec"]


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed ``name[:classes][@shift]`` spec."""

    name: str
    #: Original class ids kept, in label order (``digits:0-4`` -> (0, 1, 2, 3, 4)); None = all.
    #: A tuple of ids rather than a (lo, hi) pair so that lists like ``0,2,5`` fit too.
    subset: tuple[int, ...] | None = None
    shift: str | None = None

    @property
    def base(self) -> str:
        """``name[@shift]``: the images before any class subset (what shifts are seeded from)."""
        return self.name + (f"@{self.shift}" if self.shift else "")

    @property
    def info(self) -> dict[str, Any]:
        """The registry's facts about the dataset: ``num_classes``, ``channels``, ``size``, ..."""
        return DATASETS.info(self.name)

    @property
    def channels(self) -> int:
        """Image channels of the dataset (1 or 3)."""
        return int(self.info["channels"])

    def canonical(self) -> DatasetSpec:
        """The same dataset in its one spelling: a subset that keeps every class in its original
        order is the whole dataset (``digits:0-9`` -> ``digits``)."""
        n = int(self.info["num_classes"])
        return dataclasses.replace(self, subset=None) if self.subset == tuple(range(n)) else self

    def with_shift(self, shift: str | None) -> DatasetSpec:
        """The same classes under another shift (None: unshifted)."""
        return dataclasses.replace(self, shift=shift)

    def __str__(self) -> str:
        text = self.name
        if self.subset is not None:
            text += ":" + format_classes(self.subset)
        if self.shift:
            text += f"@{self.shift}"
        return text


def parse_spec(spec: str | DatasetSpec) -> DatasetSpec:
    """Parse ``name[:classes][@shift]``; unknown names, bad class lists and unknown shifts are UserErrors.

    A :class:`DatasetSpec` is returned as it is (it was parsed where it entered).
    """
    if isinstance(spec, DatasetSpec):
        return spec
    text = str(spec).strip()
    if not text:
        raise UserError(f"empty dataset spec; use one of: {', '.join(dataset_names())}")
    rest, at, shift = text.partition("@")
    name, colon, class_text = rest.partition(":")
    name = name.strip()
    if name not in DATASETS:
        raise UserError(
            f"unknown dataset {name!r}{did_you_mean(name, dataset_names())} in spec {text!r}; "
            f"valid datasets: {', '.join(dataset_names())}"
        )
    subset = _parse_classes(text, name, class_text) if colon else None
    shift_name: str | None = None
    if at:
        shift_name = shift.strip()
        valid = shift_names()
        if shift_name not in valid:
            raise UserError(
                f"unknown shift {shift_name!r} in dataset spec {text!r}; valid shifts: {', '.join(valid)}"
            )
    return DatasetSpec(name=name, subset=subset, shift=shift_name)


def canonical_spec(spec: str | DatasetSpec) -> str:
    """The one spelling of a dataset spec, for identities and grouping: ``digits:5,6,7,8,9``,
    ``digits: 5-9`` and ``digits:5-9`` are all ``digits:5-9``; a subset that keeps every class in
    its original order is the whole dataset (``digits:0-9`` -> ``digits``). Class order is kept:
    it is the label order, so ``digits:9,8`` is another dataset than ``digits:8,9``."""
    return str(parse_spec(spec).canonical())


def normalization(name_or_spec: str | DatasetSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) of the dataset's default normalisation.

    Every dataset uses "half" (mean 0.5, std 0.5, i.e. [0,1] -> [-1,1]), the CLAE/NaCl convention,
    so that encoders trained on different datasets see inputs on the same scale.
    """
    info = parse_spec(name_or_spec).info
    kind = info["normalization"]
    if kind != "half":  # pragma: no cover - only "half" is registered
        raise ValueError(f"unknown normalization {kind!r}")
    channels = int(info["channels"])
    return (0.5,) * channels, (0.5,) * channels


def format_classes(classes: tuple[int, ...]) -> str:
    """Class ids in label order, ascending runs of two or more written as ranges:
    ``(0,1,2,3)`` -> ``0-3``, ``(0,1,2,3,4,7)`` -> ``0-4,7``, ``(9,8)`` -> ``9,8``."""
    parts: list[str] = []
    i = 0
    while i < len(classes):
        j = i
        while j + 1 < len(classes) and classes[j + 1] == classes[j] + 1:
            j += 1
        parts.append(f"{classes[i]}-{classes[j]}" if j > i else str(classes[i]))
        i = j + 1
    return ",".join(parts)


def _parse_classes(spec: str, name: str, text: str) -> tuple[int, ...]:
    n = int(DATASETS.info(name)["num_classes"])

    def bad(reason: str) -> UserError:
        return UserError(
            f"invalid class subset {text!r} in dataset spec {spec!r}: {reason}; {name} classes are "
            f"0-{n - 1} (e.g. {name}:0-4, {name}:3 or {name}:0,2,5)"
        )

    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        lo_text, dash, hi_text = item.partition("-")
        if not lo_text.strip().isdigit() or (dash and not hi_text.strip().isdigit()):
            raise bad(f"{item!r} is not a class id or range a-b")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if lo > hi:
            raise bad(f"empty range {item!r}")
        if hi >= n:
            raise bad(f"class {hi} is out of range")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise bad("a class is listed twice")
    return tuple(out)
