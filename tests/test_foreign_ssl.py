"""Checkpoints of self-supervised libraries compute the function the library built.

solo-learn builds its CIFAR ResNet with ``Conv2d(3, 64, 3, stride=1, padding=2)`` and no max-pool
(solo/methods/base.py); its state dict has the same shapes as a padding-1 network, so only the
features tell them apart. lightly's recipe is ``nn.Sequential(*list(resnet.children())[:-1])``.
Each test builds the library's network with torchvision, saves it the way the library does, and
compares the loaded encoder's features with that network's to 1e-5.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torchvision
from _models import one_thread, randomize_bn
from torch import Tensor, nn

from robustbench_nacl.errors import CheckpointError
from robustbench_nacl.models.foreign import (
    NORMALIZATIONS,
    SOLO_NORMALIZATIONS,
    detect_format,
    load_encoder,
    load_foreign_encoder,
    read_solo_args,
    read_state_dict,
)

ATOL = 1e-5
NEW_ARGS = {
    "backbone": {"name": "resnet18", "kwargs": {}},
    "data": {"dataset": "cifar10"},
    "method": "simclr",
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These nets are tiny: intra-op threads only add overhead, which explodes on a loaded machine."""
    with one_thread():
        yield


def _images(n: int = 3, size: int = 32) -> Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _normalized(x: Tensor, name: str) -> Tensor:
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in NORMALIZATIONS[name])
    return (x - mean) / std


def _one_line(fn: Callable[[], object], *contains: str) -> str:
    with pytest.raises(CheckpointError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in contains:
        assert part in msg, msg
    return msg


# ============ solo-learn ============


def solo_resnet(cifar: bool = True, arch: Callable[[], nn.Module] = torchvision.models.resnet18) -> nn.Module:
    """The backbone solo-learn builds (solo/methods/base.py, BaseMethod.__init__), in eval mode."""
    torch.manual_seed(0)
    backbone = arch()
    backbone.fc = nn.Identity()
    if cifar:
        backbone.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False)
        backbone.maxpool = nn.Identity()
    randomize_bn(backbone)
    return backbone.eval()


