"""Batched image ops with per-sample parameters, as tensor ops on any device: crop and resize, flip,
grayscale and the colour-jitter ops, equal to torchvision's functional tensor ops applied sample by
sample (``resized_crop(antialias=True)``, ``hflip``, ``adjust_*``, ``rgb_to_grayscale``) up to float
rounding; ``tests/test_augment.py`` checks this.

Every op here runs as a fixed, small number of tensor ops whatever the batch size (no per-sample or
per-permutation Python loops, no boolean indexing): a views call is a few hundred ATen ops, which is
what bounds it on a GPU (kernel launches) and a large part of it on a CPU (dispatch overhead);
``bench/view_ops.py`` counts them. The colour jitter gives bit for bit the values of the previous
per-op implementation (every input), and of torchvision's ops (inputs in [0, 1]);
``tests/test_view_ops.py`` checks the former.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)

#: Colour-jitter op ids, the same numbering as torchvision's ``ColorJitter.get_params`` ``fn_idx``.
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3
ALL_OPS = (BRIGHTNESS, CONTRAST, SATURATION, HUE)

#: hsv -> rgb: channel c of sextant i takes the value of sextant ``(i + offset_c) mod 6`` of the red
#: channel (torchvision's table: red v q p p t v, green t v v q p p, blue p p t v v q).
_HSV_OFFSETS = (0.0, 4.0, 2.0)


def pair(size: int | Sequence[int]) -> tuple[int, int]:
    """``(height, width)`` from one size or two."""
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


def coord_dtype(device: torch.device) -> torch.dtype:
    """float64 for coordinate arithmetic, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


@functools.lru_cache(maxsize=256)
def const(values: tuple, device: torch.device, dtype: torch.dtype, shape: tuple[int, ...] = (-1,)) -> Tensor:
    """A small constant tensor of ``shape``, made once per device and dtype: no host-to-device copy
    and no op per batch. Made as a plain tensor whatever mode is active (not an inference tensor, not
    one of a tracing or counting mode's), so that the cached one may be used anywhere."""
    with torch.inference_mode(False), _disable_current_modes():
        return torch.tensor(values, dtype=dtype, device=device).reshape(shape)


def check_images(x: Tensor, *, uint8: bool = False) -> None:
    """A ValueError unless ``x`` is float images (B, C, H, W) with C in (1, 3) (``uint8``: or uint8 ones)."""
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images (B, C, H, W) with C in (1, 3), got shape {tuple(x.shape)}")
    if not x.is_floating_point() and not (uint8 and x.dtype == torch.uint8):
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
    box**, so neighbours outside the box (which exist in the full image) never leak in. Rows and
    columns are computed together, as a ``(B, 2, max(out))`` tensor of (y, x) coordinates.
    """
    check_images(x)
    b, _, ih, iw = x.shape
    oh, ow = pair(size)
    dev = x.device
    cd = coord_dtype(dev)
    n = max(oh, ow)
    # (B, 2, 2, 1): (top, left) and (height, width), as (y, x) pairs
    start, extent = torch.stack((top, left, height, width), dim=1).to(dev, cd).view(-1, 2, 2, 1).unbind(1)
    # (i + 0.5) * (extent / out) - 0.5, clamped to [0, extent - 1]; then absolute pixel coordinates ->
    # grid_sample's normalised coordinates (align_corners=False): (2 * (start + c) + 1) / in - 1
    centres = const(tuple(i + 0.5 for i in range(n)), dev, cd)
    c = centres * (extent / const((oh, ow), dev, cd, (2, 1))) - 0.5
    c = torch.minimum(c.clamp_min_(0.0), extent - 1)
    g = ((2.0 * (start + c) + 1.0) / const((ih, iw), dev, cd, (2, 1)) - 1.0).to(x.dtype)
    gy, gx = g[:, 0, :oh], g[:, 1, :ow]
    if flip is not None:
        gx = torch.where(flip.to(dev)[:, None], gx.flip(1), gx)
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
    weighted = x * const(GRAY_WEIGHTS, x.device, x.dtype, (3, 1, 1))
    if x.dtype in (torch.float32, torch.float64):
        # the sum over the 3 channels accumulates them in order, in the images' own precision
        return weighted.sum(dim=1, keepdim=True)
    r, g, b = weighted.unbind(dim=1)  # lower precisions: every partial sum rounded, as torchvision
    return ((r + g) + b).unsqueeze(1)


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


def random_grayscale_(x: Tensor, mask: Tensor) -> Tensor:
    """:func:`random_grayscale` written into ``x`` (the same values: ``x (1 - m) + gray m``)."""
    if x.shape[1] == 1:
        return x
    m = bcast(mask.to(x.dtype), x)
    gray = rgb_to_grayscale(x)
    x.mul_(1.0 - m)
    return x.add_(gray.mul_(m))


def _blend(img: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    """torchvision's ``_blend`` with a per-sample ratio ``(B, 1, 1, 1)``: ``(r img + (1 - r) other)``
    clamped to [0, 1]; the same roundings as torchvision's two products and one sum."""
    out = ratio * img
    out += (1.0 - ratio) * other
    return out.clamp_(0.0, 1.0)


def adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``torchvision.transforms.functional.adjust_brightness`` (blend with black)."""
    return _blend(x, torch.zeros_like(x), bcast(factor.to(x.dtype), x))


def adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_contrast``: blend with the mean of each sample's grayscale image."""
    mean = rgb_to_grayscale(x).mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, bcast(factor.to(x.dtype), x))


def adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_saturation``: blend with the grayscale image (1-channel: no-op, as torchvision)."""
    if x.shape[1] == 1:
        return x
    return _blend(x, rgb_to_grayscale(x), bcast(factor.to(x.dtype), x))


def _rgb2hsv(img: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # torchvision's ``_functional_tensor._rgb2hsv`` (channel dim = 1) with bit-identical results, as
    # ``(B, 1, H, W)`` tensors (h, s, v). Its bool masks and ``where``s are written as products with
    # exact 0/1 floats (x * 1 = x, x * 0 = +-0 and adding +-0 is exact; every value here is finite).
    # Temporaries are updated in place (same roundings): on a CPU, fresh pages cost as much as the math.
    maxc = torch.amax(img, dim=1, keepdim=True)
    cr = maxc - torch.amin(img, dim=1, keepdim=True)
    eqc = 1.0 - torch.sign(cr)  # maxc == minc
    # torchvision divides by 1 where eqc (then cr = 0); maxc + 1 is just as good there (maxc >= 0)
    s = cr / (maxc + eqc)
    d = maxc - img
    not_r, is_g = torch.sign(d[:, :2]).unbind(dim=1)  # maxc != r, maxc != g (d >= 0)
    rc, gc, bc = d.div_(cr.add_(eqc)).unbind(dim=1)
    is_r = 1.0 - not_r
    is_g.mul_(-1.0).add_(1.0).mul_(not_r)  # maxc == g and maxc != r: (1 - (maxc != g)) * not_r
    is_b = not_r.sub_(is_g)  # maxc != g and maxc != r
    h = (bc - gc).mul_(is_r)
    h += ((rc + 2.0) - bc).mul_(is_g)
    h += ((gc + 4.0) - rc).mul_(is_b)
    # torchvision's fmod(h / 6 + 1, 1): its argument lies in [5/6, 11/6], where frac is the same
    return h.div_(6.0).add_(1.0).frac_().unsqueeze(1), s, maxc


def _hsv2rgb(h: Tensor, s: Tensor, v: Tensor) -> Tensor:
    # torchvision's ``_hsv2rgb`` with bit-identical results for v in [0, 1]. Each output channel is one
    # of v, p = v(1 - s), q = v(1 - s f), t = v(1 - s(1 - f)) (p, q, t clamped to [0, 1]), i.e.
    # clamp(v (1 - s k)) with k one of 0, 1, f, 1 - f: k is computed per channel from the channel's
    # sextant j (0..5) as clamp(min(f + (j - 1), (5 - j) - f), 0, 1), which is exactly f at j = 1,
    # 1 - f at j = 4 (torchvision's own ``1.0 - f``), and 0 or 1 elsewhere. ``h`` is overwritten.
    # (-x + c is c - x exactly; products and sums commute exactly.)
    h6 = h.mul_(6.0)
    i = torch.floor(h6)  # 0..6; torchvision takes i % 6
    f = h6.sub_(i)
    j = i + const(_HSV_OFFSETS, h.device, h.dtype, (3, 1, 1))  # (B, 3, H, W), 0..10
    j -= (j - 5.0).clamp_(0.0, 1.0).mul_(6.0)  # mod 6, j being integral
    k = (j - 1.0).add_(f)
    k = torch.minimum(k, j.mul_(-1.0).add_(5.0).sub_(f), out=k).clamp_(0.0, 1.0)
    return k.mul_(s).mul_(-1.0).add_(1.0).mul_(v).clamp_(0.0, 1.0)


def adjust_hue(x: Tensor, factor: Tensor) -> Tensor:
    """Per-sample ``adjust_hue`` (rgb -> hsv, shift h by ``factor`` mod 1, -> rgb); 1-channel: no-op.

    Bit-identical to torchvision's for images in [0, 1] (tested).
    """
    if x.shape[1] == 1:
        return x
    h, s, v = _rgb2hsv(x)
    h += bcast(factor.to(x.dtype), h)
    # torch.remainder(h, 1.0) for h in [-0.5, 1.5) (its fmod is exact, then + 1 where negative)
    return _hsv2rgb(h.sub_(torch.floor(h)), s, v)


def _use_slices(x: Tensor) -> bool:
    """Whether :func:`color_jitter` runs each blend slot and the hue on the samples that need it only,
    sorted so that they form contiguous slices (CPU), or on the whole batch (other devices).

    On a CPU the work saved is most of the cost (with hue, a sample idles in half the slots); finding
    the slices reads a few counts back to the host, which on a GPU would be a sync per batch, while
    computing every sample there costs no extra kernel launch. Both give the same values (tested).
    """
    return x.device.type == "cpu"


def _blend_schedule(
    order: Tensor, mask: Tensor, blend_ops: tuple[int, ...], hue: bool
) -> tuple[Tensor, Tensor | None]:
    """Which blend each sample does in each slot, ``(B, slots, nb)`` bool, and the number of blends
    each sample does before its hue, ``q`` (``(B, 1)``; None without hue).

    Each sample applies its ``nb = len(blend_ops)`` blends in its own order, and (``hue``) the hue once,
    somewhere among them. The batch runs ``nb`` slots, the hue, then ``nb`` more slots (without hue:
    ``nb`` slots). A sample with ``q`` blends before its hue does them in the first ``q`` slots, and the
    others in the first slots after the hue. So a sample idles in a slot only after a blend or before
    a hue that comes first: an idle slot's blend (ratio 1, then the clamp to [0, 1]) then changes no
    value but the clamp before a leading hue, which the previous implementation made as well.
    """
    nb, dev = len(blend_ops), order.device
    pos = order.argsort(dim=1)  # pos[b, op]: the position of op in sample b's order
    bpos = pos.index_select(1, const(blend_ops, dev, torch.int64))  # (B, nb)
    rank = bpos.argsort(dim=1).argsort(dim=1)  # rank[b, k]: blend_ops[k] is sample b's rank-th blend
    if hue:
        before = (bpos < pos[:, HUE : HUE + 1]).sum(dim=1, keepdim=True)  # q
        # slot s < nb holds blend s if s < q; slot nb + s holds blend q + s if q + s < nb
        pre, post = ((1,) * nb + (0,) * nb, (0,) * nb + (1,) * nb)
        i64 = torch.int64
        blend = const((*range(nb), *range(nb)), dev, i64) + before * const(post, dev, i64)
        limit = before * const(pre, dev, i64) + const(tuple(nb * p for p in post), dev, i64)
        idle = (blend >= limit) | ~mask[:, None]
    else:
        before = None
        blend = const(tuple(range(nb)), dev, torch.int64).expand(len(order), nb)
        idle = ~mask[:, None]
    blend = blend.masked_fill(idle, -1)  # -1: no blend (no rank matches)
    return rank[:, None, :] == blend[:, :, None], before


def _slot_params(chosen: Tensor, factors: Tensor, blend_ops: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """``(slots, 3, B, 1, 1, 1)``: per slot and sample the ratio ``r`` (the blend's factor, or 1 when
    idle) and the weights ``1 - r`` of the grayscale image's mean (contrast) and of the grayscale
    image (saturation) in the blend, each ``1 - r`` or exactly 0."""
    onehot = chosen.to(dtype)
    ratio = (onehot * factors[:, None, :]).sum(dim=2) + (1.0 - onehot.sum(dim=2))
    zero = torch.zeros_like(ratio)
    is_op = dict(zip(blend_ops, onehot.unbind(dim=2), strict=True))
    one_minus = 1.0 - ratio
    weights = [is_op.get(op, zero) * one_minus for op in (CONTRAST, SATURATION)]
    table = torch.stack((ratio, *weights), dim=0)  # (3, B, slots)
    return table.permute(2, 0, 1).unflatten(2, (-1, 1, 1, 1))


def _blend_(x: Tensor, params: Tensor, blend_ops: tuple[int, ...], inplace: bool = True) -> Tensor:
    """One blend slot, in place on ``x`` when ``inplace``: ``clamp(r x + (1 - r) target, 0, 1)`` per
    sample with ``params`` ``(3, B, 1, 1, 1)`` from :func:`_slot_params` and the target black (0), the
    mean of the grayscale image or the grayscale image: torchvision's ``_blend`` roundings, since the
    weighted target is one product, or 0 (so the fused ``addcmul`` adds an exact 0 either way)."""
    ratio, w_mean, w_gray = params.unbind(0)
    weighted: Tensor | None = None
    if CONTRAST in blend_ops or SATURATION in blend_ops:
        gray = rgb_to_grayscale(x)  # (C = 1: x itself, read before x changes)
        if CONTRAST in blend_ops:
            weighted = w_mean * gray.mean(dim=(1, 2, 3), keepdim=True)
        if SATURATION in blend_ops:
            weighted = w_gray * gray if weighted is None else torch.addcmul(weighted, w_gray, gray)
    x = x.mul_(ratio) if inplace else x * ratio
    if weighted is not None:
        x += weighted
    return x.clamp_(0.0, 1.0)


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
    grayscale mean, or the grayscale image; each blend slot (see :func:`_blend_schedule`) is one blend
    with a per-sample ratio and target, which gives exactly the values of the separate ops. The hue
    runs once, and is kept for the jittered samples. Bit-identical to applying torchvision's ops
    sample by sample, given the same input in [0, 1] (tested).
    """
    return color_jitter_(x, brightness, contrast, saturation, hue, order, mask, ops, owned=False)


