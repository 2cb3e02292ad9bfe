"""Run zoo work (train, evaluate, evaluate the random-init control of one entry) where the user says.

Three launchers, registered in :data:`LAUNCHERS`: ``local`` (this machine's process pool, the work
done when the command returns), ``submitit-local`` (submitit's local executor: one background job
per entry, the same submission path as Slurm, which is what the tests exercise) and ``slurm`` (one
Slurm job array per submission through submitit). Scheduling, time limits, preemption and requeues
are submitit's and Slurm's; nothing here schedules.

Every job is a :class:`Task`: picklable, with absolute paths and the plugins to load first. It is
checkpointable in submitit's sense (it has a ``checkpoint`` method): on preemption or when its time
limit nears, submitit requeues the same task, and it resumes from what is on disk (training from
``train_state.pt``, saved atomically at every epoch end; evaluation from the rows already written).

Each submission is recorded atomically in ``<checkpoints>/.jobs/<entry id>.<action>.json``
(launcher, job id, submitit folder, host, time), so that :func:`zoo_status` can tell, from any
later process, whether each entry's work is done, running, pending, failed (with the job's error on
one line) or interrupted, and :func:`plan` never submits finished work or duplicates a live job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pickle
import socket
import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError, one_line
from .io import write_json_atomic
from .pipeline import control_entries, control_id, eval_entry, is_complete, rows_done, train_entry
from .registry import Registry
from .zoo import ZooEntry, checkpoint_dir, is_trained

#: what ``--launcher slurm`` without submitit prints (with the launcher's name before it)
INSTALL_HINT = "pip install 'robustbench-nacl[cluster]'"
#: how many times a job that reaches its time limit is requeued (preemptions are not counted)
MAX_TIMEOUT_REQUEUES = 10
#: a submitit-local job's time limit when none is given (local jobs are not preempted)
LOCAL_TIMEOUT_MIN = 7 * 24 * 60
JOBS_DIR = ".jobs"
#: Slurm states of a job that will still run (a PREEMPTED job is requeued: submitit counts it unfinished)
_SLURM_PENDING = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "PREEMPTED"}
_SLURM_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


# ============ what a job does ============


@dataclass(frozen=True)
class Action:
    """One kind of zoo work: how to run it on an entry and how to tell that it is done."""

    run: Callable[[Task], Any]
    done: Callable[[ZooEntry, Path, Path, dict[str, set[str]]], bool]  # (entry, ckpts, board, rows_done)
    progress: Callable[[ZooEntry, Path, Path, dict[str, set[str]]], bool]  # something partial is on disk


ACTIONS: Registry[Action] = Registry("zoo action")
ACTIONS.add(
    "train",
    Action(
        run=lambda t: train_entry(t.entry, t.ckpts, device=t.device, progress=t.progress),
        done=lambda e, ck, board, rows: is_trained(e, ck),
        progress=lambda e, ck, board, rows: (checkpoint_dir(e, ck) / "train_state.pt").is_file(),
    ),
    help="train the entry into CHECKPOINTS/<id>",
)
ACTIONS.add(
    "eval",
    Action(
        run=lambda t: eval_entry(t.entry, t.ckpts, t.board, device=t.device, progress=t.progress),
        done=lambda e, ck, board, rows: is_complete(e, rows),
        progress=lambda e, ck, board, rows: bool(rows.get(e.id)),
    ),
    help="evaluate the trained entry into LEADERBOARD/rows",
)
ACTIONS.add(
    "control",
    Action(
        run=lambda t: eval_entry(
            t.entry, t.ckpts, t.board, device=t.device, control=True, progress=t.progress
        ),
        done=lambda e, ck, board, rows: is_complete(e, rows, control=True),
        progress=lambda e, ck, board, rows: bool(rows.get(control_id(e))),
    ),
    help="evaluate the random-init control of the entry's architecture and seed",
)


@dataclass(frozen=True)
class Task:
    """One entry's work as a job: a picklable callable with absolute paths.

    ``checkpoint`` makes it checkpointable for submitit (the contract of
    ``submitit.helpers.Checkpointable``, without importing submitit here): a preempted or timed-out
    job is requeued with the same task, which resumes from what it saved.
    """

    entry: ZooEntry
    action: str
    ckpts: str
    board: str
    device: str = "cpu"
    plugins: tuple[str, ...] = ()  # plugin specs the job loads before it runs: the same names as here
    progress: bool = False

    def __call__(self) -> Any:
        """Run the work in this process (inside a submitit job: as one rank of it)."""
        from . import plugins
        from .utils import deterministic_from_env

        plugins.load_plugins(self.plugins)  # a no-op for those loaded already
        deterministic_from_env()  # the submitting command's --deterministic, in a job of its own
        if os.environ.get("SUBMITIT_EXECUTOR"):
            return _run_in_job(self)
        return ACTIONS.get(self.action).run(self)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """What submitit requeues on preemption or timeout: the same task (it resumes from disk)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)

    @property
    def key(self) -> str:
        """``<entry id>.<action>``: the name of the task's job record."""
        return f"{self.entry.id}.{self.action}"


