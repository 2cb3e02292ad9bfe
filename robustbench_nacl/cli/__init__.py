"""The ``robustbench-nacl`` command: the table of its subcommands (:data:`COMMANDS`), the parser
built from it, and :func:`main`.

User errors (bad flags, missing data, broken checkpoints) print one line and exit with code 2;
there is no traceback for them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .. import plugins
from ..errors import UserError
from .board import compare_args, leaderboard_args, run_compare, run_leaderboard
from .common import Parser, add_common_flags, add_plugin_flag
from .demo import demo_args, run_demo
from .eval import eval_args, run_eval
from .flags import add_config_flags, config_values
from .info import (
    datasets_args,
    encoders_args,
    losses_args,
    models_args,
    run_datasets,
    run_encoders,
    run_losses,
    run_models,
)
from .post import post_args, run_post
from .train import run_train, train_args
from .zoo import run_zoo, zoo_args

__all__ = ["CLOSED_PIPE", "COMMANDS", "Command", "add_config_flags", "build_parser", "config_values", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: what adds its flags to its parser, what runs it, and its one-line help."""

    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    help: str


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: dict[str, Command] = {
    "losses": Command(
        losses_args, run_losses, "list the loss presets (the paper's Table 1) or show one with overrides"
    ),
    "encoders": Command(encoders_args, run_encoders, "list the encoder architectures"),
    "datasets": Command(datasets_args, run_datasets, "list the datasets and how to get each"),
    "train": Command(train_args, run_train, "train one encoder with one loss preset"),
    "post": Command(
        post_args,
        run_post,
        "post-process a pretrained checkpoint (DynACL++ / AIR++: pseudo-labels, LP, adversarial finetuning)",
    ),
    "eval": Command(
        eval_args, run_eval, "probe and attack an encoder checkpoint; writes content-addressed result rows"
    ),
    "leaderboard": Command(
        leaderboard_args,
        run_leaderboard,
        "render LEADERBOARD.md, CSV/JSON, the paper's plots and index.html from result rows",
    ),
    "compare": Command(
        compare_args,
        run_compare,
        "every recipe against a baseline on the same test examples: difference, interval, p",
    ),
    "zoo": Command(
        zoo_args,
        run_zoo,
        "list, show, train, eval, run (train + eval + render), verify or status of zoo entries "
        "(zoo/*/*.json); publish, regenerate, verify-submission DIR",
    ),
    "models": Command(
        models_args,
        run_models,
        "list the published reference models (load_model / eval --model NAME) with headline numbers",
    ),
    "demo": Command(
        demo_args,
        run_demo,
        "the main job: train the demo zoo on digits, evaluate it, render the leaderboard",
    ),
}


def plugin_specs(argv: list[str]) -> list[str]:
    """The ``--plugin`` values of a command line, wherever they stand (read before the parsers are
    built, so that plugin losses and encoders are registered when their help and checks are made)."""
    pre = Parser(prog="robustbench-nacl", add_help=False, allow_abbrev=False)
    add_plugin_flag(pre)
    known, _ = pre.parse_known_args(argv)
    return list(known.plugin)


def _top_parser(add_help: bool = True) -> Parser:
    """The top-level parser without its subcommands: ``--plugin`` (and ``--help``)."""
    parser = Parser(
        prog="robustbench-nacl",
        description="Adversarial-robustness benchmark and model zoo for contrastive encoders.",
        add_help=add_help,
    )
    add_plugin_flag(parser, dest="plugin_top")  # `robustbench-nacl --plugin X COMMAND` works too
    return parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per registered command, each taking ``--plugin``.

    ``only`` names the one command whose flags are built (the others keep their name and help, so
    ``--help`` lists them all): building a command's flags can import what it runs (``train`` reads
    the loss presets, and with them torch), and ``leaderboard`` and ``compare`` run without torch.
    """
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if only is None or name == only:
            cmd.add_args(p)
            add_common_flags(p)
    return parser


def _command_of(argv: list[str]) -> str:
    """The command a command line names (its first positional after the top-level options), or ''."""
    pre = _top_parser(add_help=False)
    pre.add_argument("command", nargs="?")
    with contextlib.suppress(SystemExit):  # a malformed top-level --plugin: the full parse says so
        known, _ = pre.parse_known_args(argv)
        return known.command if known.command in COMMANDS else ""
    return ""


def _fail(command: str, message: str, code: int = 2) -> int:
    """Print ``message`` as the command's one-line error on stderr; return the exit code."""
    where = f"robustbench-nacl {command}" if command else "robustbench-nacl"
    print(f"{where}: error: {' '.join(message.split())}", file=sys.stderr)
    return code


#: the exit code after the reader of stdout went away (`| head`): a shell's code for death by SIGPIPE
CLOSED_PIPE = 128 + 13


def _closed_pipe() -> int:
    """Stop quietly, as Unix tools do when their reader closes the pipe: no message, and no second
    error when Python flushes stdout at exit (it now points at /dev/null)."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 user error, 3 non-finite loss, 130 interrupted).

    Plugins (``--plugin``, ``$ROBUSTBENCH_NACL_PLUGINS``, installed entry points) load first; one
    that fails to import or registers a name that exists is one line and exit code 2.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plugins.load_plugins(plugin_specs(argv))
    except UserError as e:
        return _fail(_command_of(argv), str(e), e.exit_code)
    parser = build_parser(only=_command_of(argv) or None)
    args, extra = parser.parse_known_args(argv)
    # argparse fills a `*` positional only from the words before the first option, so the ids of
    # `zoo publish --zoo fashion-mnist ID...` would be left over: words after the options are ids too
    if isinstance(getattr(args, "ids", None), list):
        args.ids.extend(w for w in extra if not w.startswith("-"))
        extra = [w for w in extra if w.startswith("-")]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args._argv = argv  # for the provenance line of what a command writes (no absolute paths)
    runner = COMMANDS[args.command].run
    if getattr(args, "deterministic", False):
        from ..utils import set_deterministic

        set_deterministic()
    try:
        # the parsed values again (a no-op for those loaded above): an abbreviated --plug also counts
        plugins.load_plugins([*args.plugin_top, *args.plugin], entry_points=False)
        code = runner(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is a closed pipe, not a traceback
        return code
    except UserError as e:
        return _fail(args.command, str(e), e.exit_code)
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as e:
        # the environment failed us (disk full, read-only or vanished directory): one line, not a traceback
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _fail(args.command, f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        print(f"robustbench-nacl {args.command}: interrupted", file=sys.stderr)
        return 130
