"""Loading encoders for evaluation: our own checkpoints and foreign ResNet state dicts.

:func:`load_encoder` is the one entry point. A directory written by ``train`` (or its manifest.json)
is rebuilt from its manifest; any other file is a *foreign* checkpoint, read by
:func:`load_foreign_encoder` into one of our registered encoders (``--arch``).

Foreign files come in several key layouts (:data:`FORMATS`), all converted to torchvision's ResNet
layout, which is exactly the layout of ``Encoder.backbone`` (see :mod:`robustbench_nacl.encoders`):

* ``torchvision``: ``conv1.weight``, ``layer1.0.conv1.weight``, ... (``fc.*`` dropped);
* ``lightly``: lightly's recipe ``nn.Sequential(*list(torchvision.models.resnetN().children())[:-1])``
  (``0`` conv1, ``1`` bn1, ``4``-``7`` layer1-4), bare or as ``backbone.*`` of a LightningModule
  checkpoint (heads and momentum copies dropped);
* ``solo-learn``: a Lightning checkpoint whose ``state_dict`` has ``backbone.*`` (``encoder.*`` in
  old versions) plus heads, momentum copies and queues (everything else dropped). Its CIFAR ResNet
  pads the 3x3 conv1 by 2, not 1: the stem is read from solo-learn's ``args.json`` beside the file
  (see :func:`read_solo_args` and docs/decisions.md, 'Foreign checkpoints');
* ``hcl``: the HCL/DCL code's ``f`` Sequential of resnet children without maxpool and fc
  (``f.0`` conv1, ``f.1`` bn1, ``f.3``-``f.6`` layer1-4; the ``g.*`` projection head dropped);
* ``ours``: the safetensors written by our trainer (``encoder.backbone.*``; dual BN reduced to its
  clean branch), whose ``encoder.mean``/``encoder.std`` also give the normalisation;
* ``timm`` (``--arch timm:NAME`` only): timm's own names, classifier dropped;
* ``prefixed`` (never detected): ``backbone.*`` of any other library, loaded into ``--arch`` as built.

Wrapper prefixes shared by every key (``module.`` from DataParallel, ``model.``, ``encoder.``) are
stripped first. Loading is strict: every converted key must be used and every backbone key present
with the right shape.

Safety (see docs/decisions.md, "Loading untrusted checkpoints"): safetensors is preferred (no code
can run); pickles are read with ``torch.load(..., weights_only=True)`` passed explicitly, after
refusing the environment override that would re-enable full unpickling, and a file that needs more
than tensors is refused, naming the offending globals (found by static disassembly, which executes
nothing). A file of no checkpoint format (text, empty, compressed) is named for what it is first.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.torch_version import TorchVersion

from ..errors import CheckpointError, UserError
from ..io import sha256_bytes
from ..registry import Registry, unknown_choice
from ..utils import refuse_unsafe_torch_env
from .checkpoint import (
    MANIFEST,
    check_finite,
    load_state,
    load_strict,
    read_manifest,
    resolve_manifest_path,
)
from .encoders import TIMM_PREFIX, TimmEncoder, create_encoder, set_bn_route, strip_dual_bn

__all__ = [
    "FORMATS",
    "NORMALIZATIONS",
    "SOLO_NORMALIZATIONS",
    "Layout",
    "SoloRun",
    "convert_state_dict",
    "describe_file",
    "detect_format",
    "load_encoder",
    "load_foreign_encoder",
    "read_solo_args",
    "read_state_dict",
]

#: Input normalisations of foreign checkpoints (mean, std); one value is broadcast to every channel.
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # the HCL/DCL training code's CIFAR-10 constants (not the true dataset std, but what they trained with)
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "half": ((0.5,), (0.5,)),  # CLAE / NaCl / our trainer: [0,1] -> [-1,1]
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "none": ((0.0,), (1.0,)),
}

#: Pickled checkpoints are only trusted to torch releases without the known weights_only escapes
#: (CVE-2025-32434 fixed in 2.6, CVE-2026-24747 fixed in 2.10).
_MIN_TORCH = "2.10"

#: Keys under which checkpoints nest their state dict, tried in this order.
_CONTAINERS = ("state_dict", "model", "model_state_dict", "encoder", "net")

#: Prefixes added by wrappers around the whole network; stripped when every key has one.
_WRAPPERS = ("module.", "model.", "encoder.")

_DEFAULT_NORMALIZE = "cifar10"


# ============ layouts ============


@dataclass(frozen=True)
class Layout:
    """A foreign key layout: how to recognise it and how to convert it to torchvision's ResNet keys.

    ``normalization`` returns the (mean, std) a file of this layout carries, or None (most carry none).
    """

    name: str
    detect: Callable[[Mapping[str, Tensor]], bool]
    convert: Callable[[Mapping[str, Tensor]], dict[str, Tensor]]
    normalization: Callable[[Mapping[str, Tensor]], tuple[list[float], list[float]] | None] = lambda s: None


FORMATS: Registry[Layout] = Registry("checkpoint format")


def _register(layout: Layout, description: str) -> None:
    # registration order is detection order: the most specific layouts first
    FORMATS.add(layout.name, layout, description=description)


def _has_prefix(state: Mapping[str, Tensor], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in state)


# --- ours: ContrastiveModel (encoder.backbone.*, encoder.mean/std, head.*) or a bare Encoder ---


def _ours_prefix(state: Mapping[str, Tensor]) -> str | None:
    if _has_prefix(state, "encoder.backbone."):
        return "encoder."
    if _has_prefix(state, "backbone.") and "mean" in state and "std" in state:
        return ""
    return None


def _ours_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    prefix = _ours_prefix(state) or ""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.startswith(prefix + "backbone."):
            out[key[len(prefix + "backbone.") :]] = value
        elif key in (prefix + "mean", prefix + "std") or key.startswith("head."):
            continue  # normalisation is read separately; the projection head is not evaluated
        else:
            out[key] = value  # left as is, so the strict load reports it
    # a dual-BN encoder is evaluated through its clean branch (its default route)
    return strip_dual_bn(out)


def _ours_normalization(state: Mapping[str, Tensor]) -> tuple[list[float], list[float]] | None:
    prefix = _ours_prefix(state) or ""
    mean, std = state.get(prefix + "mean"), state.get(prefix + "std")
    if mean is None or std is None:
        return None
    return mean.flatten().tolist(), std.flatten().tolist()


_register(
    Layout("ours", lambda s: _ours_prefix(s) is not None, _ours_convert, _ours_normalization),
    "weights.safetensors of our trainer: encoder.backbone.*, encoder.mean/std (dual BN -> clean branch)",
)


# --- lightly: Sequential(*resnet.children()[:-1]), bare or as a LightningModule's backbone.* ---

# children of a torchvision ResNet: 0 conv1, 1 bn1, 2 relu, 3 maxpool, 4-7 layer1-4, 8 avgpool
_LIGHTLY_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


def _lightly_prefix(state: Mapping[str, Tensor]) -> str | None:
    """ "" (a bare Sequential) or "backbone." (a LightningModule), when the keys are lightly's."""
    for prefix in ("", "backbone."):
        stem = f"{prefix}0.weight" in state and f"{prefix}1.running_mean" in state
        # 4.0.* in torchvision's children; 2.0.* in lightly's own ResNetGenerator (refused below)
        if stem and (_has_prefix(state, f"{prefix}4.0.") or _has_prefix(state, f"{prefix}2.0.")):
            return prefix
    return None


