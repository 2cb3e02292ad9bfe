"""Trainer: every preset trains, checkpoints are complete and name their full configuration, resume is
bit-identical, errors are clean."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_cli

from robustbench_nacl import losses
from robustbench_nacl.errors import CheckpointError, NonFiniteLoss, UserError
from robustbench_nacl.io import canonical_json, sha256_bytes, sha256_file
from robustbench_nacl.models.checkpoint import load_state
from robustbench_nacl.models.dual_bn import DualBatchNorm
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.training import (
    TrainConfig,
    TrainStep,
    build_model,
    config_sha256,
    recipe_sha256,
    run_id,
    train,
    training_config,
)
from robustbench_nacl.training import loop as train_loop
from robustbench_nacl.training.config import RECORDED_WHEN_SET
from robustbench_nacl.training.manifest import NOT_TRAINING, optimizer_recipe

TINY = {
    "dataset": "digits:0-2",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 8},
    "batch_size": 64,
    "knn_every": 1,
}


@pytest.mark.parametrize("preset", losses.list_presets())
def test_every_preset_trains_and_writes_a_complete_checkpoint(preset: str, tmp_path: Path) -> None:
    overrides: dict[str, Any] = {"M": 3} if losses.PRESETS.get(preset).params.M > 3 else {}
    if "teacher" in losses.PRESETS.get(preset).params.extra_params():  # DeACL: a stage-1 checkpoint first
        teacher = train(TrainConfig(loss="simclr", epochs=1, **TINY), tmp_path / "teacher", progress=False)
        overrides["teacher"] = str(teacher)
    # 128 images (two batches): what is checked is the checkpoint's completeness, not learning
    cfg = TrainConfig(loss=preset, overrides=overrides, epochs=1, max_train=128, **TINY)
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
    assert manifest["id"] == f"convnet_small.{preset}_digits-0-2_s0_{manifest['config_sha256'][:8]}"
    assert manifest["weights_sha256"] == sha256_file(out / "weights.safetensors")
    assert 0.0 <= manifest["knn_acc"] <= 1.0
    state = load_state(out / "weights.safetensors", manifest["weights_sha256"])
    assert any(k.startswith("encoder.") for k in state)
    params = losses.resolve(preset, overrides)
    assert manifest["dual_bn"] == (losses.needs(params).adversarial and params.dual_bn)
    if losses.needs(params).adversarial and "attack_eps" in params.extra_params():
        # every parameter of the inner attack is recorded (losses/adversarial.py)
        assert manifest["loss_params"]["extra"] == params.extra_params()
        assert {"attack_eps", "attack_steps", "attack_step_size"} <= set(manifest["loss_params"]["extra"])
    if manifest.get("eval_bn_route") == "adv":  # ACL/DynACL: evaluated through the adversarial branch
        encoder, _ = load_encoder(out)
        routes = {m.route for m in encoder.modules() if isinstance(m, DualBatchNorm)}
        assert routes == {"adv"}
        forged = json.loads((out / "manifest.json").read_text())
        forged["eval_bn_route"] = "aux"
        (out / "manifest.json").write_text(json.dumps(forged))
        with pytest.raises(CheckpointError, match="eval_bn_route"):
            load_encoder(out)
    if "teacher" in overrides:  # the teacher is recorded by content
        teacher_manifest = json.loads((Path(overrides["teacher"]) / "manifest.json").read_text())
        assert manifest["teacher"]["weights_sha256"] == teacher_manifest["weights_sha256"]
    assert not (out / "train_state.pt").exists()  # the resume state is removed once the run is final
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [0, 1] and "test_knn_acc" in log[0] and "test_knn_acc" in log[1]
    assert manifest["knn_acc_init"] == log[0]["test_knn_acc"]  # the random-init baseline
    _check_recorded_configuration(manifest, cfg)


def _check_recorded_configuration(manifest: dict[str, Any], cfg: TrainConfig) -> None:
    """The manifest holds every TrainConfig field, the resolved loss, and the hashes taken of them."""
    assert manifest["config"] == json.loads(json.dumps(cfg.to_dict()))
    training = manifest["training_config"]
    assert training == json.loads(json.dumps(training_config(cfg)))
    # the fields recorded only when set (the optimizer's, the schedule's) enter as they are recorded
    unset = set(RECORDED_WHEN_SET) - set(cfg.to_dict())
    kept = {f.name for f in dataclasses.fields(TrainConfig)} - set(NOT_TRAINING) - unset
    assert set(training) == kept | {"loss_params", "optimizer", "drop_last"} | set(optimizer_recipe(cfg))
    resolved = losses.resolve(cfg.loss, cfg.overrides).to_dict()
    assert manifest["loss_params"] == resolved
    if manifest.get("teacher"):  # DeACL: the recipe names its teacher by the teacher's recipe, not its path
        teacher = json.loads((Path(manifest["teacher"]["checkpoint"]) / "manifest.json").read_text())
        resolved["extra"]["teacher"] = {"recipe_sha256": teacher["recipe_sha256"]}
    assert training["loss_params"] == resolved
    assert manifest["config_sha256"] == sha256_bytes(canonical_json(training).encode())
    without_seed = {k: v for k, v in training.items() if k != "seed"}
    assert manifest["recipe_sha256"] == sha256_bytes(canonical_json(without_seed).encode())


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


def test_knn_monitor_settings_change_neither_the_weights_nor_the_id(tmp_path: Path) -> None:
    # why the kNN monitor is left out of the training configuration: it only reads the encoder
    cfg = TrainConfig(loss="simclr", epochs=1, **TINY)
    quiet = dataclasses.replace(cfg, knn_every=0, knn_k=20, knn_t=0.5)
    a = json.loads((train(cfg, tmp_path / "a", progress=False) / "manifest.json").read_text())
    b = json.loads((train(quiet, tmp_path / "b", progress=False) / "manifest.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["id"] == b["id"] and a["config_sha256"] == b["config_sha256"]
    assert a["knn"] != b["knn"]  # the manifests still say how each was monitored


def test_default_id_differs_when_one_setting_that_changes_the_weights_does() -> None:
    base = TrainConfig(loss="simclr", epochs=1, **TINY)
    assert run_id(base) == run_id(TrainConfig(loss="simclr", epochs=1, **TINY))
    assert re.fullmatch(r"convnet_small\.simclr_digits-0-2_s0_[0-9a-f]{8}", run_id(base))
    variants = {
        "encoder width": dataclasses.replace(base, encoder_kwargs={"width": 16}),
        "one --set override": dataclasses.replace(base, overrides={"t": 0.2}),
        "lr": dataclasses.replace(base, lr=1e-3),
        "epochs": dataclasses.replace(base, epochs=2),
        "max_train": dataclasses.replace(base, max_train=200),
        "precision": dataclasses.replace(base, precision="bf16"),
        "seed": dataclasses.replace(base, seed=1),
    }
    ids = {name: run_id(cfg) for name, cfg in variants.items()}
    assert len({run_id(base), *ids.values()}) == len(variants) + 1, ids
    # what cannot change the weights leaves the id alone: an override equal to the preset's value,
    # a float written as an int, where the data lives, the kNN monitor
    for same in (
        dataclasses.replace(base, overrides={"t": 0.5}),
        dataclasses.replace(base, overrides={"t": "0.5"}),  # as --set t=0.5 passes it
        dataclasses.replace(base, data_root="/elsewhere", knn_every=0),
        dataclasses.replace(base, dataset="digits:0,1,2"),  # the same classes in the same order
    ):
        assert run_id(same) == run_id(base), same
    assert run_id(dataclasses.replace(base, lr=1)) == run_id(dataclasses.replace(base, lr=1.0))
    assert run_id(dataclasses.replace(base, id="mine")) == "mine"


def test_a_timm_encoder_id_is_a_file_name_and_its_identity_names_timm() -> None:
    import importlib.metadata

    try:
        timm_version = importlib.metadata.version("timm")
    except importlib.metadata.PackageNotFoundError:  # the id needs no timm; the identity says so
        timm_version = "not installed"
    cfg = TrainConfig(loss="simclr", encoder="timm:resnet18", dataset="digits:0-4")
    rid = run_id(cfg)
    # the id is the run's folder name: "timm:resnet18" must not put a ':' into it
    assert rid.startswith("timm-resnet18.simclr_digits-0-4_s0_") and ":" not in rid
    assert training_config(cfg)["timm"] == timm_version
    # a built-in encoder's configuration (and so every existing id and hash) has no such key
    assert "timm" not in training_config(dataclasses.replace(cfg, encoder="convnet_small"))


def test_recipe_hash_is_the_configuration_hash_without_the_seed() -> None:
    seeds = [training_config(TrainConfig(loss="simclr", seed=s, **TINY)) for s in (0, 1)]
    wider = training_config(TrainConfig(loss="simclr", **{**TINY, "encoder_kwargs": {"width": 16}}))
    assert recipe_sha256(seeds[0]) == recipe_sha256(seeds[1])
    assert config_sha256(seeds[0]) != config_sha256(seeds[1])
    assert recipe_sha256(wider) != recipe_sha256(seeds[0])


def test_bf16_step_hands_the_objective_uncast_float32_views_under_autocast() -> None:
    # the trainer only opens autocast; casting (or not) the loss inputs is the objective's business
    cfg = TrainConfig(loss="simclr", precision="bf16", **TINY)
    params = losses.resolve(cfg.loss)
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=3)
    real = losses.OBJECTIVES.get(params.objective)
    seen: dict[str, Any] = {}

    def recording(model, views, *args):
        seen.update(dtypes={v.dtype for v in views}, autocast=torch.is_autocast_enabled("cpu"))
        return real.loss(model, views, *args)

    step = TrainStep(
        cfg,
        params,
        model,
        torch.optim.Adam(model.parameters(), lr=cfg.lr),
        objective=real.__class__(needs=real.needs, loss=recording),
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8, generator=g)
    value, _ = step(x, torch.randint(0, 3, (16,), generator=g), g)
    assert seen == {"dtypes": {torch.float32}, "autocast": True} and math.isfinite(value)


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
        ("precision", "fp16", "--precision 'fp16'"),
        ("epochs", 0, "--epochs 0"),
        ("batch_size", 1, "--batch-size 1"),
        ("max_train", 1, "--max-train 1"),
        # an unknown encoder used to surface only after the data was loaded (in build_model)
        ("encoder", "convnet_smal", "unknown encoder 'convnet_smal' \\(did you mean 'convnet_small'"),
    ],
)
def test_settings_are_validated_before_loading_data(
    field: str, value: Any, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the settings were checked")

    monkeypatch.setattr(train_loop, "load_dataset", no_data)
    cfg = TrainConfig(loss="simclr", **{**TINY, "epochs": 1, field: value})
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


def _train_args(out: Path, epochs: int, loss: str = "simclr", dataset: str = "digits") -> list[str]:
    # the adversarial run is kept short: 2 PGD steps on two classes exercise the same resume path
    fast = ["--set", "attack_steps=2"] if loss != "simclr" else []
    return [
        "train",
        *fast,
        "--loss",
        loss,
        "--dataset",
        dataset,
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


def _first_epoch_s(out: Path) -> float | None:
    """The first epoch's training seconds once the run has logged it, else None."""
    log = out / "log.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return next((r["wall_s"] for r in rows if r["epoch"] == 1), None)


