"""Batched, per-sample-random image augmentation as tensor ops (CPU or GPU, no per-sample loops).

Everything works on float tensors ``(B, C, H, W)`` in [0, 1] with ``C`` in {1, 3}, on whatever device
they live on. Random parameters are drawn **per sample** from an explicit ``torch.Generator`` (on the
generator's device), so a run is reproducible and resumable from the generator state. This avoids the
torchvision-v2-on-a-batch pitfall (one random draw for the whole batch: 64 identical inputs give 1
distinct view), which a test guards against.

Contents
--------
* The SimCLR/CLAE policy used by NaCl (docs/decisions.md, 'Augmentation'): RandomResizedCrop(input
  size, scale (0.08, 1), ratio (3/4, 4/3)), horizontal flip p=0.5, ColorJitter(0.8s, 0.8s, 0.8s,
  0.2s) with p=0.8 in a random per-sample op order, RandomGrayscale p=0.2, no blur:
  :class:`SimCLRAug`, :func:`sample_params`, :func:`apply`, :func:`simclr_views`. For given
  parameters the result equals torchvision's functional tensor ops applied sample by sample
  (``resized_crop(antialias=True)``, ``hflip``, ``adjust_*``, ``rgb_to_grayscale``) up to float
  rounding; ``tests/test_augment.py`` checks this.
* DACL positives (docs/decisions.md, 'DACL positives'): :func:`linear_mix`, :func:`geometric_mix`,
  :func:`binary_mix`, :func:`dacl_plus_mix`, :func:`gaussian_noise`, plus :func:`mix_with` (MIXNCA).
* :data:`VIEW_MAKERS`: name -> ``fn(x, n_views, gen, **params) -> list[Tensor]`` used by the trainer.
* :data:`SHIFTS`: the ArCL distribution-shift transformations Aug1..Aug5 (docs/decisions.md,
  'Settings').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError
from ..registry import Registry

__all__ = [
    "BRIGHTNESS",
    "CONTRAST",
    "GRAY_WEIGHTS",
    "HUE",
    "SATURATION",
    "SHIFTS",
    "VIEW_MAKERS",
    "AugParams",
    "SimCLRAug",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "apply",
    "binary_mix",
    "color_jitter",
    "dacl_plus_mix",
    "gaussian_noise",
    "geometric_mix",
    "hflip",
    "linear_mix",
    "mix_with",
    "random_grayscale",
    "random_partners",
    "resized_crop",
    "rgb_to_grayscale",
    "sample_crop_boxes",
    "sample_jitter",
    "sample_params",
    "simclr_views",
    "to_float",
]

#: ITU-R 601-2 luma weights, exactly as torchvision's ``rgb_to_grayscale`` (and PIL's "L" mode).
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)

#: Colour-jitter op ids, the same numbering as torchvision's ``ColorJitter.get_params`` ``fn_idx``.
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3
_ALL_OPS = (BRIGHTNESS, CONTRAST, SATURATION, HUE)


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
        if self.size is not None and min(_pair(self.size)) < 1:
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
    jitter_ops: tuple[int, ...] = _ALL_OPS

    def __len__(self) -> int:
        return int(self.top.shape[0])

    def to(self, device: torch.device | str) -> AugParams:
        """The same parameters with every tensor on ``device`` (no copy when already there)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, Tensor):
                kw[k] = v.to(device)
        return AugParams(**kw)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


def _rand(gen: torch.Generator, *shape: int) -> Tensor:
    """U[0, 1) float32 on the generator's device."""
    return torch.rand(shape, generator=gen, device=gen.device)


def _coord_dtype(device: torch.device) -> torch.dtype:
    """float64 for coordinate arithmetic, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def _uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> Tensor:
    """``n`` draws of U[lo, hi) (float32), computed like torchvision's ``uniform_(lo, hi)``."""
    return lo + (hi - lo) * _rand(gen, n)


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
    cd = _coord_dtype(gen.device)
    target = area * (scale[0] + (scale[1] - scale[0]) * _rand(gen, batch, 10).to(cd))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * _rand(gen, batch, 10).to(cd))
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
    top = torch.floor(_rand(gen, batch).to(cd) * (height - h + 1)).long()
    left = torch.floor(_rand(gen, batch).to(cd) * (width - w + 1)).long()
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
    order = _rand(gen, batch, 4).argsort(dim=1)
    brightness = _uniform(gen, batch, *_jitter_range(b, 1.0, 0.0))
    contrast = _uniform(gen, batch, *_jitter_range(c, 1.0, 0.0))
    saturation = _uniform(gen, batch, *_jitter_range(s, 1.0, 0.0))
    hue = _uniform(gen, batch, *_jitter_range(h, 0.0, None))
    return brightness, contrast, saturation, hue, order


