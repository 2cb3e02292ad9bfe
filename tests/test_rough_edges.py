"""Rough edges a careless user meets: common flags, a closed pipe, a killed pool's untouched tasks,
resuming on another number of processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _models import one_thread
from test_zoo_completeness import tiny_entry

from robustbench_nacl import cli, launch
from robustbench_nacl.errors import UserError
from robustbench_nacl.io import sha256_file, write_json_atomic
from robustbench_nacl.launch import records as launch_records
from robustbench_nacl.training import TrainConfig, loop, train


def test_every_command_takes_the_common_flags() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():  # type: ignore[union-attr]
        assert "--no-progress" in p._option_string_actions, name
        assert "--plugin" in p._option_string_actions, name


def test_a_closed_pipe_ends_quietly(cli_env: dict[str, str]) -> None:
    """`robustbench-nacl losses | head -1`: the reader is gone before the output is written."""
    p = subprocess.Popen(
        [sys.executable, "-m", "robustbench_nacl", "losses"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env,
        text=True,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # as `head` does once it has its line
    err = p.stderr.read()
    assert p.wait(60) == cli.CLOSED_PIPE and err == ""  # no "error: Broken pipe", no traceback


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def test_tasks_a_killed_local_pool_never_began_are_not_started(tmp_path: Path) -> None:
    a, b = tiny_entry(tmp_path / "zoo", "simclr"), tiny_entry(tmp_path / "zoo", "debiased")
    began, untouched = launch.make_tasks([a, b], "train", tmp_path / "ck", tmp_path / "board")
    pid = str(_dead_pid())  # the pool's process, killed
    for t in (began, untouched):
        launch_records.write_record(t, "local", pid, None, proc_start=None)
    record = launch.read_record(began.ckpts, began.key)
    write_json_atomic(launch.record_path(began.ckpts, began.key), {**record, "started": True})
    states = {s.task.entry.id: s for s in launch.task_states([began, untouched])}
    assert states[untouched.entry.id].state == "not started"
    assert "ended before this task began" in states[untouched.entry.id].detail
    assert states[began.entry.id].state == "failed"  # it began and left nothing: that one failed


CFG = {
    "dataset": "digits",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 4},
    "max_train": 128,
    "batch_size": 32,
    "epochs": 2,
    "knn_every": 0,
}


def _interrupted(out: Path, monkeypatch: pytest.MonkeyPatch, saved: dict | None) -> None:
    """A run stopped after epoch 1, its state saved as if by a process group ``saved``."""
    real = loop._train_epoch

    def stop_at_2(run, step, epoch, progress):  # type: ignore[no-untyped-def]
        if epoch == 1:
            raise KeyboardInterrupt
        return real(run, step, epoch, progress)

    monkeypatch.setattr(loop, "_train_epoch", stop_at_2)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(loss="simclr", **CFG), out, progress=False)
    monkeypatch.setattr(loop, "_train_epoch", real)
    state = torch.load(out / loop.STATE, weights_only=True)
    state["distributed"] = saved
    torch.save(state, out / loop.STATE)


def test_resume_on_another_world_size_is_allowed_when_sync_bn_makes_it_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with one_thread():
        ref = train(TrainConfig(loss="simclr", **CFG), tmp_path / "ref", progress=False)
        # two processes with --sync-bn: BatchNorm saw the global batch, as one process does
        _interrupted(tmp_path / "sync", monkeypatch, {"world_size": 2, "sync_bn": True})
        train(TrainConfig(loss="simclr", **CFG), tmp_path / "sync", resume=True, progress=False)
        # two processes with per-rank BatchNorm: each batch in 2 shards, another run
        _interrupted(tmp_path / "ranks", monkeypatch, {"world_size": 2, "sync_bn": False})
        with pytest.raises(UserError) as e:
            train(TrainConfig(loss="simclr", **CFG), tmp_path / "ranks", resume=True, progress=False)
    assert sha256_file(tmp_path / "sync" / "weights.safetensors") == sha256_file(ref / "weights.safetensors")
    assert "was started with 2 processes, this run has one process (no process group)" in str(e.value)
    assert "each batch in 1 shard(s) instead of 2" in str(e.value)
    assert str(e.value).endswith("resume on 2 processes without --sync-bn")


def test_empty_file_registries_say_where_they_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wheel installed without its data folders: one line naming the folders searched, exit 2."""
    from robustbench_nacl.attack import suites
    from robustbench_nacl.zoo import manifests as zoo

    monkeypatch.setattr(suites, "REPO_SUITES_DIR", tmp_path / "site-packages" / "attacks")
    monkeypatch.delenv(suites.ENV_DIR, raising=False)
    monkeypatch.setattr(zoo, "REPO_ZOO", tmp_path / "site-packages" / "zoo")
    monkeypatch.delenv(zoo.ZOO_ENV, raising=False)
    assert cli.main(["zoo", "list"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'site-packages' / 'zoo'} (the zoo folder of this installation) does not exist" in err
    assert err.count("\n") == 1
    assert cli.main(["zoo", "list", "--zoo", "paper"]) == 2
    assert "lacks them" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(zoo.ZOO_ENV, str(tmp_path / "empty"))
    assert cli.main(["zoo", "run"]) == 2
    assert (
        f"{tmp_path / 'empty'} (from $ROBUSTBENCH_NACL_ZOO) holds no *.json manifests"
        in capsys.readouterr().err
    )
    with pytest.raises(UserError) as e:
        suites.load_suite("paper")
    assert f"looked in {tmp_path / 'site-packages' / 'attacks'} (missing)" in str(e.value)
    assert "available: none" not in str(e.value)
