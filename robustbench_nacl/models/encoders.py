"""Encoders, projection heads and dual (AdvProp-style) BatchNorm.

Contract: an encoder is an ``nn.Module`` from images in [0,1] of shape (B, C, H, W) to features h of
shape (B, feature_dim). Input normalisation lives inside it as the persistent buffers ``mean`` and
``std`` (shape (1, C, 1, 1)), so attacks, epsilon, clamping and mixing are all in pixel space and a
checkpoint carries its own normalisation (docs/decisions.md, 'The attacked model'). The linear probe
and every attack use this un-normalised h; the projection head is only for the contrastive loss.

The network proper sits under ``encoder.backbone``. The ResNets reproduce torchvision's parameter and
buffer names exactly (``conv1.weight``, ``layer1.0.downsample.1.running_mean``, ...), so a torchvision
state dict without ``fc.*`` loads into ``encoder.backbone`` with ``strict=True``.

Dual BatchNorm (CLAE / AdvProp; docs/decisions.md, 'Robust term'): with ``dual_bn=True`` every
BatchNorm becomes a :class:`DualBatchNorm` with a clean branch ``.main`` and an adversarial branch
``.aux`` (momentum 0.01). :func:`bn_route` temporarily switches all of them; the default route, and
hence evaluation, is the clean branch. :func:`strip_dual_bn` exports the clean branch as a plain
state dict.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import itertools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from ..registry import Registry

__all__ = [
    "ENCODERS",
    "HEADS",
    "ROUTES",
    "TIMM_PREFIX",
    "BasicBlock",
    "Bottleneck",
    "ContrastiveModel",
    "DualBatchNorm",
    "Encoder",
    "ResNetBackbone",
    "TimmEncoder",
    "bn_route",
    "check_encoder",
    "convert_to_dual_bn",
    "create_encoder",
    "create_head",
    "encoder_names",
    "has_dual_bn",
    "head_names",
    "meta_output_shape",
    "register_encoder",
    "set_bn_route",
    "strip_dual_bn",
]

ENCODERS: Registry[Callable[..., Encoder]] = Registry("encoder")
HEADS: Registry[Callable[..., nn.Module]] = Registry("projection head")

ROUTES = ("clean", "adv")
_BN_STATE_KEYS = frozenset({"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})


# ============ dual BatchNorm ============


class DualBatchNorm(nn.Module):
    """Two BatchNorms of the same kind: ``main`` for clean inputs and ``aux`` for adversarial ones.

    ``forward`` uses the branch named by the ``route`` attribute ("clean" -> ``main``, "adv" -> ``aux``),
    default "clean". Only the selected branch's running statistics are updated in train mode. ``aux``
    uses momentum 0.01 (CLAE's auxiliary BN). Set the route with :func:`bn_route` / :func:`set_bn_route`.

    Note: in a step that uses only one route, the other branch's affine parameters get no gradient
    (DistributedDataParallel then needs ``find_unused_parameters=True``).
    """

    def __init__(
        self,
        num_features: int,
        *,
        dim: int = 2,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        aux_momentum: float | None = 0.01,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__()
        if dim not in (1, 2):
            raise ValueError(f"DualBatchNorm dim must be 1 or 2, got {dim}")
        cls = nn.BatchNorm1d if dim == 1 else nn.BatchNorm2d
        kw = {"eps": eps, "affine": affine, "track_running_stats": track_running_stats}
        self.main = cls(num_features, momentum=momentum, **kw)
        self.aux = cls(num_features, momentum=aux_momentum, **kw)
        self.route = "clean"

    @classmethod
    def from_bn(cls, bn: nn.modules.batchnorm._BatchNorm, aux_momentum: float | None = 0.01) -> DualBatchNorm:
        """Wrap an existing BatchNorm: ``main`` is ``bn`` itself, ``aux`` a copy with ``aux_momentum``."""
        if not isinstance(bn, nn.BatchNorm1d | nn.BatchNorm2d):
            raise TypeError(f"DualBatchNorm wraps BatchNorm1d/BatchNorm2d, got {type(bn).__name__}")
        dual = cls(bn.num_features, dim=1 if isinstance(bn, nn.BatchNorm1d) else 2)
        dual.main = bn
        dual.aux = copy.deepcopy(bn)
        dual.aux.momentum = aux_momentum
        return dual

    @property
    def num_features(self) -> int:
        return self.main.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) if self.route == "clean" else self.aux(x)

    def extra_repr(self) -> str:
        return f"route={self.route!r}"


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise UserError(f"unknown BatchNorm route {route!r}; valid choices: {', '.join(ROUTES)}")


def _dual_bns(model: nn.Module) -> list[DualBatchNorm]:
    return [m for m in model.modules() if isinstance(m, DualBatchNorm)]


def has_dual_bn(model: nn.Module) -> bool:
    """Whether ``model`` contains any :class:`DualBatchNorm`."""
    return any(isinstance(m, DualBatchNorm) for m in model.modules())


def set_bn_route(model: nn.Module, route: str) -> None:
    """Route every :class:`DualBatchNorm` in ``model`` to ``route`` ("clean" or "adv"), permanently."""
    _check_route(route)
    for m in _dual_bns(model):
        m.route = route


@contextlib.contextmanager
def bn_route(model: nn.Module, route: str) -> Iterator[nn.Module]:
    """Temporarily route every :class:`DualBatchNorm` in ``model`` to ``route`` ("clean" or "adv").

    Each layer's previous route is restored on exit, also when the body raises. Models without dual
    BatchNorm are unaffected (the context is then a no-op), so callers need not special-case them.
    """
    _check_route(route)
    layers = _dual_bns(model)
    previous = [m.route for m in layers]
    try:
        for m in layers:
            m.route = route
        yield model
    finally:
        for m, r in zip(layers, previous, strict=True):
            m.route = r


def convert_to_dual_bn(module: nn.Module, aux_momentum: float | None = 0.01) -> nn.Module:
    """Replace every ``BatchNorm1d``/``BatchNorm2d`` in ``module`` (in place) with a :class:`DualBatchNorm`.

    The existing BN (with its parameters and statistics) becomes ``.main``; ``.aux`` starts as a copy.
    Returns ``module`` (or the wrapper when ``module`` itself is a BatchNorm).
    """
    if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
        return DualBatchNorm.from_bn(module, aux_momentum)
    for name, child in module.named_children():
        if isinstance(child, DualBatchNorm):
            continue
        new = convert_to_dual_bn(child, aux_momentum)
        if new is not child:
            setattr(module, name, new)
    return module


def strip_dual_bn(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the clean branch of a dual-BN state dict, renamed to the plain BatchNorm layout.

    ``layer1.0.bn1.main.weight`` -> ``layer1.0.bn1.weight``; ``...aux.*`` entries are dropped; all other
    entries pass through unchanged (order kept). A plain state dict is returned as is (copied).
    """
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) >= 2 and parts[-1] in _BN_STATE_KEYS and parts[-2] in ("main", "aux"):
            if parts[-2] == "aux":
                continue
            key = ".".join(parts[:-2] + parts[-1:])
        out[key] = value
    return out