def write_solo(
    backbone: nn.Module, directory: Path, args: dict | None = NEW_ARGS, prefix: str = "backbone."
) -> Path:
    """A solo-learn Lightning checkpoint: backbone, momentum copy, heads, queue; args.json beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    own = backbone.state_dict()
    state = {f"{prefix}{k}": v for k, v in own.items()}
    state.update({f"momentum_{prefix}{k}": v.clone() for k, v in own.items()})
    state.update(
        {
            "projector.0.weight": torch.randn(64, 512),
            "classifier.weight": torch.randn(10, 512),
            "classifier.bias": torch.randn(10),
            "queue": torch.randn(2, 64, 16),
        }
    )
    ckpt = {"epoch": 9, "global_step": 99, "state_dict": state, "lr_schedulers": []}
    torch.save(ckpt, directory / "simclr-cifar10-abc123-ep=9.ckpt")
    if args is not None:
        (directory / "args.json").write_text(json.dumps(args))
    return directory / "simclr-cifar10-abc123-ep=9.ckpt"


@pytest.mark.parametrize("fmt", ["auto", "solo-learn"])
def test_solo_learn_checkpoint_computes_solo_learns_network(fmt: str, tmp_path: Path) -> None:
    net = solo_resnet()
    path = write_solo(net, tmp_path)
    encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, normalize="none")
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)
    assert info["format"] == "solo-learn" and info["encoder_kwargs"] == {"stem_padding": 2}
    assert "padding 2" in info["stem"] and "resnet18 on cifar10" in info["stem"]
    assert encoder.backbone.conv1.padding == (2, 2)


def test_the_padding_one_network_differs_from_solo_learns(tmp_path: Path) -> None:
    """What the loader used to build (padding 1) loads strictly and computes something else."""
    net = solo_resnet()
    path = write_solo(net, tmp_path)
    wrong, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt="prefixed", normalize="none")
    assert info["encoder_kwargs"] == {} and wrong.backbone.conv1.padding == (1, 1)
    x = _images()
    with torch.no_grad():
        gap = (wrong(x) - net(x)).abs().max().item()
    assert gap > 100 * ATOL  # measured: 2.2 on these images (features up to 10)


def test_solo_learn_normalisation_comes_from_its_args_json(tmp_path: Path) -> None:
    net = solo_resnet()
    path = write_solo(net, tmp_path)
    encoder, info = load_encoder(path, arch="resnet18_cifar")  # the CLI's default: normalize=None
    mean, std = SOLO_NORMALIZATIONS["cifar10"]
    assert info["normalize"] == "solo-learn:cifar10"
    assert encoder.mean.flatten().tolist() == pytest.approx(mean)
    assert encoder.std.flatten().tolist() == pytest.approx(std)
    x = _images()
    want = net((x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1))
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"backbone": "resnet18", "dataset": "cifar100"}, id="flat"),
        pytest.param(
            {"encoder": "resnet18", "dataset": "cifar10", "backbone_args": {"cifar": True}}, id="2021"
        ),
    ],
)
def test_older_solo_learn_layouts(args: dict, tmp_path: Path) -> None:
    """Older versions: flat backbone/dataset in args.json, and the backbone saved as encoder.*."""
    net = solo_resnet()
    path = write_solo(net, tmp_path, args=args, prefix="encoder." if "encoder" in args else "backbone.")
    assert detect_format(read_state_dict(path)) == "solo-learn"
    encoder, _ = load_foreign_encoder(path, arch="resnet18_cifar", normalize="none")
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)


def test_solo_learn_off_cifar_keeps_torchvisions_stem(tmp_path: Path) -> None:
    net = solo_resnet(cifar=False)
    args = {"backbone": {"name": "resnet18"}, "data": {"dataset": "imagenet100"}}
    path = write_solo(net, tmp_path, args=args)
    encoder, info = load_foreign_encoder(path, arch="resnet18_imagenet", normalize="none")
    assert info["encoder_kwargs"] == {} and "torchvision stem" in info["stem"]
    x = _images(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)
    _one_line(lambda: load_foreign_encoder(path, arch="resnet18_cifar"), "--arch resnet18_imagenet")


def test_solo_learn_resnet50(tmp_path: Path) -> None:
    net = solo_resnet(arch=torchvision.models.resnet50)
    args = {"backbone": {"name": "resnet50"}, "data": {"dataset": "cifar100"}}
    path = write_solo(net, tmp_path, args=args)
    encoder, _ = load_foreign_encoder(path, arch="resnet50_cifar", normalize="none")
    x = _images(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)


def test_without_args_json_a_3x3_stem_is_not_guessed(tmp_path: Path) -> None:
    net = solo_resnet()
    path = write_solo(net, tmp_path, args=None)
    _one_line(
        lambda: load_foreign_encoder(path, arch="resnet18_cifar"),
        "cannot tell the stem",
        "args.json",
        "--format solo-learn",
    )
    # saying it is solo-learn's settles it: solo-learn's only 3x3 stem pads by 2
    encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt="solo-learn", normalize="none")
    assert info["encoder_kwargs"] == {"stem_padding": 2}
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)


def test_without_args_json_a_7x7_stem_is_torchvisions(tmp_path: Path) -> None:
    net = solo_resnet(cifar=False)
    path = write_solo(net, tmp_path, args=None)
    encoder, _ = load_foreign_encoder(path, arch="resnet18_imagenet", normalize="none")
    x = _images(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), net(x), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("args_text", "says"),
    [
        ('{"backbone": {"name": "vit_small"}, "data": {"dataset": "cifar10"}}', "'vit_small'"),
        ('{"method": "simclr"}', "names no solo-learn backbone and dataset"),
        ("{not json", "not readable JSON"),
        ('{"backbone": {"name": "resnet50"}, "data": {"dataset": "cifar10"}}', "--arch resnet50_cifar"),
    ],
)
def test_bad_or_unsupported_args_json_is_one_line(args_text: str, says: str, tmp_path: Path) -> None:
    path = write_solo(solo_resnet(), tmp_path, args=None)
    (tmp_path / "args.json").write_text(args_text)
    _one_line(lambda: load_foreign_encoder(path, arch="resnet18_cifar"), says)


def test_a_stem_option_contradicting_args_json_is_refused(tmp_path: Path) -> None:
    path = write_solo(solo_resnet(), tmp_path)
    _one_line(lambda: load_foreign_encoder(path, arch="resnet18_cifar", stem_padding=1), "stem_padding=2")


def test_read_solo_args_prefers_the_recorded_cifar_flag(tmp_path: Path) -> None:
    ckpt = tmp_path / "x.ckpt"
    (tmp_path / "args.json").write_text(
        json.dumps({"backbone": "resnet18", "dataset": "custom", "cifar": True})
    )
    run = read_solo_args(ckpt)
    assert run is not None and run.cifar and run.backbone == "resnet18" and run.dataset == "custom"
    (tmp_path / "args.json").unlink()
    assert read_solo_args(ckpt) is None


# ============ lightly ============


def lightly_backbone() -> nn.Module:
    """lightly's recipe: a torchvision resnet18 without its classifier, as a Sequential."""
    torch.manual_seed(0)
    backbone = nn.Sequential(*list(torchvision.models.resnet18().children())[:-1])
    randomize_bn(backbone)
    return backbone.eval()


