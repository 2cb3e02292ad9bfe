"""In-memory evaluation: ``evaluate(module, dataset=..., name=...)`` gives the rows a checkpoint of the
same weights gives, ranked beside it under one protocol, and never touches the caller's module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from robustbench_nacl import render_leaderboard
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.eval.source import state_dict_sha256
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.training import TrainConfig, train

QUICK = {"suite": "quick", "n_examples": 40, "probe": ProbeConfig(epochs=30, lr=1e-2), "progress": False}
ENCODER_CLASS = "robustbench_nacl.models.encoders.Encoder"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = TrainConfig(
        loss="simclr",
        dataset="digits:0-4",
        encoder="convnet_small",
        encoder_kwargs={"width": 8},
        epochs=1,
        batch_size=64,
        max_train=256,
        knn_every=0,
    )
    return train(cfg, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


def _numbers(rows) -> dict[tuple, tuple[float, float]]:
    return {(r["setting"], r["attack"], r["norm"], r["eps"]): (r["clean_acc"], r["robust_acc"]) for r in rows}


def test_a_module_ranks_beside_the_checkpoint_of_its_weights(ckpt: Path, tmp_path: Path) -> None:
    from_disk = evaluate(ckpt, out=tmp_path, **QUICK)
    module, _ = load_encoder(ckpt)
    mine = evaluate(module, dataset="digits:0-4", name="mine", out=tmp_path, **QUICK)
    # the same weights, probe seed and attack seeds: the same numbers, under the same protocol
    assert _numbers(mine) == _numbers(from_disk)
    assert {r.protocol_id for r in mine} == {r.protocol_id for r in from_disk}
    assert {r.recipe_id for r in mine}.isdisjoint({r.recipe_id for r in from_disk})
    sha = state_dict_sha256(module)
    for r in mine:
        assert r["checkpoint_id"] == "mine" and r["loss"] == "mine" and r["checkpoint_format"] == "module"
        assert r["module_class"] == ENCODER_CLASS and r["encoder"] == ENCODER_CLASS
        assert r["module_sha256"] == sha == r["checkpoint_sha256"]
        assert r["recipe"] == {
            "kind": "module",
            "class": ENCODER_CLASS,
            "state_dict_sha256": sha,
            "normalize": None,
        }
    render_leaderboard([*from_disk, *mine], tmp_path / "board")
    table = (
        (tmp_path / "board" / "LEADERBOARD.md").read_text().split("## In-domain", 1)[1].split("\n\n", 2)[1]
    )
    assert {line.split("|")[2].strip() for line in table.splitlines()[2:]} == {"mine", "simclr"}


def test_the_callers_module_is_left_as_it_was_and_a_rerun_is_a_no_op(ckpt: Path, tmp_path: Path) -> None:
    module, _ = load_encoder(ckpt)
    module.train()  # a module in training mode, as one mid-way through a training loop would be
    before = {k: v.clone() for k, v in module.state_dict().items()}
    first = evaluate(module, dataset="digits:0-4", out=tmp_path, **QUICK)
    assert module.training and all(m.training for m in module.modules())
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm statistics included
    assert all(v.is_contiguous() for v in after.values())  # not converted to channels_last
    assert {r["checkpoint_id"] for r in first} == {"Encoder"}  # the class name without name=
    again = evaluate(module, dataset="digits:0-4", out=tmp_path, **QUICK)
    assert again.computed == 0 and [r.row_id for r in again] == [r.row_id for r in first]


def _tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def test_a_normalisation_in_front_is_part_of_what_is_evaluated(tmp_path: Path) -> None:
    net = _tiny_net()
    raw = evaluate(net, dataset="digits:0-4", name="net", out=tmp_path, **QUICK)
    half = evaluate(net, dataset="digits:0-4", name="net", normalize="half", out=tmp_path, **QUICK)
    assert raw.computed == len(raw) and half.computed == len(half)  # other rows, not reused ones
    assert {r["module_sha256"] for r in [*raw, *half]} == {state_dict_sha256(net)}
    assert {r["checkpoint_sha256"] for r in half}.isdisjoint({r["checkpoint_sha256"] for r in raw})
    assert {r["recipe"]["normalize"]["mean"] == [0.5] for r in half} == {True}
    assert {r.recipe_id for r in half}.isdisjoint({r.recipe_id for r in raw})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs the dataset"),
        ({"dataset": "digits:0-4", "control": True}, "control=True needs a checkpoint"),
        ({"dataset": "digits:0-4", "name": "a/b"}, "without path separators"),
        ({"dataset": "digits:0-4", "normalize": "cifar10"}, "mean has 3 values; digits:0-4 has 1 channel"),
        ({"dataset": "digits:0-4", "normalize": "cifar"}, "unknown normalization 'cifar'"),
        ({"dataset": "digits:0-4", "normalize": ([0.5], [0.0])}, "std must be positive"),
        ({"dataset": "digits:0-4", "arch": "convnet_small"}, "an in-memory module takes neither"),
    ],
)
def test_bad_in_memory_arguments_are_one_line_errors(kwargs: dict, match: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=match) as err:
        evaluate(_tiny_net(), out=tmp_path, **QUICK, **kwargs)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "rows").exists()


def test_name_is_for_modules_only(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="name= labels an in-memory module"):
        evaluate(ckpt, name="mine", out=tmp_path, **QUICK)