# ============ the encoder wrapper ============


def _channel_stats(values: Sequence[float], in_channels: int, what: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float32).flatten()
    if t.numel() == 1:
        t = t.expand(in_channels).clone()
    if t.numel() != in_channels:
        raise UserError(
            f"encoder {what} has {t.numel()} values but the images have {in_channels} channels; "
            f"give 1 or {in_channels} values"
        )
    if not torch.isfinite(t).all():
        raise UserError(f"encoder {what} must be finite, got {t.tolist()}")
    return t.view(1, in_channels, 1, 1)


class Encoder(nn.Module):
    """Images in [0,1] (B, C, H, W) -> features (B, feature_dim): ``backbone((x - mean) / std)``.

    ``mean``/``std`` are persistent buffers of shape (1, C, 1, 1), so they travel with the state dict.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        backbone: nn.Module,
        feature_dim: int,
        *,
        in_channels: int,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        input_shape: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.feature_dim = int(feature_dim)
        self.in_channels = int(in_channels)
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        mean_t = _channel_stats(mean, in_channels, "mean")
        std_t = _channel_stats(std, in_channels, "std")
        if (std_t <= 0).any():
            raise UserError(f"encoder std must be positive, got {std_t.flatten().tolist()}")
        self.register_buffer("mean", mean_t, persistent=True)
        self.register_buffer("std", std_t, persistent=True)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """[0,1] pixels -> the backbone's input space."""
        return (x - self.mean) / self.std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(x))

    def extra_repr(self) -> str:
        return f"feature_dim={self.feature_dim}, in_channels={self.in_channels}"