def _lightly_features(backbone: nn.Module, x: Tensor) -> Tensor:
    # lightly's models flatten the (B, 512, 1, 1) output: self.backbone(x).flatten(start_dim=1)
    return backbone(_normalized(x, "imagenet")).flatten(start_dim=1)


def _save_bare(backbone: nn.Module, path: Path) -> Path:
    torch.save(backbone.state_dict(), path / "backbone.pth")
    return path / "backbone.pth"


def _save_tutorial(backbone: nn.Module, path: Path) -> Path:
    # docs/source/tutorials_source/package/tutorial_simclr_clothing.py
    torch.save({"resnet18_parameters": backbone.state_dict()}, path / "model.pth")
    return path / "model.pth"


def _save_lightning(backbone: nn.Module, path: Path) -> Path:
    state = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    state.update({f"backbone_momentum.{k}": v.clone() for k, v in backbone.state_dict().items()})
    state.update(
        {"projection_head.layers.0.weight": torch.randn(128, 512), "prototypes.weight": torch.randn(8, 128)}
    )
    torch.save({"epoch": 1, "global_step": 10, "state_dict": state}, path / "epoch=1.ckpt")
    return path / "epoch=1.ckpt"


@pytest.mark.parametrize("save", [_save_bare, _save_tutorial, _save_lightning])
def test_lightly_recipe_computes_lightlys_network(save: Callable, tmp_path: Path) -> None:
    net = lightly_backbone()
    path = save(net, tmp_path)
    assert detect_format(read_state_dict(path)) == "lightly"
    for fmt in ("auto", "lightly"):
        encoder, info = load_encoder(path, arch="resnet18_imagenet", fmt=fmt, normalize="imagenet")
        assert info["format"] == "lightly"
        x = _images(2, 64)
        with torch.no_grad():
            torch.testing.assert_close(encoder(x), _lightly_features(net, x), rtol=0, atol=ATOL)


def test_lightly_recipe_into_a_cifar_arch_is_one_line(tmp_path: Path) -> None:
    path = _save_bare(lightly_backbone(), tmp_path)
    _one_line(lambda: load_encoder(path, arch="resnet18_cifar"), "conv1.weight", "--arch")


def test_lightlys_resnet_generator_is_refused_in_one_line(tmp_path: Path) -> None:
    # ResNetGenerator's children: 0 conv1, 1 bn1, 2-5 layer1-4 (its ReLU after bn1 is functional)
    state = {
        "0.weight": torch.randn(64, 3, 3, 3),
        "1.weight": torch.ones(64),
        "1.running_mean": torch.zeros(64),
        "2.0.conv1.weight": torch.randn(64, 64, 3, 3),
    }
    torch.save(state, tmp_path / "generator.pth")
    assert detect_format(state) == "lightly"
    _one_line(
        lambda: load_encoder(tmp_path / "generator.pth", arch="resnet18_cifar"), "ResNetGenerator", "ReLU"
    )


def test_stem_padding_is_an_encoder_option_checked_in_one_line() -> None:
    from robustbench_nacl.errors import UserError
    from robustbench_nacl.models.factory import create_encoder

    assert create_encoder("resnet18_cifar", stem_padding=2).backbone.conv1.padding == (2, 2)
    assert create_encoder("resnet18_cifar").backbone.conv1.padding == (1, 1)
    assert create_encoder("resnet18_imagenet").backbone.conv1.padding == (3, 3)
    with pytest.raises(UserError, match="stem_padding must be an integer >= 0"):
        create_encoder("resnet18_cifar", stem_padding=-1)