def _enabled_ops(jitter: tuple[float, float, float, float]) -> tuple[int, ...]:
    # torchvision turns an op off (None) when its range collapses onto the identity (value 0).
    return tuple(op for op, v in zip(_ALL_OPS, jitter, strict=True) if v > 0)


def sample_params(cfg: SimCLRAug, batch: int, height: int, width: int, gen: torch.Generator) -> AugParams:
    """Draw per-sample parameters of one view for a batch of ``batch`` images of ``height x width``.

    All tensors are created on ``gen.device``; :func:`apply` moves them to the data's device if needed.
    The draws happen in a fixed order and do not depend on the data, so a generator state determines
    the parameters.
    """
    top, left, h, w = sample_crop_boxes(batch, height, width, cfg.scale, cfg.ratio, gen)
    flip = _rand(gen, batch) < cfg.p_flip
    jit = _rand(gen, batch) < cfg.p_jitter
    brightness, contrast, saturation, hue, order = sample_jitter(batch, cfg.jitter, gen)
    gray = _rand(gen, batch) < cfg.p_gray
    size = (height, width) if cfg.size is None else _pair(cfg.size)
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
# --------------------------------------------------------------------------------------------------


def _check_images(x: Tensor) -> None:
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images (B, C, H, W) with C in (1, 3), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got dtype {x.dtype} (use to_float)")


def _bcast(v: Tensor, x: Tensor) -> Tensor:
    """A per-sample ``(B,)`` tensor viewed as ``(B, 1, ..., 1)`` to broadcast against ``x``."""
    return v.to(device=x.device).reshape(-1, *([1] * (x.ndim - 1)))


def to_float(x: Tensor) -> Tensor:
    """uint8 images -> float32 in [0, 1] (``x / 255``, like ``convert_image_dtype``); floats pass through."""
    if x.dtype == torch.uint8:
        return x.to(torch.float32) / 255.0
    if x.is_floating_point():
        return x
    raise ValueError(f"expected uint8 or float images, got dtype {x.dtype}")