# ============ ResNet (torchvision's parameter layout) ============


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (same attribute names: conv1, bn1, conv2, bn2, downsample)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
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
        self.conv2 = _conv3x3(planes, planes, stride)
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


def _init_weights(module: nn.Module) -> None:
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
        _init_weights(self)

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


# ============ registered encoders ============


def _check_positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"encoder option {what} must be a positive integer, got {value!r}")
    return value


def _resnet(
    block: type[BasicBlock | Bottleneck],
    layers: Sequence[int],
    stem: str,
    *,
    in_channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    input_shape: tuple[int, int, int] | None,
    width: int,
    stem_padding: int | None = None,
) -> Encoder:
    width = _check_positive_int(width, "width")
    if stem_padding is not None and (
        isinstance(stem_padding, bool) or not isinstance(stem_padding, int) or stem_padding < 0
    ):
        raise UserError(f"encoder option stem_padding must be an integer >= 0, got {stem_padding!r}")
    if stem == "imagenet" and input_shape is not None and min(input_shape[1:]) < 64:
        warnings.warn(
            f"an ImageNet-stem ResNet (7x7/2 conv + max-pool) on {input_shape[1]}x{input_shape[2]} images "
            "downsamples 4x before the first block; use a *_cifar encoder for small images",
            UserWarning,
            stacklevel=4,
        )
    backbone = ResNetBackbone(
        block, layers, in_channels=in_channels, width=width, stem=stem, stem_padding=stem_padding
    )
    return Encoder(
        backbone,
        backbone.feature_dim,
        in_channels=in_channels,
        mean=mean,
        std=std,
        input_shape=input_shape,
    )


def _register_resnet(
    name: str, block: type[BasicBlock | Bottleneck], layers: Sequence[int], stem: str, description: str
) -> None:
    def factory(
        *,
        in_channels: int = 3,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        input_shape: tuple[int, int, int] | None = None,
        width: int = 64,
        stem_padding: int | None = None,
    ) -> Encoder:
        return _resnet(
            block,
            layers,
            stem,
            in_channels=in_channels,
            mean=mean,
            std=std,
            input_shape=input_shape,
            width=width,
            stem_padding=stem_padding,
        )

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = (
        f"{description}. ``width``: base width (64 = standard; feature_dim = 8 * width * expansion); "
        "``stem_padding``: conv1's padding when it is not the usual one (2 for solo-learn's CIFAR ResNets)."
    )
    feature_dim = 8 * 64 * block.expansion
    ENCODERS.add(name, factory, description=description, input="images", feature_dim=feature_dim)


