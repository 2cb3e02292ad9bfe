"""Command-line flags generated from config dataclasses: one flag per scalar field, its default the
field's default and its help the field's comment in the dataclass's source.

Why the source is parsed (with :mod:`ast`): each field of ``TrainConfig``, ``ProbeConfig``,
``AlfConfig`` and ``AffConfig`` is documented by a ``# comment`` beside it (or on the line above),
and that comment is the flag's help, so a new field becomes a documented flag with no edit here
(docs/decisions.md, "CLI flags from the config dataclasses"). Help kept in ``field(metadata=...)``
instead would repeat every comment in a second place, and any rewording would change ``--help``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from collections.abc import Iterable
from typing import Any

from .common import finite_arg, int_arg, seed_arg


def _optional_scalar(tp: Any) -> type | None:
    """``int``/``float``/``str``/``bool`` for a field of that type (or that type ``| None``), else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            return None
        tp = args[0]
    return tp if tp in (int, float, str, bool) else None


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the dataclass's source (trailing, or on the line above): its help text."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = re.search(r"#\s*(.+)$", lines[node.end_lineno - 1])  # type: ignore[operator]
        above = re.match(r"\s*#\s*(.+)$", lines[node.lineno - 2]) if node.lineno > 1 else None
        if m := trailing or above:
            out[node.target.id] = m.group(1).strip()
    return out


def config_fields(cls: type, skip: Iterable[str] = ()) -> list[dataclasses.Field[Any]]:
    """The fields of a config dataclass that become flags: every scalar one not in ``skip``."""
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if f.name not in skip and _optional_scalar(hints[f.name])]


def flag_name(field_name: str, prefix: str = "") -> str:
    """``batch_size`` -> ``--batch-size`` (``--probe-batch-size`` with prefix ``probe-``)."""
    return f"--{prefix}{field_name.replace('_', '-')}"


def add_config_flags(
    p: argparse.ArgumentParser,
    cls: type,
    *,
    prefix: str = "",
    skip: Iterable[str] = (),
    help: dict[str, str] | None = None,
    choices: dict[str, list[str]] | None = None,
) -> None:
    """One flag per scalar field of dataclass ``cls``, its default the field's default.

    A field added to the dataclass appears as a flag with no edit here; its help is ``help[name]``,
    else the field's comment in the source.
    """
    hints, comments = typing.get_type_hints(cls), _field_comments(cls)
    for f in config_fields(cls, skip):
        tp = _optional_scalar(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = (help or {}).get(f.name) or comments.get(f.name) or f"{cls.__name__}.{f.name}"
        text = text.replace("%", "%%")  # argparse formats help with %
        kw: dict[str, Any] = {"default": default, "dest": (prefix + f.name).replace("-", "_")}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction  # it appends the default itself
        else:
            # numbers are range-checked as they are parsed: finite floats, 64-bit ints, seeds >= 0
            checked = {float: finite_arg, int: seed_arg if "seed" in f.name else int_arg}.get(tp, tp)
            kw.update(type=checked, metavar={int: "N", float: "X"}.get(tp, f.name.split("_")[-1].upper()))
            text += " (default: %(default)s)"
        if choices and f.name in choices:
            kw["choices"] = choices[f.name]
        p.add_argument(flag_name(f.name, prefix), help=text, **kw)


def config_values(
    cls: type, args: argparse.Namespace, *, prefix: str = "", skip: Iterable[str] = ()
) -> dict[str, Any]:
    """The values of the flags :func:`add_config_flags` made, as keyword arguments of ``cls``."""
    return {f.name: getattr(args, (prefix + f.name).replace("-", "_")) for f in config_fields(cls, skip)}


def add_recipe_flag(p: argparse.ArgumentParser) -> None:
    """``--finetune-recipe``: the named finetuning recipe (eval/finetune_recipes.py), its help listing
    the registered recipes and the methods a recipe can be pinned to."""
    from ..eval.finetune_recipes import DEFAULT_RECIPE, FINETUNE_RECIPES

    names = "; ".join(
        f"{r.name}: {r.summary}"
        + (f" ({r.name}:METHOD, METHOD one of {', '.join(r.methods)})" if r.methods else "")
        for r in FINETUNE_RECIPES.values()
    )
    p.add_argument(
        "--finetune-recipe",
        default=DEFAULT_RECIPE,
        metavar="RECIPE",
        help=f"the SLF/ALF/AFF settings: {names} (default: {DEFAULT_RECIPE})".replace("%", "%%"),
    )


def robustssl_args(p: argparse.ArgumentParser) -> None:
    """``eval``'s flags for the RobustSSL benchmark's checkpoints and released corruption sets
    (docs/decisions.md, 'Robust self-supervised evaluation')."""
    from ..models.foreign.robustssl import PRETRAININGS  # lazy, like every command's heavy imports

    p.add_argument(
        "--pretraining",
        default=None,
        metavar="NAME",
        help="a RobustSSL benchmark checkpoint of this method, read as the benchmark reads it (--format "
        f"robustssl:NAME): {', '.join(PRETRAININGS.names())}",
    )
    p.add_argument(
        "--corruptions-from",
        default=None,
        metavar="DIR",
        help="read --corruptions from the released CIFAR-10-C / CIFAR-100-C .npy files in DIR (or "
        "DIR/CIFAR-10-C) instead of computing them; 'all' is the benchmark's 15",
    )
