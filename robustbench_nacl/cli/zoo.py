"""The ``zoo`` command: its table of subcommands (list, show, train, eval, run, verify, status,
curves, publish, regenerate, verify-submission), its flags, and the subcommands that only read or copy."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UserError
from ..io import refuse_reference_dir
from .common import DEFAULT_ZOO_BOARD, DEFAULT_ZOO_OUT, count_arg, deterministic_flag, protocol_arg
from .zoo_jobs import launcher_args, zoo_entries, zoo_eval, zoo_run, zoo_train


def _zoo_list(args: argparse.Namespace) -> int:
    """One table line per entry of --zoo (default: every zoo): id, loss, dataset, seed, trained?"""
    from tabulate import tabulate

    from .. import zoo

    rows = [
        [e.id, e.loss, e.dataset, e.seed, "yes" if zoo.is_trained(e, args.out) else "no"]
        for e in zoo.load_zoo(args.zoo)
    ]
    print(tabulate(rows, headers=["id", "loss", "dataset", "seed", "trained"], tablefmt="github"))
    return 0


def _zoo_show(args: argparse.Namespace) -> int:
    """Print the manifests of the entries named."""
    from .. import zoo

    if not args.ids:
        raise UserError("zoo show needs an entry id, e.g. `zoo show convnet_small.simclr_digits-0-4_s0`")
    for i in args.ids:
        print(json.dumps(zoo.find_entry(i).to_dict(), indent=2))
    return 0


def _zoo_verify(args: argparse.Namespace) -> int:
    """One line per entry asked for (missing ones too), then a count; exit 1 if a checkpoint changed,
    2 if none of the entries asked for has a checkpoint under --out (nothing was verified)."""
    from .. import zoo

    report = zoo.verify_entries(zoo_entries(args), args.out)
    for entry, status, detail in report.results:
        print(f"{status:<18} {entry.id}  {detail}")
    for entry in report.missing:
        print(f"{'missing':<18} {entry.id}  no checkpoint at {zoo.checkpoint_dir(entry, args.out)}")
    print(report.summary())
    if not report.results:
        which = f"zoo {args.zoo!r}" if args.zoo and not args.ids else "the entries asked for"
        raise UserError(
            f"verified none of the {len(report.missing)} entries of {which}: none has a checkpoint "
            f"under {args.out} and none is published; train them with `zoo train` or pass the --out they "
            "were trained into"
        )
    if report.bad:
        print(f"{len(report.bad)} checkpoint(s) do not match their recorded sha256", file=sys.stderr)
        return 1
    return 0


def _zoo_status(args: argparse.Namespace) -> int:
    """One line per entry: where its training, evaluation and control stand, then a count per state."""
    from tabulate import tabulate

    from ..launch import ACTIONS, zoo_status

    entries = zoo_entries(args)
    states: dict[str, dict[str, Any]] = {}
    for st in zoo_status(entries, args.out, args.leaderboard):
        states.setdefault(st.task.entry.id, {})[st.task.action] = st
    table = []
    for e in entries:
        mine = states.get(e.id, {})
        cells = [
            "-" if a not in mine else mine[a].state + (f" ({mine[a].job_id})" if mine[a].live else "")
            for a in ACTIONS.names()
        ]
        why = [f"{a}: {st.detail}" for a, st in mine.items() if st.state not in ("done", "not started")]
        table.append([e.id, *cells, "; ".join(why)])
    print(tabulate(table, headers=["id", *ACTIONS.names(), "detail"], tablefmt="github"))
    counts = []
    for a in ACTIONS.names():
        found = [mine[a].state for mine in states.values() if a in mine]
        order = dict.fromkeys(
            ["done", "running", "pending", "failed", "interrupted", "unknown", "not started"]
        )
        parts = [f"{found.count(s)} {s}" for s in order if found.count(s)]
        counts.append(f"{a} {', '.join(parts) or 'none'}")
    print(f"{len(entries)} entries (checkpoints {args.out}, rows {args.leaderboard}): " + "; ".join(counts))
    return 0


def _zoo_curves(args: argparse.Namespace) -> int:
    """Draw the learning curves of the trained entries asked for from their log.jsonl into --leaderboard."""
    from .. import zoo
    from ..report.curves import CurveRun, read_log, render_curves

    refuse_reference_dir(args.leaderboard, "--leaderboard")
    entries = zoo_entries(args)
    logged = [e for e in entries if (zoo.checkpoint_dir(e, args.out) / "log.jsonl").is_file()]
    if not logged:
        raise UserError(
            f"none of the {len(entries)} entries asked for has a training log under {args.out}; "
            "train them with `zoo train` or pass the --out they were trained into"
        )
    several = len({e.dataset for e in logged}) > 1
    runs = [
        CurveRun(
            e.id, _curve_label(e, several), e.seed, read_log(zoo.checkpoint_dir(e, args.out) / "log.jsonl")
        )
        for e in logged
    ]
    title = f"learning curves: zoo {args.zoo}" if args.zoo and not args.ids else "learning curves"
    files = render_curves(runs, args.leaderboard, title=title)
    lines = len({r.label for r in runs})
    print(f"{len(runs)} runs, {lines} lines -> " + ", ".join(str(p) for p in files.values()))
    if len(logged) < len(entries):
        print(f"{len(entries) - len(logged)} entries have no training log under {args.out}: not drawn")
    return 0


def _curve_label(entry: Any, dataset: bool) -> str:
    """One line per recipe: the preset, its overrides, and the dataset where the entries have several."""
    overrides = " ".join(f"{k}={v}" for k, v in sorted(entry.overrides.items()))
    return " ".join(p for p in (entry.loss, overrides, f"@ {entry.dataset}" if dataset else "") if p)


def _zoo_publish(args: argparse.Namespace) -> int:
    """Copy the trained, evaluated entries of --zoo into the package's published set (maintainers)."""
    from ..hub.release import publish_zoo

    if not args.zoo:
        raise UserError("zoo publish needs --zoo NAME: a published set is one zoo")
    publish_zoo(zoo_entries(args), args.out, args.leaderboard, args.zoo)
    return 0