_CIFAR_STEM = "CIFAR stem (3x3/1 conv1, no max-pool), global avg-pool"
_IMAGENET_STEM = "torchvision stem (7x7/2 conv1 + 3x3/2 max-pool), global avg-pool; for 64px+ images"
_register_resnet("resnet18_cifar", BasicBlock, (2, 2, 2, 2), "cifar", f"ResNet-18, {_CIFAR_STEM} (NaCl/CLAE)")
_register_resnet("resnet50_cifar", Bottleneck, (3, 4, 6, 3), "cifar", f"ResNet-50, {_CIFAR_STEM} (HCL/DCL)")
_register_resnet("resnet18_imagenet", BasicBlock, (2, 2, 2, 2), "imagenet", f"ResNet-18, {_IMAGENET_STEM}")
_register_resnet("resnet50_imagenet", Bottleneck, (3, 4, 6, 3), "imagenet", f"ResNet-50, {_IMAGENET_STEM}")


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [_conv3x3(cin, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


@ENCODERS.register(
    "convnet_small",
    description="3-conv CNN (32-64-128, BN, ReLU, one max-pool, global avg-pool) for 8x8 / 28x28 images",
    input="images",
    feature_dim=128,
)
def convnet_small(
    *,
    in_channels: int = 3,
    mean: Sequence[float] = (0.5,),
    std: Sequence[float] = (0.5,),
    input_shape: tuple[int, int, int] | None = None,
    width: int = 32,
) -> Encoder:
    w = _check_positive_int(width, "width")
    backbone = nn.Sequential(
        *_conv_bn_relu(in_channels, w),
        *_conv_bn_relu(w, 2 * w),
        nn.MaxPool2d(2),
        *_conv_bn_relu(2 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
    )
    _init_weights(backbone)
    return Encoder(backbone, 4 * w, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape)


@ENCODERS.register(
    "mlp",
    description="MLP on the flattened image: depth x (Linear-BN1d-ReLU); needs input_shape",
    input="flat",
    feature_dim=512,
)
def mlp(
    *,
    in_channels: int = 3,
    mean: Sequence[float] = (0.5,),
    std: Sequence[float] = (0.5,),
    input_shape: tuple[int, int, int] | None = None,
    hidden: int = 512,
    depth: int = 3,
) -> Encoder:
    if input_shape is None:
        raise UserError("encoder 'mlp' needs input_shape=(C, H, W) to size its first layer")
    hidden = _check_positive_int(hidden, "hidden")
    depth = _check_positive_int(depth, "depth")
    c, h, w = input_shape
    layers: list[nn.Module] = [nn.Flatten(1)]
    d_in = c * h * w
    for _ in range(depth):
        # no bias: the BatchNorm right after makes it redundant
        layers += [nn.Linear(d_in, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True)]
        d_in = hidden
    return Encoder(
        nn.Sequential(*layers), hidden, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape
    )


def encoder_names() -> list[str]:
    """Registered encoder names, in registration order (``timm:NAME`` encoders are not listed)."""
    return ENCODERS.names()


# ============ encoders from plugins ============

_ENCODER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_WRAPPER_ARGS = ("in_channels", "mean", "std", "input_shape")
PluginFactory = Callable[..., nn.Module]


def register_encoder(
    name: str, *, description: str | None = None, input: str = "images"
) -> Callable[[PluginFactory], PluginFactory]:
    """Decorator: register ``factory(in_channels, **kwargs) -> nn.Module`` as the encoder ``name``.

    The module maps normalised images (B, C, H, W) to features (B, d) and sets ``out_dim = d``. It
    becomes ``Encoder.backbone``: the encoder puts the input normalisation in front of it, so
    ``--encoder name`` trains, evaluates and reloads like a built-in one. The factory's keyword
    arguments are its ``--encoder-kwargs``; one named ``input_shape`` also receives (C, H, W) when
    known. ``input``: "images" or "flat" (the tests' fixture shapes). A name already registered is a
    one-line ``UserError``.
    """

    def deco(factory: PluginFactory) -> PluginFactory:
        if not isinstance(name, str) or not _ENCODER_NAME.fullmatch(name):
            raise UserError(
                f"encoder name {name!r}: use letters, digits and underscores, starting with a letter"
            )
        if name in ENCODERS:
            raise UserError(f"encoder {name!r} is already registered; choose another name")
        try:
            inspect.signature(factory).bind(1)
        except TypeError:
            raise UserError(f"encoder {name!r}: its factory must take the number of channels first") from None
        summary = description or _doc_line(factory) or f"encoder from {factory.__module__}"
        module = getattr(factory, "__module__", None)
        ENCODERS.add(name, _plugin_builder(name, factory), description=summary, input=input, module=module)
        return factory

    return deco


def _plugin_builder(name: str, factory: PluginFactory) -> Callable[..., Encoder]:
    """Wrap a plugin factory into the registry's calling convention (keyword-only, returns an Encoder)."""
    own = list(inspect.signature(factory).parameters.values())[1:]  # the first one takes in_channels
    takes_shape = any(p.name == "input_shape" for p in own)

    def build(
        *,
        in_channels: int = 3,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        input_shape: tuple[int, int, int] | None = None,
        **kwargs: Any,
    ) -> Encoder:
        backbone = factory(in_channels, **kwargs, **({"input_shape": input_shape} if takes_shape else {}))
        dim = getattr(backbone, "out_dim", None) if isinstance(backbone, nn.Module) else None
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise UserError(
                f"encoder {name!r}: its factory must return an nn.Module with out_dim (the feature size) set"
            )
        encoder = Encoder(backbone, dim, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape)
        if input_shape is not None:
            materialize_lazy(encoder, input_shape)  # before an optimizer, EMA or copy sees the module
            _check_feature_shape(name, encoder, input_shape)
        return encoder

    wrapper = [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, default=None) for a in _WRAPPER_ARGS]
    kept = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind <= p.POSITIONAL_OR_KEYWORD else p
        for p in own
        if p.kind != p.VAR_POSITIONAL  # options are passed by name only
    ]
    params = wrapper + [p for p in kept if p.name not in _WRAPPER_ARGS]
    params.sort(key=lambda p: p.kind == inspect.Parameter.VAR_KEYWORD)  # **kwargs must come last
    build.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    build.__name__ = build.__qualname__ = name
    build.__doc__ = factory.__doc__
    return build


def materialize_lazy(module: nn.Module, input_shape: Sequence[int]) -> nn.Module:
    """Give lazy layers (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) their shapes, PyTorch's documented
    recipe: one dry forward, here on 2 blank images of ``input_shape`` (C, H, W) (the shapes are all a
    lazy layer infers). In eval mode and without gradient, so no BatchNorm statistic moves; the new
    weights are drawn from the global generator, as the layer's first forward would draw them. A no-op
    (nothing run) for a module without lazy parameters. Returns ``module``, materialised in place."""
    from torch.nn.parameter import is_lazy

    tensors = list(itertools.chain(module.parameters(), module.buffers()))
    if not any(is_lazy(t) for t in tensors):
        return module
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(2, *input_shape, device=tensors[0].device))
    finally:
        module.train(was_training)
    return module


