"""What a zoo job does: the :data:`ACTIONS` (train, eval, control) and the picklable :class:`Task`
that runs one of them on one entry, in this process or inside a submitit job."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..pipeline import control_entries, control_id, eval_entry, is_complete, train_entry
from ..registry import Registry
from ..zoo import ZooEntry, checkpoint_dir, is_trained


@dataclass(frozen=True)
class Action:
    """One kind of zoo work: how to run it on an entry and how to tell that it is done."""

    run: Callable[[Task], Any]
    done: Callable[[ZooEntry, Path, Path, dict[str, set[str]]], bool]  # (entry, ckpts, board, rows_done)
    progress: Callable[[ZooEntry, Path, Path, dict[str, set[str]]], bool]  # something partial is on disk


#: what a killed training leaves in its checkpoint folder: train's resume state, post_process's
#: per-stage states (robustbench_nacl.post.run.STATE_DIR; named here so that `zoo status` imports no torch)
PARTIAL = ("train_state.pt", "post-state")


def _partly_trained(folder: Path) -> bool:
    """Whether a training (or post-processing) of this folder was started and not finished."""
    return any((folder / name).exists() for name in PARTIAL)


ACTIONS: Registry[Action] = Registry("zoo action")
ACTIONS.add(
    "train",
    Action(
        run=lambda t: train_entry(t.entry, t.ckpts, device=t.device, progress=t.progress),
        done=lambda e, ck, board, rows: is_trained(e, ck),
        progress=lambda e, ck, board, rows: _partly_trained(checkpoint_dir(e, ck)),
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
        from .. import plugins
        from ..utils import deterministic_from_env

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
    from ..training import distributed

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
    from .. import plugins

    ACTIONS.get(action)  # an unknown action fails here, in one line
    specs = os.environ.get(plugins.ENV_VAR, "")  # what load_plugins exported: file paths are absolute
    plugin_specs = tuple(s for s in specs.split(os.pathsep) if s.strip())
    chosen = control_entries(entries) if action == "control" else list(entries)
    ck, bd = str(Path(ckpts).resolve()), str(Path(board).resolve())
    return [Task(e, action, ck, bd, device, plugin_specs) for e in chosen]
