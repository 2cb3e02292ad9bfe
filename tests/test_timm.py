"""timm backbones: ``--encoder timm:NAME`` trains, reloads and evaluates like a built-in encoder;
foreign timm state dicts load strictly; sizes a network cannot take and a missing timm are one line.

timm is in the test extra; without it the tests that need it are skipped with the reason, and the
one that checks the missing-timm message still runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from fixtures import write_cifar10

import robustbench_nacl
from robustbench_nacl.errors import CheckpointError, UserError
from robustbench_nacl.models.dual_bn import DualBatchNorm, bn_route
from robustbench_nacl.models.factory import check_encoder, create_encoder
from robustbench_nacl.models.foreign import load_foreign_encoder
from robustbench_nacl.models.timm_encoder import TimmEncoder
from robustbench_nacl.training import TrainConfig, train

# the smallest timm networks: a ResNet that takes any size, and a ConvNeXt that needs 32x32
RESNET = "timm:test_resnet"
CONVNEXT = "timm:test_convnext"
TINY = {"dataset": "digits:0-4", "epochs": 1, "batch_size": 32, "max_train": 64, "knn_every": 0}


@pytest.fixture
def timm():
    return pytest.importorskip("timm", reason="timm is not installed: pip install 'robustbench-nacl[timm]'")


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_without_timm_a_timm_encoder_is_one_line_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` sees when it is not installed
    for call in (lambda: create_encoder(RESNET, in_channels=1), lambda: check_encoder(RESNET)):
        with pytest.raises(UserError) as err:
            call()
        assert "pip install 'robustbench-nacl[timm]'" in one_line(err)


@pytest.mark.parametrize("loss", ["simclr", "adv"])
def test_a_timm_encoder_trains_on_digits_and_reloads(timm, tmp_path: Path, loss: str) -> None:
    out = train(TrainConfig(loss=loss, encoder=RESNET, **TINY), tmp_path / "run", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder"] == RESNET and manifest["dual_bn"] == (loss == "adv")
    encoder, info = robustbench_nacl.load_encoder(out)
    assert isinstance(encoder, TimmEncoder) and encoder.feature_dim == 96 and info["arch"] == RESNET
    with torch.no_grad():
        assert encoder(torch.rand(4, 1, 8, 8)).shape == (4, 96)
    # a dual-BN timm encoder keeps the adversarial branch and evaluates through the clean one
    assert any(isinstance(m, DualBatchNorm) for m in encoder.modules()) == (loss == "adv")


def test_digits_are_too_small_for_a_convnext_one_line_with_the_smallest_size(timm, tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        create_encoder(CONVNEXT, in_channels=1, input_shape=(1, 8, 8))
    msg = one_line(err)
    assert "cannot take 8x8 inputs" in msg and "the smallest square size it takes is 32x32" in msg
    # train says the same, before any epoch runs or anything is written
    with pytest.raises(UserError, match="smallest square size it takes is 32x32"):
        train(TrainConfig(encoder=CONVNEXT, **TINY), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_a_size_error_in_forward_names_the_sizes_that_work(timm) -> None:
    encoder = create_encoder("timm:test_vit", in_channels=1)  # built without an input shape
    with pytest.raises(UserError) as err:
        encoder(torch.rand(2, 1, 28, 28))
    msg = one_line(err)
    assert "28x28" in msg and "divisible by patch size" in msg
    assert "smallest square size it takes is 16x16 (the smallest from 28 up: 32x32)" in msg
    with torch.no_grad():
        assert encoder(torch.rand(2, 1, 32, 32)).shape == (2, encoder.feature_dim)
    # other failures are not blamed on the size
    with pytest.raises(RuntimeError, match="channels"):
        encoder(torch.rand(2, 3, 32, 32))


def test_a_convnext_runs_on_a_32x32_fixture(timm, tmp_path: Path) -> None:
    write_cifar10(tmp_path / "data", n_train=40, n_test=20)
    cfg = TrainConfig(
        encoder=CONVNEXT,
        dataset="cifar10",
        data_root=str(tmp_path / "data"),
        epochs=1,
        batch_size=20,
        knn_every=0,
    )
    out = train(cfg, tmp_path / "run", progress=False)
    encoder, _ = robustbench_nacl.load_encoder(out)
    x = robustbench_nacl.load_dataset("cifar10", "test", root=tmp_path / "data").x[:5].float() / 255
    with torch.no_grad():
        h = encoder(x)
    assert h.shape == (5, 64) and torch.isfinite(h).all()


def test_feature_size_is_what_the_network_returns(timm) -> None:
    # MobileNetV3's pooled features (num_features=288) go through a 1024-wide head conv
    enc = create_encoder("timm:mobilenetv3_small_050", in_channels=3, input_shape=(3, 32, 32))
    assert enc.feature_dim == 1024 and enc.backbone.num_features != 1024
    with torch.no_grad():
        assert enc.eval()(torch.rand(2, 3, 32, 32)).shape == (2, 1024)


def test_timm_options_and_name_errors_are_one_line(timm) -> None:
    enc = create_encoder("timm:test_vit", in_channels=1, img_size=32, drop_path_rate=0.1)
    assert enc.backbone.patch_embed.img_size == (32, 32)
    cases = [
        ("timm:resnet1888", {}, "did you mean 'timm:resnet18'"),
        ("timm:", {}, "unknown timm model"),
        (RESNET, {"pretrained": True}, "sets pretrained itself"),
        (RESNET, {"num_classes": 10}, "sets num_classes itself"),
        (RESNET, {"bogus": 3}, "does not take these options"),
        ("resnet19", {}, "or timm:MODEL"),
    ]
    for name, kwargs, match in cases:
        with pytest.raises(UserError, match=match) as err:
            create_encoder(name, **kwargs)
        one_line(err)


# ============ foreign timm checkpoints ============


def _tiny_resnet18(timm, num_classes: int) -> torch.nn.Module:
    # timm's resnet18 definition at 1/8 width and one block per stage: the torchvision key layout
    return timm.create_model(
        "resnet18", num_classes=num_classes, in_chans=3, layers=[1, 1, 1, 1], channels=[8, 16, 32, 64]
    )


TINY_KWARGS = {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64]}


def test_a_timm_state_dict_loads_with_identical_features(timm, tmp_path: Path) -> None:
    model = _tiny_resnet18(timm, num_classes=10).eval()  # with its classifier, as timm saves it
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.save(model.state_dict(), tmp_path / "timm.pt")
    encoder, info = load_foreign_encoder(
        tmp_path / "timm.pt", arch="timm:resnet18", normalize="half", **TINY_KWARGS
    )
    assert isinstance(encoder, TimmEncoder) and info["format"] == "torchvision"  # fc.* dropped
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        want = model.forward_head(model.forward_features((x - 0.5) / 0.5), pre_logits=True)
        torch.testing.assert_close(encoder(x), want, rtol=0, atol=0)


def test_a_timm_state_dict_of_another_architecture_is_one_line(timm, tmp_path: Path) -> None:
    torch.save(_tiny_resnet18(timm, num_classes=0).state_dict(), tmp_path / "timm.pt")
    with pytest.raises(CheckpointError) as err:
        load_foreign_encoder(tmp_path / "timm.pt", arch=RESNET, fmt="torchvision")
    msg = one_line(err)
    assert "missing: " in msg and "unexpected: " in msg and "conv1.0.weight" in msg


def test_classifier_keys_follow_timms_config(timm) -> None:
    enc = create_encoder("timm:test_convnext", in_channels=3)
    full = timm.create_model("test_convnext", num_classes=10).state_dict()
    assert sorted(enc.classifier_keys(full)) == ["head.fc.bias", "head.fc.weight"]
    assert "head.norm.weight" in enc.backbone.state_dict()  # kept: part of the features
    assert sorted(set(full) - set(enc.classifier_keys(full))) == sorted(enc.backbone.state_dict())


def test_dual_bn_routes_through_timm_norm_layers(timm) -> None:
    enc = create_encoder("timm:test_efficientnet", in_channels=1, input_shape=(1, 8, 8), dual_bn=True)
    duals = [m for m in enc.modules() if isinstance(m, DualBatchNorm)]
    assert duals  # timm's BatchNormAct2d is a BatchNorm2d: converted too
    x = torch.rand(4, 1, 8, 8)
    enc.train()
    with bn_route(enc, "adv"):
        enc(x)
    assert all(int(d.aux.num_batches_tracked) == 1 and int(d.main.num_batches_tracked) == 0 for d in duals)


@pytest.mark.parametrize("name", ["test_resnet", "test_convnext", "test_vit", "test_efficientnet"])
def test_a_timm_state_dict_with_its_classifier_is_detected_and_loads_exactly(
    timm, tmp_path: Path, name: str
) -> None:
    """timm's own key names (no torchvision layout): detected as "timm", the classifier dropped."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10).eval()  # as timm saves it: with its classifier
    torch.save(model.state_dict(), tmp_path / "timm.pt")
    encoder, info = load_foreign_encoder(tmp_path / "timm.pt", arch=f"timm:{name}", normalize="none")
    assert info["format"] == "timm" and isinstance(encoder, TimmEncoder)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)
        torch.testing.assert_close(encoder(x), want, rtol=0, atol=0)