def _check_feature_shape(name: str, encoder: Encoder, input_shape: tuple[int, int, int]) -> None:
    """A plugin's features must be (B, out_dim); checked on the meta device, so nothing is computed."""
    shape, _ = meta_output_shape(encoder.backbone, input_shape)
    if shape is not None and shape != (2, encoder.feature_dim):
        raise UserError(
            f"encoder {name!r} returns features of shape {shape} for 2 images of shape {input_shape}; "
            f"expected (2, {encoder.feature_dim}) (out_dim)"
        )


def _doc_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0].strip() if doc else ""


def meta_output_shape(
    module: nn.Module, input_shape: Sequence[int]
) -> tuple[tuple[int, ...] | None, BaseException | None]:
    """``(output shape, None)`` of ``module`` on 2 inputs of ``input_shape``, or ``(None, error)``.

    Runs on the meta device (``torch.func.functional_call`` with meta copies of the parameters and
    buffers): shapes are checked as on a real device, but no memory is used, nothing is computed,
    the module's state and the random generators are untouched.
    """
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    state = {k: torch.empty_like(v, device="meta") for k, v in tensors}
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    x = torch.empty(2, *input_shape, device="meta", dtype=dtype)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = torch.func.functional_call(module, state, (x,))
    except Exception as e:  # a shape the network cannot take (or an op without a meta kernel)
        return None, e
    return (tuple(out.shape), None) if isinstance(out, torch.Tensor) else (None, None)


# ============ timm backbones ============

TIMM_PREFIX = "timm:"
#: timm.create_model arguments the encoder sets itself
_TIMM_FIXED = ("num_classes", "in_chans", "pretrained", "pretrained_cfg_overlay", "features_only")
TIMM_INSTALL = "pip install 'robustbench-nacl[timm]'"


def _import_timm() -> Any:
    """timm, imported on first use: it is an optional dependency."""
    try:
        import timm
    except ImportError:
        raise UserError(f"timm encoders need the timm package: {TIMM_INSTALL}") from None
    return timm