def resized_crop(
    x: Tensor,
    top: Tensor,
    left: Tensor,
    height: Tensor,
    width: Tensor,
    size: int | tuple[int, int],
    flip: Tensor | None = None,
) -> Tensor:
    """Crop box ``b`` out of image ``b`` and resize it to ``size`` (bilinear), optionally mirrored.

    Equals ``torchvision.transforms.functional.resized_crop(img, top, left, h, w, size, antialias=True)``
    (followed by ``hflip`` where ``flip``) per sample up to float rounding **when the crop is not larger
    than the output** -- always the case for the SimCLR policy, whose crops lie inside the image and are
    resized back to the image size. Why antialias does not matter then: for upsampling (scale
    ``in/out <= 1``) PyTorch's antialiased bilinear kernel has support ``max(scale, 1) = 1``, i.e. it is
    the plain triangle filter, and its border renormalisation equals plain bilinear's clamping of the
    source coordinate, so ``antialias=True`` and ``False`` give the same weights. For crops larger than
    the output this is plain (aliasing) bilinear, i.e. ``antialias=False``.

    Implementation: one ``grid_sample`` (``align_corners=False``) whose sampling points are PyTorch's
    bilinear source coordinates ``(i + 0.5) * h / out - 0.5`` clamped to ``[0, h - 1]`` **inside the crop
    box**, so neighbours outside the box (which exist in the full image) never leak in.
    """
    _check_images(x)
    b, _, ih, iw = x.shape
    oh, ow = _pair(size)
    dev = x.device
    cd = _coord_dtype(dev)
    top, left, height, width = (t.to(dev, cd) for t in (top, left, height, width))

    ys = (torch.arange(oh, device=dev, dtype=cd) + 0.5)[None] * (height / oh)[:, None] - 0.5
    xs = (torch.arange(ow, device=dev, dtype=cd) + 0.5)[None] * (width / ow)[:, None] - 0.5
    ys = torch.minimum(ys.clamp_min(0.0), (height - 1)[:, None])
    xs = torch.minimum(xs.clamp_min(0.0), (width - 1)[:, None])
    if flip is not None:
        xs = torch.where(flip.to(dev)[:, None], xs.flip(1), xs)
    # absolute pixel coordinates -> grid_sample's normalised coordinates (align_corners=False)
    gy = ((2.0 * (top[:, None] + ys) + 1.0) / ih - 1.0).to(x.dtype)
    gx = ((2.0 * (left[:, None] + xs) + 1.0) / iw - 1.0).to(x.dtype)
    grid = torch.stack((gx[:, None, :].expand(b, oh, ow), gy[:, :, None].expand(b, oh, ow)), dim=-1)
    # "border" only matters for float-rounding overshoot at the image edge (points are inside the image).
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def hflip(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mirror left-right the samples where ``mask`` (all samples when ``mask`` is None)."""
    if mask is None:
        return x.flip(-1)
    return torch.where(_bcast(mask, x), x.flip(-1), x)


def rgb_to_grayscale(x: Tensor) -> Tensor:
    """``(B, 1, H, W)`` luma, ``0.2989 R + 0.587 G + 0.114 B`` (torchvision's formula and evaluation order).

    For 1-channel input this is the input itself (torchvision returns a clone).
    """
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(dim=1)
    wr, wg, wb = GRAY_WEIGHTS
    return (wr * r + wg * g + wb * b).unsqueeze(1)


def _select(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``a`` for the samples where ``mask``, ``b`` elsewhere, for finite values.

    Exact (``a * 1 + b * 0 = a``) and on CPU ~2x faster than ``torch.where`` with a broadcast mask.
    """
    m = _bcast(mask.to(a.dtype), a)
    return a * m + b * (1.0 - m)


def random_grayscale(x: Tensor, mask: Tensor) -> Tensor:
    """Replace the samples where ``mask`` by their grayscale image repeated over 3 channels (C=1: no-op)."""
    if x.shape[1] == 1:
        return x
    return _select(mask, rgb_to_grayscale(x), x)


def _blend(img: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    """torchvision's ``_blend`` with a per-sample ratio: ``(r * img + (1 - r) * other).clamp(0, 1)``."""
    r = _bcast(ratio.to(img.dtype), img)
    out = r * img
    out += (1.0 - r) * other  # in place: the same roundings as ``r * img + (1 - r) * other``
    return out.clamp_(0.0, 1.0)


def adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``torchvision.transforms.functional.adjust_brightness`` (blend with black)."""
    return _blend(x, torch.zeros_like(x), factor)


def _gray_mean(x: Tensor) -> Tensor:
    return rgb_to_grayscale(x).mean(dim=(1, 2, 3), keepdim=True)


def adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_contrast``: blend with the mean of each sample's grayscale image."""
    return _blend(x, _gray_mean(x), factor)


def adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_saturation``: blend with the grayscale image (1-channel: no-op, as torchvision)."""
    if x.shape[1] == 1:
        return x
    return _blend(x, rgb_to_grayscale(x), factor)


def _is_zero(d: Tensor) -> Tensor:
    """Float 0/1 indicator of ``d == 0`` for ``d >= 0`` (``1 - sign(d)``; exact, and on CPU several times
    faster than a bool comparison followed by a float product or ``torch.where``)."""
    return 1.0 - torch.sign(d)


def _rgb2hsv(img: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # torchvision's ``_functional_tensor._rgb2hsv`` (channel dim = 1) with bit-identical results; its bool
    # masks and ``where``s are written as products with exact 0/1 floats (x * 1 = x, x * 0 = +-0 and
    # adding +-0 is exact; every value here is finite), and amax/amin replace torch.max/min(dim).values.
    r, g, b = img.unbind(dim=1)
    maxc = torch.amax(img, dim=1)
    minc = torch.amin(img, dim=1)
    cr = maxc - minc
    eqc = _is_zero(cr)  # maxc == minc
    # torchvision divides by 1 where eqc (then cr = 0); maxc + 1 is just as good there (maxc >= 0)
    s = cr / (maxc + eqc)
    cr_divisor = cr + eqc
    dr, dg, db = maxc - r, maxc - g, maxc - b
    rc = dr / cr_divisor
    gc = dg / cr_divisor
    bc = db / cr_divisor
    is_r = _is_zero(dr)  # maxc == r
    is_g = (1.0 - is_r) * _is_zero(dg)  # maxc == g and maxc != r
    is_b = (1.0 - is_r) - is_g  # maxc != g and maxc != r
    h = is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc)
    h = torch.fmod((h / 6.0 + 1.0), 1.0)
    return h, s, maxc  # (h, s, v), unstacked to save copies


def _sextant(i: Tensor, k: int) -> Tensor:
    return torch.clamp_min(1.0 - (i - k).abs(), 0.0)  # 1.0 where the integer-valued i == k, else 0.0


def _hsv2rgb(h: Tensor, s: Tensor, v: Tensor) -> Tensor:
    # torchvision's ``_hsv2rgb`` with bit-identical results. Its one-hot einsum over the 6 sextants adds
    # exact zeros to the selected value; here the one-hot weights are exact 0/1 floats as well.
    i = torch.floor(h * 6.0)
    f = (h * 6.0) - i
    p = torch.clamp((v * (1.0 - s)), 0.0, 1.0)
    q = torch.clamp((v * (1.0 - s * f)), 0.0, 1.0)
    t = torch.clamp((v * (1.0 - s * (1.0 - f))), 0.0, 1.0)
    # i is in {0, ..., 6}; torchvision takes i % 6, so 6 (h rounded up to 1.0) is sextant 0
    e1, e2, e3, e4, e5 = (_sextant(i, k) for k in range(1, 6))
    e0 = 1.0 - ((((e1 + e2) + e3) + e4) + e5)
    # sextant -> (R, G, B): 0 (v,t,p) 1 (q,v,p) 2 (p,v,t) 3 (p,q,v) 4 (t,p,v) 5 (v,p,q)
    red = v * (e0 + e5) + p * (e2 + e3) + q * e1 + t * e4
    green = v * (e1 + e2) + p * (e4 + e5) + t * e0 + q * e3
    blue = v * (e3 + e4) + p * (e0 + e1) + t * e2 + q * e5
    return torch.stack((red, green, blue), dim=1)


def adjust_hue(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_hue`` (rgb -> hsv, shift h by ``factor`` mod 1, -> rgb); 1-channel: no-op."""
    if x.shape[1] == 1:
        return x
    h, s, v = _rgb2hsv(x)
    h = (h + _bcast(factor.to(x.dtype), h)) % 1.0
    return _hsv2rgb(h, s, v)


def _use_subsets(x: Tensor) -> bool:
    """Whether to run masked ops on the selected samples only (index + copy) instead of on all (where).

    On CPU computing only the selected samples saves work (hue is the expensive op); on GPU boolean
    indexing costs a host sync per op, while computing all samples and selecting is sync-free. Both
    give the same values (tested).
    """
    return x.device.type == "cpu"


def _masked_(x: Tensor, sel: Tensor, fn: Callable[[Tensor, Tensor], Tensor], factor: Tensor) -> Tensor:
    """``fn(x, factor)`` on the samples where ``sel``, ``x`` elsewhere; may write into ``x`` (owned)."""
    if _use_subsets(x):
        idx = sel.nonzero().squeeze(1)
        if idx.numel() == 0:
            return x
        if idx.numel() == x.shape[0]:
            return fn(x, factor)
        x[idx] = fn(x[idx], factor[idx])
        return x
    return torch.where(_bcast(sel, x), fn(x, factor), x)


def color_jitter(
    x: Tensor,
    brightness: Tensor,
    contrast: Tensor,
    saturation: Tensor,
    hue: Tensor,
    order: Tensor,
    mask: Tensor | None = None,
    ops: Sequence[int] = _ALL_OPS,
) -> Tensor:
    """Per-sample ``ColorJitter``: sample ``b`` applies the ops in ``order[b]`` with its own factors.

    ``mask`` (``(B,)`` bool) selects the samples that are jittered at all; ``ops`` the enabled ops. For
    1-channel images saturation and hue are no-ops (torchvision's behaviour), brightness/contrast apply.
    Brightness, contrast and saturation are all ``_blend(img, target, factor)`` with target black, the
    grayscale mean, or the grayscale image; at each of the 4 positions they are done as one blend with a
    per-sample target, which gives exactly the values of the separate ops (samples not blended at a
    position get ratio 1, i.e. ``clamp(x, 0, 1)``, which is ``x`` for inputs in [0, 1]).
    """
    _check_images(x)
    dev = x.device
    order = order.to(dev)
    factors = torch.stack((brightness, contrast, saturation), dim=1).to(dev, x.dtype)  # (B, 3)
    if mask is None:
        mask = torch.ones(x.shape[0], dtype=torch.bool, device=dev)
    mask = mask.to(dev)
    ops = tuple(op for op in ops if x.shape[1] == 3 or op in (BRIGHTNESS, CONTRAST))
    blend_ops = tuple(op for op in ops if op != HUE)
    one = torch.ones_like(brightness, dtype=x.dtype, device=dev)
    if HUE in ops and not blend_ops:
        x = x.clone()  # the hue step writes into x; every blend returns a new tensor
    for pos in range(4):
        op = order[:, pos]
        if blend_ops:
            # one blend for all three ops: per sample ratio r and target (0, mean gray, or gray image);
            # samples without a blend here get r = 1 (1 * x + 0 * target = x, exactly)
            is_op = [(mask & (op == k)).to(x.dtype) for k in (BRIGHTNESS, CONTRAST, SATURATION)]
            active = sum(is_op[k] for k in blend_ops)
            ratio = sum(is_op[k] * factors[:, k] for k in blend_ops) + (one - active)
            gray = rgb_to_grayscale(x)
            target = 0.0
            if CONTRAST in blend_ops:
                target = _bcast(is_op[CONTRAST], x) * gray.mean(dim=(1, 2, 3), keepdim=True)
            if SATURATION in blend_ops:
                target = target + _bcast(is_op[SATURATION], x) * gray
            x = _blend(x, target, ratio)
        if HUE in ops:
            x = _masked_(x, mask & (op == HUE), adjust_hue, hue.to(dev))
    return x


def apply(x: Tensor, params: AugParams) -> Tensor:
    """One view: crop + resize (+ flip), colour jitter in each sample's op order, grayscale.

    ``x``: float ``(B, C, H, W)`` in [0, 1]; the result has ``params.size`` and the same dtype/device.
    """
    _check_images(x)
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
    _check_n_views(n_views)
    cfg = SimCLRAug() if cfg is None else cfg
    xf = to_float(x)
    _check_images(xf)
    b, _, h, w = xf.shape
    return [apply(xf, sample_params(cfg, b, h, w, gen)) for _ in range(n_views)]


def _check_n_views(n_views: int) -> None:
    if not isinstance(n_views, int) or n_views < 1:
        raise ValueError(f"n_views must be a positive int, got {n_views!r}")


# --------------------------------------------------------------------------------------------------
# DACL positives: mix every sample with a random *other* sample of the batch
# --------------------------------------------------------------------------------------------------


def random_partners(batch: int, gen: torch.Generator) -> Tensor:
    """``(batch,)`` int64 partners with ``partner[i] != i``: ``(i + U{1..B-1}) mod B``, on gen's device."""
    if batch < 2:
        raise ValueError(f"mixing needs a batch of at least 2 samples (a partner != self), got {batch}")
    shift = torch.randint(1, batch, (batch,), generator=gen, device=gen.device)
    return (torch.arange(batch, device=gen.device) + shift) % batch


def _partners(x: Tensor, gen: torch.Generator) -> Tensor:
    return x[random_partners(x.shape[0], gen).to(x.device)]


def _check_unit(name: str, v: float) -> None:
    if not 0.0 <= float(v) <= 1.0:
        raise UserError(f"{name} must be in [0, 1], got {v}")


def _lambdas(x: Tensor, gen: torch.Generator, alpha: float) -> Tensor:
    _check_unit("mix alpha", alpha)
    return _uniform(gen, x.shape[0], float(alpha), 1.0).to(x.device, x.dtype)


def mix_with(x: Tensor, partners_x: Tensor, lam: float | Tensor) -> Tensor:
    """Linear mixing ``lam * x + (1 - lam) * partners_x``; ``lam`` a float or a per-sample ``(B,)`` tensor.

    Works for any ``(B, ...)`` shape (images or feature vectors). Used for MIXNCA (fixed ``lam``).
    """
    if partners_x.shape != x.shape:
        raise ValueError(f"partners shape {tuple(partners_x.shape)} != {tuple(x.shape)}")
    if isinstance(lam, Tensor) and lam.ndim == 1:
        lam = _bcast(lam.to(x.dtype), x)
    return lam * x + (1.0 - lam) * partners_x


def linear_mix(x: Tensor, gen: torch.Generator, alpha: float) -> Tensor:
    """Linear-Mixup positive ``lam x + (1 - lam) x~``, ``lam ~ U(alpha, 1)`` per sample, partner != self."""
    return mix_with(x, _partners(x, gen), _lambdas(x, gen, alpha))


def _geometric(x: Tensor, xp: Tensor, lam: Tensor) -> Tensor:
    lam = _bcast(lam, x)
    return x.pow(lam) * xp.pow(1.0 - lam)


def _check_nonneg(x: Tensor) -> None:
    if bool((x < 0).any()):
        raise ValueError(
            "geometric mixing needs non-negative inputs ([0, 1] pixels); shift/scale features first"
        )


def geometric_mix(x: Tensor, gen: torch.Generator, alpha: float, *, checked: bool = False) -> Tensor:
    """Geometric-Mixup positive ``x^lam * x~^(1 - lam)``, ``lam ~ U(alpha, 1)``; needs ``x >= 0``.

    Geometric mixing does not commute with normalisation, so apply it to [0, 1] pixels; negative inputs
    would give NaNs and raise ``ValueError``. ``checked=True``: the caller has established ``x >= 0``
    (the check reads a value back from the device: a host sync).
    """
    if not checked:
        _check_nonneg(x)
    return _geometric(x, _partners(x, gen), _lambdas(x, gen, alpha))


#: How ``rho`` reads in Binary-Mixup: "from_partner" (default: the fraction of values taken from the
#: partner) or "keep" (DACL as printed: m ~ Bernoulli(rho) keeps the anchor's own values).
RHO_MODES = ("from_partner", "keep")


def _binary_mask(x: Tensor, gen: torch.Generator, rho: float, mode: str = "from_partner") -> Tensor:
    """True where a value comes from the partner."""
    _check_unit("mix rho", rho)
    if mode not in RHO_MODES:
        raise ValueError(f"mix_rho_mode must be one of {RHO_MODES}, got {mode!r}")
    take = float(rho) if mode == "from_partner" else 1.0 - float(rho)
    return (torch.rand(x.shape, generator=gen, device=gen.device) < take).to(x.device)


def binary_mix(x: Tensor, gen: torch.Generator, rho: float, mode: str = "from_partner") -> Tensor:
    """Binary-Mixup positive: every feature (pixel value) is taken from the partner with probability ``rho``.

    ``mode="from_partner"`` (default): ``rho`` is the fraction swapped in from the partner, so small
    ``rho`` keeps the positive close to the anchor; ``mode="keep"``: DACL as printed, ``rho`` is the
    probability of keeping the anchor's value (docs/decisions.md, 'DACL positives').
    """
    xp = _partners(x, gen)
    return torch.where(_binary_mask(x, gen, rho, mode), xp, x)


def dacl_plus_mix(
    x: Tensor,
    gen: torch.Generator,
    alpha: float,
    rho: float,
    choice: Tensor | None = None,
    mode: str = "from_partner",
    *,
    checked: bool = False,
) -> Tensor:
    """DACL+ positive: per sample one of {linear, geometric, binary} mixing (0, 1, 2), chosen at random.

    ``choice`` (``(B,)`` int) fixes the per-sample choice; the ``dacl_plus`` view maker draws it once and
    passes it to every view ("use it for both positives"). One partner, lambda and mask per call.
    ``checked``: as in :func:`geometric_mix`.
    """
    if not checked:
        _check_nonneg(x)
    b = x.shape[0]
    if choice is None:
        choice = torch.randint(0, 3, (b,), generator=gen, device=gen.device)
    xp = _partners(x, gen)
    lam = _lambdas(x, gen, alpha)
    mask = _binary_mask(x, gen, rho, mode)
    c = _bcast(choice.to(x.device), x)
    lin = mix_with(x, xp, lam)
    geo = _geometric(x, xp, lam)
    binary = torch.where(mask, xp, x)
    return torch.where(c == 0, lin, torch.where(c == 1, geo, binary))


def gaussian_noise(x: Tensor, gen: torch.Generator, scale: float) -> Tensor:
    """DACL's Gaussian baseline ``x + scale * N(0, I)``: the listed "mean" is the scale.

    See docs/decisions.md, 'DACL positives'.

    Not clamped to [0, 1]: DACL defines it as additive isotropic noise (on tabular features it has no
    range to clamp to); clamping would make the noise non-Gaussian and biased towards the image interior
    (at scale 0.3-0.5 most dark/bright pixels would saturate). Encoders normalise internally and accept
    any real input, so the positives are simply unbounded.
    """
    if float(scale) < 0:
        raise UserError(f"noise scale must be >= 0, got {scale}")
    noise = torch.randn(x.shape, generator=gen, device=gen.device, dtype=torch.float32)
    return x + float(scale) * noise.to(x.device, x.dtype)


# --------------------------------------------------------------------------------------------------
# view makers: name -> fn(x, n_views, gen, **params) -> list of n_views tensors shaped like x
# --------------------------------------------------------------------------------------------------

ViewMaker = Callable[..., list[Tensor]]

#: The trainer calls ``VIEW_MAKERS.get(name)(x, n_views, gen, **params)``; unknown params are ignored so
#: presets can pass one common dict. Info: ``params`` (the keys it reads), ``bounded`` (outputs in [0, 1]).
VIEW_MAKERS: Registry[ViewMaker] = Registry("view maker")


@VIEW_MAKERS.register("simclr", params=("strength", "scale_min"), bounded=True)
def _simclr_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, strength: float = 1.0, scale_min: float = 0.08, **_: Any
) -> list[Tensor]:
    """SimCLR/CLAE views: crop, flip, ColorJitter(0.8s, 0.8s, 0.8s, 0.2s) p=0.8, grayscale p=0.2."""
    cfg = SimCLRAug(strength=float(strength), scale=(float(scale_min), 1.0))
    return simclr_views(x, n_views, gen, cfg)


@VIEW_MAKERS.register("acl", params=("aug_strength",), bounded=True)
def _acl_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, aug_strength: float = 1.0, **_: Any
) -> list[Tensor]:
    """ACL/DynACL views at strength s: crop (1 - 0.9s, 1), flip, jitter (0.4s..0.1s) p=0.8s, gray p=0.2s."""
    s = float(aug_strength)
    if not 0.0 <= s <= 1.0:
        raise UserError(f"aug_strength={s}; must lie in [0, 1]")
    # ACL train_simCLR.py (strength 1.0) and DynACL train_DynACL.py reload(strength): one policy
    cfg = SimCLRAug(strength=0.5 * s, scale=(1.0 - 0.9 * s, 1.0), p_jitter=0.8 * s, p_gray=0.2 * s)
    return simclr_views(x, n_views, gen, cfg)


@VIEW_MAKERS.register("crop_flip", params=("scale_min",), bounded=True)
def _crop_flip_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, scale_min: float = 0.08, **_: Any
) -> list[Tensor]:
    """RandomResizedCrop + horizontal flip only (the supervised baseline's augmentation)."""
    cfg = SimCLRAug(scale=(float(scale_min), 1.0), strength=0.0, p_jitter=0.0, p_gray=0.0)
    return simclr_views(x, n_views, gen, cfg)


