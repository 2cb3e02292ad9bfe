"""The launchers (:data:`LAUNCHERS`: local, submitit-local, slurm): how tasks are submitted, how
their recorded jobs are looked at later, and :func:`launch`, which hands tasks to one of them
(an entry's training after that of the entry it needs: a DeACL teacher, a post entry's parent)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError, one_line
from ..io import write_json_atomic
from ..registry import Registry
from .records import (
    JOBS_DIR,
    exc_line,
    job_error,
    pid_alive,
    proc_start,
    read_record,
    record_path,
    write_record,
)
from .tasks import Task

#: what ``--launcher slurm`` without submitit prints (with the launcher's name before it)
INSTALL_HINT = "pip install 'robustbench-nacl[cluster]'"
#: how many times a job that reaches its time limit is requeued (preemptions are not counted)
MAX_TIMEOUT_REQUEUES = 10
#: a submitit-local job's time limit when none is given (local jobs are not preempted)
LOCAL_TIMEOUT_MIN = 7 * 24 * 60
#: Slurm states of a job that will still run (a PREEMPTED job is requeued: submitit counts it unfinished)
_SLURM_PENDING = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "PREEMPTED"}
_SLURM_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


@dataclass(frozen=True)
class LaunchOptions:
    """How jobs are run: the local pool's size, and what each submitit job asks the scheduler for."""

    workers: int = 1  # local: parallel worker processes
    partition: str | None = None
    gpus_per_job: int = 0  # > 1: a training job runs one DDP process per GPU
    time_min: int | None = None  # each job's time limit (a job that reaches it is requeued)
    array_parallelism: int | None = None  # at most this many jobs of one array run at once
    cpus_per_task: int | None = None
    slurm_args: dict[str, str] = field(default_factory=dict)  # any other sbatch option
    progress: bool = True  # local: progress bars (--no-progress: none)


@dataclass
class Submitted:
    """One task handed to a launcher: its job id, and (local) its result or (submitit) its job."""

    task: Task
    job_id: str
    job: Any = None
    result: Any = None


@dataclass(frozen=True)
class Probe:
    """A recorded job seen from now: whether it still runs (or waits), in the scheduler's words."""

    live: bool
    state: str  # "running" | "pending" | the scheduler's end state
    error: str | None = None  # the job's exception on one line, when it raised one


@dataclass(frozen=True)
class Launcher:
    """How to submit tasks, and how to look at their recorded jobs later (from any process)."""

    submit: Callable[[list[Task], LaunchOptions], list[Submitted]]
    probe: Callable[[list[dict[str, Any]]], list[Probe]]
    waits: bool  # True: the work is done when submit returns


LAUNCHERS: Registry[Launcher] = Registry("launcher")


def require_submitit(launcher: str) -> Any:
    """The submitit module, or a one-line UserError saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise UserError(
            f"--launcher {launcher} needs submitit, which is not installed: {INSTALL_HINT}"
        ) from None
    return submitit


class _Recorded:
    """A local-pool task that writes its error into its job record (the pool reports only the first)."""

    def __init__(self, index: int, task: Task) -> None:
        self.index, self.task = index, task

    def __call__(self) -> tuple[int, Any]:
        """Run the task, marking its record started, and failed with its error if it raises."""
        record = read_record(self.task.ckpts, self.task.key)
        if record is not None:  # a pool killed before this task began leaves it "not started"
            with contextlib.suppress(UserError):
                write_json_atomic(record_path(self.task.ckpts, self.task.key), {**record, "started": True})
        try:
            return self.index, self.task()
        except Exception as e:
            record = read_record(self.task.ckpts, self.task.key)
            if record is not None:
                with contextlib.suppress(UserError):  # a read-only checkpoints folder: see _submit_local
                    write_json_atomic(
                        record_path(self.task.ckpts, self.task.key), {**record, "error": exc_line(e)}
                    )
            raise


def _call(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` (a picklable top-level function for the pool)."""
    return fn()


