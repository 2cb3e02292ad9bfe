"""Zoo work as jobs (robustbench_nacl.launch): submitit's local executor end to end (preemption,
requeue, a killed job, resubmission, `zoo status`), the Slurm submission against stand-in Slurm
commands, and the one line a missing submitit gives."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run_cli

from robustbench_nacl import launch, zoo
from robustbench_nacl.cli import main
from robustbench_nacl.launch import records as launch_records

needs_submitit = pytest.mark.skipif(
    importlib.util.find_spec("submitit") is None,
    # submitit comes with the test extra (and .ci/run fails if it does not import): this skip only
    # concerns a bare `pip install -e .` running the tests
    reason="submitit is not installed: pip install -e '.[test]' (or the [cluster] extra) brings it",
)

RECIPE = {
    "epochs": 2,
    "batch_size": 64,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 256,
}
EVAL = {"transfer": None, "shift": None, "suite": "quick", "n_examples": 30, "probe_epochs": 20}
STEPS_PER_EPOCH = 256 // 64

# A plugin whose losses let a test act at a known point of a job: `gated_simclr` holds training (in
# its second epoch, after the first was saved) while the file `hold` exists, and says which process
# holds; every call leaves one byte in calls.<pid>. `nan_loss` makes training fail.
PLUGIN = """
import os, time
from pathlib import Path
import torch.nn.functional as F
import robustbench_nacl as rbn

GATE = Path(os.environ["RBN_TEST_GATE"])

@rbn.register_pair_loss("gated_simclr", t=0.5)
def gated_simclr(z1, z2, t):
    with open(GATE / f"calls.{os.getpid()}", "a") as f:
        f.write("x")
    if (GATE / "hold").exists() and Path(os.environ["RBN_TEST_GATE_STATE"]).exists():
        (GATE / f"held.{os.getpid()}").write_text("")
        while (GATE / "hold").exists():
            time.sleep(0.05)
    return rbn.pair_loss(F.normalize(z1, dim=1), F.normalize(z2, dim=1), estimator="g0", temperature=t)

@rbn.register_pair_loss("nan_loss", t=0.5)
def nan_loss(z1, z2, t):
    return (z1 * z2).sum() * float("nan")
"""


def _entry(loss: str, zoo_name: str, root: Path) -> zoo.ZooEntry:
    e = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", loss, "digits:0-4", 0),
        zoo=zoo_name,
        encoder="convnet_small",
        loss=loss,
        dataset="digits:0-4",
        seed=0,
        recipe=dict(RECIPE),
        encoder_kwargs={"width": 8},
        eval=dict(EVAL),
    )
    zoo.write_entry(e, root)
    return e


@pytest.fixture
def env(tmp_path: Path, cli_env: dict[str, str]) -> dict[str, str]:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (tmp_path / "gate").mkdir()
    cli_env.update(
        ROBUSTBENCH_NACL_ZOO=str(tmp_path / "zoo"),
        ROBUSTBENCH_NACL_PLUGINS=str(tmp_path / "plugin.py"),
        RBN_TEST_GATE=str(tmp_path / "gate"),
        RBN_TEST_GATE_STATE=str(tmp_path / "none"),
        SUBMITIT_LOG_LEVEL="WARNING",
    )
    return cli_env


@pytest.fixture
def jobs_ended(tmp_path: Path) -> Iterator[None]:
    """After the test, end the jobs it started that still run (a failed test leaves some): open the
    gate, and interrupt each job's controller, which ends its task as ``job.cancel()`` does."""
    yield
    (tmp_path / "gate" / "hold").unlink(missing_ok=True)
    for record in (tmp_path / "ck" / ".jobs").glob("*.json"):
        data = json.loads(record.read_text())
        if data["launcher"] == "submitit-local" and launch_records.pid_alive(data):
            os.kill(int(data["job_id"]), signal.SIGINT)


def _until(what: str, check: Callable[[], object], timeout: float = 90) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _held(gate: Path, seen: set[int]) -> int | None:
    pids = {int(p.name.split(".")[1]) for p in gate.glob("held.*")} - seen
    return pids.pop() if pids else None


def _sha_and_mtime(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _status(env: dict[str, str], ck: Path, zoo_name: str) -> tuple[dict[str, list[str]], str]:
    res = run_cli(
        ["zoo", "status", "--zoo", zoo_name, "--out", str(ck), "--leaderboard", str(ck.parent / "b")], env
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    table = {
        cells[0]: cells[1:] for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:-1])
    }
    return table, lines[-1]