def _lightly_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    prefix = _lightly_prefix(state) or ""
    if _has_prefix(state, f"{prefix}2.0."):
        # ResNetGenerator applies the ReLU after bn1 functionally, so its Sequential of children
        # has none: no registered encoder computes that network
        raise CheckpointError(
            "this is lightly's ResNetGenerator backbone (keys 2.0.*), whose Sequential of children "
            "drops the ReLU after bn1; it is not supported, use a torchvision ResNet backbone"
        )
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            continue  # projection/prediction heads, backbone_momentum.*, prototypes: training only
        name = key[len(prefix) :]
        child, _, rest = name.partition(".")
        # anything unmapped stays as it is, so the strict load reports it
        out[f"{_LIGHTLY_CHILDREN[child]}.{rest}" if child in _LIGHTLY_CHILDREN else name] = value
    return out


_register(
    Layout("lightly", lambda s: _lightly_prefix(s) is not None, _lightly_convert),
    "lightly recipe Sequential(*resnet.children()[:-1]): 0 conv1, 1 bn1, 4-7 layer1-4, bare or backbone.*",
)


# --- solo-learn: Lightning state_dict with backbone.* next to heads, momentum encoders, queues ---


def _solo_prefix(state: Mapping[str, Tensor]) -> str | None:
    if _has_prefix(state, "backbone."):
        return "backbone."
    # solo-learn before mid-2021 called the backbone "encoder" (its own loader still renames it)
    if "encoder.conv1.weight" in state:
        return "encoder."
    return None


