"""The ``demo`` command: train the demo zoo, evaluate it and render its leaderboard in one go."""

from __future__ import annotations

import argparse

from .common import DEFAULT_DEMO_OUT, command_line, count_arg, protocol_arg, writable_out


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo into ``--out``."""
    from ..demo import run_demo as demo

    writable_out(args.out)
    demo(
        args.out,
        dataset=args.dataset,
        quick=args.quick,
        device=args.device,
        workers=args.workers,
        command=command_line(args),
        protocol=args.protocol,
    )
    return 0


def demo_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``demo``."""
    p.add_argument("--out", default=str(DEFAULT_DEMO_OUT), help="output directory (default: %(default)s)")
    p.add_argument(
        "--quick", action="store_true", help="fewer epochs and examples, same code path (~1 minute)"
    )
    p.add_argument("--dataset", default="digits", help="digits (embedded, default) | fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--workers", type=count_arg, default=None, help="parallel worker processes (default: min(2, cores))"
    )
    protocol_arg(p)