def color_jitter_(
    x: Tensor,
    brightness: Tensor,
    contrast: Tensor,
    saturation: Tensor,
    hue: Tensor,
    order: Tensor,
    mask: Tensor | None = None,
    ops: Sequence[int] = ALL_OPS,
    *,
    owned: bool,
) -> Tensor:
    """:func:`color_jitter`, allowed to write into ``x`` when ``owned`` (the caller's own temporary)."""
    check_images(x)
    dev = x.device
    order = order.to(dev)
    mask = torch.ones(x.shape[0], dtype=torch.bool, device=dev) if mask is None else mask.to(dev)
    ops = tuple(op for op in ops if x.shape[1] == 3 or op in (BRIGHTNESS, CONTRAST))
    blend_ops = tuple(op for op in (BRIGHTNESS, CONTRAST, SATURATION) if op in ops)
    with_hue = HUE in ops
    hue = hue.to(dev)
    if not blend_ops:
        return _select(mask, adjust_hue(x, hue), x) if with_hue else x
    factors = torch.stack([(brightness, contrast, saturation)[op] for op in blend_ops], dim=1)
    factors = factors.to(dev, x.dtype)
    chosen, before = _blend_schedule(order, mask, blend_ops, with_hue)
    params = _slot_params(chosen, factors, blend_ops, x.dtype)
    nb = len(blend_ops)
    if before is not None and len(ops) == len(ALL_OPS) and _use_slices(x):
        return _jitter_slices(x, params, hue, before, mask, nb, owned)
    if len(ops) < len(ALL_OPS):
        # The previous implementation blended every sample at each of the 4 positions, with ratio 1
        # where the position held no enabled blend: a clamp to [0, 1] of the samples whose order starts
        # with a disabled op. Kept, so that the values stay the same for every input (a no-op for
        # inputs in [0, 1]). (With every op enabled, the idle slots make exactly its other clamps.)
        first_off = ~(order[:, :1] == const(ops, dev, order.dtype)).any(dim=1) & mask
        low = bcast(torch.where(first_off, 0.0, -torch.inf).to(x.dtype), x)
        x, owned = (x.clamp_(low, 1.0 - low) if owned else x.clamp(low, 1.0 - low)), True
    for slot, slot_params in enumerate(params.unbind(0)):
        if with_hue and slot == nb:
            x = torch.where(bcast(mask, x), adjust_hue(x, hue), x)
        x, owned = _blend_(x, slot_params, blend_ops, inplace=owned), True
    return x