def _solo_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # projector.*, predictor.*, classifier.*, momentum_*, queue* ...: training-only, not the encoder
    prefix = _solo_prefix(state) or "backbone."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


_register(
    Layout("solo-learn", lambda s: _solo_prefix(s) is not None, _solo_convert),
    "solo-learn Lightning ckpt: backbone.* (or legacy encoder.*); stem from its args.json; heads dropped",
)


# --- HCL / DCL: f = Sequential(resnet children minus maxpool and fc), g = projection head ---

_HCL_CHILDREN = {"0": "conv1", "1": "bn1", "3": "layer1", "4": "layer2", "5": "layer3", "6": "layer4"}


def _hcl_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.startswith("g."):
            continue  # the projection head
        parts = key.split(".", 2)
        if len(parts) == 3 and parts[0] == "f" and parts[1] in _HCL_CHILDREN:
            key = f"{_HCL_CHILDREN[parts[1]]}.{parts[2]}"
        out[key] = value  # anything unmapped stays, so the strict load reports it
    return out


_register(
    Layout("hcl", lambda s: "f.0.weight" in s and _has_prefix(s, "f.3."), _hcl_convert),
    "HCL/DCL code: f.0 conv1, f.1 bn1, f.3-f.6 layer1-4 (g.* head dropped)",
)


# --- torchvision: resnet state dict, possibly with its classifier ---


def _torchvision_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("fc.")}


_register(
    Layout("torchvision", lambda s: "conv1.weight" in s and _has_prefix(s, "layer1."), _torchvision_convert),
    "torchvision ResNet state dict: conv1.weight, layer1.0..., fc.* dropped",
)


_register(
    Layout("timm", lambda s: False, dict),
    "timm state dict (model.state_dict()): keys kept as timm names them; the classifier is dropped",
)


def _prefixed_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}


_register(
    Layout("prefixed", lambda s: False, _prefixed_convert),
    "backbone.* of any other library (other keys dropped), loaded into --arch as built; never detected",
)


def _check_format(fmt: str) -> None:
    if fmt != "auto" and fmt not in FORMATS:
        raise unknown_choice("checkpoint format", fmt, ["auto", *FORMATS.names()])


def _strip_wrappers(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Remove prefixes that every key shares (``module.encoder.conv1.weight`` -> ``conv1.weight``)."""
    out = dict(state)
    while out:
        prefix = next((p for p in _WRAPPERS if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = {k[len(prefix) :]: v for k, v in out.items()}
    return out


def detect_format(state: Mapping[str, Tensor]) -> str:
    """The name of the first registered layout that recognises ``state`` (wrapper prefixes ignored)."""
    stripped = _strip_wrappers(state)
    for name in FORMATS:
        if FORMATS.get(name).detect(stripped):
            return name
    shown = ", ".join(_clean(k) for k in list(stripped)[:5]) or "none"
    raise CheckpointError(
        f"cannot tell the layout of this state dict (first keys: {shown}); "
        f"pass --format, one of: {', '.join(FORMATS.names())}"
    )


def convert_state_dict(state: Mapping[str, Tensor], fmt: str) -> dict[str, Tensor]:
    """Convert a foreign state dict of layout ``fmt`` (or "auto") to torchvision's ResNet backbone keys."""
    _check_format(fmt)
    if fmt == "auto":
        fmt = detect_format(state)
    return FORMATS.get(fmt).convert(_strip_wrappers(state))


# ============ reading files ============


_EXPECTED = (
    "expected a directory written by `train` (or its manifest.json), a .safetensors file, "
    "or a state dict saved with torch.save (.pt, .pth, .ckpt)"
)


def _looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # a multi-byte character cut by the end of the sample
    return True


def describe_file(head: bytes) -> tuple[bool, str]:
    """(may it be a checkpoint?, what it is) from the first bytes of a file; reads nothing else.

    Checkpoints are safetensors (an 8-byte header length, then JSON), zip archives (torch.save) or
    pickles (legacy torch.save); anything else is named so that the error can say what was passed.
    """
    if not head:
        return False, "an empty file"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 0:
        return True, "a safetensors file"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return True, "a zip archive (the format of torch.save)"
    if head.startswith(b"\x80"):
        return True, "a pickle (legacy torch.save format)"
    if head.startswith(b"\x1f\x8b"):
        return False, "a gzip-compressed file (decompress it first)"
    if len(head) > 262 and head[257:262] == b"ustar":
        return False, "a tar archive (extract the checkpoint from it first)"
    if _looks_like_text(head):
        text = head.decode("utf-8", errors="replace").strip()
        kind = "a JSON file" if text[:1] in ("{", "[") else "a text file"
        return False, f"{kind} (it begins {_clean(text, 40)!r})" if text else f"{kind} of blank lines"
    return False, f"a binary file of no checkpoint format (it begins {head[:8].hex(' ')})"


def _refuse_non_checkpoint(path: Path, head: bytes) -> None:
    """A one-line CheckpointError saying what ``path`` is, unless it may be a checkpoint."""
    plausible, what = describe_file(head)
    if not plausible:
        raise CheckpointError(f"{path} is {what}, not a checkpoint; {_EXPECTED}")


def _read_head(path: Path, n: int = 512) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or _first_line(e)}") from None


