"""Loading foreign and own checkpoints: layouts, strictness, and refusal of unsafe files."""

from __future__ import annotations

import ast
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torchvision
from _models import one_thread, randomize_bn
from safetensors.torch import save_file
from torch import Tensor, nn

from robustbench_nacl.errors import CheckpointError, UserError
from robustbench_nacl.io import sha256_bytes
from robustbench_nacl.models import checkpoint
from robustbench_nacl.models.dual_bn import has_dual_bn
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.foreign import (
    FORMATS,
    NORMALIZATIONS,
    convert_state_dict,
    describe_file,
    detect_format,
    load_encoder,
    load_foreign_encoder,
    read_state_dict,
)
from robustbench_nacl.models.heads import ContrastiveModel

PACKAGE = Path(__file__).resolve().parents[1] / "robustbench_nacl"
WIDTH = 16


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These nets are tiny: intra-op threads only add overhead, which explodes on a loaded machine."""
    with one_thread():
        yield


def _source(arch: str = "resnet18_cifar", normalize: str = "cifar10", **kw) -> nn.Module:
    torch.manual_seed(0)
    mean, std = NORMALIZATIONS[normalize]
    enc = create_encoder(arch, mean=mean, std=std, width=WIDTH, **kw)
    randomize_bn(enc)
    return enc.eval()


def _images(n: int = 2, size: int = 8) -> Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _one_line_error(fn: Callable[[], object], *contains: str) -> str:
    with pytest.raises(CheckpointError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in contains:
        assert part in msg, msg
    return msg


# ============ writers of each foreign layout ============


def _write_torchvision(state: dict[str, Tensor], path: Path) -> Path:
    head = {"fc.weight": torch.randn(10, 8 * WIDTH), "fc.bias": torch.randn(10)}
    torch.save(OrderedDict({**state, **head}), path / "resnet.pth")
    return path / "resnet.pth"


def _write_solo(state: dict[str, Tensor], path: Path) -> Path:
    sd = {f"backbone.{k}": v for k, v in state.items()}
    sd.update({f"momentum_backbone.{k}": v.clone() for k, v in state.items()})
    sd.update(
        {
            "projector.0.weight": torch.randn(32, 8 * WIDTH),
            "projector.0.bias": torch.randn(32),
            "classifier.weight": torch.randn(10, 8 * WIDTH),
            "classifier.bias": torch.randn(10),
            "queue": torch.randn(2, 32, 64),
            "queue_ptr": torch.zeros(1, dtype=torch.long),
        }
    )
    ckpt = {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.1.0",
        "state_dict": sd,
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.3, "params": [0, 1]}]}],
        "lr_schedulers": [],
        "hyper_parameters": {"method": "simclr", "max_epochs": 3},
    }
    torch.save(ckpt, path / "solo.ckpt")
    # solo-learn's Checkpointer writes the run's configuration beside the checkpoint
    (path / "args.json").write_text(
        json.dumps({"backbone": {"name": "resnet18"}, "data": {"dataset": "cifar10"}})
    )
    return path / "solo.ckpt"


_HCL_NAMES = {"conv1": "0", "bn1": "1", "layer1": "3", "layer2": "4", "layer3": "5", "layer4": "6"}


def _write_hcl(state: dict[str, Tensor], path: Path) -> Path:
    sd = OrderedDict()
    for k, v in state.items():
        if k.endswith("num_batches_tracked"):
            continue  # some old checkpoints lack them: the loader fills them in
        child, rest = k.split(".", 1)
        sd[f"module.f.{_HCL_NAMES[child]}.{rest}"] = v  # saved from nn.DataParallel, as the HCL code does
    sd["module.g.0.weight"] = torch.randn(32, 8 * WIDTH)
    sd["module.g.1.weight"] = torch.ones(32)
    sd["module.g.3.weight"] = torch.randn(8, 32)
    torch.save(sd, path / "hcl_model_400.pth")
    return path / "hcl_model_400.pth"


def _write_dataparallel(state: dict[str, Tensor], path: Path) -> Path:
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 9}, path / "dp.pt")
    return path / "dp.pt"


def _write_safetensors(state: dict[str, Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, path / "resnet.safetensors")
    return path / "resnet.safetensors"


WRITERS = {
    # layout: (writer, detected format, options of the network that wrote it)
    "torchvision": (_write_torchvision, "torchvision", {}),
    "solo-learn": (_write_solo, "solo-learn", {"stem_padding": 2}),  # solo-learn's CIFAR stem
    "hcl": (_write_hcl, "hcl", {}),
    "dataparallel": (_write_dataparallel, "torchvision", {}),
    "safetensors": (_write_safetensors, "torchvision", {}),
}


@pytest.mark.parametrize("layout", list(WRITERS))
def test_foreign_layouts_load_bit_identically(layout: str, tmp_path: Path) -> None:
    writer, expected_format, options = WRITERS[layout]
    source = _source(**options)
    path = writer(source.backbone.state_dict(), tmp_path)
    assert detect_format(read_state_dict(path)) == expected_format
    for fmt in ("auto", expected_format):
        encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt=fmt, width=WIDTH)
        assert not encoder.training
        assert info["format"] == expected_format and info["arch"] == "resnet18_cifar"
        assert info["normalize"] == "cifar10" and info["path"] == str(path)
        assert info["sha256"] == sha256_bytes(path.read_bytes())
        x = _images()
        with torch.no_grad():
            assert torch.equal(encoder(x), source(x))


def test_hcl_fills_missing_num_batches_tracked(tmp_path: Path) -> None:
    path = _write_hcl(_source().backbone.state_dict(), tmp_path)
    assert not any(k.endswith("num_batches_tracked") for k in read_state_dict(path))
    encoder, _ = load_foreign_encoder(path, arch="resnet18_cifar", width=WIDTH)
    assert int(encoder.backbone.bn1.num_batches_tracked) == 0


def test_real_torchvision_resnet18_cifar_stem(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tv = torchvision.models.resnet18()
    tv.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    tv.maxpool = nn.Identity()
    randomize_bn(tv)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    tv.fc = nn.Identity()
    tv.eval()
    encoder, info = load_encoder(tmp_path / "tv.pth", arch="resnet18_cifar", normalize="imagenet")
    assert info["format"] == "torchvision" and info["n_tensors"] == len(tv.state_dict()) + 2
    x = _images(2, 8)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in NORMALIZATIONS["imagenet"])
    with torch.no_grad():
        assert torch.equal(encoder(x), tv((x - mean) / std))


@pytest.mark.parametrize("dual_bn", [False, True])
def test_ours_safetensors_as_foreign_file(dual_bn: bool, tmp_path: Path) -> None:
    source = _source(normalize="half", dual_bn=dual_bn)
    model = ContrastiveModel(source, "clae")
    checkpoint.save_weights(tmp_path / "w.safetensors", model)
    state = read_state_dict(tmp_path / "w.safetensors")
    assert detect_format(state) == "ours"
    assert set(convert_state_dict(state, "ours")) == set(_source().backbone.state_dict())
    # normalize=None takes the normalisation the file carries
    path = tmp_path / "w.safetensors"
    encoder, info = load_foreign_encoder(path, arch="resnet18_cifar", fmt="ours", normalize=None, width=WIDTH)
    assert info["normalize"] == "half" and not has_dual_bn(encoder)
    x = _images()
    with torch.no_grad():
        assert torch.equal(encoder(x), source(x))


# ============ our own checkpoints ============


def _write_run(directory: Path, *, dual_bn: bool) -> ContrastiveModel:
    """A tiny checkpoint laid out as ``train`` writes it (weights first, manifest last)."""
    torch.manual_seed(0)
    encoder = create_encoder("resnet18_cifar", mean=(0.5,), std=(0.5,), width=WIDTH, dual_bn=dual_bn)
    randomize_bn(encoder)
    model = ContrastiveModel(encoder, "clae").eval()
    directory.mkdir(parents=True)
    sha = checkpoint.save_weights(directory / checkpoint.WEIGHTS, model)
    manifest = {
        "id": f"resnet18_cifar.{'adv' if dual_bn else 'simclr'}_digits_s0",
        "encoder": "resnet18_cifar",
        "encoder_kwargs": {"width": WIDTH},
        "in_channels": 3,
        "input_size": [16, 16],
        "num_classes": 10,
        "dual_bn": dual_bn,
        "head": "clae",
        "loss": "adv" if dual_bn else "simclr",
        "loss_params": {"t": 0.5},
        "dataset": "digits",
        "seed": 0,
        "epochs": 1,
        "normalization": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
        "weights": checkpoint.WEIGHTS,
        "weights_sha256": sha,
    }
    checkpoint.write_manifest(directory, manifest)
    return model


@pytest.mark.parametrize("dual_bn", [False, True])
def test_own_checkpoint_loads_from_manifest(dual_bn: bool, tmp_path: Path) -> None:
    run = tmp_path / "run"
    model = _write_run(run, dual_bn=dual_bn)
    x = _images()
    with torch.no_grad():
        expected = model.encoder(x)
    for target in (run, run / "manifest.json", run / checkpoint.WEIGHTS):
        encoder, info = load_encoder(target)
        assert not encoder.training and has_dual_bn(encoder) == dual_bn
        assert info["checkpoint_id"] == f"resnet18_cifar.{'adv' if dual_bn else 'simclr'}_digits_s0"
        assert info["sha256"] == sha256_bytes((run / checkpoint.WEIGHTS).read_bytes())
        assert info["dataset"] == "digits" and info["seed"] == 0 and info["loss_params"] == {"t": 0.5}
        assert info["format"] == "ours" and info["encoder"] == "resnet18_cifar"
        own = model.encoder.state_dict()
        assert all(torch.equal(v, own[k]) for k, v in encoder.state_dict().items())  # aux branch too
        with torch.no_grad():
            assert torch.equal(encoder(x), expected)  # default route: the clean branch


def test_own_checkpoint_rejects_conflicting_options(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", dual_bn=False)
    load_encoder(tmp_path / "run", arch="resnet18_cifar", normalize="half")  # consistent: accepted
    _one_line_error(lambda: load_encoder(tmp_path / "run", arch="resnet50_cifar"), "--arch")
    with pytest.raises(UserError, match="--normalize"):
        load_encoder(tmp_path / "run", normalize="imagenet")
    _one_line_error(lambda: load_encoder(tmp_path / "nowhere"), "not found")
    (tmp_path / "empty").mkdir()
    _one_line_error(lambda: load_encoder(tmp_path / "empty"), "manifest")


def test_manifest_sha256_mismatch_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, dual_bn=False)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["weights_sha256"] = "0" * 64
    (run / "manifest.json").write_text(json.dumps(manifest))
    _one_line_error(lambda: load_encoder(run), "sha256")


def test_manifest_weights_must_sit_beside_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, dual_bn=False)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["weights"] = "../elsewhere.safetensors"
    (run / "manifest.json").write_text(json.dumps(manifest))
    _one_line_error(lambda: load_encoder(run), "file name")


# ============ safety ============


class _OpenPayload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _SystemPayload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


@pytest.mark.parametrize("payload", [_OpenPayload, _SystemPayload])
def test_pickle_with_code_is_refused_without_running_it(payload: type, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = dict(_source().backbone.state_dict())
    state["evil"] = payload(marker)
    torch.save({"state_dict": state}, tmp_path / "evil.pth")
    assert not marker.exists()
    msg = _one_line_error(
        lambda: load_encoder(tmp_path / "evil.pth", arch="resnet18_cifar"), "refused", "beyond tensors"
    )
    assert ("open" in msg) if payload is _OpenPayload else ("system" in msg)
    assert not marker.exists()


def test_env_override_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_torchvision(_source().backbone.state_dict(), tmp_path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    _one_line_error(lambda: read_state_dict(path), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_truncated_file_is_refused(suffix: str, tmp_path: Path) -> None:
    good = (_write_safetensors if suffix == ".safetensors" else _write_torchvision)(
        _source().backbone.state_dict(), tmp_path
    )
    bad = tmp_path / f"truncated{suffix}"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    _one_line_error(lambda: load_foreign_encoder(bad, arch="resnet18_cifar", width=WIDTH), str(bad))


def _broken(state: dict[str, Tensor], how: str) -> dict[str, Tensor]:
    state = dict(state)
    if how == "nan":
        state["layer2.0.conv1.weight"] = state["layer2.0.conv1.weight"].clone()
        state["layer2.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    elif how == "missing":
        del state["layer4.1.bn2.running_var"]
    elif how == "extra":
        state["layer5.0.conv1.weight"] = torch.randn(3, 3)
    return state


@pytest.mark.parametrize(("how", "says"), [("nan", "NaN"), ("missing", "missing"), ("extra", "unexpected")])
@pytest.mark.parametrize("writer", [_write_torchvision, _write_safetensors])
def test_broken_weights_are_refused(how: str, says: str, writer: Callable, tmp_path: Path) -> None:
    path = writer(_broken(_source().backbone.state_dict(), how), tmp_path)
    _one_line_error(lambda: load_foreign_encoder(path, arch="resnet18_cifar", width=WIDTH), says)


def test_wrong_arch_mentions_arch(tmp_path: Path) -> None:
    path = _write_safetensors(_source("resnet50_cifar").backbone.state_dict(), tmp_path)
    _one_line_error(lambda: load_encoder(path, arch="resnet18_cifar"), "--arch")


def test_foreign_file_needs_arch_and_a_known_layout(tmp_path: Path) -> None:
    path = _write_torchvision(_source().backbone.state_dict(), tmp_path)
    with pytest.raises(UserError, match="--arch") as info:
        load_encoder(path)
    assert "\n" not in str(info.value)
    torch.save({"whatever.weight": torch.ones(2)}, tmp_path / "odd.pt")
    _one_line_error(lambda: load_encoder(tmp_path / "odd.pt", arch="resnet18_cifar"), "--format")
    torch.save({"epoch": 3, "acc": 0.5}, tmp_path / "meta.pt")
    _one_line_error(lambda: read_state_dict(tmp_path / "meta.pt"), "no state dict")
    with pytest.raises(UserError, match="auto, ours"):
        load_encoder(path, arch="resnet18_cifar", fmt="caffe")
    with pytest.raises(UserError, match="normalization"):
        load_encoder(path, arch="resnet18_cifar", normalize="mnist")


NOT_CHECKPOINTS = {
    # file name: (content, what the error says the file is)
    "notes.txt": (b"hello world\nsecond line\n", "is a text file (it begins 'hello world second line')"),
    "weights.pth": (b"hello", "is a text file (it begins 'hello')"),
    "config.yaml": (b'{"lr": 0.1}', "is a JSON file"),
    "empty.pt": (b"", "is an empty file"),
    "blank.pt": (b"\n\n  \n", "is a text file of blank lines"),
    "model.pth.gz": (b"\x1f\x8b\x08\x00" + bytes(20), "is a gzip-compressed file (decompress it first)"),
    "model.h5": (
        b"\x89HDF\r\n\x1a\n" + bytes(20),
        "is a binary file of no checkpoint format (it begins 89 48",
    ),
}


@pytest.mark.parametrize("name", list(NOT_CHECKPOINTS))
@pytest.mark.parametrize("arch", [None, "resnet18_cifar"])
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(
    name: str, arch: str | None, tmp_path: Path
) -> None:
    """Without --arch it is not "a foreign checkpoint", and with --arch not "(101)" (the pickle
    loader's key error for the letter 'h'): the error says what the file is and what is expected."""
    content, what = NOT_CHECKPOINTS[name]
    (tmp_path / name).write_bytes(content)
    msg = _one_line_error(lambda: load_encoder(tmp_path / name, arch=arch), f"{tmp_path / name} {what}")
    assert "not a checkpoint; expected a directory written by `train`" in msg and ".safetensors" in msg
    assert "--arch" not in msg and "(101)" not in msg


def test_a_real_foreign_checkpoint_without_arch_says_what_it_is_and_asks_for_arch(tmp_path: Path) -> None:
    path = _write_torchvision(_source().backbone.state_dict(), tmp_path)
    with pytest.raises(UserError) as info:
        load_encoder(path)
    assert "is a zip archive (the format of torch.save) without a manifest.json beside it" in str(info.value)
    assert "pass --arch" in str(info.value)
    torch.save({"whatever.weight": torch.ones(2)}, tmp_path / "odd.pt")
    _one_line_error(
        lambda: load_encoder(tmp_path / "odd.pt", arch="resnet18_cifar"), f"{tmp_path / 'odd.pt'}: "
    )


def test_describe_file_recognises_the_checkpoint_formats(tmp_path: Path) -> None:
    state = {"w": torch.ones(2)}
    save_file(state, tmp_path / "a.safetensors")
    torch.save(state, tmp_path / "b.pt")
    torch.save(state, tmp_path / "c.pt", _use_new_zipfile_serialization=False)
    heads = {n: (tmp_path / n).read_bytes()[:512] for n in ("a.safetensors", "b.pt", "c.pt")}
    assert describe_file(heads["a.safetensors"]) == (True, "a safetensors file")
    assert describe_file(heads["b.pt"]) == (True, "a zip archive (the format of torch.save)")
    assert describe_file(heads["c.pt"]) == (True, "a pickle (legacy torch.save format)")


def test_formats_registry_has_the_layouts() -> None:
    from robustbench_nacl.models.foreign.robustssl import PRETRAININGS

    # the RobustSSL benchmark's layouts come before the plain ones: a dual-BN file has conv1/layer1 too
    robustssl = ["robustssl", *(f"robustssl:{n}" for n in PRETRAININGS.names())]
    plain = ["hcl", "torchvision", "timm", "prefixed"]
    assert FORMATS.names() == ["ours", "lightly", "solo-learn", *robustssl, *plain]


def test_every_torch_load_passes_weights_only_true() -> None:
    """Static check: an explicit ``weights_only=True`` cannot be flipped by env vars or defaults."""
    calls = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization"):
                assert all(a.name != "load" for a in node.names), f"{path}: import torch.load by name"
            if not (isinstance(node, ast.Attribute) and node.attr == "load"):
                continue
            base = ast.unparse(node.value)
            if base not in ("torch", "torch.serialization"):
                continue
            call = next(
                (c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.func is node),
                None,
            )
            assert call is not None, f"{path}:{node.lineno}: {base}.load used other than by a call"
            kw = {k.arg: k.value for k in call.keywords}
            ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            assert ok, f"{path}:{node.lineno}: torch.load without weights_only=True"
            calls += 1
    assert calls >= 1  # foreign.py reads pickles through torch.load
