"""The RobustSSL benchmark's released checkpoints load strictly and compute the benchmark's network.

Each fixture is built here from the layout's key names and shapes (GodXuxilie/RobustSSL_Benchmark,
Finetuning_Methods/Vanilla_Finetuning/models/resnet_multi_bn.py; LijieFan/AdvCL,
models/resnet_cifar_multibn_ensembleFC.py; pantheon5100/DeACL, solo/models/resnet_add_normalize.py),
saved with torch.save as the authors do, and the loaded encoder's features are compared with a naive
functional forward of the same tensors, written from the authors' architecture (a CIFAR ResNet-18:
3x3/1 conv1 padded by 1, no max-pool, BasicBlocks) for the branch the benchmark evaluates
(``bnNameCnt`` = 1), to 1e-5.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _models import one_thread
from torch import Tensor

from robustbench_nacl.errors import CheckpointError, UserError
from robustbench_nacl.models.foreign import NORMALIZATIONS, detect_format, load_foreign_encoder
from robustbench_nacl.models.foreign.robustssl import PRETRAININGS, pretraining_format

ATOL = 1e-5
WIDTH = 16  # a quarter-width ResNet-18: the same keys and structure, a sixteenth of the bytes


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def _bn(n: int, g: torch.Generator) -> dict[str, Tensor]:
    return {
        "weight": torch.rand(n, generator=g) + 0.5,
        "bias": torch.randn(n, generator=g) * 0.1,
        "running_mean": torch.randn(n, generator=g) * 0.1,
        "running_var": torch.rand(n, generator=g) + 0.5,
        "num_batches_tracked": torch.tensor(7),
    }


def _conv(cout: int, cin: int, k: int, g: torch.Generator) -> Tensor:
    return torch.randn(cout, cin, k, k, generator=g) * (2.0 / (cin * k * k)) ** 0.5


def resnet18_layout(bn: Callable[[str], list[str]], ds: tuple[str, str], width: int, seed: int = 0) -> dict:
    """A CIFAR ResNet-18's tensors under a layout: ``bn(name)`` -> the prefixes of its BatchNorm(s),
    ``ds`` the names of the downsample conv and BatchNorm inside a block."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {"conv1.weight": _conv(width, 3, 3, g)}

    def add_bn(name: str, n: int) -> None:
        for prefix in bn(name):
            out.update({f"{prefix}.{k}": v for k, v in _bn(n, g).items()})

    add_bn("bn1", width)
    cin = width
    for layer in range(1, 5):
        cout = width * 2 ** (layer - 1)
        for block in range(2):
            b = f"layer{layer}.{block}"
            out[f"{b}.conv1.weight"] = _conv(cout, cin if block == 0 else cout, 3, g)
            add_bn(f"{b}.bn1", cout)
            out[f"{b}.conv2.weight"] = _conv(cout, cout, 3, g)
            add_bn(f"{b}.bn2", cout)
            if block == 0 and layer > 1:
                out[f"{b}.{ds[0]}.weight"] = _conv(cout, cin, 1, g)
                add_bn(f"{b}.{ds[1]}", cout)
        cin = cout
    return out


def naive_features(sd: dict[str, Tensor], x: Tensor, bn: Callable[[str], str], ds: tuple[str, str]) -> Tensor:
    """The authors' CIFAR ResNet-18, functionally: ``bn(name)`` is the prefix of the evaluated BN."""

    def norm(name: str, h: Tensor) -> Tensor:
        p = bn(name)
        w, b = sd[f"{p}.weight"], sd[f"{p}.bias"]
        return F.batch_norm(h, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], w, b, False, 0.0, 1e-5)

    h = F.relu(norm("bn1", F.conv2d(x, sd["conv1.weight"], padding=1)))
    for layer in range(1, 5):
        for block in range(2):
            b, stride = f"layer{layer}.{block}", 2 if layer > 1 and block == 0 else 1
            out = F.relu(norm(f"{b}.bn1", F.conv2d(h, sd[f"{b}.conv1.weight"], stride=stride, padding=1)))
            out = norm(f"{b}.bn2", F.conv2d(out, sd[f"{b}.conv2.weight"], padding=1))
            key = f"{b}.{ds[0]}.weight"
            identity = norm(f"{b}.{ds[1]}", F.conv2d(h, sd[key], stride=stride)) if key in sd else h
            h = F.relu(out + identity)
    return h.mean(dim=(2, 3))