def _clean(text: Any, limit: int = 80) -> str:
    """One line, bounded: names from an untrusted file must not break the one-line error contract."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return _clean(lines[0] if lines else type(e).__name__, 200)


def _unsafe_globals(data: bytes) -> list[str]:
    """GLOBALs the restricted unpickler would refuse, by static disassembly (nothing is executed)."""
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is None:
        return []
    try:
        return sorted(finder(io.BytesIO(data)))
    except Exception:  # legacy (non-zip) pickles and corrupt archives: nothing to report
        return []


def _torch_load(data: bytes, origin: Path) -> Any:
    """``torch.load`` restricted to tensors and plain containers; any refusal is a one-line error."""
    try:
        refuse_unsafe_torch_env()
    except UserError as e:
        raise CheckpointError(f"refusing to read {origin}: {e}") from None
    if TorchVersion(torch.__version__) < _MIN_TORCH:
        raise CheckpointError(
            f"torch {torch.__version__} has known weights_only escapes; upgrade to torch>={_MIN_TORCH} "
            f"or convert {origin} to safetensors where you trust it"
        )
    try:
        # weights_only=True passed explicitly, so no environment variable or default can flip it.
        # The loader's warnings (e.g. about an unusual pickle protocol) would break the CLI's
        # one-line error contract; whether the file is usable is reported by the error, if any.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        if "TorchScript" in str(e):
            raise CheckpointError(
                f"{origin} is a TorchScript archive (code, not just weights) and was refused; "
                "save its state_dict instead"
            ) from None
        unsafe = _unsafe_globals(data)
        if unsafe or isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
            named = f" ({', '.join(_clean(g) for g in unsafe[:5])})" if unsafe else ""
            raise CheckpointError(
                f"{origin} holds Python objects beyond tensors{named} and was refused, since loading it "
                "could run code; re-save only its state dict (or convert it to safetensors) where trusted"
            ) from None
        raise CheckpointError(f"{origin} is not a readable torch checkpoint ({_first_line(e)})") from None


def _is_tensor_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items())
    )


def _unwrap(obj: Any, origin: Path, depth: int = 0) -> dict[str, Tensor]:
    """The flat name -> tensor dict inside a loaded checkpoint (top level, or under a container key)."""
    if _is_tensor_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping) and depth < 3:
        for key in _CONTAINERS:
            inner = obj.get(key)
            if not isinstance(inner, Mapping):
                continue
            # inside a container, non-tensor leaves (counters, metadata) are ignored
            tensors = {k: v for k, v in inner.items() if isinstance(k, str) and isinstance(v, Tensor)}
            if tensors:
                return tensors
            try:
                return _unwrap(inner, origin, depth + 1)
            except CheckpointError:
                continue
        if len(obj) == 1 and _is_tensor_dict(next(iter(obj.values()))):
            # a state dict under a name of the user's choosing, as lightly's tutorial saves it
            # ({"resnet18_parameters": backbone.state_dict()})
            return dict(next(iter(obj.values())))
    found = (
        f"top-level keys: {', '.join(_clean(k, 40) for k in list(obj)[:6])}"
        if isinstance(obj, Mapping)
        else f"a {type(obj).__name__}"
    )
    raise CheckpointError(
        f"{origin} holds no state dict ({found}); expected a name -> tensor dict, "
        f"possibly under one of: {', '.join(_CONTAINERS)}"
    )


def _read(path: str | Path) -> tuple[dict[str, Tensor], str]:
    """(flat state dict, sha256 of the file's bytes), read once so the hash is of what was loaded."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(
            f"checkpoint file {p} not found" + (" (it is a directory)" if p.is_dir() else "")
        )
    data = p.read_bytes()
    _refuse_non_checkpoint(p, data[:512])
    sha = sha256_bytes(data)
    if p.suffix == ".safetensors":
        # load_state re-reads the file; the expected sha256 makes sure it is the same bytes we hashed
        state = load_state(p, expected_sha256=sha)
    else:
        state = _unwrap(_torch_load(data, p), p)
        check_finite(state, p)
    return state, sha


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a checkpoint file as a flat name -> tensor dict (safetensors, or a weights-only pickle).

    Raises ``CheckpointError`` (one line) for missing, corrupt, unsafe or non-finite files.
    """
    return _read(path)[0]


# ============ building encoders ============


def _normalization_name(mean: Sequence[float], std: Sequence[float]) -> str | None:
    """The name in :data:`NORMALIZATIONS` equal to (mean, std), broadcasting single values."""
    for name, (m, s) in NORMALIZATIONS.items():
        n = max(len(mean), len(std), len(m), len(s))
        if any(len(v) not in (1, n) for v in (mean, std, m, s)):
            continue
        if all(
            math.isclose(a[i % len(a)], b[i % len(b)], abs_tol=1e-6)
            for a, b in ((mean, m), (std, s))
            for i in range(n)
        ):
            return name
    return None


def _named_normalization(normalize: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    try:
        return NORMALIZATIONS[normalize]
    except KeyError:
        raise unknown_choice("normalization", normalize, NORMALIZATIONS) from None


def _fill_num_batches_tracked(module: nn.Module, state: dict[str, Tensor]) -> None:
    # Old (pre-0.4.1) checkpoints and some converters lack BatchNorm's num_batches_tracked. It only
    # matters in train mode with momentum=None, never for eval outputs, so fill it in rather than
    # fail; only for BatchNorms whose statistics are present, so a missing layer is still reported.
    for key, value in module.state_dict().items():
        stats = key[: -len("num_batches_tracked")] + "running_mean"
        if key.endswith("num_batches_tracked") and key not in state and stats in state:
            state[key] = torch.zeros_like(value)


# ============ solo-learn's stem ============

SOLO_ARGS = "args.json"
#: solo-learn's ResNets are torchvision's; these datasets get its CIFAR stem (solo/methods/base.py)
_SOLO_CIFAR = ("cifar10", "cifar100")
_SOLO_RESNETS = ("resnet18", "resnet50")
_SOLO_CIFAR_PADDING = 2  # solo-learn: nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False)
#: solo-learn's pretraining normalisation per dataset (solo/data/pretrain_dataloader.py, MEANS_N_STD)
SOLO_NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "stl10": ((0.4914, 0.4823, 0.4466), (0.247, 0.243, 0.261)),
    "imagenet100": NORMALIZATIONS["imagenet"],
    "imagenet": NORMALIZATIONS["imagenet"],
}


@dataclass(frozen=True)
class SoloRun:
    """What solo-learn's ``args.json`` says about the network it built."""

    backbone: str
    dataset: str
    cifar: bool
    source: str