def pad_crop(x: Tensor, gen: torch.Generator, padding: int) -> Tensor:
    """``RandomCrop(size, padding)`` per sample: zero-pad by ``padding``, crop the input's size back
    at a uniform offset (torchvision's zero fill), batched with one gather."""
    b, _, h, w = x.shape
    xp = F.pad(x, (padding, padding, padding, padding))
    dev = x.device
    top = torch.randint(0, 2 * padding + 1, (b,), generator=gen, device=gen.device).to(dev)
    left = torch.randint(0, 2 * padding + 1, (b,), generator=gen, device=gen.device).to(dev)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, None, :, None]  # (B, 1, H, 1)
    cols = (left[:, None] + torch.arange(w, device=dev))[:, None, None, :]  # (B, 1, 1, W)
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(x.shape[1], device=dev)[None, :, None, None]
    return xp[bi, ci, rows, cols]


@VIEW_MAKERS.register("pad_crop_flip", params=(), bounded=True)
def _pad_crop_flip_maker(x: Tensor, n_views: int, gen: torch.Generator, /, **_: Any) -> list[Tensor]:
    """DeACL's weak view: RandomCrop(size, padding=size/8) (4 px at 32 px) + horizontal flip p=0.5."""
    _check_n_views(n_views)
    xf = to_float(x)
    _check_images(xf)
    pad = max(1, round(xf.shape[-1] / 8))
    out = []
    for _ in range(n_views):
        v = pad_crop(xf, gen, pad)
        out.append(hflip(v, _rand(gen, v.shape[0]) < 0.5))
    return out


