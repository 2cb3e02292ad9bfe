"""The ResNet backbone in torchvision's parameter layout (``conv1.weight``, ``layer1.0.downsample.1.*``,
...), with a CIFAR stem (3x3/1 conv1, no max-pool) or torchvision's ImageNet stem, and torchvision's init.

Its names are exactly torchvision's, so a torchvision state dict without ``fc.*`` loads into it with
``strict=True``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    """A 3x3 convolution without bias, padded to keep the size at stride 1."""
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (same attribute names: conv1, bn1, conv2, bn2, downsample)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def init_weights(module: nn.Module) -> None:
    """torchvision's ResNet init: Kaiming-normal fan_out convs; BN weight 1, bias 0; no zero-init residual."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm | nn.GroupNorm) and m.weight is not None:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class ResNetBackbone(nn.Module):
    """A torchvision-layout ResNet without ``fc``, returning the globally average-pooled features.

    ``stem="cifar"``: 3x3/1 conv1 and no max-pool (the CIFAR ResNet of SimCLR/CLAE/NaCl); ``stem="imagenet"``:
    torchvision's 7x7/2 conv1 + 3x3/2 max-pool. ``stem_padding`` overrides conv1's padding (default 1
    for the CIFAR stem, 3 for the ImageNet one); solo-learn's CIFAR ResNets pad by 2, which changes
    every feature while the state dict keeps the same shapes (docs/decisions.md, 'Foreign checkpoints').
    ``width`` is the base width (64 = the standard nets); stage widths are ``width * (1, 2, 4, 8)`` and
    the feature dimension ``8 * width * expansion``.
    """

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: Sequence[int],
        *,
        in_channels: int = 3,
        width: int = 64,
        stem: str = "cifar",
        stem_padding: int | None = None,
    ) -> None:
        super().__init__()
        if stem == "cifar":
            pad = 1 if stem_padding is None else stem_padding
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=pad, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        elif stem == "imagenet":
            pad = 3 if stem_padding is None else stem_padding
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=pad, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            raise ValueError(f"unknown ResNet stem {stem!r}")
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.inplanes = width
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.feature_dim = width * 8 * block.expansion
        init_weights(self)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)
