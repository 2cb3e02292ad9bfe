"""The RobustSSL benchmark's released checkpoints (GodXuxilie/RobustSSL_Benchmark, its model zoo):
the layouts of ACL, DynACL and its variants, AdvCL, A-InfoNCE and DeACL, converted the way the
benchmark's ``Finetuning_Methods/Vanilla_Finetuning/utils.py`` converts them for its SLF / ALF
evaluation (docs/decisions.md, 'RobustSSL benchmark checkpoints').

* dual BN (ACL, DynACL, DynACL++, DynACL-AIR, DynACL-AIR++, DynACL-RCS): every BatchNorm is a
  ``batch_norm_multiple`` with ``bn_list.0`` (the clean, "normal" branch) and ``bn_list.1`` (the
  adversarial, "pgd" branch); the downsample is ``downsample.conv`` / ``downsample.bn``; the
  projection head is ``fc.*``; ``normalize.mean/std`` hold the input normalisation (ImageNet's in
  the benchmark's model). The benchmark evaluates branch ``bnNameCnt`` = 1 (``cvt_state_dict``).
* AdvCL and A-InfoNCE: the same ``bn_list`` / ``downsample.conv`` naming (``load_BN_checkpoint_AdvCL``
  keeps ``bn_list.1``), heads ``fc_002`` ... ``fc_500``, ``head_ce``, ``head_proj``, ``head_pred``, and
  no input normalisation (the benchmark builds them with ``do_normalize=0``).
* DeACL: a solo-learn checkpoint, ``backbone.*`` of a torchvision-named ResNet with its
  ``normalize.mean/std`` (``load_BN_checkpoint_DeACL`` strips ``backbone.``); never detected, since
  every solo-learn file has ``backbone.*``: ``--pretraining DeACL``.

Every network is the benchmark's CIFAR ResNet: 3x3/1 conv1 padded by 1, no max-pool (``--arch
resnet18_cifar``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from ...errors import CheckpointError
from ...registry import Registry
from .layout import Layout, has_prefix
from .normalization import NORMALIZATIONS

#: The branch the benchmark evaluates: ``get_model`` sets ``args.bnNameCnt = 1`` for every dual-BN
#: method in SLF and ALF (utils.py), i.e. the adversarial ("pgd") BatchNorms.
BENCHMARK_BRANCH = 1
_BRANCH = re.compile(r"\.bn_list\.(\d+)\.")
#: training-only heads of ACL/DynACL (``fc.*``) and of AdvCL/A-InfoNCE (the rest)
_ACL_HEADS = ("fc.",)
_ADVCL_HEADS = ("fc_002.", "fc_010.", "fc_050.", "fc_100.", "fc_500.", "head_ce.", "head_proj.", "head_pred.")
_NORMALIZE = ("normalize.mean", "normalize.std")


@dataclass(frozen=True)
class Pretraining:
    """How the benchmark evaluates one method's released checkpoint."""

    family: str  # "dual-bn" | "advcl" | "deacl": the key layout
    normalization: str  # when the file carries none: "imagenet" (do_normalize=1) or "none" (=0)
    branch: int | None = BENCHMARK_BRANCH  # the bn_list index evaluated; None: single BN


#: ``--pretraining`` names, spelled as the benchmark's ``--pretraining`` choices (vanilla_finetuning.py)
PRETRAININGS: Registry[Pretraining] = Registry("RobustSSL pretraining")
for _name in ("ACL", "DynACL", "DynACL++", "DynACL-AIR", "DynACL-AIR++", "DynACL-RCS"):
    PRETRAININGS.add(_name, Pretraining("dual-bn", "imagenet"))
for _name in ("AdvCL", "A-InfoNCE"):
    PRETRAININGS.add(_name, Pretraining("advcl", "none"))
PRETRAININGS.add("DeACL", Pretraining("deacl", "imagenet", branch=None))


def branches(state: Mapping[str, Tensor]) -> list[int]:
    """The ``bn_list`` indices present in ``state`` (sorted)."""
    return sorted({int(m.group(1)) for k in state if (m := _BRANCH.search(k))})


