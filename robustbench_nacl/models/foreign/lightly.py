"""The ``lightly`` layout: lightly's recipe ``Sequential(*resnet.children()[:-1])``, bare or as the
``backbone.*`` of a LightningModule checkpoint (heads and momentum copies dropped)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ...errors import CheckpointError
from .layout import Layout, has_prefix

# children of a torchvision ResNet: 0 conv1, 1 bn1, 2 relu, 3 maxpool, 4-7 layer1-4, 8 avgpool
_LIGHTLY_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


def _lightly_prefix(state: Mapping[str, Tensor]) -> str | None:
    """ "" (a bare Sequential) or "backbone." (a LightningModule), when the keys are lightly's."""
    for prefix in ("", "backbone."):
        stem = f"{prefix}0.weight" in state and f"{prefix}1.running_mean" in state
        # 4.0.* in torchvision's children; 2.0.* in lightly's own ResNetGenerator (refused below)
        if stem and (has_prefix(state, f"{prefix}4.0.") or has_prefix(state, f"{prefix}2.0.")):
            return prefix
    return None


def _lightly_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    prefix = _lightly_prefix(state) or ""
    if has_prefix(state, f"{prefix}2.0."):
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


LAYOUTS = (
    (
        Layout("lightly", lambda s: _lightly_prefix(s) is not None, _lightly_convert),
        "lightly recipe Sequential(*resnet.children()[:-1]): 0 conv1, 1 bn1, 4-7 layer1-4, "
        "bare or backbone.*",
    ),
)