def _run_in_job(task: Task) -> Any:
    """Inside a submitit job: with several tasks per job (GPUs), join one process group (DDP)."""
    import submitit

    if submitit.JobEnvironment().num_tasks <= 1:
        return ACTIONS.get(task.action).run(task)
    from .training import distributed

    # MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK as torchrun sets them; every rank keeps all
    # of the job's GPUs visible and picks cuda:LOCAL_RANK
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    device = distributed.init_from_env(task.device) or task.device
    try:
        return ACTIONS.get(task.action).run(dataclasses.replace(task, device=device))
    finally:
        distributed.shutdown()


def make_tasks(
    entries: Iterable[ZooEntry],
    action: str,
    ckpts: str | Path,
    board: str | Path,
    device: str = "cpu",
) -> list[Task]:
    """One task per entry, with absolute paths and this process's plugins (``control``: one per seed)."""
    from . import plugins

    ACTIONS.get(action)  # an unknown action fails here, in one line
    specs = os.environ.get(plugins.ENV_VAR, "")  # what load_plugins exported: file paths are absolute
    plugin_specs = tuple(s for s in specs.split(os.pathsep) if s.strip())
    chosen = control_entries(entries) if action == "control" else list(entries)
    ck, bd = str(Path(ckpts).resolve()), str(Path(board).resolve())
    return [Task(e, action, ck, bd, device, plugin_specs) for e in chosen]


# ============ job records ============


def record_path(ckpts: str | Path, key: str) -> Path:
    """Where the job record of a task (``<entry id>.<action>``) lives."""
    return Path(ckpts) / JOBS_DIR / f"{key}.json"


def read_record(ckpts: str | Path, key: str) -> dict[str, Any] | None:
    """A task's latest job record, or None (none, or unreadable: as if never submitted)."""
    try:
        data = json.loads(record_path(ckpts, key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("job_id"), str) else None


def _write_record(task: Task, launcher: str, job_id: str, folder: Path | None, **extra: Any) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(
        record_path(task.ckpts, task.key),
        {
            "entry": task.entry.id,
            "action": task.action,
            "launcher": launcher,
            "job_id": job_id,
            "folder": str(folder) if folder else None,
            "host": socket.gethostname(),
            "submitted": now,
            **extra,
        },
    )


# ============ launchers ============


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
                        record_path(self.task.ckpts, self.task.key), {**record, "error": _exc_line(e)}
                    )
            raise


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def _submit_local(tasks: list[Task], opts: LaunchOptions) -> list[Submitted]:
    from .pipeline import make_pool, run_jobs

    inline = opts.workers <= 1
    tasks = [dataclasses.replace(t, progress=inline and opts.progress) for t in tasks]
    for t in tasks:
        # best effort: evaluating checkpoints in a read-only folder (someone else's) runs unrecorded
        with contextlib.suppress(UserError):
            _write_record(t, "local", str(os.getpid()), None, proc_start=_proc_start(os.getpid()))
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
                _write_record(t, name, str(job.job_id), folder, proc_start=pid and _proc_start(pid))
                out.append(Submitted(t, str(job.job_id), job=job))
        return out

    return submit


# ============ looking at recorded jobs ============


def _exc_line(e: BaseException) -> str:
    return one_line(e, 240, with_type=True)


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux: /proc), which tells a reused pid from the original."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(record: dict[str, Any]) -> bool:
    """Whether the recorded process of this host still runs (not a zombie, not a reused pid)."""
    try:
        pid = int(record["job_id"])
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # no /proc (macOS): the pid exists
        return True
    started = record.get("proc_start")
    return state not in ("Z", "X") and (started is None or started == _proc_start(pid))