def _float_views(x: Tensor, n_views: int) -> Tensor:
    _check_n_views(n_views)
    xf = to_float(x)
    if xf.ndim < 2:
        raise ValueError(f"expected a batch (B, ...), got shape {tuple(xf.shape)}")
    return xf


def _nonneg_views(x: Tensor, n_views: int) -> Tensor:
    """``_float_views``, checked non-negative once per call; uint8 images (the trainer's) are by their
    type, so the check, a host sync, is skipped for them."""
    xf = _float_views(x, n_views)
    if x.dtype != torch.uint8:
        _check_nonneg(xf)
    return xf


@VIEW_MAKERS.register("identity", params=(), bounded=True)
def _identity_maker(x: Tensor, n_views: int, gen: torch.Generator, /, **_: Any) -> list[Tensor]:
    """``n_views`` copies of the raw images as float (no randomness)."""
    xf = _float_views(x, n_views)
    return [xf.clone() for _ in range(n_views)]


@VIEW_MAKERS.register("dacl", params=("mix_alpha",), bounded=True)
def _dacl_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, mix_alpha: float = 0.9, **_: Any
) -> list[Tensor]:
    """Each view a Linear-Mixup of the raw image with its own partner and lambda (DACL Algorithm 1)."""
    xf = _float_views(x, n_views)
    return [linear_mix(xf, gen, mix_alpha) for _ in range(n_views)]