def _timm_builder(name: str) -> Callable[..., Encoder]:
    """The factory of ``timm:MODEL``; an unknown model is a one-line error with the closest names."""
    model_name = name[len(TIMM_PREFIX) :]
    timm = _import_timm()
    if not model_name or not timm.is_model(model_name):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(TIMM_PREFIX + c) for c in close)}?)" if close else ""
        raise UserError(f"unknown timm model {model_name!r}{hint}; timm.list_models() lists them")

    def build(
        *,
        in_channels: int = 3,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        input_shape: tuple[int, int, int] | None = None,
        **kwargs: Any,
    ) -> Encoder:
        fixed = sorted(set(kwargs) & set(_TIMM_FIXED))
        if fixed:
            raise UserError(
                f"encoder {name!r} sets {', '.join(fixed)} itself (num_classes=0, in_chans=C, no download); "
                f"load pretrained weights as a foreign checkpoint with --arch {name}"
            )
        try:
            model = timm.create_model(
                model_name, num_classes=0, in_chans=in_channels, pretrained=False, **kwargs
            )
        except TypeError as e:
            raise UserError(f"encoder {name!r} does not take these options ({_first_line(e)})") from None
        return TimmEncoder(model, name, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape)

    build.__name__ = build.__qualname__ = model_name
    return build


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TimmEncoder(Encoder):
    """A timm network as an Encoder: ``timm.create_model(NAME, num_classes=0, in_chans=C, pretrained=False)``.

    ``backbone`` is the timm model itself, so a timm state dict loads into it under timm's own
    names. The feature size is what the network returns (``head_hidden_size`` or ``num_features``),
    measured on the meta device. An input size the network cannot take (8x8 digits are too small
    for most) is a one-line ``UserError`` naming the smallest square size that works: checked at
    construction when ``input_shape`` is known, otherwise when a forward fails (docs/decisions.md,
    'timm backbones').
    """

    def __init__(
        self,
        model: nn.Module,
        name: str,
        *,
        in_channels: int,
        mean: Sequence[float],
        std: Sequence[float],
        input_shape: tuple[int, int, int] | None,
    ) -> None:
        self._reference = _reference_size(model)
        shape, _ = meta_output_shape(model, (in_channels, self._reference, self._reference))
        fallback = getattr(model, "head_hidden_size", None) or model.num_features
        dim = shape[1] if shape is not None and len(shape) == 2 else fallback
        super().__init__(model, dim, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape)
        self.name = name
        if input_shape is not None:
            self.check_input_size(tuple(input_shape[1:]))

    def check_input_size(self, hw: tuple[int, ...]) -> None:
        """A one-line ``UserError`` when the network cannot take (H, W) inputs."""
        shape, err = meta_output_shape(self.backbone, (self.in_channels, *hw))
        message = self._size_message(hw, err) if shape is None else None
        if message:
            raise UserError(message)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return super().forward(x)
        except (RuntimeError, AssertionError, ValueError) as e:
            hw = tuple(x.shape[-2:])
            if meta_output_shape(self.backbone, (self.in_channels, *hw))[0] is not None:
                raise  # the size is fine: another problem, reported as it is
            message = self._size_message(hw, e)
            if message is None:
                raise
            raise UserError(message) from None

    def _size_message(self, hw: tuple[int, ...], err: BaseException | None) -> str | None:
        """Why (H, W) does not work and which sizes do; None when the meta probe cannot tell."""
        c, ref = self.in_channels, self._reference
        if meta_output_shape(self.backbone, (c, ref, ref))[0] is None:
            return None  # the probe cannot run this network at all: no claim about sizes
        limit = max(2 * ref, 2 * max(hw), 64)
        smallest, at_least = _smallest_sizes(self.backbone, c, max(hw), limit)
        cause = f" ({_first_line(err, 120)})" if err is not None else ""
        head = f"encoder {self.name!r} cannot take {'x'.join(map(str, hw))} inputs{cause}"
        if smallest is None:
            return f"{head}; no square size up to {limit} works either"
        larger = at_least not in (None, smallest)
        tail = f" (the smallest from {max(hw)} up: {at_least}x{at_least})" if larger else ""
        return f"{head}; the smallest square size it takes is {smallest}x{smallest}{tail}"

    def classifier_keys(self, state: Mapping[str, Any]) -> list[str]:
        """Keys of a timm state dict that belong to its classifier, which this backbone (num_classes=0) lacks.

        The classifier's module names come from timm's ``pretrained_cfg["classifier"]``; dropping
        these keys is to timm files what dropping ``fc.*`` is to torchvision ones.
        """
        names = getattr(self.backbone, "pretrained_cfg", {}).get("classifier") or ()
        names = (names,) if isinstance(names, str) else tuple(names)
        own = set(self.backbone.state_dict())
        return [k for k in state if k not in own and any(k.startswith(n + ".") for n in names)]

    def extra_repr(self) -> str:
        return f"{self.name}, " + super().extra_repr()


