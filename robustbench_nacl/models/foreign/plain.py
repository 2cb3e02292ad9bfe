"""Plain state dicts: torchvision's ResNet, the HCL/DCL code's ``f`` Sequential, timm's own names,
and ``backbone.*`` of any other library (``prefixed``, never detected)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from .layout import Layout, has_prefix

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


# --- torchvision: resnet state dict, possibly with its classifier ---


def _torchvision_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("fc.")}


def _prefixed_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}


LAYOUTS = (
    (
        Layout("hcl", lambda s: "f.0.weight" in s and has_prefix(s, "f.3."), _hcl_convert),
        "HCL/DCL code: f.0 conv1, f.1 bn1, f.3-f.6 layer1-4 (g.* head dropped)",
    ),
    (
        Layout(
            "torchvision", lambda s: "conv1.weight" in s and has_prefix(s, "layer1."), _torchvision_convert
        ),
        "torchvision ResNet state dict: conv1.weight, layer1.0..., fc.* dropped",
    ),
    (
        Layout("timm", lambda s: False, dict),
        "timm state dict (model.state_dict()): keys kept as timm names them; the classifier is dropped",
    ),
    (
        Layout("prefixed", lambda s: False, _prefixed_convert),
        "backbone.* of any other library (other keys dropped), loaded into --arch as built; never detected",
    ),
)
