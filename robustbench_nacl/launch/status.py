"""Where zoo work stands (done, running, pending, failed, interrupted, not started, unknown), from
the files on disk and each task's recorded job: ``zoo status``, the submission :func:`plan` that
never submits finished work or duplicates a live job, and :func:`wait`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..pipeline import current_sha256, rows_done
from ..zoo import ZooEntry
from .launchers import LAUNCHERS, Probe, Submitted
from .records import job_error, read_record, record_path
from .tasks import ACTIONS, Task, make_tasks


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
    # a row counts for a trained entry only if it was computed on the weights trained now: a
    # retrained entry's old rows have the same keys (a key leaves the weights out)
    current: dict[str, dict[str, str]] = {}
    for t in tasks:
        current.setdefault(t.board, {}).update(current_sha256([t.entry], t.ckpts))
    out = []
    for t in tasks:
        if t.board not in rows:  # the rows of the device class the tasks run on
            rows[t.board] = rows_done(t.board, current[t.board], device=t.device)
        out.append(_state(t, rows[t.board], records[t.key], probes.get(t.key)))
    return out


def _state(
    task: Task, rows: dict[str, set[str]], record: dict[str, Any] | None, probe: Probe | None
) -> WorkState:
    """One task's state from what is on disk, its job record and the launcher's probe."""
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
    tail = job_error(record)[1] if record.get("folder") else ""
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