@needs_submitit
def test_a_killed_job_resumes_on_resubmission_and_the_finished_entry_is_not_retrained(
    tmp_path: Path, env: dict[str, str], jobs_ended: None
) -> None:
    gated = _entry("gated_simclr", "t", tmp_path / "zoo")
    other = _entry("simclr", "t", tmp_path / "zoo")
    ck, gate = tmp_path / "ck", tmp_path / "gate"
    env["RBN_TEST_GATE_STATE"] = str(zoo.checkpoint_dir(gated, ck) / "train_state.pt")
    (gate / "hold").write_text("")
    submit = ["zoo", "train", "--zoo", "t", "--out", str(ck), "--launcher", "submitit-local"]
    # the jobs outlive the command (as Slurm jobs would): its output goes to a file, not a pipe they hold
    with open(tmp_path / "submit.log", "w") as log:
        sub = subprocess.run(
            [sys.executable, "-m", "robustbench_nacl", *submit], env=env, stdout=log, stderr=log
        )
    text = (tmp_path / "submit.log").read_text()
    assert sub.returncode == 0 and "submitted 2 submitit-local job(s)" in text, text
    job_id = launch.read_record(ck, f"{gated.id}.train")["job_id"]

    # preempted in its second epoch: submitit checkpoints the task and requeues it in the same job
    first = _until("the gated job to hold in epoch 2", lambda: _held(gate, set()))
    os.kill(first, signal.SIGUSR2)
    second = _until("the requeued job to hold again", lambda: _held(gate, {first}))
    assert launch.read_record(ck, f"{gated.id}.train")["job_id"] == job_id
    weights = zoo.checkpoint_dir(other, ck) / "weights.safetensors"
    _until("the other entry to finish", lambda: zoo.is_trained(other, ck))
    before = _sha_and_mtime(weights)

    os.kill(second, signal.SIGKILL)  # the node dies: no result, only the first epoch's train_state.pt
    _until("the killed job to end", lambda: not launch_records.pid_alive({"job_id": job_id}))
    states = {s.task.entry.id: s for s in launch.zoo_status([gated, other], ck, tmp_path / "b", ["train"])}
    assert states[other.id].state == "done"
    assert states[gated.id].state == "interrupted" and "resubmit to resume" in states[gated.id].detail

    (gate / "hold").unlink()
    res = run_cli([*submit, "--wait"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{other.id}: already trained" in res.stdout and "submitted 1 submitit-local job(s)" in res.stdout
    assert f"{gated.id}: done" in res.stdout
    assert _sha_and_mtime(weights) == before  # the finished entry was not trained again
    calls = {int(p.name.split(".")[1]): len(p.read_text()) for p in gate.glob("calls.*")}
    assert calls[first] == STEPS_PER_EPOCH + 1 and calls[second] == 1
    (last,) = set(calls) - {first, second}
    assert calls[last] == STEPS_PER_EPOCH  # the resubmitted job trained only the second epoch
    table, counts = _status(env, ck, "t")
    assert table[other.id][0] == table[gated.id][0] == "done" and "train 2 done;" in counts


@needs_submitit
def test_zoo_status_gives_a_failed_job_its_reason_on_one_line(
    tmp_path: Path, env: dict[str, str], jobs_ended: None
) -> None:
    bad = _entry("nan_loss", "f", tmp_path / "zoo")
    idle = _entry("debiased", "f", tmp_path / "zoo")
    ck = tmp_path / "ck"
    res = run_cli(["zoo", "train", bad.id, "--out", str(ck), "--launcher", "submitit-local", "--wait"], env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{bad.id}: failed (NonFiniteLoss: " in res.stdout
    table, counts = _status(env, ck, "f")
    assert table[bad.id][0] == "failed" and table[bad.id][-1].startswith("train: NonFiniteLoss: ")
    assert table[idle.id][:2] == ["not started", "not started"]
    assert "train 1 failed, 1 not started" in counts
    assert "Traceback" not in res.stdout + table[bad.id][-1]


# ============ Slurm, against stand-in sbatch / srun / sacct ============

FAKE_SBATCH = """#!/bin/sh
cp "$1" "$(dirname "$0")/submitted.sh"
echo "Submitted batch job 91817"
"""


@needs_submitit
def test_slurm_submission_status_and_no_duplicate_of_a_live_job(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _entry("simclr", "s", tmp_path / "zoo"), _entry("debiased", "s", tmp_path / "zoo")
    bin_dir, ck = tmp_path / "bin", tmp_path / "ck"
    bin_dir.mkdir()
    for name, text in {
        "sbatch": FAKE_SBATCH,
        "srun": "#!/bin/sh\n",
        "sacct": "#!/bin/sh\ncat $(dirname $0)/sacct.txt\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", env["ROBUSTBENCH_NACL_ZOO"])
    flags = ["--slurm-partition", "gpu", "--slurm-gpus-per-job", "2", "--slurm-time", "120"]
    flags += ["--slurm-array-parallelism", "1", "--slurm-arg", "account=abc"]
    cmd = ["zoo", "train", "--zoo", "s", "--out", str(ck), "--device", "cuda", "--launcher", "slurm", *flags]
    assert main(cmd) == 0
    assert "submitted 2 slurm job(s) (91817_0, 91817_1)" in capsys.readouterr().out
    script = (bin_dir / "submitted.sh").read_text()
    for line in (
        "--array=0-1%1",
        "--partition=gpu",
        "--gpus-per-node=2",
        "--ntasks-per-node=2",
        "--time=120",
    ):
        assert f"#SBATCH {line}\n" in script
    assert "#SBATCH --account=abc\n" in script and "#SBATCH --signal=USR2@90\n" in script
    records = {e.id: launch.read_record(ck, f"{e.id}.train") for e in (a, b)}
    assert sorted(r["job_id"] for r in records.values()) == ["91817_0", "91817_1"]
    assert {r["launcher"] for r in records.values()} == {"slurm"}
    ja, jb = records[a.id]["job_id"], records[b.id]["job_id"]

    (bin_dir / "sacct.txt").write_text(f"JobID|State|NodeList\n{ja}|RUNNING|n1\n{jb}|PENDING|None\n")
    assert main(cmd) == 0  # a live job is never duplicated
    out = capsys.readouterr().out
    assert out.count("not submitted again") == 2 and "submitted" not in out.replace("submitted again", "")
    states = {s.task.entry.id: s for s in launch.zoo_status([a, b], ck, tmp_path / "b", ["train"])}
    assert (states[a.id].state, states[b.id].state) == ("running", "pending")

    # the job of a raised an error (submitit's result file); b's was cancelled after its first epoch
    folder = Path(records[a.id]["folder"])
    trace = "Traceback (most recent call last):\n  ...\nrobustbench_nacl.errors.DatasetNotFound: no cifar100"
    (folder / f"{ja}_0_result.pkl").write_bytes(pickle.dumps(("error", trace + "\n")))
    zoo.checkpoint_dir(b, ck).mkdir(parents=True)
    (zoo.checkpoint_dir(b, ck) / "train_state.pt").write_bytes(b"")
    (bin_dir / "sacct.txt").write_text(f"JobID|State|NodeList\n{ja}|FAILED|n1\n{jb}|CANCELLED by 1|n2\n")
    states = {s.task.entry.id: s for s in launch.zoo_status([a, b], ck, tmp_path / "b", ["train"])}
    assert (states[a.id].state, states[a.id].detail) == ("failed", "DatasetNotFound: no cifar100")
    assert states[b.id].state == "interrupted" and "(CANCELLED)" in states[b.id].detail


# ============ without submitit ============


def test_a_submitit_launcher_without_submitit_is_one_line_naming_the_extra(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _entry("simclr", "m", tmp_path / "zoo")
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", env["ROBUSTBENCH_NACL_ZOO"])
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` now fails as if not installed
    args = [
        "zoo",
        "train",
        "--zoo",
        "m",
        "--out",
        str(tmp_path / "ck"),
        "--launcher",
        "slurm",
        "--slurm-time",
        "5",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'robustbench-nacl[cluster]'" in err
    assert not (tmp_path / "ck" / ".jobs").exists()
    # --slurm-* flags without a submitit launcher would silently run here: refused, one line
    assert main(["zoo", "train", "--zoo", "m", "--out", str(tmp_path / "ck"), "--slurm-time", "5"]) == 2
    assert "--slurm-time: for --launcher slurm or submitit-local" in capsys.readouterr().err