DUAL_DS = ("downsample.conv", "downsample.bn")
IMAGENET = [torch.tensor(v) for v in NORMALIZATIONS["imagenet"]]


def dual_bn_state(width: int, seed: int = 0) -> dict[str, Tensor]:
    """ACL / DynACL's ``resnet_multi_bn`` with bn_names ['normal', 'pgd']: two branches per BN."""
    return resnet18_layout(lambda n: [f"{n}.bn_list.0", f"{n}.bn_list.1"], DUAL_DS, width, seed)


def acl_file(width: int) -> dict[str, Tensor]:
    """An ACL-family state dict: the encoder, its proj_head ``fc.*`` (dual BN too) and ``normalize``."""
    sd = dual_bn_state(width)
    g = torch.Generator().manual_seed(5)
    d = 8 * width
    for i in (1, 2, 3):
        sd[f"fc.fc{i}.weight"] = torch.randn(d, d, generator=g)
        sd.update({f"fc.bn{i}.bn_list.{j}.{k}": v for j in (0, 1) for k, v in _bn(d, g).items()})
    sd["fc.fc1.bias"] = torch.randn(d, generator=g)
    sd["normalize.mean"], sd["normalize.std"] = IMAGENET
    return sd


def advcl_file(width: int) -> dict[str, Tensor]:
    """AdvCL / A-InfoNCE: the same dual BN naming, their heads, no normalize module."""
    sd = dual_bn_state(width, seed=1)
    g = torch.Generator().manual_seed(6)
    d = 8 * width
    for n in (2, 10, 50, 100, 500):
        sd[f"fc_{n:03d}.weight"], sd[f"fc_{n:03d}.bias"] = torch.randn(n, d, generator=g), torch.zeros(n)
    for head in ("head_ce", "head_proj"):
        sd[f"{head}.0.weight"], sd[f"{head}.3.weight"] = torch.randn(d, d, generator=g), torch.randn(4, d)
        sd.update({f"{head}.1.{k}": v for k, v in _bn(d, g).items()})
    sd["head_pred.0.weight"] = torch.randn(128, 128, generator=g)
    return sd


def _dual_branch(name: str) -> str:
    return f"{name}.bn_list.1"  # the branch the benchmark evaluates (bnNameCnt = 1)


def _save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def _images(n: int = 2) -> Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _check(
    encoder: torch.nn.Module, sd: dict, bn: Callable[[str], str], ds: tuple[str, str], norm: str
) -> float:
    x = _images()
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in NORMALIZATIONS[norm])
    with torch.no_grad():
        gap = (encoder(x) - naive_features(sd, (x - mean) / std, bn, ds)).abs().max().item()
    assert gap <= ATOL, gap
    return gap


@pytest.mark.parametrize("fmt", ["auto", "robustssl", "robustssl:ACL", "robustssl:DynACL"])
def test_acl_dual_bn_checkpoint_computes_its_adversarial_branch(fmt: str, tmp_path: Path) -> None:
    sd = acl_file(64)  # full width once: the released ResNet-18's shapes
    path = _save(tmp_path / "ACL_DS.pt", {"epoch": 1000, "state_dict": sd, "optim": {"lr": 0.5}})
    encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, normalize=None)
    assert info["format"] == ("robustssl" if fmt == "auto" else fmt) and info["normalize"] == "imagenet"
    _check(encoder, sd, _dual_branch, DUAL_DS, "imagenet")
    x = (_images() - IMAGENET[0].view(1, 3, 1, 1)) / IMAGENET[1].view(1, 3, 1, 1)
    with torch.no_grad():  # the clean branch is another function: the branch is not a detail
        clean = naive_features(sd, x, lambda n: f"{n}.bn_list.0", DUAL_DS)
        assert (encoder(_images()) - clean).abs().max().item() > 100 * ATOL


@pytest.mark.parametrize("name", ["DynACL++", "DynACL-AIR", "DynACL-AIR++", "DynACL-RCS"])
def test_dynacl_variants_read_state_dict_dual_first(name: str, tmp_path: Path) -> None:
    sd = acl_file(WIDTH)
    decoy = {k: torch.zeros_like(v) for k, v in sd.items()}  # get_model reads state_dict_dual first
    path = _save(tmp_path / "DynACL++.pt", {"state_dict": decoy, "state_dict_dual": sd})
    fmt = pretraining_format("auto", name)
    encoder, _ = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, normalize=None, width=WIDTH)
    _check(encoder, sd, _dual_branch, DUAL_DS, "imagenet")


