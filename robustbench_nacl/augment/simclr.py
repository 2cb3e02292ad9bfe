"""The SimCLR/CLAE augmentation policy used by NaCl (docs/decisions.md, 'Augmentation'):
RandomResizedCrop(input size, scale (0.08, 1), ratio (3/4, 4/3)), horizontal flip p=0.5,
ColorJitter(0.8s, 0.8s, 0.8s, 0.2s) with p=0.8 in a random per-sample op order, RandomGrayscale p=0.2,
no blur: :class:`SimCLRAug`, its per-sample parameters (:func:`sample_params`), :func:`apply` and
:func:`simclr_views`.

Random parameters are drawn **per sample** from an explicit ``torch.Generator`` (on the generator's
device), so a run is reproducible and resumable from the generator state. This avoids the
torchvision-v2-on-a-batch pitfall (one random draw for the whole batch: 64 identical inputs give 1
distinct view), which a test guards against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from ..errors import UserError
from .ops import (
    ALL_OPS,
    check_images,
    color_jitter,
    coord_dtype,
    pair,
    random_grayscale,
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
    area = float(height * width)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    # float64 for the size arithmetic, like torchvision's python floats (the draws themselves are float32).
    cd = coord_dtype(gen.device)
    target = area * (scale[0] + (scale[1] - scale[0]) * rand(gen, batch, 10).to(cd))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * rand(gen, batch, 10).to(cd))
    w = torch.round(torch.sqrt(target * aspect)).long()  # round-half-even, as python's round()
    h = torch.round(torch.sqrt(target / aspect)).long()
    valid = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = valid.to(torch.uint8).argmax(dim=1, keepdim=True)  # index of the first valid candidate
    found = valid.any(dim=1)
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)

    # torchvision's fallback: the central crop, clamped to the ratio range.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        fw, fh = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        fw, fh = round(height * max(ratio)), height
    else:
        fw, fh = width, height
    w = torch.where(found, w, torch.full_like(w, fw))
    h = torch.where(found, h, torch.full_like(h, fh))

    # uniform integer offsets in [0, H - h] and [0, W - w] (torch.randint's distribution)
    top = torch.floor(rand(gen, batch).to(cd) * (height - h + 1)).long()
    left = torch.floor(rand(gen, batch).to(cd) * (width - w + 1)).long()
    top = torch.minimum(top, height - h)  # guard against u*(n) rounding up to n
    left = torch.minimum(left, width - w)
    top = torch.where(found, top, (height - h) // 2)
    left = torch.where(found, left, (width - w) // 2)
    return top, left, h, w


def _jitter_range(value: float, center: float, lo_bound: float | None) -> tuple[float, float]:
    lo = center - value
    if lo_bound is not None:
        lo = max(lo_bound, lo)
    return lo, center + value


def sample_jitter(
    batch: int,
    jitter: tuple[float, float, float, float],
    gen: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(brightness, contrast, saturation, hue, order)`` per sample, as ``ColorJitter.get_params``.

    Brightness/contrast/saturation factors ~ U[max(0, 1 - v), 1 + v], hue ~ U[-h, h]; ``order`` is a
    uniformly random permutation of the four ops per sample, shape ``(batch, 4)``.
    """
    b, c, s, h = jitter
    order = rand(gen, batch, 4).argsort(dim=1)
    brightness = uniform(gen, batch, *_jitter_range(b, 1.0, 0.0))
    contrast = uniform(gen, batch, *_jitter_range(c, 1.0, 0.0))
    saturation = uniform(gen, batch, *_jitter_range(s, 1.0, 0.0))
    hue = uniform(gen, batch, *_jitter_range(h, 0.0, None))
    return brightness, contrast, saturation, hue, order


def _enabled_ops(jitter: tuple[float, float, float, float]) -> tuple[int, ...]:
    # torchvision turns an op off (None) when its range collapses onto the identity (value 0).
    return tuple(op for op, v in zip(ALL_OPS, jitter, strict=True) if v > 0)


def sample_params(cfg: SimCLRAug, batch: int, height: int, width: int, gen: torch.Generator) -> AugParams:
    """Draw per-sample parameters of one view for a batch of ``batch`` images of ``height x width``.

    All tensors are created on ``gen.device``; :func:`apply` moves them to the data's device if needed.
    The draws happen in a fixed order and do not depend on the data, so a generator state determines
    the parameters.
    """
    top, left, h, w = sample_crop_boxes(batch, height, width, cfg.scale, cfg.ratio, gen)
    flip = rand(gen, batch) < cfg.p_flip
    jit = rand(gen, batch) < cfg.p_jitter
    brightness, contrast, saturation, hue, order = sample_jitter(batch, cfg.jitter, gen)
    gray = rand(gen, batch) < cfg.p_gray
    size = (height, width) if cfg.size is None else pair(cfg.size)
    return AugParams(
        top=top,
        left=left,
        height=h,
        width=w,
        flip=flip,
        jitter=jit,
        brightness=brightness,
        contrast=contrast,
        saturation=saturation,
        hue=hue,
        order=order,
        gray=gray,
        size=size,
        jitter_ops=_enabled_ops(cfg.jitter),
    )


# --------------------------------------------------------------------------------------------------
# batched ops (per-sample parameters)


def apply(x: Tensor, params: AugParams) -> Tensor:
    """One view: crop + resize (+ flip), colour jitter in each sample's op order, grayscale.

    ``x``: float ``(B, C, H, W)`` in [0, 1]; the result has ``params.size`` and the same dtype/device.
    """
    check_images(x)
    if len(params) != x.shape[0]:
        raise ValueError(f"parameters for {len(params)} samples, batch has {x.shape[0]}")
    p = params.to(x.device)
    out = resized_crop(x, p.top, p.left, p.height, p.width, p.size, flip=p.flip)
    if p.jitter_ops:
        out = color_jitter(
            out, p.brightness, p.contrast, p.saturation, p.hue, p.order, mask=p.jitter, ops=p.jitter_ops
        )
    return random_grayscale(out, p.gray)


def simclr_views(x: Tensor, n_views: int, gen: torch.Generator, cfg: SimCLRAug | None = None) -> list[Tensor]:
    """``n_views`` independent SimCLR views of a batch (uint8 or float in [0, 1]), each with its own draws."""
    check_n_views(n_views)
    cfg = SimCLRAug() if cfg is None else cfg
    xf = to_float(x)
    check_images(xf)
    b, _, h, w = xf.shape
    return [apply(xf, sample_params(cfg, b, h, w, gen)) for _ in range(n_views)]


def check_n_views(n_views: int) -> None:
    if not isinstance(n_views, int) or n_views < 1:
        raise ValueError(f"n_views must be a positive int, got {n_views!r}")