def _probe_process(records: list[dict[str, Any]], result_file: bool) -> list[Probe]:
    """Jobs that are processes of one host: ``local`` (this command's pid) and ``submitit-local``
    (the pid of submitit's controller, which is the job id)."""
    host = socket.gethostname()
    out = []
    for r in records:
        if r.get("host") != host:
            out.append(Probe(False, f"unknown: a process of host {r.get('host')}; look there"))
        elif _pid_alive(r):
            out.append(Probe(True, "running"))
        else:
            out.append(Probe(False, "process ended", _job_error(r)[0] if result_file else r.get("error")))
    return out


def _job_error(record: dict[str, Any]) -> tuple[str | None, str]:
    """(the job's exception on one line, or None; the last line of its stderr) from submitit's files."""
    folder, job_id = Path(record.get("folder") or "."), record["job_id"]
    error = None
    with contextlib.suppress(OSError, ValueError, EOFError, pickle.UnpicklingError, AttributeError):
        with open(folder / f"{job_id}_0_result.pkl", "rb") as f:
            # submitit's own record of this job (what job.result() reads): ("error", traceback text)
            outcome, payload = pickle.load(f)
        lines = [ln for ln in str(payload).splitlines() if ln.strip()]
        if outcome == "error" and lines:
            name, sep, message = lines[-1].partition(": ")  # "robustbench_nacl.errors.UserError: ..."
            error = one_line(name.rsplit(".", 1)[-1] + sep + message, 240)
    tail = ""
    with contextlib.suppress(OSError):
        lines = (folder / f"{job_id}_0_log.err").read_text(errors="replace").splitlines()
        tail = next((ln for ln in reversed(lines) if ln.strip() and not ln.startswith("submitit ")), "")
    return error, one_line(tail, 240)


def _probe_slurm(records: list[dict[str, Any]]) -> list[Probe]:
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
            out.append(Probe(False, state, _job_error(r)[0]))
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


# ============ status ============


@dataclass(frozen=True)
class WorkState:
    """Where one task stands: done | running | pending | failed | interrupted | not started | unknown."""

    task: Task
    state: str
    job_id: str | None = None
    detail: str = ""  # why it failed, or what an interruption left

    @property
    def live(self) -> bool:
        """A job is (or may be) working on it or waiting to: it is not submitted again."""
        return self.state in ("running", "pending", "unknown")


def task_states(tasks: list[Task]) -> list[WorkState]:
    """The state of each task, from the files on disk and its recorded job (one scheduler query)."""
    rows: dict[str, dict[str, set[str]]] = {}
    records = {t.key: read_record(t.ckpts, t.key) for t in tasks}
    probes: dict[str, Probe] = {}
    for name in LAUNCHERS.names():
        mine = [(k, r) for k, r in records.items() if r is not None and r.get("launcher") == name]
        if mine:
            probes.update(
                zip([k for k, _ in mine], LAUNCHERS.get(name).probe([r for _, r in mine]), strict=True)
            )
    out = []
    for t in tasks:
        if t.board not in rows:
            rows[t.board] = rows_done(t.board)
        out.append(_state(t, rows[t.board], records[t.key], probes.get(t.key)))
    return out


def _state(
    task: Task, rows: dict[str, set[str]], record: dict[str, Any] | None, probe: Probe | None
) -> WorkState:
    action, ck, board = ACTIONS.get(task.action), Path(task.ckpts), Path(task.board)
    job = record["job_id"] if record else None
    if action.done(task.entry, ck, board, rows):
        return WorkState(task, "done", job)
    partial = action.progress(task.entry, ck, board, rows)
    if record is None or probe is None:
        return WorkState(
            task,
            "interrupted" if partial else "not started",
            None,
            "partial work on disk, no job recorded (a local `zoo run` at work, or one that stopped)"
            if partial
            else "",
        )
    where = f"{record['launcher']} job {job}"
    if probe.live:
        return WorkState(task, probe.state, job, f"{where} {probe.state}")
    if probe.state.startswith("unknown"):
        path = record_path(task.ckpts, task.key)
        return WorkState(task, "unknown", job, f"{where}: {probe.state} (delete {path} to resubmit)")
    if probe.error:
        return WorkState(task, "failed", job, probe.error)
    if record.get("launcher") == "local" and not record.get("started") and not partial:
        return WorkState(task, "not started", job, f"{where} ended before this task began")
    if partial:
        return WorkState(task, "interrupted", job, f"{where} ended ({probe.state}); resubmit to resume")
    tail = _job_error(record)[1] if record.get("folder") else ""
    reason = f"{where} ended without finishing ({probe.state})" + (f": {tail}" if tail else "")
    return WorkState(task, "failed", job, one_line(reason, 240))