def _is_dual(state: Mapping[str, Tensor]) -> bool:
    return "conv1.weight" in state and any(".bn_list." in k for k in state) and has_prefix(state, "layer1.")


def _is_advcl(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith(_ADVCL_HEADS) for k in state)


def _convert_dual(state: Mapping[str, Tensor], branch: int) -> dict[str, Tensor]:
    """One branch of a ``bn_list`` state dict in torchvision's names; heads and normalisation dropped."""
    present = branches(state)
    if present and branch not in present:
        raise CheckpointError(
            f"this dual-BN checkpoint has BatchNorm branches {present}, not the branch {branch} the "
            "RobustSSL benchmark evaluates"
        )
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.startswith(_ACL_HEADS + _ADVCL_HEADS) or key in _NORMALIZE:
            continue  # projection heads are not evaluated; the normalisation is read separately
        m = _BRANCH.search(key)
        if m:
            if int(m.group(1)) != branch:
                continue  # the other branch
            key = (
                f"{key[: m.start()]}.{key[m.end() :]}"  # layer1.0.bn1.bn_list.1.weight -> layer1.0.bn1.weight
            )
        # downsample.conv / downsample.bn -> torchvision's downsample.0 / downsample.1
        key = key.replace(".downsample.conv.", ".downsample.0.").replace(".downsample.bn.", ".downsample.1.")
        out[key] = value  # anything unmapped stays, so the strict load names it
    return out


def _convert_deacl(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # projector, momentum copies, the teacher: training only; normalize.* is read separately
    out = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
    return {k: v for k, v in out.items() if k not in _NORMALIZE and not k.startswith("fc.")}


def _file_normalization(
    state: Mapping[str, Tensor], prefix: str = ""
) -> tuple[list[float], list[float]] | None:
    mean, std = state.get(prefix + "normalize.mean"), state.get(prefix + "normalize.std")
    if mean is None or std is None:
        return None
    return mean.flatten().tolist(), std.flatten().tolist()


def _named(name: str) -> tuple[list[float], list[float]]:
    mean, std = NORMALIZATIONS[name]
    return list(mean), list(std)


def _layout(name: str, method: Pretraining) -> Layout:
    """The layout of one ``--pretraining`` method: never detected, named by ``--format robustssl:NAME``."""
    prefix = "backbone." if method.family == "deacl" else ""

    def convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return _convert_deacl(state) if method.branch is None else _convert_dual(state, method.branch)

    def normalization(state: Mapping[str, Tensor]) -> tuple[list[float], list[float]]:
        # the file's normalize buffers override the model's (the benchmark loads with strict=False)
        if method.normalization == "none":
            return _named("none")
        return _file_normalization(state, prefix) or _named(method.normalization)

    return Layout(f"robustssl:{name}", lambda s: False, convert, normalization)


def _detected_normalization(state: Mapping[str, Tensor]) -> tuple[list[float], list[float]] | None:
    if _is_advcl(state):
        return _named("none")
    return _file_normalization(state) or (_named("imagenet") if has_prefix(state, "fc.") else None)


LAYOUTS = (
    (
        Layout(
            "robustssl",
            _is_dual,
            lambda s: _convert_dual(s, BENCHMARK_BRANCH),
            _detected_normalization,
            ask_normalization="pass --pretraining NAME (its input normalisation depends on the method)",
        ),
        "RobustSSL benchmark dual-BN checkpoint (ACL, DynACL..., AdvCL, A-InfoNCE): bn_list.1, as evaluated",
    ),
    *(
        (_layout(name, PRETRAININGS.get(name)), f"RobustSSL benchmark checkpoint of {name} (--pretraining)")
        for name in PRETRAININGS.names()
    ),
)


def pretraining_format(fmt: str, pretraining: str | None) -> str:
    """``--format`` after ``--pretraining NAME``: ``robustssl:NAME`` (with --format auto or robustssl)."""
    if pretraining is None:
        return fmt
    PRETRAININGS.get(pretraining)  # an unknown name: one line listing the valid ones
    if fmt not in ("auto", "robustssl", f"robustssl:{pretraining}"):
        raise CheckpointError(f"--pretraining {pretraining} reads the RobustSSL layout; drop --format {fmt}")
    return f"robustssl:{pretraining}"
