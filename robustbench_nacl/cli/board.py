"""The ``leaderboard`` and ``compare`` commands: render result rows, and compare every recipe with a
baseline on the same test examples."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..io import refuse_reference_dir
from .common import DEFAULT_RESULTS, command_line, finite_arg


@contextlib.contextmanager
def rendering(folder: str | Path) -> Iterator[None]:
    """One render of a leaderboard folder at a time; what a render killed mid-write left is removed
    first (only renders write files at the folder's top level: rows live in its rows/)."""
    from ..locks import advisory_lock, remove_temporaries, sweep

    fresh = not Path(folder).exists()
    try:
        with advisory_lock(folder, "leaderboard", f"the leaderboard in {folder}"):
            remove_temporaries(folder)
            yield
    except BaseException:
        if fresh:  # a failed first render leaves no empty folder behind (rmdir: only if it is empty)
            with contextlib.suppress(OSError):
                Path(folder).rmdir()
        raise
    sweep(folder)  # locks of killed evaluations whose rows another run then completed


def run_leaderboard(args: argparse.Namespace) -> int:
    """Render the leaderboard of ``--rows`` into ``--out``; print the files written."""
    from ..report.leaderboard import main_leaderboard

    refuse_reference_dir(args.out)
    with rendering(args.out):
        files = main_leaderboard(
            args.rows,
            args.out,
            headline_eps=args.headline_eps,
            command=command_line(args),
            rank_by=args.rank_by,
            baseline=args.baseline,
            baseline_recipe=args.baseline_recipe,
            notify=lambda notice: print(notice, file=sys.stderr),
            reported=args.reported,
        )
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


class _AppendOrDefault(argparse.Action):
    """``action="append"`` whose default list is replaced, not extended, by the first value given."""

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any, opt: Any = None
    ) -> None:
        """Append ``value``, dropping the default list the first time."""
        current = getattr(ns, self.dest)
        setattr(ns, self.dest, [*(current if current is not self.default else []), value])


def _baseline_flags(p: argparse.ArgumentParser, default: str | None) -> None:
    """``--baseline`` (with this default) and ``--baseline-recipe``."""
    p.add_argument(
        "--baseline",
        default=default,
        help="loss family every recipe is compared with"
        + (" (default: %(default)s)" if default else " (default: simclr where present; none: no column)"),
    )
    p.add_argument(
        "--baseline-recipe",
        default=None,
        metavar="RECIPE_ID",
        help="which recipe of the baseline family, when it has several (a recipe id prefix)",
    )


def leaderboard_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``leaderboard``."""
    p.add_argument(
        "--rows",
        action=_AppendOrDefault,
        default=[str(DEFAULT_RESULTS)],
        metavar="DIR",
        help="directory of result rows: the --out of `eval`; repeat it to rank your rows (the first) "
        f"beside reference rows (default: {DEFAULT_RESULTS})",
    )
    p.add_argument(
        "--out", default=str(DEFAULT_RESULTS), help="where to write the leaderboard (default: %(default)s)"
    )
    p.add_argument(
        "--headline-eps", type=finite_arg, default=0.002, help="epsilon of the headline robust columns"
    )
    p.add_argument(
        "--rank-by",
        default=None,
        metavar="METRIC",
        help="clean or ATTACK@EPS, e.g. worst_case@max, fgsm@0.002, pgd@8/255 "
        "(default: the worst case at the suite's largest epsilon)",
    )
    _baseline_flags(p, None)
    p.add_argument(
        "--reported",
        default=None,
        metavar="NAME",
        help="add a section of the field's published numbers beside the matching tables, marked "
        "reported and never ranked or tested: robustssl (the RobustSSL benchmark's leaderboard)",
    )


def run_compare(args: argparse.Namespace) -> int:
    """Print every recipe's comparison with the baseline, or each claim's test with ``--claims``
    (a table, JSON, or with ``--markdown`` the reading)."""
    from ..errors import UserError

    if args.claims is None and (args.margin is not None or args.markdown):
        raise UserError(f"{'--margin' if args.margin is not None else '--markdown'} applies to --claims only")
    if args.claims is not None:
        from ..report.claims import DEFAULT_MARGIN, main_claims

        output = "json" if args.json else "markdown" if args.markdown else "text"
        margin = DEFAULT_MARGIN if args.margin is None else args.margin
        text = main_claims(args.rows, args.claims, margin=margin, output=output)
        print(text, end="" if text.endswith("\n") else "\n")
        return 0
    from ..report.compare import main_compare

    text = main_compare(args.rows, args.baseline, baseline_recipe=args.baseline_recipe, as_json=args.json)
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


def compare_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``compare``."""
    p.add_argument(
        "--rows",
        nargs="+",
        default=[str(DEFAULT_RESULTS)],
        metavar="DIR",
        help="directories of result rows (default: %(default)s)",
    )
    _baseline_flags(p, "simclr")
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print the comparisons (or the claims' tests) as JSON"
    )
    out.add_argument(
        "--markdown", action="store_true", help="with --claims: print the reading, one sentence per test"
    )
    p.add_argument(
        "--claims",
        nargs="?",
        const="nacl",
        default=None,
        metavar="NAME|PATH",
        help="sort each claim of a claims file (default: nacl, files/claims/) into established, contradicted "
        "or not established; each claim names its own baseline, so --baseline is not used",
    )
    p.add_argument(
        "--margin",
        type=finite_arg,
        default=None,
        metavar="POINTS",
        help="with --claims: the equivalence margin of no-cost claims, in points (default: 2)",
    )