@pytest.mark.slow
# dynacl: the adversarial engine (the attack's own generator) and a per-epoch schedule resume too.
# A SimCLR-family run killed three times at seeded points is tests/test_reliability_faults.py's.
@pytest.mark.parametrize(("loss", "dataset"), [("dynacl", "digits:0-1")])
def test_sigkill_then_resume_is_bit_identical(
    tmp_path: Path, cli_env: dict[str, str], loss: str, dataset: str
) -> None:
    epochs = 3
    ref = run_cli(_train_args(tmp_path / "ref", epochs, loss, dataset), cli_env)
    assert ref.returncode == 0, ref.stderr
    ref_sha = json.loads((tmp_path / "ref" / "manifest.json").read_text())["weights_sha256"]

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "robustbench_nacl", *_train_args(out, epochs, loss, dataset)],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # kill half an epoch after epoch 1 was logged (the log is written after the state), with the
    # epoch's length measured by the run itself: inside epoch 2 however fast or loaded the machine
    deadline = time.time() + 240
    while (epoch_s := _first_epoch_s(out)) is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    time.sleep(0.5 * (epoch_s or 0.0))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "manifest.json").exists()
    saved = torch.load(out / "train_state.pt", weights_only=True)["epoch"]
    assert 1 <= saved < epochs
    assert not list(out.glob(".*.tmp"))  # no half-written temporary files survive the kill

    res = run_cli([*_train_args(out, epochs, loss, dataset), "--resume"], cli_env)
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


