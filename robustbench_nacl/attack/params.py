"""Validators of attack parameters (used by suites.py through the registry's ``params`` metadata)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def short_repr(v: Any, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters (error messages stay one short line)."""
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def int_at_least(lo: int) -> Callable[[Any], int]:
    """Validator: an integer (not a bool) >= ``lo``."""

    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"must be an integer >= {lo}, got {short_repr(v)}")
        return int(v)

    return check


def positive_float(v: Any) -> float:
    """Validator: a finite number > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"must be a finite number > 0, got {short_repr(v)}")
    return float(v)


def boolean(v: Any) -> bool:
    """Validator: true or false."""
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {short_repr(v)}")
    return v


def one_of(*choices: str) -> Callable[[Any], str]:
    """Validator: one of the given strings."""

    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {short_repr(v)}")
        return str(v)

    return check


def list_of(*choices: str) -> Callable[[Any], list[str]]:
    """Validator: a non-empty list of distinct strings from ``choices``."""

    def check(v: Any) -> list[str]:
        if not isinstance(v, (list, tuple)) or not v or any(c not in choices for c in v):
            raise ValueError(f"must be a non-empty list drawn from {', '.join(choices)}, got {short_repr(v)}")
        if len(set(v)) != len(v):
            raise ValueError(f"has duplicates: {short_repr(v)}")
        return [str(c) for c in v]

    return check