def test_an_unknown_layout_for_a_builtin_arch_still_asks_for_format(tmp_path: Path) -> None:
    torch.save({"blocks.0.weight": torch.ones(2)}, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError, match="--format") as err:
        load_foreign_encoder(tmp_path / "odd.pt", arch="resnet18_cifar")
    one_line(err)


def test_a_one_channel_timm_state_dict_evaluates_on_digits(timm, tmp_path: Path) -> None:
    """`eval FILE --arch timm:NAME` on 1-channel data: channels come from the file's stem conv."""
    import robustbench_nacl as rbn
    from robustbench_nacl.errors import CheckpointError
    from robustbench_nacl.models.foreign import load_foreign_encoder

    model = timm.create_model("test_resnet", num_classes=10, in_chans=1, pretrained=False)
    path = tmp_path / "gray.pt"
    torch.save(model.state_dict(), path)
    with pytest.raises(CheckpointError, match="1-channel network but normalisation 'cifar10' has 3"):
        load_foreign_encoder(path, arch="timm:test_resnet")
    _, info = load_foreign_encoder(path, arch="timm:test_resnet", normalize="none")
    assert info["in_channels"] == 1 and info["format"] == "timm"
    rows = rbn.evaluate(
        path,
        arch="timm:test_resnet",
        normalize="none",
        dataset="digits:0-4",
        suite="quick",
        n_examples=30,
        probe=rbn.ProbeConfig(epochs=5),
        out=tmp_path / "out",
        progress=False,
    )
    assert rows and all(r["dataset"] == "digits:0-4" for r in rows)