def _nested(args: Mapping[str, Any], *path: str) -> Any:
    value: Any = args
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _first_str(args: Mapping[str, Any], *paths: tuple[str, ...]) -> str | None:
    for path in paths:
        value = _nested(args, *path)
        if isinstance(value, str):
            return value
    return None


def read_solo_args(checkpoint: str | Path) -> SoloRun | None:
    """solo-learn's ``args.json`` beside ``checkpoint`` (None when there is none).

    Recent versions write ``backbone: {name}`` and ``data: {dataset}``; older ones a flat
    ``backbone`` (``encoder`` before mid-2021) and ``dataset``, and a ``cifar`` flag in
    ``backbone_args`` (or at the top level), which wins when present since it built the network.
    A file that is there but names no backbone or dataset is a one-line ``CheckpointError``.
    """
    path = Path(checkpoint).parent / SOLO_ARGS
    if not path.is_file():
        return None
    try:
        args = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({_first_line(e)})") from None
    backbone = _first_str(args, ("backbone", "name"), ("backbone",), ("encoder",))
    dataset = _first_str(args, ("data", "dataset"), ("dataset",))
    if not isinstance(args, Mapping) or backbone is None or dataset is None:
        raise CheckpointError(
            f"{path} names no solo-learn backbone and dataset (backbone.name and data.dataset, or "
            f"backbone and dataset in older versions), so the stem of {Path(checkpoint).name} is unknown"
        )
    flags = (_nested(args, "backbone_args", "cifar"), args.get("cifar"))
    flag = next((v for v in flags if isinstance(v, bool)), None)
    cifar = dataset in _SOLO_CIFAR if flag is None else flag
    return SoloRun(_clean(backbone), _clean(dataset), cifar, str(path))