def zoo_status(
    entries: list[ZooEntry],
    ckpts: str | Path,
    board: str | Path,
    actions: Iterable[str] = ("train", "eval", "control"),
) -> list[WorkState]:
    """Every (entry, action)'s state; ``control`` only for the entries whose control is evaluated."""
    tasks = [t for a in actions for t in make_tasks(entries, a, ckpts, board)]
    return task_states(tasks)


# ============ submitting ============


@dataclass(frozen=True)
class Plan:
    """What a submission will do: the tasks to submit, and those left alone (done, or with a live job)."""

    todo: list[Task]
    done: list[WorkState]
    live: list[WorkState]


def plan(tasks: list[Task]) -> Plan:
    """Leave out finished tasks and tasks whose recorded job still runs or waits (never duplicated)."""
    states = task_states(tasks)
    return Plan(
        todo=[s.task for s in states if s.state != "done" and not s.live],
        done=[s for s in states if s.state == "done"],
        live=[s for s in states if s.live],
    )


def launch(launcher: str, tasks: list[Task], opts: LaunchOptions) -> list[Submitted]:
    """Hand ``tasks`` to ``launcher``; each gets a job record (local: the work is done on return).

    A training task whose entry distils a teacher entry (DeACL) that is not trained yet waits for it:
    a launcher that waits trains the teachers first, then the students; one that does not (Slurm)
    submits the rest now and holds those back with a note on stderr (a job array has no dependency
    order): running `zoo train` again once the teachers are trained submits them.
    """
    if not tasks:
        return []
    chosen = LAUNCHERS.get(launcher)
    first, held = teacher_order(tasks, chosen.waits)
    if not held:
        return chosen.submit(tasks, opts)
    if chosen.waits:
        return (chosen.submit(first, opts) if first else []) + chosen.submit(held, opts)
    print(
        f"{len(held)} training job(s) wait for their teacher's training and were not submitted "
        f"({', '.join(t.entry.id for t in held[:3])}{', ...' if len(held) > 3 else ''}): run "
        "`zoo train` again once `zoo status` says their teachers are trained (`zoo train TEACHER_ID`)",
        file=sys.stderr,
    )
    return chosen.submit(first, opts) if first else []


def teacher_order(tasks: list[Task], waits: bool) -> tuple[list[Task], list[Task]]:
    """(tasks that can run now, training tasks whose teacher entry is not trained yet). With a
    launcher that waits, a held task whose teacher is not trained by this submission is a one-line
    error (without one, the teacher may be a job still running: the task is only held)."""
    held = [t for t in tasks if t.action == "train" and t.entry.teacher and not _teacher_trained(t)]
    first = [t for t in tasks if t not in held]
    training = {t.entry.id for t in first if t.action == "train"}
    for t in held:
        if waits and t.entry.teacher not in training:
            raise UserError(
                f"zoo entry {t.entry.id} distils entry {t.entry.teacher}, which is neither trained under "
                f"{t.ckpts} nor trained by this command: add it (`zoo train {t.entry.teacher} "
                f"{t.entry.id}`) or train it first"
            )
    return first, held


def _teacher_trained(task: Task) -> bool:
    return (Path(task.ckpts) / str(task.entry.teacher) / "manifest.json").is_file()


def wait(submitted: list[Submitted], progress: bool = True) -> list[WorkState]:
    """Block until every submitted job has ended; then each task's state (done, failed, ...)."""
    from tqdm.auto import tqdm

    jobs = [s.job for s in submitted if s.job is not None]
    if jobs:
        import submitit

        with tqdm(total=len(jobs), desc="jobs", unit="job", disable=not progress) as bar:
            local = all(isinstance(j, submitit.LocalJob) for j in jobs)
            for _ in submitit.helpers.as_completed(jobs, poll_frequency=1 if local else 60):
                bar.update()
    return task_states([s.task for s in submitted])


def jobs_folder(ckpts: str | Path) -> Path:
    """Where job records and submitit's job folders (pickles and logs) live."""
    return Path(ckpts) / JOBS_DIR