@VIEW_MAKERS.register("dacl_geometric", params=("mix_alpha",), bounded=True)
def _dacl_geometric_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, mix_alpha: float = 0.9, **_: Any
) -> list[Tensor]:
    """Each view a Geometric-Mixup of the raw image (lambda ~ U(mix_alpha, 1))."""
    xf = _nonneg_views(x, n_views)
    return [geometric_mix(xf, gen, mix_alpha, checked=True) for _ in range(n_views)]


@VIEW_MAKERS.register("dacl_binary", params=("mix_rho", "mix_rho_mode"), bounded=True)
def _dacl_binary_maker(
    x: Tensor,
    n_views: int,
    gen: torch.Generator,
    /,
    mix_rho: float = 0.1,
    mix_rho_mode: str = "from_partner",
    **_: Any,
) -> list[Tensor]:
    """Each view a Binary-Mixup of the raw image (a fraction ``mix_rho`` of values from the partner)."""
    xf = _float_views(x, n_views)
    return [binary_mix(xf, gen, mix_rho, mix_rho_mode) for _ in range(n_views)]


@VIEW_MAKERS.register("dacl_plus", params=("mix_alpha", "mix_rho", "mix_rho_mode"), bounded=True)
def _dacl_plus_maker(
    x: Tensor,
    n_views: int,
    gen: torch.Generator,
    /,
    mix_alpha: float = 0.9,
    mix_rho: float = 0.1,
    mix_rho_mode: str = "from_partner",
    **_: Any,
) -> list[Tensor]:
    """DACL+: one mixing type per sample (shared by its views), fresh partner/lambda/mask per view."""
    xf = _nonneg_views(x, n_views)
    choice = torch.randint(0, 3, (xf.shape[0],), generator=gen, device=gen.device)
    return [
        dacl_plus_mix(xf, gen, mix_alpha, mix_rho, choice=choice, mode=mix_rho_mode, checked=True)
        for _ in range(n_views)
    ]


