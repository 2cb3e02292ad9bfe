"""Trainer: every preset trains, checkpoints are complete, resume is bit-identical, errors are clean."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from robustbench_nacl import losses
from robustbench_nacl.errors import NonFiniteLoss, UserError
from robustbench_nacl.io import sha256_file
from robustbench_nacl.models.checkpoint import load_state
from robustbench_nacl.train.trainer import TrainConfig, train

TINY = {
    "dataset": "digits:0-2",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 8},
    "batch_size": 64,
    "knn_every": 1,
}


@pytest.mark.parametrize("preset", losses.list_presets())
def test_every_preset_trains_and_writes_a_complete_checkpoint(preset: str, tmp_path: Path) -> None:
    overrides = {"M": 3} if losses.PRESETS.get(preset).params.M > 3 else {}
    cfg = TrainConfig(loss=preset, overrides=overrides, epochs=1, **TINY)
    out = train(cfg, tmp_path / "run", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    for key in (
        "id",
        "encoder",
        "loss",
        "loss_params",
        "dataset",
        "recipe",
        "seed",
        "epochs",
        "normalization",
        "weights_sha256",
        "versions",
        "wall_s",
        "knn_acc",
    ):
        assert key in manifest, key
    assert manifest["id"] == f"convnet_small.{preset}_digits-0-2_s0"
    assert manifest["weights_sha256"] == sha256_file(out / "weights.safetensors")
    assert 0.0 <= manifest["knn_acc"] <= 1.0
    state = load_state(out / "weights.safetensors", manifest["weights_sha256"])
    assert any(k.startswith("encoder.") for k in state)
    assert manifest["dual_bn"] == (manifest["loss_params"]["alpha"] > 0)
    assert not (out / "train_state.pt").exists()  # the resume state is removed once the run is final
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [0, 1] and "test_knn_acc" in log[0] and "test_knn_acc" in log[1]
    assert manifest["knn_acc_init"] == log[0]["test_knn_acc"]  # the random-init baseline


def test_same_seed_same_bits_and_fused_views_differ(tmp_path: Path) -> None:
    cfg = TrainConfig(loss="simclr", epochs=1, **TINY)
    a = json.loads((train(cfg, tmp_path / "a", progress=False) / "manifest.json").read_text())
    b = json.loads((train(cfg, tmp_path / "b", progress=False) / "manifest.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]
    fused = TrainConfig(loss="simclr", epochs=1, fuse_views=True, **TINY)
    c = json.loads((train(fused, tmp_path / "c", progress=False) / "manifest.json").read_text())
    assert c["recipe"]["fuse_views"] is True
    # one pass for both views means BatchNorm statistics over both: different weights
    assert c["weights_sha256"] != a["weights_sha256"]


def test_refuses_to_overwrite_a_run_and_validates_flags(tmp_path: Path) -> None:
    cfg = TrainConfig(loss="simclr", epochs=1, **TINY)
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(UserError, match="already holds a training run"):
        train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(UserError, match="at least 2 images"):
        train(
            TrainConfig(loss="simclr", epochs=1, **{**TINY, "batch_size": 1}), tmp_path / "x", progress=False
        )
    with pytest.raises(UserError, match=r"empty|no images|class"):
        train(
            TrainConfig(loss="simclr", epochs=1, **{**TINY, "dataset": "digits:12-14"}),
            tmp_path / "y",
            progress=False,
        )
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_resume_handles_what_a_kill_can_leave(tmp_path: Path) -> None:
    cfg = TrainConfig(loss="simclr", epochs=1, **TINY)
    out = train(cfg, tmp_path / "run", progress=False)
    sha = json.loads((out / "manifest.json").read_text())["weights_sha256"]
    # killed after the manifest was written, before the state was removed: the run is complete
    (out / "train_state.pt").write_bytes(b"left over")
    assert train(cfg, out, resume=True, progress=False) == out
    assert not (out / "train_state.pt").exists()
    assert sha256_file(out / "weights.safetensors") == sha
    other = TrainConfig(loss="simclr", epochs=2, **TINY)
    with pytest.raises(UserError, match="different configuration"):
        train(other, out, resume=True, progress=False)
    # killed mid-way through the first state write: a stale temporary, and no state yet
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".train_state.pt.abc123.tmp").write_bytes(b"partial")
    train(cfg, fresh, resume=True, progress=False)
    assert sorted(p.name for p in fresh.iterdir()) == ["log.jsonl", "manifest.json", "weights.safetensors"]
    assert sha256_file(fresh / "weights.safetensors") == sha
    # a state file that is not one: one clear error naming it, nothing else touched
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match=r"train_state\.pt is unreadable .*delete it"):
        train(cfg, bad, resume=True, progress=False)
    assert [p.name for p in bad.iterdir()] == ["train_state.pt"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", float("nan"), "--lr nan"),
        ("lr", float("inf"), "--lr inf"),
        ("weight_decay", float("nan"), "--weight-decay nan"),
        ("weight_decay", -1e-4, "--weight-decay -0.0001"),
    ],
)
def test_optimizer_settings_are_validated_before_training(
    field: str, value: float, message: str, tmp_path: Path
) -> None:
    cfg = TrainConfig(loss="simclr", epochs=1, **TINY, **{field: value})
    with pytest.raises(UserError, match=message):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_non_finite_loss_stops_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = losses.OBJECTIVES.get("contrastive")

    def nan_loss(*args, **kwargs):
        loss, stats = real.loss(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setitem(
        losses.OBJECTIVES._items, "contrastive", real.__class__(needs=real.needs, loss=nan_loss)
    )
    with pytest.raises(NonFiniteLoss, match="non-finite loss"):
        train(TrainConfig(loss="simclr", epochs=1, **TINY), tmp_path / "nan", progress=False)
    assert not (tmp_path / "nan" / "weights.safetensors").exists()


def _train_args(out: Path, epochs: int) -> list[str]:
    return [
        "train",
        "--loss",
        "simclr",
        "--dataset",
        "digits",
        "--encoder",
        "convnet_small",
        "--encoder-arg",
        "width=16",
        "--epochs",
        str(epochs),
        "--batch-size",
        "32",
        "--knn-every",
        "100",
        "--out",
        str(out),
        "--no-progress",
    ]


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tmp_path: Path, cli_env: dict[str, str]) -> None:
    epochs = 3
    ref = run_cli(_train_args(tmp_path / "ref", epochs), cli_env)
    assert ref.returncode == 0, ref.stderr
    ref_sha = json.loads((tmp_path / "ref" / "manifest.json").read_text())["weights_sha256"]

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "robustbench_nacl", *_train_args(out, epochs)],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while not (out / "train_state.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # now inside epoch 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "manifest.json").exists()
    saved = torch.load(out / "train_state.pt", weights_only=True)["epoch"]
    assert 1 <= saved < epochs
    assert not list(out.glob(".*.tmp"))  # no half-written temporary files survive the kill

    res = run_cli([*_train_args(out, epochs), "--resume"], cli_env)
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "manifest.json").read_text())["weights_sha256"] == ref_sha


def test_missing_cifar_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, cli_env: dict[str, str]) -> None:
    data = tmp_path / "data"
    res = run_cli(
        [
            "train",
            "--loss",
            "simclr",
            "--dataset",
            "cifar10",
            "--encoder",
            "resnet18_cifar",
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],
        cli_env,
        timeout=120,
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cifar10" in lines[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
    assert not data.exists() or not any(data.rglob("*"))
