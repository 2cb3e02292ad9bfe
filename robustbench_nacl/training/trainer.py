"""Deprecated alias: import from :mod:`robustbench_nacl.train` instead.

Kept only while ``cli.py``, ``zoo.py``, ``demo.py``, the package ``__init__`` and
``bench/attack_sweep_ratio.py`` still import ``TrainConfig``, ``TrainStep``, ``build_model``,
``run_id`` and ``train`` from here; delete this file once they do not. Names are looked up in
:mod:`.loop` at each access, so a test that patches ``loop.train`` also reaches these callers.
"""

from __future__ import annotations

from typing import Any

from . import loop

_NAMES = ("TrainConfig", "TrainStep", "build_model", "run_id", "train")


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