def _solo_arch(run: SoloRun, arch: str, p: Path) -> None:
    """The registered encoder solo-learn's network is must be ``arch``; a one-line error otherwise."""
    if run.backbone not in _SOLO_RESNETS:
        raise CheckpointError(
            f"{p}: solo-learn backbone {run.backbone!r} (from {run.source}) is not supported; "
            f"only {' and '.join(_SOLO_RESNETS)} map to registered encoders"
        )
    expected = f"{run.backbone}_{'cifar' if run.cifar else 'imagenet'}"
    if arch != expected:
        raise CheckpointError(
            f"{p} is a solo-learn {run.backbone} trained on {run.dataset} (says {run.source}), "
            f"built as {expected}; pass --arch {expected}"
        )


def _conv1_kernel(state: Mapping[str, Tensor]) -> int | None:
    weight = state.get("conv1.weight")
    return int(weight.shape[-1]) if weight is not None and weight.dim() == 4 else None


def _solo_normalization(run: SoloRun | None) -> tuple[str, list[float], list[float]] | None:
    """(name, mean, std) solo-learn pretrained with, when its args.json names a dataset it knows."""
    if run is None or run.dataset not in SOLO_NORMALIZATIONS:
        return None
    mean, std = SOLO_NORMALIZATIONS[run.dataset]
    return f"solo-learn:{run.dataset}", list(mean), list(std)


def _solo_stem(
    p: Path, run: SoloRun | None, arch: str, state: Mapping[str, Tensor], explicit: bool
) -> tuple[dict[str, Any], str]:
    """(encoder options, one-line description) of the stem solo-learn built for the file ``p``.

    From ``args.json`` (``run``) when it is there. Without it a 7x7 conv1 is torchvision's stem in
    every library; a 3x3 one is solo-learn's CIFAR stem (padding 2) only if the user says the file
    is solo-learn's (``--format solo-learn``), since other libraries pad it by 1: not guessed.
    """
    pad2 = {"stem_padding": _SOLO_CIFAR_PADDING}
    cifar_stem = f"solo-learn CIFAR stem (3x3/1 conv1, padding {_SOLO_CIFAR_PADDING}, no max-pool)"
    if run is not None:
        _solo_arch(run, arch, p)
        where = f"from {run.source}: {run.backbone} on {run.dataset}"
        return (pad2, f"{cifar_stem}, {where}") if run.cifar else ({}, f"torchvision stem, {where}")
    if _conv1_kernel(state) != 3:
        return {}, "torchvision stem (7x7/2 conv1, max-pool): solo-learn leaves it as is off CIFAR"
    if explicit:
        return pad2, f"{cifar_stem}: --format solo-learn with a 3x3 conv1, no args.json"
    raise CheckpointError(
        f"{p}: cannot tell the stem of this backbone.* checkpoint: no solo-learn {SOLO_ARGS} beside it, "
        f"and its 3x3 conv1 is padded by {_SOLO_CIFAR_PADDING} in solo-learn but by 1 elsewhere; put the "
        f"run's {SOLO_ARGS} beside it, or pass --format solo-learn (padding 2) "
        "or --format prefixed (as --arch builds it)"
    )


def _with_stem(options: dict[str, Any], stem: dict[str, Any], p: Path) -> dict[str, Any]:
    """``options`` plus the stem's; an option that contradicts what the file says is refused."""
    clash = sorted(k for k in stem if k in options and options[k] != stem[k])
    if clash:
        key = clash[0]
        raise CheckpointError(f"{p} was built with {key}={stem[key]}, not {key}={options[key]}; omit {key}")
    return {**options, **stem}


# ============ loading foreign files ============


def _detect(p: Path, state: Mapping[str, Tensor], fmt: str, arch: str) -> str:
    """The layout of ``state``: ``fmt`` itself, else detected; a timm file keeps timm's own names."""
    if fmt != "auto":
        return fmt
    try:
        return detect_format(state)
    except CheckpointError as e:  # the layout error names keys; say which file holds them
        if not arch.startswith(TIMM_PREFIX):
            raise CheckpointError(f"{p}: {e}") from None
    return "timm"