class _Killed(Exception):
    """Stands for a kill: raised as the second epoch starts, after the first one's state was saved."""


RESUME_TINY = {
    "dataset": "digits:0-1",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 4},
    "batch_size": 32,
    "max_train": 96,
    "knn_every": 0,
    "epochs": 2,
}


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeACL's stage 1: a SimCLR checkpoint with the student's encoder."""
    out = tmp_path_factory.mktemp("teacher") / "simclr"
    return train(TrainConfig(loss="simclr", **{**RESUME_TINY, "epochs": 1}), out, progress=False)


# every adversarial preset besides dynacl (killed for real above): its setup (DeACL's teacher), the
# attack's own generator and its parameters come back from train_state.pt alone. In-process, as cheap
# as a kill: the run stops after epoch 1 of 2 and a fresh train(resume=True) finishes it.
@pytest.mark.parametrize("preset", ["acl", "rocl", "deacl"])
def test_adversarial_preset_resumed_after_an_interruption_is_bit_identical(
    preset: str, tiny_teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides: dict[str, Any] = {"attack_steps": 2}
    if preset == "deacl":
        overrides["teacher"] = str(tiny_teacher)
    cfg = TrainConfig(loss=preset, overrides=overrides, **RESUME_TINY)
    ref = train(cfg, tmp_path / "ref", progress=False)
    ref_manifest = json.loads((ref / "manifest.json").read_text())

    real_epoch = train_loop._train_epoch

    def killed_at_epoch_2(run: Any, step: Any, epoch: int, progress: bool) -> dict[str, Any]:
        if epoch == 1:
            raise _Killed
        return real_epoch(run, step, epoch, progress)

    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        m.setattr(train_loop, "_train_epoch", killed_at_epoch_2)
        with pytest.raises(_Killed):
            train(cfg, out, progress=False)
    assert torch.load(out / "train_state.pt", weights_only=True)["epoch"] == 1
    assert not (out / "manifest.json").exists()
    torch.manual_seed(12345)  # a new process's global RNG: the state file must restore it
    train(cfg, out, resume=True, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights_sha256"] == ref_manifest["weights_sha256"]
    assert sha256_file(out / "weights.safetensors") == ref_manifest["weights_sha256"]
    # the attack's parameters are all recorded
    extra = manifest["loss_params"]["extra"]
    assert extra["attack_steps"] == 2
    assert {"attack_eps", "attack_step_size", "attack_random_start", "attack_bn_eval"} <= set(extra)


# ============ log.jsonl: appended, one line per epoch ============


def _log_rows(out: Path) -> list[dict[str, Any]]:
    """The log's rows without their wall-clock seconds (the only field that differs run to run)."""
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_log_is_appended_one_line_per_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After each epoch the log gains exactly one line (two after the first: the epoch-0 kNN row), in
    the same file (same inode), the lines written before unchanged: appended, not rewritten."""
    snapshots: list[tuple[int, bytes]] = []
    real = train_loop.write_log

    def spy(path: Path, rows: list[dict[str, Any]], logged: int) -> None:
        real(path, rows, logged)
        snapshots.append((path.stat().st_ino, path.read_bytes()))

    monkeypatch.setattr(train_loop, "write_log", spy)
    epochs = 3
    out = train(TrainConfig(loss="simclr", epochs=epochs, **TINY), tmp_path / "run", progress=False)
    assert len(snapshots) == epochs
    assert len({ino for ino, _ in snapshots}) == 1  # one file throughout, never replaced
    for k, (_, text) in enumerate(snapshots, start=1):
        assert len(text.splitlines()) == k + 1  # the epoch-0 row, then one row per epoch
        assert text.endswith(b"\n") and json.loads(text.splitlines()[-1])["epoch"] == k
    for (_, before), (_, after) in itertools.pairwise(snapshots):
        assert after.startswith(before)
    assert (out / "log.jsonl").read_bytes() == snapshots[-1][1]


def test_resume_leaves_the_log_of_an_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after epoch 1 with a line the state does not cover (a row logged by a later epoch whose
    state was never saved): the resumed run cuts it, in place, and ends with the reference's lines."""
    cfg = TrainConfig(loss="simclr", epochs=3, **TINY)
    ref = train(cfg, tmp_path / "ref", progress=False)
    real_save = train_loop._save_state

    def killed_before_state_2(run: Any, epoch: int) -> None:
        if epoch == 2:
            raise _Killed  # the second epoch trained, neither its state nor its row written
        real_save(run, epoch)

    out = tmp_path / "killed"
    monkeypatch.setattr(train_loop, "_save_state", killed_before_state_2)
    with pytest.raises(_Killed):
        train(cfg, out, progress=False)
    monkeypatch.undo()
    log = out / "log.jsonl"
    assert len(log.read_text().splitlines()) == 2  # epoch 0 and epoch 1
    with log.open("a") as f:
        f.write(json.dumps({"epoch": 2, "train_loss": 0.0, "wall_s": 0.0}) + "\n")
    inode = log.stat().st_ino
    train(cfg, out, resume=True, progress=False)
    assert log.stat().st_ino == inode  # cut and appended in place
    assert [r["epoch"] for r in _log_rows(out)] == [0, 1, 2, 3]
    assert _log_rows(out) == _log_rows(ref)
