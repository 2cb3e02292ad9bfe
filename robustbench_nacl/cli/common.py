"""What every command shares: the default output folders, the parser class, the flags several
commands take (--plugin, --no-progress, --deterministic, --protocol) and small argument helpers."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path
from typing import Any, NoReturn

from ..errors import UserError
from ..io import check_writable_dir, refuse_reference_dir
from ..untrusted import MAX_FLOAT, MAX_SEED

#: Where every command writes by default: one folder of the user's, ignored by the repository's
#: .gitignore, never the repository's reference leaderboard/ (see docs/decisions.md, "Output folders").
DEFAULT_OUT = Path("robustbench_out")
DEFAULT_RESULTS = DEFAULT_OUT / "leaderboard"  # eval rows (OUT/rows) and the rendered leaderboard
DEFAULT_ZOO_OUT = DEFAULT_OUT / "zoo"
DEFAULT_ZOO_BOARD = DEFAULT_OUT / "zoo-leaderboard"
DEFAULT_DEMO_OUT = DEFAULT_OUT / "demo"


def json_kv(items: list[str] | None) -> dict[str, Any]:
    """``["width=16", "act=relu"]`` -> ``{"width": 16, "act": "relu"}``: a value is JSON where it parses.

    Not :func:`robustbench_nacl.losses.parse_overrides`: ``--set`` values stay strings (the loss
    coerces them to its parameters' types), are stripped, and their error names ``--set``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def writable_out(path: str | Path, option: str = "--out") -> None:
    """Refuse the repository's reference folders, then fail early if ``path`` cannot be written."""
    refuse_reference_dir(path, option)
    check_writable_dir(path)


def command_line(args: argparse.Namespace) -> str:
    """The command as the user typed it, without the interpreter's or the script's absolute path."""
    return shlex.join(["robustbench-nacl", *getattr(args, "_argv", [])])


#: The largest magnitude a float flag may have: every number ends up in a float32 tensor (a learning
#: rate of 1e300 overflows inside the optimizer, far from the flag that set it).


def finite_arg(text: str) -> float:
    """argparse type of a float flag: a finite number of float32 range (argparse's one-line error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and abs(value) <= MAX_FLOAT):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of at most {MAX_FLOAT:g}")
    return value


def _int_in(text: str, low: int, high: int = MAX_SEED) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text[:40]!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in [{low}, 2**63 - 1]")
    return value


def int_arg(text: str) -> int:
    """argparse type of an int flag: a 64-bit integer (a 23-digit value overflows numpy and torch)."""
    return _int_in(text, -MAX_SEED - 1)


def seed_arg(text: str) -> int:
    """argparse type of a seed: an integer in [0, 2**63 - 1] (what numpy and torch generators take)."""
    return _int_in(text, 0)


def count_arg(text: str) -> int:
    """argparse type of a count (examples, a batch size, workers): an integer in [1, 2**63 - 1]."""
    return _int_in(text, 1)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, and where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Exit 2 with the usage error on one line."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


PLUGIN_HELP = (
    "load a plugin before the command runs: a dotted module name or the path of a .py file "
    "(repeatable; see examples/README.md)"
)


def deterministic_flag(p: argparse.ArgumentParser) -> None:
    """``--deterministic``, for the commands that train or evaluate."""
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="CUDA: deterministic algorithms and cuDNN kernels, CUBLAS_WORKSPACE_CONFIG (slower; "
        "docs/decisions.md, 'Determinism on CUDA'); no effect on CPU results",
    )


def add_plugin_flag(p: argparse.ArgumentParser, dest: str = "plugin") -> None:
    """``--plugin MODULE`` (repeatable), into ``dest``."""
    p.add_argument("--plugin", action="append", default=[], dest=dest, metavar="MODULE", help=PLUGIN_HELP)


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """The flags every command takes, whether or not it has anything to show or load for them."""
    add_plugin_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def protocol_arg(p: argparse.ArgumentParser, default: str | None = "slf", default_text: str = "") -> None:
    """``--protocol``: one finetuning protocol or a comma list, checked as it is parsed (``default``
    None: resolved later, as ``default_text`` says)."""
    p.add_argument(
        "--protocol",
        default=default,
        type=_protocols,
        help="finetuning protocol(s): slf (linear probe on clean features), alf (adversarial linear), "
        "aff (adversarial full, TRADES), label-free (the representation attacked, no head; also on an "
        "unlabeled image folder as --dataset), or a comma list, e.g. slf,alf,aff (default: "
        + (default_text or "%(default)s")
        + ")",
    )


def _protocols(text: str) -> str:
    """The protocols of ``--protocol``, normalised; a bad one is argparse's one-line usage error."""
    from ..eval.finetune import parse_protocols

    try:
        return ",".join(parse_protocols(text))
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_data_root(path: str | None) -> None:
    """``--data-root DIR`` must exist: a mistyped one would silently fall back to another copy of the
    data (the system's Fashion-MNIST, the default cache), and the rows would not say which was read."""
    if path and not Path(path).expanduser().is_dir():
        raise UserError(f"--data-root {path}: no such folder (leave the flag out for the default data root)")
