"""Building an encoder by name (:func:`create_encoder`): a registered one or ``timm:MODEL``, with its
options, input shape and dual BatchNorm checked and applied."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import UserError
from .dual_bn import convert_to_dual_bn
from .encoders import ENCODERS, WRAPPER_ARGS, Encoder, check_positive_int
from .timm_encoder import TIMM_PREFIX, timm_builder


def check_encoder(name: str) -> None:
    """A one-line ``UserError`` unless ``name`` is a registered encoder or an available ``timm:MODEL``."""
    _factory(name)


def _factory(name: str) -> Callable[..., Encoder]:
    if isinstance(name, str) and name.startswith(TIMM_PREFIX):
        return timm_builder(name)
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
    accepted = set(params) - set(WRAPPER_ARGS)
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
    in_channels = check_positive_int(in_channels, "in_channels")
    input_shape = _check_input_shape(input_shape, in_channels)
    _check_options(name, factory, kwargs)
    encoder = factory(in_channels=in_channels, mean=mean, std=std, input_shape=input_shape, **kwargs)
    if dual_bn:
        convert_to_dual_bn(encoder)
    return encoder