@pytest.mark.parametrize("fmt", ["auto", "robustssl:AdvCL", "robustssl:A-InfoNCE"])
def test_advcl_and_ainfonce_checkpoints_take_no_normalisation(fmt: str, tmp_path: Path) -> None:
    sd = advcl_file(WIDTH)
    path = _save(tmp_path / "AdvCL.pt", {"state_dict": sd})  # bare dicts load alike
    encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, normalize=None, width=WIDTH)
    assert info["normalize"] == "none"  # the benchmark builds them with do_normalize=0
    _check(encoder, sd, _dual_branch, DUAL_DS, "none")


def test_deacl_checkpoint_strips_backbone_and_keeps_its_normalisation(tmp_path: Path) -> None:
    ds = ("downsample.0", "downsample.1")
    sd = resnet18_layout(lambda n: [n], ds, WIDTH, seed=2)
    mean, std = [0.4914, 0.4822, 0.4465], [0.247, 0.243, 0.261]  # DeACL's resnet_add_normalize
    state = {f"backbone.{k}": v for k, v in sd.items()}
    state |= {"backbone.normalize.mean": torch.tensor(mean), "backbone.normalize.std": torch.tensor(std)}
    state |= {
        "projector.0.weight": torch.randn(32, 8 * WIDTH),
        "momentum_backbone.conv1.weight": sd["conv1.weight"],
    }
    path = _save(tmp_path / "DeACL.pt", {"state_dict": state})
    assert detect_format(state) == "solo-learn"  # so DeACL needs --pretraining DeACL
    fmt = pretraining_format("auto", "DeACL")
    encoder, _ = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, normalize=None, width=WIDTH)
    assert encoder.mean.flatten().tolist() == pytest.approx(mean)
    x = _images()
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        gap = (encoder(x) - naive_features(sd, (x - m) / s, lambda n: n, ds)).abs().max().item()
    assert gap <= ATOL, gap


def _one_line(fn: Callable[[], object], *contains: str) -> str:
    with pytest.raises((CheckpointError, UserError)) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert all(part in msg for part in contains), msg
    return msg


def test_a_renamed_key_fails_with_one_line_naming_missing_and_unexpected(tmp_path: Path) -> None:
    sd = acl_file(WIDTH)
    sd["layer2.0.bn2.bn_lst.1.weight"] = sd.pop("layer2.0.bn2.bn_list.1.weight")
    path = _save(tmp_path / "ACL.pt", {"state_dict": sd})
    _one_line(
        lambda: load_foreign_encoder(path, arch="resnet18_cifar", fmt="robustssl:ACL", width=WIDTH),
        "missing: layer2.0.bn2.weight",
        "unexpected: layer2.0.bn2.bn_lst.1.weight",
    )


def test_a_file_with_one_branch_only_is_refused_in_one_line(tmp_path: Path) -> None:
    sd = {k: v for k, v in acl_file(WIDTH).items() if ".bn_list.1." not in k}
    path = _save(tmp_path / "ACL.pt", sd)
    _one_line(
        lambda: load_foreign_encoder(path, arch="resnet18_cifar", fmt="robustssl:ACL", width=WIDTH),
        "branches [0]",
        "branch 1",
    )


def test_a_dual_bn_file_without_heads_or_normalisation_asks_for_the_method(tmp_path: Path) -> None:
    path = _save(tmp_path / "stripped.pt", dual_bn_state(WIDTH))
    _one_line(
        lambda: load_foreign_encoder(path, arch="resnet18_cifar", normalize=None, width=WIDTH),
        "--pretraining",
    )


def test_a_pickle_with_code_is_refused(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "ACL.pt"
    path.write_bytes(pickle.dumps({"state_dict": acl_file(WIDTH), "args": Payload()}, protocol=2))
    _one_line(lambda: load_foreign_encoder(path, arch="resnet18_cifar", fmt="robustssl:ACL"), "refused")


def test_pretraining_names_and_format_conflicts() -> None:
    dual = ["ACL", "DynACL", "DynACL++", "DynACL-AIR", "DynACL-AIR++", "DynACL-RCS"]
    assert PRETRAININGS.names() == [*dual, "AdvCL", "A-InfoNCE", "DeACL"]
    assert pretraining_format("robustssl", "AdvCL") == "robustssl:AdvCL"
    _one_line(lambda: pretraining_format("auto", "SimCLR"), "unknown RobustSSL pretraining")
    _one_line(lambda: pretraining_format("lightly", "ACL"), "--pretraining ACL")
