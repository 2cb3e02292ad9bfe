"""Job records on disk (``<checkpoints>/.jobs/<entry id>.<action>.json``) and what they let a later
process find out: whether the recorded process still runs, and the error a finished job left."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import socket
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..io import write_json_atomic
from .tasks import Task

JOBS_DIR = ".jobs"


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


def write_record(task: Task, launcher: str, job_id: str, folder: Path | None, **extra: Any) -> None:
    """Record atomically that ``task`` was handed to ``launcher`` as job ``job_id``."""
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


def jobs_folder(ckpts: str | Path) -> Path:
    """Where job records and submitit's job folders (pickles and logs) live."""
    return Path(ckpts) / JOBS_DIR


def exc_line(e: BaseException) -> str:
    """An exception as one line of at most 240 characters, with its type."""
    return one_line(e, 240, with_type=True)


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux: /proc), which tells a reused pid from the original."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(record: dict[str, Any]) -> bool:
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
    return state not in ("Z", "X") and (started is None or started == proc_start(pid))


def job_error(record: dict[str, Any]) -> tuple[str | None, str]:
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
