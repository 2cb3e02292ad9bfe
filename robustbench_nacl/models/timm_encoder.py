"""timm backbones as encoders: ``timm:MODEL`` names any ``timm.list_models()`` network (timm is an
optional dependency), wrapped so that an input size it cannot take is a one-line error naming the
sizes that work (docs/decisions.md, 'timm backbones')."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UserError, one_line
from .encoders import Encoder, meta_output_shape

TIMM_PREFIX = "timm:"
#: timm.create_model arguments the encoder sets itself
_TIMM_FIXED = ("num_classes", "in_chans", "pretrained", "pretrained_cfg_overlay", "features_only")
TIMM_INSTALL = "pip install 'robustbench-nacl[timm]'"


def _message(e: BaseException, limit: int = 200) -> str:
    """An exception's message on one line (its class name when empty), bounded."""
    return one_line(e, limit) or type(e).__name__


def _import_timm() -> Any:
    """timm, imported on first use: it is an optional dependency."""
    try:
        import timm
    except ImportError:
        raise UserError(f"timm encoders need the timm package: {TIMM_INSTALL}") from None
    return timm


def timm_builder(name: str) -> Callable[..., Encoder]:
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
            raise UserError(f"encoder {name!r} does not take these options ({_message(e)})") from None
        return TimmEncoder(model, name, in_channels=in_channels, mean=mean, std=std, input_shape=input_shape)

    build.__name__ = build.__qualname__ = model_name
    return build


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
        cause = f" ({_message(err, 120)})" if err is not None else ""
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
