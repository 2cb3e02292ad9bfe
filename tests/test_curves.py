"""Learning curves: the trainer's probe monitor (logged per epoch, out of every identity, the same
weights with it or without it) and `zoo curves` (learning_curves.png and a CSV of the logged points)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from robustbench_nacl import pipeline, zoo
from robustbench_nacl.cli import main as cli_main
from robustbench_nacl.errors import UserError
from robustbench_nacl.models.features import monitor_probe_accuracy
from robustbench_nacl.report.curves import CSV, PNG, CurveRun, curve, draw_learning_curves, lines, read_log
from robustbench_nacl.training import (
    TrainConfig,
    config_sha256,
    recipe_sha256,
    run_id,
    train,
    training_config,
)

EPOCHS = 3
RECIPE = {"epochs": EPOCHS, "batch_size": 64, "lr": 3e-3, "max_train": 256}
MONITOR = {"knn_every": 1, "monitor_probe": True}
PUBLISHED = ROOT / "robustbench_nacl" / "files" / "published" / "demo" / "models"


def _entry(loss: str, root: Path) -> zoo.ZooEntry:
    e = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", loss, "digits:0-4", 0),
        zoo="t",
        encoder="convnet_small",
        loss=loss,
        dataset="digits:0-4",
        seed=0,
        recipe=dict(RECIPE),
        encoder_kwargs={"width": 8},
    )
    zoo.write_entry(e, root)
    return e


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[zoo.ZooEntry]]:
    """Two tiny digits entries of a zoo `t`, trained with the probe monitor every epoch."""
    tmp = tmp_path_factory.mktemp("curves")
    entries = [_entry(loss, tmp / "zoo") for loss in ("simclr", "debiased")]
    train(entries[0].train_config(**MONITOR), zoo.checkpoint_dir(entries[0], tmp / "ckpts"), progress=False)
    # the other as a zoo run trains it: the manifest's recipe asks for the monitor
    monitored = dataclasses.replace(entries[1], recipe={**RECIPE, "monitor_every": 1, "monitor_probe": True})
    zoo.write_entry(monitored, tmp / "zoo")
    pipeline.train_entry(monitored, tmp / "ckpts")
    return tmp, [entries[0], monitored]


def _log(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()]


def test_the_probe_monitor_logs_every_monitored_epoch(trained) -> None:
    tmp, entries = trained
    for e in entries:
        log = _log(zoo.checkpoint_dir(e, tmp / "ckpts"))
        assert [r["epoch"] for r in log] == list(range(EPOCHS + 1))  # epoch 0: at initialisation
        for r in log:
            for key in ("test_knn_acc", "train_probe_acc", "test_probe_acc"):
                assert 0.0 <= r[key] <= 1.0, (e.id, r)
        # a linear probe on 32 standardised features of 256 images fits its training split well
        assert log[-1]["train_probe_acc"] > 0.9, log[-1]
        manifest = json.loads((zoo.checkpoint_dir(e, tmp / "ckpts") / "manifest.json").read_text())
        assert manifest["config"]["monitor_probe"] is True  # the manifest says how the run was monitored


def test_the_probe_monitor_changes_neither_the_weights_nor_any_identity(trained, tmp_path: Path) -> None:
    tmp, entries = trained
    monitored = zoo.checkpoint_dir(entries[0], tmp / "ckpts")
    plain_cfg = entries[0].train_config(knn_every=1)
    plain = train(plain_cfg, tmp_path / "plain", progress=False)
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (monitored, plain))
    assert a["weights_sha256"] == b["weights_sha256"]  # it draws from no RNG stream of the training
    for key in ("id", "config_sha256", "recipe_sha256", "training_config"):
        assert a[key] == b[key], key
    assert "monitor_probe" not in b["config"]  # off: the recorded configuration is what it always was
    assert "monitor_probe" not in b["training_config"]
    # the same weights give the same kNN accuracy; only the monitored run has the probe fields
    assert [r["test_knn_acc"] for r in _log(monitored)] == [r["test_knn_acc"] for r in _log(plain)]
    assert not any("test_probe_acc" in r for r in _log(plain))
    # without an explicit id, the default id (config hash) is the same too
    assert run_id(TrainConfig(**{**plain_cfg.to_dict(), "id": None, "monitor_probe": True})) == run_id(
        TrainConfig(**{**plain_cfg.to_dict(), "id": None})
    )


@pytest.mark.parametrize("path", sorted(PUBLISHED.glob("*/manifest.json")), ids=lambda p: p.parent.name)
def test_published_demo_manifests_still_give_their_own_ids_and_hashes(path: Path) -> None:
    manifest = json.loads(path.read_text())
    config = manifest["config"]
    teacher = (config.get("overrides") or {}).get("teacher")
    if isinstance(teacher, dict):  # a DeACL teacher shipped by id and sha256: the set's own model
        folder = PUBLISHED / teacher["id"]
        assert (
            json.loads((folder / "manifest.json").read_text())["weights_sha256"] == teacher["weights_sha256"]
        )
        config = {**config, "overrides": {**config["overrides"], "teacher": str(folder)}}
    cfg = TrainConfig(**config)
    assert cfg.to_dict() == config  # no new key in the recorded configuration
    training = training_config(cfg)
    assert json.loads(json.dumps(training)) == manifest["training_config"]
    assert config_sha256(training) == manifest["config_sha256"]
    assert recipe_sha256(training) == manifest["recipe_sha256"]
    assert run_id(cfg) == manifest["id"]


def test_the_monitor_probe_fits_separable_features_and_draws_no_random_numbers() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(300) % 3
    centres = torch.tensor([[5.0, 0.0, 0.0, 0.0], [0.0, 5.0, 0.0, 0.0], [0.0, 0.0, 5.0, 0.0]])
    f = centres[y] + 0.3 * torch.randn(300, 4, generator=g)
    f[:, 3] = 7.0  # a feature constant on the training split: no division by zero, weight kept at 0
    state = torch.get_rng_state()
    fit, test = monitor_probe_accuracy(f[:200], y[:200], f[200:], y[200:], num_classes=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert fit == 1.0 and test == 1.0
    again = monitor_probe_accuracy(f[:200], y[:200], f[200:], y[200:], num_classes=3)
    assert again == (fit, test)
    # labels unrelated to the features: the test accuracy falls to about chance
    shuffled = y[torch.randperm(300, generator=g)]
    _, chance = monitor_probe_accuracy(f[:200], shuffled[:200], f[200:], shuffled[200:], num_classes=3)
    assert chance < 0.6


def test_zoo_curves_draws_the_logged_points(
    trained, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, entries = trained
    cli_env["ROBUSTBENCH_NACL_ZOO"] = str(tmp / "zoo")
    board = tmp / "board"
    res = run_cli(
        ["zoo", "curves", "--zoo", "t", "--out", str(tmp / "ckpts"), "--leaderboard", str(board)], cli_env
    )
    assert res.returncode == 0, res.stderr
    assert "2 runs, 2 lines" in res.stdout
    png = (board / PNG).read_bytes()
    assert png.startswith(b"\x89PNG")
    import matplotlib.image

    assert matplotlib.image.imread(board / PNG).shape[:2] == (460, 1240)
    with open(board / CSV, newline="") as f:
        table = list(csv.DictReader(f))
    for e in entries:
        log = _log(zoo.checkpoint_dir(e, tmp / "ckpts"))
        mine = [r for r in table if r["id"] == e.id]
        assert [int(r["epoch"]) for r in mine] == [r["epoch"] for r in log]
        assert {r["label"] for r in mine} == {e.loss}
        for row, logged in zip(mine, log, strict=True):
            for key in ("test_knn_acc", "train_probe_acc", "test_probe_acc"):
                assert float(row[key]) == logged[key], (e.id, key)  # written exactly as logged
            assert row["train_loss"] == ("" if logged["epoch"] == 0 else repr(logged["train_loss"]))
    # drawn again from the same logs (in this process: the same command's main): the same bytes
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp / "zoo"))
    curves = ["zoo", "curves", "--zoo", "t", "--leaderboard", str(board)]
    assert cli_main([*curves, "--out", str(tmp / "ckpts")]) == 0
    assert (board / PNG).read_bytes() == png
    capsys.readouterr()
    # nothing trained under --out: one line, exit 2
    assert cli_main([*curves, "--out", str(tmp / "empty")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "none of the 2 entries asked for has a training log" in err


def _run(label: str, seed: int, points: dict[int, float], field: str = "test_knn_acc") -> CurveRun:
    return CurveRun(f"{label}_s{seed}", label, seed, tuple({"epoch": e, field: v} for e, v in points.items()))


def test_a_line_is_the_mean_over_seeds_with_their_range() -> None:
    runs = [
        _run("simclr", 0, {0: 0.5, 1: 0.6, 2: 0.7}),
        _run("simclr", 1, {0: 0.3, 2: 0.9}),  # a seed that logged fewer epochs
        _run("nca", 0, {0: 0.4}),
    ]
    points = curve(runs[:2], "test_knn_acc")
    assert [(p.epoch, p.n) for p in points] == [(0, 2), (1, 1), (2, 2)]
    assert points[0].mean == pytest.approx(0.4) and (points[0].lo, points[0].hi) == (0.3, 0.5)
    assert points[2].mean == pytest.approx(0.8) and (points[2].lo, points[2].hi) == (0.7, 0.9)
    assert list(lines(runs, "test_knn_acc")) == ["nca", "simclr"]
    assert lines(runs, "test_probe_acc") == {}  # no run logged the probe
    # a figure without a probe line still draws both panels (the second says why it is empty)
    assert draw_learning_curves(runs).startswith(b"\x89PNG")


def test_a_log_line_that_is_not_a_trainer_row_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"epoch": 0, "test_knn_acc": 0.5}\n{"epoch": 1, "train_lo\n')
    with pytest.raises(UserError, match=r"log.jsonl:2 is not a log row"):
        read_log(log)