@VIEW_MAKERS.register("gaussian", params=("noise_scale",), bounded=False)
def _gaussian_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, noise_scale: float = 0.05, **_: Any
) -> list[Tensor]:
    """Each view ``x + noise_scale * N(0, I)`` (unclamped; see :func:`gaussian_noise`)."""
    xf = _float_views(x, n_views)
    return [gaussian_noise(xf, gen, noise_scale) for _ in range(n_views)]


# --------------------------------------------------------------------------------------------------
# ArCL distribution shifts (Aug1..Aug5): fn(x float (N, C, H, W) in [0, 1], gen)
# --------------------------------------------------------------------------------------------------

Shift = Callable[[Tensor, torch.Generator], Tensor]

#: ArCL's modified test sets; data.py applies them chunk by chunk. Parameters are not given by ArCL
#: (DECISION: SimCLR defaults): crop = RandomResizedCrop(scale (0.08, 1), ratio (3/4, 4/3)) resized back,
#: flip = RandomHorizontalFlip(p=0.5) (torchvision's default; p=1 would be a deterministic mirror),
#: jitter = ColorJitter(0.4, 0.4, 0.4, 0.1) always applied (SimCLR-CIFAR strengths; p=1 because the
#: shift is "ColorJitter", not SimCLR's RandomApply(p=0.8)), grayscale deterministic (C=1: no-op).
SHIFTS: Registry[Shift] = Registry("distribution shift")

