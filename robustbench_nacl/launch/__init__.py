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

``tasks`` holds what a job does, ``records`` the job records, ``launchers`` the launchers and
:func:`launch`, ``status`` where work stands (:func:`zoo_status`, :func:`plan`, :func:`wait`).
"""

from .launchers import (
    INSTALL_HINT,
    LAUNCHERS,
    LOCAL_TIMEOUT_MIN,
    MAX_TIMEOUT_REQUEUES,
    Launcher,
    LaunchOptions,
    Probe,
    Submitted,
    launch,
    require_submitit,
    teacher_order,
)
from .records import JOBS_DIR, jobs_folder, read_record, record_path
from .status import Plan, WorkState, plan, task_states, wait, zoo_status
from .tasks import ACTIONS, Action, Task, make_tasks

__all__ = [
    "ACTIONS",
    "INSTALL_HINT",
    "JOBS_DIR",
    "LAUNCHERS",
    "LOCAL_TIMEOUT_MIN",
    "MAX_TIMEOUT_REQUEUES",
    "Action",
    "LaunchOptions",
    "Launcher",
    "Plan",
    "Probe",
    "Submitted",
    "Task",
    "WorkState",
    "jobs_folder",
    "launch",
    "make_tasks",
    "plan",
    "read_record",
    "record_path",
    "require_submitit",
    "task_states",
    "teacher_order",
    "wait",
    "zoo_status",
]
