"""A small name -> object registry (timm's ``register_model`` idea, without the hub logic).

Adding a loss preset, encoder, dataset, view maker or attack is one decorated function; the CLI
choices and the parametrised tests pick it up from here.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from .errors import UserError

T = TypeVar("T")


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` naming the valid choices closest to a mistyped ``name``, or ``""``.

    Case is ignored when matching (``SimCLR`` finds ``simclr``); the suggestion keeps the valid spelling.
    """
    valid = list(choices)
    by_lower = {c.lower(): c for c in valid}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(by_lower[c]) for c in close)}?)" if close else ""


def unknown_choice(kind: str, name: object, choices: Iterable[str]) -> UserError:
    """The one-line error for a name that is not among ``choices``: the closest ones, then every one."""
    valid = list(choices)
    return UserError(f"unknown {kind} {name!r}{did_you_mean(name, valid)}; valid choices: {', '.join(valid)}")


class Registry(Generic[T]):
    """Maps names to objects plus free-form metadata; unknown names raise a one-line ``UserError``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._info: dict[str, dict[str, Any]] = {}

    def register(self, name: str | None = None, **info: Any) -> Callable[[T], T]:
        """Decorator: ``@REG.register("name", key=value)``; the name defaults to the object's ``__name__``.

        A name that is already registered is a one-line :class:`UserError`.
        """

        def deco(obj: T) -> T:
            key = name or obj.__name__  # type: ignore[attr-defined]
            if key in self._items:
                # a plugin naming a built-in (or another plugin's) name: one line, exit 2
                raise UserError(f"{self.kind} {key!r} is already registered; choose another name")
            self._items[key] = obj
            self._info[key] = dict(info)
            return obj

        return deco

    def add(self, name: str, obj: T, **info: Any) -> T:
        """Register ``obj`` under ``name`` without a decorator."""
        return self.register(name, **info)(obj)

    def get(self, name: str) -> T:
        """The object registered as ``name``; a ``UserError`` listing the valid names otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name read from a file
            raise unknown_choice(self.kind, name, self.names()) from None

    def info(self, name: str) -> dict[str, Any]:
        """Metadata given at registration."""
        self.get(name)
        return self._info[name]

    def names(self, pattern: str = "*") -> list[str]:
        """Registered names matching a glob pattern, in registration order."""
        return [k for k in self._items if fnmatch.fnmatch(k, pattern)]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