def _zoo_regenerate(args: argparse.Namespace) -> int:
    """Rewrite the generated zoos' manifests from the presets (after adding a preset to the package)."""
    from .. import zoo

    for name, (written, removed) in zoo.regenerate(args.zoo).items():
        print(f"zoo {name}: {written} manifests written, {removed} stale ones removed")
    return 0


def _zoo_verify_submission(args: argparse.Namespace) -> int:
    """Recompute a sample of a submission's rows from its weights; exit 1 naming a row that disagrees."""
    from ..hub.submission import verify_submission

    if len(args.ids) != 1:
        raise UserError(
            "zoo verify-submission needs one folder: `zoo verify-submission DIR` (CONTRIBUTING.md)"
        )
    report = verify_submission(
        args.ids[0], settings=args.sample_settings, tolerance=args.tolerance, device=args.device
    )
    for line in report.lines:
        print(line)
    if report.failures:
        print(f"rejected: {report.failures[0]}", file=sys.stderr)
        return 1
    print(f"accepted: {report.summary}")
    return 0


_ZOO_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _zoo_list,
    "show": _zoo_show,
    "train": zoo_train,
    "eval": zoo_eval,
    "run": zoo_run,
    "verify": _zoo_verify,
    "status": _zoo_status,
    "curves": _zoo_curves,
    "publish": _zoo_publish,
    "regenerate": _zoo_regenerate,
    "verify-submission": _zoo_verify_submission,
}


def run_zoo(args: argparse.Namespace) -> int:
    """Run the zoo subcommand named by ``action``."""
    return _ZOO_ACTIONS[args.action](args)


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (anything else is a one-line usage error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    return parse


def zoo_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``zoo`` (every subcommand's, each saying which it is for)."""
    deterministic_flag(p)
    p.add_argument("action", choices=list(_ZOO_ACTIONS))
    p.add_argument("ids", nargs="*", help="entry ids (default: every entry of --zoo)")
    p.add_argument("--zoo", default=None, help="which zoo: demo | fashion-mnist | paper (default: all)")
    p.add_argument(
        "--out",
        default=str(DEFAULT_ZOO_OUT),
        help="checkpoints directory, one folder per entry id (default: %(default)s)",
    )
    p.add_argument(
        "--leaderboard",
        default=str(DEFAULT_ZOO_BOARD),
        help="eval/run: where result rows (LEADERBOARD/rows) and the rendered leaderboard go; curves: "
        "where learning_curves.png and .csv go (default: %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=count_arg,
        default=1,
        help="train/eval/run on the local pool: worker processes (default: 1)",
    )
    p.add_argument("--no-controls", action="store_true", help="eval/run: no random-init controls")
    p.add_argument(
        "--any-device",
        action="store_true",
        help="eval/run: count rows computed on another device class (cpu, or a GPU by its name) as "
        "done; by default only rows of --device's class do (status counts those)",
    )
    protocol_arg(p)
    p.add_argument(
        "--rank-by",
        default=None,
        metavar="METRIC",
        help="run: the leaderboard's ranking metric, as `leaderboard --rank-by` (default: the worst case "
        "at the suite's largest epsilon)",
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto (in a job: cuda, never cuda:N)")
    p.add_argument(
        "--sample-settings",
        type=_at_least(1),
        default=2,
        help="verify-submission: settings whose rows are recomputed (in-domain first; default: %(default)s)",
    )
    p.add_argument(
        "--tolerance",
        type=_at_least(0),
        default=0,
        help="verify-submission: attacked outcomes allowed to differ per 200 examples (another CPU's "
        "rounding; default: %(default)s, exact)",
    )
    launcher_args(p)
