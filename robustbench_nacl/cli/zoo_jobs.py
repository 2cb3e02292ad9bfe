"""The ``zoo`` subcommands that run work: ``train``, ``eval`` (through ``--launcher``) and ``run``
(train, evaluate and render in this process), with the launcher flags they take."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import refuse_reference_dir
from .board import rendering
from .common import command_line, json_kv, writable_out
from .flags import flag_name


def zoo_train(args: argparse.Namespace) -> int:
    """Train the entries asked for that are not trained (or have a live job), with --launcher."""
    from ..launch import make_tasks

    writable_out(args.out)
    options = _launch_options(args)
    return _zoo_launch(
        args, make_tasks(zoo_entries(args), "train", args.out, args.leaderboard, args.device), options
    )


def zoo_eval(args: argparse.Namespace) -> int:
    """Evaluate every trained entry asked for (and one random-init control per seed) into --leaderboard."""
    from .. import zoo
    from ..launch import make_tasks
    from ..pipeline import ANY_DEVICE, is_complete, rows_done

    refuse_reference_dir(args.leaderboard, "--leaderboard")
    options = _launch_options(args)
    entries = zoo_entries(args)
    trained = [e for e in entries if zoo.is_trained(e, args.out)]
    # rows committed without their checkpoints count as done (those of this device's class, unless
    # --any-device)
    complete = rows_done(args.leaderboard, device=ANY_DEVICE if args.any_device else args.device)
    missing = [e for e in entries if e not in trained and not is_complete(e, complete)]
    if not trained and missing:
        raise UserError(
            f"none of the {len(entries)} entries is trained under {args.out}; run `zoo train` first"
        )
    tasks = make_tasks(trained, "eval", args.out, args.leaderboard, args.device)
    if not args.no_controls:
        tasks += make_tasks(trained, "control", args.out, args.leaderboard, args.device)
    code = _zoo_launch(args, tasks, options)
    if missing:
        print(f"{len(missing)} entries are not trained under {args.out}: not evaluated")
    if not trained:
        print(f"the rows of all {len(entries)} entries are complete under {args.leaderboard}")
    return code


def _launch_options(args: argparse.Namespace) -> Any:
    """--launcher and the --slurm-* flags as LaunchOptions; a missing submitit is one line, here."""
    from ..launch import LAUNCHERS, LaunchOptions, require_submitit

    LAUNCHERS.get(args.launcher)
    slurm = {k: v for k, v in vars(args).items() if k.startswith("slurm_") and v not in (None, [])}
    if args.launcher == "local" and slurm:
        flags = ", ".join(flag_name(k) for k in slurm)
        raise UserError(f"{flags}: for --launcher slurm or submitit-local, not for the local pool")
    if args.launcher != "local":
        require_submitit(args.launcher)
    if args.launcher == "slurm" and args.slurm_time is None:
        raise UserError(
            "--launcher slurm needs --slurm-time MIN, each job's time limit (it is requeued at it)"
        )
    for name in ("slurm_gpus_per_job", "slurm_time", "slurm_array_parallelism", "slurm_cpus_per_task"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "slurm_gpus_per_job" else 1):
            raise UserError(
                f"{flag_name(name)} {value}: must be a whole number >= {int(name != 'slurm_gpus_per_job')}"
            )
    gpus = args.slurm_gpus_per_job
    return LaunchOptions(
        workers=args.workers,
        partition=args.slurm_partition,
        gpus_per_job=(1 if args.device.startswith("cuda") else 0) if gpus is None else gpus,
        time_min=args.slurm_time,
        array_parallelism=args.slurm_array_parallelism,
        cpus_per_task=args.slurm_cpus_per_task,
        slurm_args={str(k): str(v) for k, v in json_kv(args.slurm_arg).items()},
        progress=not args.no_progress,
    )


def _task_label(task: Any) -> str:
    """How a task is named in what the zoo commands print."""
    return f"random-init control of {task.entry.id}" if task.action == "control" else task.entry.id


def _task_done_line(task: Any, result: Any = None) -> str:
    """What `zoo train|eval` prints for a finished task (``result``: what a local run returned)."""
    from .. import zoo
    from ..pipeline import expected_rows

    if task.action == "train":
        d = zoo.checkpoint_dir(task.entry, task.ckpts)
        return f"{task.entry.id}: " + (f"trained -> {d}" if result is not None else f"already trained ({d})")
    n = expected_rows(task.entry) if result is None else result
    where = f" in {Path(task.board) / 'rows'}" if task.action == "eval" else ""
    return f"{_task_label(task)}: {n} rows{where}" + (
        " (complete: not evaluated again)" if result is None else ""
    )


def _zoo_launch(args: argparse.Namespace, tasks: list[Any], options: Any) -> int:
    """Skip finished tasks and live jobs, hand the rest to --launcher; with --wait (or local) report
    each outcome. Exit 1 if a waited-for job failed."""
    from .. import launch

    plan = launch.plan(tasks)
    for st in plan.done:
        print(_task_done_line(st.task))
    for st in plan.live:
        print(f"{_task_label(st.task)}: {st.detail}; not submitted again")
    submitted = launch.launch(args.launcher, plan.todo, options)
    if launch.LAUNCHERS.get(args.launcher).waits:
        for sub in submitted:
            print(_task_done_line(sub.task, sub.result))
        return 0
    if submitted:
        ids = ", ".join(s.job_id for s in submitted[:4]) + (", ..." if len(submitted) > 4 else "")
        print(
            f"submitted {len(submitted)} {args.launcher} job(s) ({ids}); job records and logs under "
            f"{launch.jobs_folder(args.out)}; `robustbench-nacl zoo status` shows where they stand"
        )
    if not args.wait or not submitted:
        return 0
    states = launch.wait(submitted)
    for st in states:
        print(f"{_task_label(st.task)}: {st.state}" + (f" ({st.detail})" if st.state != "done" else ""))
    return 1 if any(st.state != "done" for st in states) else 0


def zoo_run(args: argparse.Namespace) -> int:
    """Train, evaluate and render a whole zoo; resumable (finished entries and rows are skipped)."""
    from ..locks import sweep
    from ..pipeline import run_entries
    from ..report.leaderboard import render_leaderboard
    from ..results.rows import load_rows

    if args.launcher != "local":
        raise UserError(
            f"zoo run works in this process; with --launcher {args.launcher} run `zoo train`, then "
            "`zoo eval` (each with --wait, or when `zoo status` says done), then `leaderboard`"
        )
    refuse_reference_dir(args.leaderboard, "--leaderboard")
    writable_out(args.out)
    t0 = time.perf_counter()
    entries = zoo_entries(args)
    run = run_entries(
        entries,
        args.out,
        args.leaderboard,
        workers=args.workers,
        device=args.device,
        controls=not args.no_controls,
        progress=not args.no_progress,
        any_device=args.any_device,
    )
    sweep(args.out)  # locks of killed trainings finished by a later run
    with rendering(args.leaderboard):
        files = render_leaderboard(
            load_rows(args.leaderboard), args.leaderboard, command=command_line(args), rank_by=args.rank_by
        )
    print(
        f"{len(entries)} entries: {run.trained} trained ({run.train_s:.0f} s), {run.evaluated} evaluations "
        f"({run.eval_s:.0f} s), {run.skipped} already complete"
        + (f", {run.waited} finished by another process while this one waited" if run.waited else "")
        + f"; {time.perf_counter() - t0:.0f} s in all\n"
        f"  leaderboard: {files['LEADERBOARD.md']}"
    )
    return 0


def zoo_entries(args: argparse.Namespace) -> list[Any]:
    """The entries named (or every entry of --zoo), for the --protocol asked for."""
    from .. import zoo
    from ..pipeline import with_protocol

    entries = [zoo.find_entry(i) for i in args.ids] if args.ids else zoo.load_zoo(args.zoo)
    return with_protocol(entries, getattr(args, "protocol", "slf"))


def launcher_args(p: argparse.ArgumentParser) -> None:
    """``--launcher``, ``--wait`` and the ``--slurm-*`` flags."""
    from ..launch import LAUNCHERS

    g = p.add_argument_group("where train/eval run (one job per entry; see README, 'Running on a cluster')")
    g.add_argument(
        "--launcher",
        default="local",
        choices=LAUNCHERS.names(),
        help="local: this machine's process pool, done when the command returns (default); "
        "submitit-local: background jobs on this machine through submitit; slurm: one Slurm job array "
        "through submitit (pip install 'robustbench-nacl[cluster]'). Finished entries and entries "
        "with a live job are not submitted again",
    )
    g.add_argument(
        "--wait", action="store_true", help="submitit launchers: wait for the jobs; exit 1 if one failed"
    )
    g.add_argument("--slurm-partition", metavar="P", help="Slurm partition (default: the cluster's)")
    g.add_argument(
        "--slurm-gpus-per-job",
        type=int,
        metavar="G",
        help="GPUs per job (default: 1 with --device cuda, else 0); a training job with G > 1 runs one "
        "DDP process per GPU, an evaluation job uses one",
    )
    g.add_argument(
        "--slurm-time",
        type=int,
        metavar="MIN",
        help="each job's time limit in minutes (required by slurm); a job that reaches it, or is "
        "preempted, is requeued and resumes from its last epoch",
    )
    g.add_argument(
        "--slurm-array-parallelism", type=int, metavar="K", help="at most K jobs of the array at once"
    )
    g.add_argument("--slurm-cpus-per-task", type=int, metavar="N", help="CPUs per process")
    g.add_argument(
        "--slurm-arg",
        action="append",
        metavar="KEY=VALUE",
        help="any other sbatch option, e.g. account=ABC, qos=high, constraint=a100 (repeatable)",
    )