def _jitter_slices(
    x: Tensor, params: Tensor, hue: Tensor, before: Tensor, mask: Tensor, nb: int, owned: bool
) -> Tensor:
    """:func:`color_jitter_` with every op enabled, each slot and the hue run on their samples only.

    The samples sorted by the number ``q`` of blends before their hue, descending, the non-jittered
    last: slot ``s < nb`` changes the samples with ``q > s`` (a prefix), the hue the jittered ones (a
    prefix), slot ``nb + s`` those with ``q < nb - s`` (a range), and the leading clamp of the previous
    implementation (before a leading hue, and of the samples not jittered) a suffix.
    """
    key = before.squeeze(1).masked_fill(~mask, -1)
    perm = key.argsort(descending=True, stable=True)
    # ends[k]: the number of samples with q >= k, for k = 0..nb (the jittered ones: ends[0])
    ends = (key >= const(tuple(range(nb + 1)), x.device, key.dtype, (-1, 1))).sum(dim=1).tolist()
    xs = x.index_select(0, perm)
    params = params.index_select(2, perm)
    hue = hue.index_select(0, perm)
    xs[ends[1] :].clamp_(0.0, 1.0)
    blend_ops = (BRIGHTNESS, CONTRAST, SATURATION)
    for slot, slot_params in enumerate(params.unbind(0)):
        if slot == nb and ends[0]:
            xs[: ends[0]] = adjust_hue(xs[: ends[0]], hue[: ends[0]])
        lo, hi = (0, ends[slot + 1]) if slot < nb else (ends[2 * nb - slot], ends[0])
        if hi > lo:
            _blend_(xs[lo:hi], slot_params[:, lo:hi], blend_ops)
    return (x if owned else torch.empty_like(xs)).index_copy_(0, perm, xs)
