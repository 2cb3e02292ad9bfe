"""The SimCLR/CLAE augmentation policy used by NaCl (docs/decisions.md, 'Augmentation'):
RandomResizedCrop(input size, scale (0.08, 1), ratio (3/4, 4/3)), horizontal flip p=0.5,
ColorJitter(0.8s, 0.8s, 0.8s, 0.2s) with p=0.8 in a random per-sample op order, RandomGrayscale p=0.2,
no blur: :class:`SimCLRAug`, its per-sample parameters (:func:`sample_params`), :func:`apply` and
:func:`simclr_views`.

Random parameters are drawn **per sample** from an explicit ``torch.Generator`` (on the generator's
device), so a run is reproducible and resumable from the generator state. This avoids the
torchvision-v2-on-a-batch pitfall (one random draw for the whole batch: 64 identical inputs give 1
distinct view), which a test guards against. :func:`simclr_views` makes every view's draws in turn
(the generator calls of one view at a time) and then computes all the views as one batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from ..errors import UserError
from .ops import (
    ALL_OPS,
    check_images,
    color_jitter_,
    const,
    coord_dtype,
    pair,
    random_grayscale_,
    resized_crop,
    to_float,
)

# --------------------------------------------------------------------------------------------------
# configuration and per-sample parameters
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimCLRAug:
    """The SimCLR/CLAE augmentation policy (NaCl's recipe with the defaults; no blur).

    ``size`` is the output size (``None``: the input's size, the policy's setting). The colour jitter
    is ``ColorJitter(0.8*strength, 0.8*strength, 0.8*strength, 0.2*strength)``; ``strength=0.5`` gives
    the common SimCLR-CIFAR ``(0.4, 0.4, 0.4, 0.1)``.
    """

    size: int | tuple[int, int] | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    strength: float = 1.0
    p_flip: float = 0.5
    p_jitter: float = 0.8
    p_gray: float = 0.2

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if not 0.0 < lo <= hi <= 1.0:
            raise UserError(f"crop scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        rlo, rhi = self.ratio
        if not 0.0 < rlo <= rhi:
            raise UserError(f"crop ratio must satisfy 0 < min <= max, got {self.ratio}")
        if not 0.0 <= self.strength <= 2.5:  # hue = 0.2*strength must stay within torchvision's [0, 0.5]
            raise UserError(f"colour-jitter strength must be in [0, 2.5], got {self.strength}")
        for name in ("p_flip", "p_jitter", "p_gray"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise UserError(f"{name} must be a probability in [0, 1], got {p}")
        if self.size is not None and min(pair(self.size)) < 1:
            raise UserError(f"output size must be positive, got {self.size}")

    @property
    def jitter(self) -> tuple[float, float, float, float]:
        """``(brightness, contrast, saturation, hue)`` strengths, as passed to ``ColorJitter``."""
        s = float(self.strength)
        return (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)


@dataclass
class AugParams:
    """Per-sample parameters of one SimCLR view of a batch of ``B`` images (all tensors have length B).

    ``order[b, k]`` is the jitter op (``BRIGHTNESS``..``HUE``) sample ``b`` applies at position ``k``, as
    torchvision's ``fn_idx``. ``jitter_ops`` lists the ops the policy enables at all (torchvision skips an op
    whose range is degenerate, e.g. strength 0); ``size`` is the output ``(height, width)``.
    """

    top: Tensor  # (B,) int64
    left: Tensor  # (B,) int64
    height: Tensor  # (B,) int64, crop height
    width: Tensor  # (B,) int64, crop width
    flip: Tensor  # (B,) bool
    jitter: Tensor  # (B,) bool: colour jitter applied at all
    brightness: Tensor  # (B,) float32 factor
    contrast: Tensor  # (B,) float32 factor
    saturation: Tensor  # (B,) float32 factor
    hue: Tensor  # (B,) float32 shift in [-0.5, 0.5]
    order: Tensor  # (B, 4) int64 permutation of the 4 jitter ops
    gray: Tensor  # (B,) bool
    size: tuple[int, int]
    jitter_ops: tuple[int, ...] = ALL_OPS

    def __len__(self) -> int:
        return int(self.top.shape[0])

    def to(self, device: torch.device | str) -> AugParams:
        """The same parameters with every tensor on ``device`` (no copy when already there)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, Tensor):
                kw[k] = v.to(device)
        return AugParams(**kw)


def rand(gen: torch.Generator, *shape: int) -> Tensor:
    """U[0, 1) float32 on the generator's device."""
    return torch.rand(shape, generator=gen, device=gen.device)


def uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> Tensor:
    """``n`` draws of U[lo, hi) (float32), computed like torchvision's ``uniform_(lo, hi)``."""
    return lo + (hi - lo) * rand(gen, n)