def _pick_normalization(
    from_file: tuple[list[float], list[float]] | None,
    normalize: str | None,
    solo: tuple[str, list[float], list[float]] | None = None,
) -> tuple[str, list[float], list[float]]:
    """(name, mean, std): with ``normalize`` None the file's own (or solo-learn's, from its
    args.json) when known, else the named one ("cifar10" by default)."""
    if normalize is None and from_file is not None:
        mean, std = from_file
        return _normalization_name(mean, std) or "file", mean, std
    if normalize is None and solo is not None:
        return solo
    normalize = normalize or _DEFAULT_NORMALIZE
    mean, std = (list(v) for v in _named_normalization(normalize))
    return normalize, mean, std


def stem_channels(state: dict[str, Any], default: int = 3) -> int:
    """Input channels of a state dict saved in module order: those of its first convolution kernel
    (a 1-channel Fashion-MNIST/digits network has ``(out, 1, k, k)`` there), else ``default``."""
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 4:
            return int(value.shape[1])
    return default


def load_foreign_encoder(
    path: str | Path,
    *,
    arch: str,
    fmt: str = "auto",
    normalize: str | None = _DEFAULT_NORMALIZE,
    in_channels: int | None = None,
    input_shape: tuple[int, int, int] | None = None,
    **encoder_kwargs: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """Load a foreign state dict into the registered encoder ``arch``, strictly; returns (encoder, info).

    ``normalize`` names the input normalisation the weights were trained with (foreign files do not
    carry it); ``None`` takes it from the file when it has one (layout "ours"; solo-learn's args.json
    naming a dataset of :data:`SOLO_NORMALIZATIONS`), else "cifar10".
    ``encoder_kwargs`` go to :func:`create_encoder` (e.g. ``width``); a solo-learn file adds the
    stem it was built with (``stem_padding``). The encoder is in eval mode.
    info: sha256 (of the file), format, arch, normalize, path, n_tensors (in the file), stem (solo-learn
    only), plus encoder, encoder_kwargs, in_channels, mean, std and dual_bn (False) for rebuilding
    the same architecture.
    """
    _check_format(fmt)
    p = Path(path)
    state, sha = _read(p)
    explicit, fmt = fmt != "auto", _detect(p, state, fmt, arch)
    layout = FORMATS.get(fmt)
    stripped = _strip_wrappers(state)
    run = read_solo_args(p) if fmt == "solo-learn" else None
    normalize, mean, std = _pick_normalization(
        layout.normalization(stripped), normalize, _solo_normalization(run)
    )
    try:
        backbone_state = layout.convert(stripped)
    except CheckpointError as e:
        raise CheckpointError(f"{p}: {e}") from None
    stem: dict[str, Any] = {}
    if fmt == "solo-learn":
        options, stem["stem"] = _solo_stem(p, run, arch, backbone_state, explicit)
        encoder_kwargs = _with_stem(encoder_kwargs, options, p)
    if in_channels is None:
        # timm files keep the module order of torch.save, stem first; our ResNet layouts are RGB
        in_channels = stem_channels(backbone_state) if arch.startswith(TIMM_PREFIX) else 3
    if len(mean) not in (1, in_channels):
        raise CheckpointError(
            f"{p} is a {in_channels}-channel network but normalisation {normalize!r} has {len(mean)} "
            "channels; pass --normalize none, or a normalisation with one value per channel"
        )
    encoder = create_encoder(
        arch, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape, **encoder_kwargs
    )
    if isinstance(encoder, TimmEncoder):
        for key in encoder.classifier_keys(backbone_state):
            del backbone_state[key]
    _fill_num_batches_tracked(encoder.backbone, backbone_state)
    load_strict(encoder.backbone, backbone_state, f"{p} ({fmt} layout, --arch {arch})")
    encoder.eval()
    return encoder, {
        "sha256": sha,
        "format": fmt,
        "arch": arch,
        "normalize": normalize,
        "path": str(p),
        "n_tensors": len(state),
        **stem,
        "encoder": arch,
        "encoder_kwargs": dict(encoder_kwargs),
        "in_channels": in_channels,
        "mean": encoder.mean.flatten().tolist(),
        "std": encoder.std.flatten().tolist(),
        "dual_bn": False,
    }


def _load_ours(
    manifest_path: Path, *, arch: str | None, fmt: str, normalize: str | None
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild an encoder from a checkpoint written by ``train`` (manifest + verified safetensors)."""
    manifest = read_manifest(manifest_path)
    origin = manifest_path.parent
    if fmt not in ("auto", "ours"):
        raise UserError(f"{origin} is a checkpoint written by `train`; --format {fmt} does not apply to it")
    name = manifest["encoder"]
    if arch is not None and arch != name:
        raise CheckpointError(f"{origin} holds a {name} encoder, not --arch {arch}; omit --arch for it")
    norm = manifest.get("normalization") or {}
    mean, std = norm.get("mean", (0.5,)), norm.get("std", (0.5,))
    if normalize is not None and _normalization_name(mean, std) != normalize:
        _named_normalization(normalize)  # an unknown name gets the list of valid ones
        raise UserError(
            f"{origin} was trained with normalisation mean={list(mean)} std={list(std)}; "
            f"--normalize {normalize} does not apply to it (omit --normalize)"
        )
    weights = str(manifest["weights"])
    if Path(weights).name != weights or weights in ("", ".", ".."):
        # the manifest names a file beside it; anything else could point anywhere on disk
        raise CheckpointError(f"{manifest_path}: weights {weights!r} must be a file name in {origin}")
    weights_path = origin / weights
    state = load_state(weights_path, expected_sha256=manifest["weights_sha256"])
    in_channels = manifest.get("in_channels", 3)
    size = manifest.get("input_size")
    try:
        input_shape = (int(in_channels), *(int(s) for s in size)) if size else None
        encoder = create_encoder(
            name,
            in_channels=int(in_channels),
            mean=mean,
            std=std,
            dual_bn=bool(manifest.get("dual_bn", False)),
            input_shape=input_shape,  # type: ignore[arg-type]
            **dict(manifest.get("encoder_kwargs") or {}),
        )
    except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: a forged size that cannot be allocated
        raise CheckpointError(f"{manifest_path} has malformed encoder fields ({_first_line(e)})") from None
    # the projection head is not evaluated; the encoder (buffers included) must match exactly
    enc_state = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    load_strict(encoder, enc_state, weights_path)
    # a dual-BN encoder stays dual: evaluation uses the clean branch unless the manifest names
    # another (ACL/DynACL checkpoints: the adversarial branch, as their authors evaluate them)
    route = manifest.get("eval_bn_route", "clean")
    if route not in ("clean", "adv"):
        raise CheckpointError(f"{manifest_path}: eval_bn_route {route!r} must be 'clean' or 'adv'")
    set_bn_route(encoder, route)
    encoder.eval()
    info = {
        **manifest,
        "checkpoint_id": manifest.get("id"),
        "sha256": manifest["weights_sha256"],
        "format": "ours",
        "arch": name,
        "normalize": _normalization_name(encoder.mean.flatten().tolist(), encoder.std.flatten().tolist())
        or "manifest",
        "path": str(weights_path),
        "manifest_path": str(manifest_path),
        "n_tensors": len(state),
    }
    return encoder, info


def _sibling_manifest(path: Path) -> Path | None:
    """The manifest.json beside a weights file that it describes (so ``run/weights.safetensors`` works)."""
    candidate = path.parent / MANIFEST
    if not path.is_file() or not candidate.is_file():
        return None
    try:
        manifest = json.loads(candidate.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return candidate if isinstance(manifest, dict) and manifest.get("weights") == path.name else None


def load_encoder(
    checkpoint: str | Path,
    *,
    arch: str | None = None,
    fmt: str = "auto",
    normalize: str | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """One entry point for evaluation: any checkpoint -> (encoder in eval mode, info).

    A directory written by ``train``, its manifest.json, or the weights file a manifest beside it
    describes, is rebuilt from the manifest (sha256 verified; info holds the manifest's fields plus
    checkpoint_id and sha256). Any other file is foreign and needs ``arch``
    (see :func:`load_foreign_encoder`; ``normalize=None`` -> the file's own, else "cifar10").
    """
    _check_format(fmt)
    p = Path(checkpoint)
    if not p.exists():
        raise CheckpointError(
            f"checkpoint {p} not found; pass a directory written by `train` or a weights file"
        )
    if p.is_dir() or p.suffix == ".json":
        return _load_ours(resolve_manifest_path(p), arch=arch, fmt=fmt, normalize=normalize)
    sibling = _sibling_manifest(p)
    if sibling is not None:
        return _load_ours(sibling, arch=arch, fmt=fmt, normalize=normalize)
    head = _read_head(p)
    _refuse_non_checkpoint(p, head)  # a text file is not "a foreign checkpoint"
    if arch is None:
        raise UserError(
            f"{p} is {describe_file(head)[1]} without a manifest.json beside it, so a foreign "
            "checkpoint: pass --arch (one of the encoders, e.g. resnet18_cifar, or timm:NAME) to load it"
        )
    return load_foreign_encoder(p, arch=arch, fmt=fmt, normalize=normalize)
