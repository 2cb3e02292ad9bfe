"""A small name -> object registry (timm's ``register_model`` idea, without the hub logic).

Adding a loss preset, encoder, dataset, view maker or attack is one decorated function; the CLI
choices and the parametrised tests pick it up from here.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects plus free-form metadata; unknown names raise a one-line ``UserError``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._info: dict[str, dict[str, Any]] = {}

    def register(self, name: str | None = None, **info: Any) -> Callable[[T], T]:
        """Decorator: ``@REG.register("name", key=value)``; the name defaults to the object's ``__name__``."""

        def deco(obj: T) -> T:
            key = name or obj.__name__  # type: ignore[attr-defined]
            if key in self._items:
                raise ValueError(f"{self.kind} {key!r} registered twice")
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
        except KeyError:
            raise UserError(
                f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names())}"
            ) from None

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
