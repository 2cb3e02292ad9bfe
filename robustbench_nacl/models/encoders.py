"""Encoders: the :class:`Encoder` wrapper, the registry :data:`ENCODERS` with the built-in encoders
(ResNets, convnet_small, mlp), and encoders registered by plugins (:func:`register_encoder`).

Contract: an encoder is an ``nn.Module`` from images in [0,1] of shape (B, C, H, W) to features h of
shape (B, feature_dim). Input normalisation lives inside it as the persistent buffers ``mean`` and
``std`` (shape (1, C, 1, 1)), so attacks, epsilon, clamping and mixing are all in pixel space and a
checkpoint carries its own normalisation (docs/decisions.md, 'The attacked model'). The linear probe
and every attack use this un-normalised h; the projection head is only for the contrastive loss.

The network proper sits under ``encoder.backbone``. The ResNets reproduce torchvision's parameter and
buffer names exactly (``conv1.weight``, ``layer1.0.downsample.1.running_mean``, ...), so a torchvision
state dict without ``fc.*`` loads into ``encoder.backbone`` with ``strict=True``. Built by name with
:func:`robustbench_nacl.models.factory.create_encoder`; heads, dual BatchNorm and timm backbones live in
``heads``, ``dual_bn`` and ``timm_encoder``.
"""

from __future__ import annotations

import inspect
import itertools
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from ..registry import Registry
from .resnet import BasicBlock, Bottleneck, ResNetBackbone, conv3x3, init_weights

__all__ = [
    "ENCODERS",
    "Encoder",
    "encoder_names",
    "materialize_lazy",
    "meta_output_shape",
    "register_encoder",
]

ENCODERS: Registry[Callable[..., Encoder]] = Registry("encoder")


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


# ============ registered encoders ============


def check_positive_int(value: Any, what: str) -> int:
    """``value`` itself when it is a positive int (not a bool); a one-line error naming ``what`` otherwise."""
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
    width = check_positive_int(width, "width")
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
    return [conv3x3(cin, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


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
    w = check_positive_int(width, "width")
    backbone = nn.Sequential(
        *_conv_bn_relu(in_channels, w),
        *_conv_bn_relu(w, 2 * w),
        nn.MaxPool2d(2),
        *_conv_bn_relu(2 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
    )
    init_weights(backbone)
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
    hidden = check_positive_int(hidden, "hidden")
    depth = check_positive_int(depth, "depth")
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
WRAPPER_ARGS = ("in_channels", "mean", "std", "input_shape")
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

    wrapper = [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, default=None) for a in WRAPPER_ARGS]
    kept = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind <= p.POSITIONAL_OR_KEYWORD else p
        for p in own
        if p.kind != p.VAR_POSITIONAL  # options are passed by name only
    ]
    params = wrapper + [p for p in kept if p.name not in WRAPPER_ARGS]
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