def _submit_local(tasks: list[Task], opts: LaunchOptions) -> list[Submitted]:
    """Run the tasks on this machine's pool (inline with one worker); return when all are done."""
    from ..pipeline import make_pool, run_jobs

    inline = opts.workers <= 1
    tasks = [dataclasses.replace(t, progress=inline and opts.progress) for t in tasks]
    for t in tasks:
        # best effort: evaluating checkpoints in a read-only folder (someone else's) runs unrecorded
        with contextlib.suppress(UserError):
            write_record(t, "local", str(os.getpid()), None, proc_start=proc_start(os.getpid()))
    cuda = any(t.device.startswith("cuda") for t in tasks)
    pool = make_pool(opts.workers, "cuda" if cuda else "cpu")
    try:
        jobs = [(_Recorded(i, t),) for i, t in enumerate(tasks)]
        results = dict(
            run_jobs(pool, jobs, _call, f"{len(tasks)} jobs", progress=opts.progress and not inline)
        )
    finally:
        if pool is not None:
            pool.shutdown()
    return [Submitted(t, str(os.getpid()), result=results[i]) for i, t in enumerate(tasks)]


def _executor_parameters(cluster: str, action: str, opts: LaunchOptions) -> dict[str, Any]:
    """submitit AutoExecutor parameters; slurm_* ones are ignored by the local executor."""
    gpus = opts.gpus_per_job if action == "train" else min(opts.gpus_per_job, 1)
    default_time = LOCAL_TIMEOUT_MIN if cluster == "local" else None
    return {
        "name": f"rbn-{action}",
        "timeout_min": opts.time_min or default_time,
        "gpus_per_node": gpus or None,  # no --gpus-per-node=0 line: clusters without GPU gres refuse it
        "tasks_per_node": max(gpus, 1),  # one process per GPU: DDP inside the job
        "cpus_per_task": opts.cpus_per_task,
        "slurm_partition": opts.partition,
        "slurm_array_parallelism": opts.array_parallelism,
        "slurm_additional_parameters": dict(opts.slurm_args) or None,
    }


def _submitit_submit(cluster: str, name: str) -> Callable[[list[Task], LaunchOptions], list[Submitted]]:
    """The submit function of a submitit launcher: one job array per action, each job recorded."""

    def submit(tasks: list[Task], opts: LaunchOptions) -> list[Submitted]:
        submitit = require_submitit(name)
        out: list[Submitted] = []
        for action in dict.fromkeys(t.action for t in tasks):  # one array per action
            group = [t for t in tasks if t.action == action]
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            folder = Path(group[0].ckpts) / JOBS_DIR / f"{stamp}-{action}-{uuid.uuid4().hex[:6]}"
            executor = submitit.AutoExecutor(
                folder=folder, cluster=cluster, **{f"{cluster}_max_num_timeout": MAX_TIMEOUT_REQUEUES}
            )
            executor.update_parameters(**_executor_parameters(cluster, action, opts))
            try:
                with executor.batch():
                    jobs = [executor.submit(t) for t in group]
            except (OSError, RuntimeError, ValueError) as e:  # sbatch refused (partition, time, account)
                raise UserError(f"--launcher {name}: submission failed: {one_line(str(e), 240)}") from None
            for t, job in zip(group, jobs, strict=True):
                pid = int(job.job_id) if cluster == "local" else None  # the controller's pid
                write_record(t, name, str(job.job_id), folder, proc_start=pid and proc_start(pid))
                out.append(Submitted(t, str(job.job_id), job=job))
        return out

    return submit


def _probe_process(records: list[dict[str, Any]], result_file: bool) -> list[Probe]:
    """Jobs that are processes of one host: ``local`` (this command's pid) and ``submitit-local``
    (the pid of submitit's controller, which is the job id)."""
    host = socket.gethostname()
    out = []
    for r in records:
        if r.get("host") != host:
            out.append(Probe(False, f"unknown: a process of host {r.get('host')}; look there"))
        elif pid_alive(r):
            out.append(Probe(True, "running"))
        else:
            out.append(Probe(False, "process ended", job_error(r)[0] if result_file else r.get("error")))
    return out