def _draw_crop(batch: int, gen: torch.Generator) -> list[Tensor]:
    """:func:`sample_crop_boxes`' draws, in the generator's order: area fractions and log aspect ratios
    of 10 candidates each ``(batch, 10)``, then the top and left offsets ``(batch,)``."""
    return [rand(gen, batch, 10), rand(gen, batch, 10), rand(gen, batch), rand(gen, batch)]


def _crop_boxes(
    draws: Sequence[Tensor], height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(top, left, h, w)`` from :func:`_draw_crop`'s draws, of any batch (:func:`sample_crop_boxes`)."""
    u_area, u_aspect, u_top, u_left = draws
    dev = u_area.device
    area = float(height * width)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    # float64 for the size arithmetic, like torchvision's python floats (the draws themselves are float32).
    cd = coord_dtype(dev)
    target = area * (scale[0] + (scale[1] - scale[0]) * u_area.to(cd))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u_aspect.to(cd))
    # (h, w) of every candidate, (batch, 2, 10); round-half-even, as python's round()
    hw = torch.round(torch.sqrt(torch.stack((target / aspect, target * aspect), dim=1))).long()
    limit = const((height, width), dev, torch.int64)
    valid = ((hw > 0) & (hw <= limit[:, None])).all(dim=1)
    first = valid.to(torch.uint8).argmax(dim=1)  # index of the first valid candidate
    found = valid.any(dim=1, keepdim=True)
    hw = hw.gather(2, first[:, None, None].expand(-1, 2, 1)).squeeze(2)  # (batch, 2)

    # torchvision's fallback: the central crop, clamped to the ratio range.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        fw, fh = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        fw, fh = round(height * max(ratio)), height
    else:
        fw, fh = width, height
    hw = torch.where(found, hw, const((fh, fw), dev, torch.int64))

    # uniform integer offsets in [0, H - h] and [0, W - w] (torch.randint's distribution)
    room = limit - hw
    offsets = torch.floor(torch.stack((u_top, u_left), dim=1).to(cd) * (room + 1)).long()
    offsets = torch.minimum(offsets, room)  # guard against u*(n) rounding up to n
    offsets = torch.where(found, offsets, room // 2)
    top, left = offsets.unbind(dim=1)
    h, w = hw.unbind(dim=1)
    return top, left, h, w


def sample_crop_boxes(
    batch: int,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    gen: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(top, left, h, w)`` int64 tensors of shape ``(batch,)``: RandomResizedCrop boxes.

    Vectorised ``torchvision.transforms.RandomResizedCrop.get_params``: every sample draws 10 candidates
    (area fraction ~ U(scale), log aspect ratio ~ U(log ratio), ``w = round(sqrt(A*r))``,
    ``h = round(sqrt(A/r))``), keeps the first one that fits, and falls back to the central crop
    clamped to ``ratio`` when none does; the position is then uniform over the valid offsets.
    """
    return _crop_boxes(_draw_crop(batch, gen), height, width, scale, ratio)


def _jitter_range(value: float, center: float, lo_bound: float | None) -> tuple[float, float]:
    lo = center - value
    if lo_bound is not None:
        lo = max(lo_bound, lo)
    return lo, center + value


def _draw_jitter(batch: int, gen: torch.Generator) -> list[Tensor]:
    """:func:`sample_jitter`'s draws, in the generator's order: the op order's keys ``(batch, 4)``, then
    the brightness, contrast, saturation and hue factors ``(batch,)``."""
    return [rand(gen, batch, 4), *(rand(gen, batch) for _ in range(4))]


def _jitter_params(
    draws: Sequence[Tensor], jitter: tuple[float, float, float, float]
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`sample_jitter`'s result from :func:`_draw_jitter`'s draws (any batch size)."""
    u_order, *u_factors = draws
    b, c, s, h = jitter
    ranges = (_jitter_range(b, 1.0, 0.0), _jitter_range(c, 1.0, 0.0), _jitter_range(s, 1.0, 0.0))
    ranges += (_jitter_range(h, 0.0, None),)
    dev = u_order.device
    # lo + (hi - lo) * u per column, as :func:`uniform` (the kernels round the python scalars to float32)
    lo = const(tuple(r[0] for r in ranges), dev, torch.float32)
    span = const(tuple(r[1] - r[0] for r in ranges), dev, torch.float32)
    brightness, contrast, saturation, hue = (lo + span * torch.stack(u_factors, dim=1)).unbind(dim=1)
    return brightness, contrast, saturation, hue, u_order.argsort(dim=1)


def sample_jitter(
    batch: int,
    jitter: tuple[float, float, float, float],
    gen: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(brightness, contrast, saturation, hue, order)`` per sample, as ``ColorJitter.get_params``.

    Brightness/contrast/saturation factors ~ U[max(0, 1 - v), 1 + v], hue ~ U[-h, h]; ``order`` is a
    uniformly random permutation of the four ops per sample, shape ``(batch, 4)``.
    """
    return _jitter_params(_draw_jitter(batch, gen), jitter)


def _enabled_ops(jitter: tuple[float, float, float, float]) -> tuple[int, ...]:
    # torchvision turns an op off (None) when its range collapses onto the identity (value 0).
    return tuple(op for op, v in zip(ALL_OPS, jitter, strict=True) if v > 0)


def _draw_view(batch: int, gen: torch.Generator) -> list[Tensor]:
    """Every draw of one view, in the generator's order: crop, flip, jitter applied, jitter, grayscale."""
    crop = _draw_crop(batch, gen)
    flip, jitter = rand(gen, batch), rand(gen, batch)
    return [*crop, flip, jitter, *_draw_jitter(batch, gen), rand(gen, batch)]


def _params(cfg: SimCLRAug, draws: Sequence[Tensor], height: int, width: int) -> AugParams:
    """:class:`AugParams` from :func:`_draw_view`'s draws (of one view, or of several concatenated)."""
    crop, (u_flip, u_jitter), jitter, u_gray = draws[:4], draws[4:6], draws[6:11], draws[11]
    top, left, h, w = _crop_boxes(crop, height, width, cfg.scale, cfg.ratio)
    brightness, contrast, saturation, hue, order = _jitter_params(jitter, cfg.jitter)
    return AugParams(
        top=top,
        left=left,
        height=h,
        width=w,
        flip=u_flip < cfg.p_flip,
        jitter=u_jitter < cfg.p_jitter,
        brightness=brightness,
        contrast=contrast,
        saturation=saturation,
        hue=hue,
        order=order,
        gray=u_gray < cfg.p_gray,
        size=(height, width) if cfg.size is None else pair(cfg.size),
        jitter_ops=_enabled_ops(cfg.jitter),
    )


def sample_params(cfg: SimCLRAug, batch: int, height: int, width: int, gen: torch.Generator) -> AugParams:
    """Draw per-sample parameters of one view for a batch of ``batch`` images of ``height x width``.

    All tensors are created on ``gen.device``; :func:`apply` moves them to the data's device if needed.
    The draws happen in a fixed order and do not depend on the data, so a generator state determines
    the parameters.
    """
    return _params(cfg, _draw_view(batch, gen), height, width)


# --------------------------------------------------------------------------------------------------
# batched ops (per-sample parameters)


def apply(x: Tensor, params: AugParams) -> Tensor:
    """One view: crop + resize (+ flip), colour jitter in each sample's op order, grayscale.

    ``x``: float ``(B, C, H, W)`` in [0, 1]; the result has ``params.size`` and the same dtype/device.
    """
    check_images(x)
    p = _checked(params, x)
    return _jitter_gray_(resized_crop(x, p.top, p.left, p.height, p.width, p.size, flip=p.flip), p, gray=True)


def _checked(params: AugParams, x: Tensor) -> AugParams:
    if len(params) != x.shape[0]:
        raise ValueError(f"parameters for {len(params)} samples, batch has {x.shape[0]}")
    return params.to(x.device)


def _jitter_gray_(out: Tensor, p: AugParams, *, gray: bool) -> Tensor:
    """The colour jitter and the grayscale step written into ``out`` (the crop, the caller's own
    tensor); ``gray=False`` skips the grayscale (a policy with ``p_gray = 0``, whose mask is all False:
    the same values)."""
    if p.jitter_ops:
        out = color_jitter_(
            out, p.brightness, p.contrast, p.saturation, p.hue, p.order, p.jitter, p.jitter_ops, owned=True
        )
    return random_grayscale_(out, p.gray) if gray else out


def simclr_views(x: Tensor, n_views: int, gen: torch.Generator, cfg: SimCLRAug | None = None) -> list[Tensor]:
    """``n_views`` independent SimCLR views of a batch (uint8 or float in [0, 1]), each with its own draws."""
    check_n_views(n_views)
    cfg = SimCLRAug() if cfg is None else cfg
    check_images(x if x.dtype == torch.uint8 else to_float(x), uint8=True)  # (to_float's dtype error)
    b, _, h, w = x.shape
    # The views' draws in the generator's order (view after view, as one view at a time would make
    # them), then one batch of n_views * B samples: the same values, a fixed number of ops per call.
    per_view = [_draw_view(b, gen) for _ in range(n_views)]
    draws = per_view[0] if n_views == 1 else [torch.cat(d) for d in zip(*per_view, strict=True)]
    xs = x.repeat(n_views, 1, 1, 1) if n_views > 1 else x
    p = _checked(_params(cfg, draws, h, w), xs)
    # the float copy of the input lives only during the crop (less memory held by the jitter)
    out = resized_crop(to_float(xs), p.top, p.left, p.height, p.width, p.size, flip=p.flip)
    return list(_jitter_gray_(out, p, gray=cfg.p_gray > 0).chunk(n_views))


def check_n_views(n_views: int) -> None:
    if not isinstance(n_views, int) or n_views < 1:
        raise ValueError(f"n_views must be a positive int, got {n_views!r}")
