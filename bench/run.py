"""Run the benchmark figures: ``python bench/run.py`` (all) or ``python bench/run.py --only NAME``.

Every figure is one JSON object on its own line of stdout (progress goes to stderr). Without
``--only`` each figure runs in its own child process, so that one figure's memory and thread state
cannot leak into the next; the child's JSON line is passed through unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: figure name -> module in bench/ with ``run(args) -> dict``
FIGURES = {
    "train_overhead": "train_overhead",
    "train_vs_reference": "train_vs_reference",
    "probe_speedup": "probe_speedup",
    "attack_sweep_ratio": "attack_sweep_ratio",
    "autoattack_cost": "autoattack_cost",
    "peak_rss_mb": "peak_rss_mb",
    "channels_last": "channels_last",
    "gpu_epoch": "gpu_epoch",
    "adv_step_cost": "adv_step_cost",
    "finetune_cost": "finetune_cost",
    "post_cost": "post_cost",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=sorted(FIGURES), help="run this figure (repeatable)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2: the cores)")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default: per figure)")
    p.add_argument("--reps-resnet", type=int, default=None, help="repetitions of the resnet18 steps")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes (smoke run)")
    p.add_argument("--full-demo", action="store_true", help="peak_rss_mb: the full demo, not --quick")
    p.add_argument(
        "--eval-n", type=int, default=10_000, help="peak_rss_mb: images of the resnet18 evaluation"
    )
    p.add_argument(
        "--aa-encoders",
        default="simclr,acl",
        help="autoattack_cost: the published seed-0 encoders to attack, comma-separated families "
        "(control: the random-init control), e.g. simclr,acl,dynacl,intcl,control",
    )
    return p.parse_args(argv)


def _forward_args(args: argparse.Namespace) -> list[str]:
    out = ["--threads", str(args.threads), "--eval-n", str(args.eval_n), "--aa-encoders", args.aa_encoders]
    for flag, value in (("--reps", args.reps), ("--reps-resnet", args.reps_resnet)):
        if value is not None:
            out += [flag, str(value)]
    out += ["--quick"] * args.quick + ["--full-demo"] * args.full_demo
    return out


def run_one(name: str, args: argparse.Namespace) -> int:
    """Run one figure in this process and print its JSON line."""
    from common import emit, set_threads

    set_threads(args.threads)
    module = importlib.import_module(FIGURES[name])
    try:
        figure = module.run(args)
    except Exception as e:  # a figure that fails still prints one line saying why
        traceback.print_exc()
        emit({"figure": name, "value": None, "unit": None, "config": {}, "error": f"{type(e).__name__}: {e}"})
        return 1
    emit(figure)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the selected figures (all by default), each in a child process unless ``--only`` was given."""
    args = parse_args(argv)
    if args.only:
        return max(run_one(name, args) for name in args.only)
    rc = 0
    for name in FIGURES:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--only", name, *_forward_args(args)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        for line in lines:
            json.loads(line)  # every stdout line of a figure is one JSON object
            print(line, flush=True)
        rc = max(rc, proc.returncode)
    return rc


if __name__ == "__main__":
    sys.exit(main())