_SHIFT_JITTER = SimCLRAug(strength=0.5).jitter  # (0.4, 0.4, 0.4, 0.1)


def _check_shift_input(x: Tensor) -> None:
    _check_images(x)


@SHIFTS.register("grayscale", arcl="Aug1")
def _shift_grayscale(x: Tensor, gen: torch.Generator) -> Tensor:
    """Deterministic grayscale, 3 equal channels (1-channel input: unchanged copy)."""
    _check_shift_input(x)
    if x.shape[1] == 1:
        return x.clone()
    return rgb_to_grayscale(x).expand_as(x).contiguous()


@SHIFTS.register("crop", arcl="Aug2")
def _shift_crop(x: Tensor, gen: torch.Generator) -> Tensor:
    """RandomResizedCrop (SimCLR crop distribution), resized back to the input size."""
    _check_shift_input(x)
    n, _, h, w = x.shape
    cfg = SimCLRAug()
    top, left, ch, cw = sample_crop_boxes(n, h, w, cfg.scale, cfg.ratio, gen)
    return resized_crop(x, top, left, ch, cw, (h, w))


@SHIFTS.register("flip", arcl="Aug3")
def _shift_flip(x: Tensor, gen: torch.Generator) -> Tensor:
    """RandomHorizontalFlip(p=0.5), per sample."""
    _check_shift_input(x)
    return hflip(x, _rand(gen, x.shape[0]) < 0.5)


def _jitter_always(x: Tensor, gen: torch.Generator) -> Tensor:
    b, c, s, h, order = sample_jitter(x.shape[0], _SHIFT_JITTER, gen)
    return color_jitter(x, b, c, s, h, order)


@SHIFTS.register("jitter", arcl="Aug4")
def _shift_jitter(x: Tensor, gen: torch.Generator) -> Tensor:
    """ColorJitter(0.4, 0.4, 0.4, 0.1), always applied, random op order per sample."""
    _check_shift_input(x)
    return _jitter_always(x, gen)


@SHIFTS.register("grayscale+jitter", arcl="Aug5")
def _shift_grayscale_jitter(x: Tensor, gen: torch.Generator) -> Tensor:
    """Grayscale, then ColorJitter(0.4, 0.4, 0.4, 0.1) (in the name's order; channels stay equal)."""
    return _jitter_always(_shift_grayscale(x, gen), gen)