def _probe_slurm(records: list[dict[str, Any]]) -> list[Probe]:
    """Ask Slurm (one sacct call) where each recorded job stands."""
    try:
        submitit = require_submitit("slurm")
    except UserError:
        return [Probe(False, f"unknown: asking Slurm needs submitit ({INSTALL_HINT})") for _ in records]
    watcher = submitit.SlurmJob.watcher  # one sacct call for every job asked about
    for r in records:
        watcher.register_job(r["job_id"])
    watcher.update()
    out = []
    for r in records:
        state = (watcher.get_state(r["job_id"], mode="cache").split() or ["UNKNOWN"])[0].upper()
        if state in _SLURM_RUNNING or state in _SLURM_PENDING:
            out.append(Probe(True, "running" if state in _SLURM_RUNNING else "pending"))
        elif state == "UNKNOWN":  # sacct failed, or does not list the job (yet)
            out.append(Probe(False, "unknown: sacct does not report this job"))
        else:  # COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...
            out.append(Probe(False, state, job_error(r)[0]))
    return out


LAUNCHERS.add(
    "local",
    Launcher(_submit_local, lambda rs: _probe_process(rs, result_file=False), waits=True),
    help="this machine's process pool (the default)",
)
LAUNCHERS.add(
    "submitit-local",
    Launcher(_submitit_submit("local", "submitit-local"), lambda rs: _probe_process(rs, True), waits=False),
    help="submitit's local executor: background jobs on this machine",
)
LAUNCHERS.add(
    "slurm",
    Launcher(_submitit_submit("slurm", "slurm"), _probe_slurm, waits=False),
    help="one Slurm job array per submission, through submitit",
)


def launch(launcher: str, tasks: list[Task], opts: LaunchOptions) -> list[Submitted]:
    """Hand ``tasks`` to ``launcher``; each gets a job record (local: the work is done on return).

    A training task whose entry needs another entry's checkpoint that is not trained yet (a DeACL
    teacher, the parent of a ++ post entry) waits for it: a launcher that waits trains those first,
    then the rest; one that does not (Slurm) submits the rest now and holds those back with a note on
    stderr (a job array has no dependency order): running `zoo train` again once the needed entries
    are trained submits them.
    """
    if not tasks:
        return []
    chosen = LAUNCHERS.get(launcher)
    first, held = teacher_order(tasks, chosen.waits)
    if not held:
        return chosen.submit(tasks, opts)
    if chosen.waits:  # this stage, then the next (a post entry of a DeACL student: three stages)
        if not first:
            raise UserError(f"zoo entries {', '.join(t.entry.id for t in held[:3])} need each other")
        return chosen.submit(first, opts) + launch(launcher, held, opts)
    print(
        f"{len(held)} training job(s) wait for the training of their teacher or post parent and were "
        f"not submitted ({', '.join(t.entry.id for t in held[:3])}{', ...' if len(held) > 3 else ''}): "
        "run `zoo train` again once `zoo status` says those are trained (`zoo train ENTRY_ID`)",
        file=sys.stderr,
    )
    return chosen.submit(first, opts) if first else []


def teacher_order(tasks: list[Task], waits: bool) -> tuple[list[Task], list[Task]]:
    """(tasks that can run now, training tasks whose needed entry, a DeACL teacher or a post entry's
    parent, is not trained yet). With a launcher that waits, a held task whose needed entry is not
    trained by this submission is a one-line error (without one, it may be a job still running: the
    task is only held)."""
    held = [t for t in tasks if t.action == "train" and not _dependency_trained(t)]
    first = [t for t in tasks if t not in held]
    training = {t.entry.id for t in tasks if t.action == "train"}  # held ones train at a later stage
    for t in held:
        verb, needed = t.entry.dependency() or ("", "")
        if waits and needed not in training:
            raise UserError(
                f"zoo entry {t.entry.id} {verb} entry {needed}, which is neither trained under "
                f"{t.ckpts} nor trained by this command: add it (`zoo train {needed} "
                f"{t.entry.id}`) or train it first"
            )
    return first, held


def _dependency_trained(task: Task) -> bool:
    """Whether the entry the task's entry needs (teacher, post parent; None: nothing) is trained
    under the task's checkpoints."""
    dep = task.entry.dependency()
    return dep is None or (Path(task.ckpts) / dep[1] / "manifest.json").is_file()