def _reference_size(model: nn.Module) -> int:
    """A size the network was designed for (timm's default input size), to measure its output."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = cfg.get("input_size") or (3, 224, 224)
    return int(max(size[1:]))


def _smallest_sizes(module: nn.Module, c: int, at_least: int, limit: int) -> tuple[int | None, int | None]:
    """(smallest square size that works, smallest one >= ``at_least``), trying sizes 1..limit upwards.

    Sizes are not monotone (a ViT takes multiples of its patch size), so every size is tried; each
    try is a meta-device forward (about 1 ms for a 12-block ViT).
    """
    smallest = None
    for s in range(1, limit + 1):
        if meta_output_shape(module, (c, s, s))[0] is None:
            continue
        smallest = smallest or s
        if s >= at_least:
            return smallest, s
    return smallest, None


def check_encoder(name: str) -> None:
    """A one-line ``UserError`` unless ``name`` is a registered encoder or an available ``timm:MODEL``."""
    _factory(name)


def _factory(name: str) -> Callable[..., Encoder]:
    if isinstance(name, str) and name.startswith(TIMM_PREFIX):
        return _timm_builder(name)
    try:
        return ENCODERS.get(name)
    except UserError as e:
        raise UserError(f"{e}; or timm:MODEL for a timm backbone") from None


def _check_input_shape(input_shape: Any, in_channels: int) -> tuple[int, int, int] | None:
    if input_shape is None:
        return None
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise UserError(f"input_shape must be (C, H, W), got {input_shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape!r}")
    if shape[0] != in_channels:
        raise UserError(f"input_shape {shape} has {shape[0]} channels but in_channels={in_channels}")
    return shape  # type: ignore[return-value]


def _check_options(name: str, factory: Callable[..., Encoder], kwargs: Mapping[str, Any]) -> None:
    params = inspect.signature(factory).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # the factory passes options on (timm.create_model): it reports unknown ones itself
    accepted = set(params) - set(_WRAPPER_ARGS)
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise UserError(
            f"encoder {name!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(accepted)) or 'none'}"
        )


def create_encoder(
    name: str,
    *,
    in_channels: int = 3,
    mean: Sequence[float] = (0.5,),
    std: Sequence[float] = (0.5,),
    dual_bn: bool = False,
    input_shape: tuple[int, int, int] | None = None,
    **kwargs: Any,
) -> Encoder:
    """Build the encoder ``name``: a registered one, or ``timm:MODEL`` (a timm network; timm is optional).

    Args:
        name: one of :func:`encoder_names`, or ``timm:MODEL`` for any ``timm.list_models()`` name.
        in_channels: image channels C.
        mean, std: per-channel normalisation (length 1 is broadcast to C); stored as buffers.
        dual_bn: replace every BatchNorm with a :class:`DualBatchNorm` (clean ``main`` + adversarial ``aux``).
        input_shape: (C, H, W) of the images; required by "mlp", optional elsewhere; C must equal in_channels.
        **kwargs: encoder options, e.g. ``width`` (ResNets, convnet_small), ``hidden``/``depth`` (mlp),
            or any ``timm.create_model`` option (``drop_path_rate``, ``img_size``, ...).

    Raises:
        UserError: unknown name or option, inconsistent shapes or normalisation, an input size the
            network cannot take, timm missing.
    """
    factory = _factory(name)
    in_channels = _check_positive_int(in_channels, "in_channels")
    input_shape = _check_input_shape(input_shape, in_channels)
    _check_options(name, factory, kwargs)
    encoder = factory(in_channels=in_channels, mean=mean, std=std, input_shape=input_shape, **kwargs)
    if dual_bn:
        convert_to_dual_bn(encoder)
    return encoder


# ============ projection heads ============


@HEADS.register(
    "clae",
    description="Linear(d,512)-ReLU-Linear(512,64): CLAE/NaCl projection head",
    hidden=512,
    out_dim=64,
)
def clae_head(in_dim: int, hidden: int = 512, out_dim: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))


@HEADS.register(
    "simclr",
    description="Linear(d,512,no bias)-BN1d-ReLU-Linear(512,128): HCL/DCL projection head",
    hidden=512,
    out_dim=128,
)
def simclr_head(in_dim: int, hidden: int = 512, out_dim: int = 128) -> nn.Module:
    return nn.Sequential(
        nn.Linear(in_dim, hidden, bias=False),
        nn.BatchNorm1d(hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, out_dim, bias=True),
    )


@HEADS.register("none", description="identity: the loss sees the encoder features", hidden=None, out_dim=None)
def identity_head(in_dim: int, hidden: int | None = None, out_dim: int | None = None) -> nn.Module:
    if hidden is not None or (out_dim is not None and out_dim != in_dim):
        raise UserError("projection head 'none' takes no hidden/out_dim options")
    return nn.Identity()


@HEADS.register(
    "linear",
    description="Linear(d, num_classes): the classifier of the supervised baseline (needs out_dim)",
    hidden=None,
    out_dim=None,
)
def linear_head(in_dim: int, hidden: int | None = None, out_dim: int | None = None) -> nn.Module:
    if out_dim is None:
        raise UserError("head 'linear' needs out_dim (the number of classes)")
    return nn.Linear(in_dim, out_dim)


def head_names() -> list[str]:
    """Registered projection-head names."""
    return HEADS.names()


def create_head(
    name: str,
    in_dim: int,
    *,
    hidden: int | None = None,
    out_dim: int | None = None,
    dual_bn: bool = False,
) -> nn.Module:
    """Build the registered projection head ``name`` on ``in_dim``-d features.

    ``hidden``/``out_dim`` default to the head's registered values (512/64 "clae", 512/128 "simclr").
    The returned module has an ``out_dim`` attribute. ``dual_bn`` converts its BatchNorms to
    :class:`DualBatchNorm`.
    """
    factory = HEADS.get(name)
    in_dim = _check_positive_int(in_dim, "in_dim")
    kwargs: dict[str, int] = {}
    if hidden is not None:
        kwargs["hidden"] = _check_positive_int(hidden, "hidden")
    if out_dim is not None:
        kwargs["out_dim"] = _check_positive_int(out_dim, "out_dim")
    head = factory(in_dim, **kwargs)
    head.out_dim = kwargs.get("out_dim") or HEADS.info(name)["out_dim"] or in_dim
    if dual_bn:
        head = convert_to_dual_bn(head)
    return head


class ContrastiveModel(nn.Module):
    """Encoder plus projection head: ``forward(x) = head(encoder(x))``, not L2-normalised (the loss does it).

    ``head`` is a module or a registered head name; with a name, ``hidden``/``out_dim`` are passed to
    :func:`create_head`, and ``dual_bn=None`` gives the head dual BatchNorm exactly when the encoder has it.
    Probing and attacks use ``model.encoder`` alone (the projection head is discarded).
    """

    def __init__(
        self,
        encoder: Encoder,
        head: nn.Module | str = "clae",
        *,
        hidden: int | None = None,
        out_dim: int | None = None,
        dual_bn: bool | None = None,
    ) -> None:
        super().__init__()
        if isinstance(head, str):
            if dual_bn is None:
                dual_bn = has_dual_bn(encoder)
            head = create_head(head, encoder.feature_dim, hidden=hidden, out_dim=out_dim, dual_bn=dual_bn)
        elif hidden is not None or out_dim is not None or dual_bn is not None:
            raise TypeError("hidden/out_dim/dual_bn only apply when head is given by name")
        self.encoder = encoder
        self.head = head
        self.feature_dim = encoder.feature_dim
        self.out_dim = int(getattr(head, "out_dim", encoder.feature_dim))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder features h (what the probe and the attacks see)."""
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))
