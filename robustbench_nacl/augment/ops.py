"""Batched image ops with per-sample parameters, as tensor ops on any device: crop and resize, flip,
grayscale and the colour-jitter ops, equal to torchvision's functional tensor ops applied sample by
sample (``resized_crop(antialias=True)``, ``hflip``, ``adjust_*``, ``rgb_to_grayscale``) up to float
rounding; ``tests/test_augment.py`` checks this."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)

#: Colour-jitter op ids, the same numbering as torchvision's ``ColorJitter.get_params`` ``fn_idx``.
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3
ALL_OPS = (BRIGHTNESS, CONTRAST, SATURATION, HUE)


def pair(size: int | Sequence[int]) -> tuple[int, int]:
    """``(height, width)`` from one size or two."""
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


def coord_dtype(device: torch.device) -> torch.dtype:
    """float64 for coordinate arithmetic, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def check_images(x: Tensor) -> None:
    """A ValueError unless ``x`` is float images (B, C, H, W) with C in (1, 3)."""
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images (B, C, H, W) with C in (1, 3), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got dtype {x.dtype} (use to_float)")


def bcast(v: Tensor, x: Tensor) -> Tensor:
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
    check_images(x)
    b, _, ih, iw = x.shape
    oh, ow = pair(size)
    dev = x.device
    cd = coord_dtype(dev)
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
    return torch.where(bcast(mask, x), x.flip(-1), x)


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
    m = bcast(mask.to(a.dtype), a)
    return a * m + b * (1.0 - m)


def random_grayscale(x: Tensor, mask: Tensor) -> Tensor:
    """Replace the samples where ``mask`` by their grayscale image repeated over 3 channels (C=1: no-op)."""
    if x.shape[1] == 1:
        return x
    return _select(mask, rgb_to_grayscale(x), x)


def _blend(img: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    """torchvision's ``_blend`` with a per-sample ratio: ``(r * img + (1 - r) * other).clamp(0, 1)``."""
    r = bcast(ratio.to(img.dtype), img)
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
    h = (h + bcast(factor.to(x.dtype), h)) % 1.0
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
    return torch.where(bcast(sel, x), fn(x, factor), x)


def color_jitter(
    x: Tensor,
    brightness: Tensor,
    contrast: Tensor,
    saturation: Tensor,
    hue: Tensor,
    order: Tensor,
    mask: Tensor | None = None,
    ops: Sequence[int] = ALL_OPS,
) -> Tensor:
    """Per-sample ``ColorJitter``: sample ``b`` applies the ops in ``order[b]`` with its own factors.

    ``mask`` (``(B,)`` bool) selects the samples that are jittered at all; ``ops`` the enabled ops. For
    1-channel images saturation and hue are no-ops (torchvision's behaviour), brightness/contrast apply.
    Brightness, contrast and saturation are all ``_blend(img, target, factor)`` with target black, the
    grayscale mean, or the grayscale image; at each of the 4 positions they are done as one blend with a
    per-sample target, which gives exactly the values of the separate ops (samples not blended at a
    position get ratio 1, i.e. ``clamp(x, 0, 1)``, which is ``x`` for inputs in [0, 1]).
    """
    check_images(x)
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
                target = bcast(is_op[CONTRAST], x) * gray.mean(dim=(1, 2, 3), keepdim=True)
            if SATURATION in blend_ops:
                target = target + bcast(is_op[SATURATION], x) * gray
            x = _blend(x, target, ratio)
        if HUE in ops:
            x = _masked_(x, mask & (op == HUE), adjust_hue, hue.to(dev))
    return x
