"""Common corruptions at five severities (Hendrycks & Dietterich, ICLR 2019), batched on tensors.

Each corruption is the formula of the CIFAR-10-C generator (hendrycks/robustness,
``ImageNet-C/create_c/make_cifar_c.py``) with its CIFAR parameters per severity, applied to a whole
batch ``(N, C, H, W)`` of uint8 images at once, and quantised back to uint8 the way the published
datasets were (``np.uint8`` of the clipped result: truncation). Random corruptions draw from a
``torch.Generator`` seeded by the caller, so a corrupted test set is a pure function of
(images, corruption, severity, seed). docs/decisions.md, 'Corruptions', lists what is here, what is
left out and why; tests/test_corruptions.py checks each formula against imagecorruptions (the
maintained packaging of the same code) or its scikit-image / Pillow primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError
from ..registry import Registry, did_you_mean

SEVERITIES = (1, 2, 3, 4, 5)

#: fn(x in [0,1] float (N, C, H, W), parameter of one severity, generator) -> float, unclipped
CorruptionFn = Callable[[Tensor, object, torch.Generator], Tensor]


@dataclass(frozen=True)
class CorruptionInfo:
    """A corruption's family, its parameter at severities 1..5, and the channel counts it applies to."""

    family: str  # noise | blur | digital
    params: tuple[object, ...]
    channels: tuple[int, ...] = (1, 3)


CORRUPTIONS: Registry[CorruptionFn] = Registry("corruption")


def _register(name: str, family: str, params: Sequence[object], channels: tuple[int, ...] = (1, 3)):
    return CORRUPTIONS.register(name, spec=CorruptionInfo(family, tuple(params), channels))


# ============ noise ============


@_register("gaussian_noise", "noise", (0.04, 0.06, 0.08, 0.09, 0.10))
def gaussian_noise(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """x + N(0, c^2) per pixel and channel."""
    return x + float(c) * torch.randn(x.shape, generator=gen, dtype=x.dtype)


@_register("shot_noise", "noise", (500, 250, 100, 75, 50))
def shot_noise(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """Poisson(x * c) / c: photon noise with c photons at full intensity."""
    return torch.poisson(x.double() * float(c), generator=gen).to(x.dtype) / float(c)


@_register("impulse_noise", "noise", (0.01, 0.02, 0.03, 0.05, 0.07))
def impulse_noise(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """Salt and pepper (scikit-image ``random_noise(mode='s&p', amount=c)``): a fraction c of the
    values, drawn independently per pixel and channel, set to 0 or 1 with equal probability."""
    flipped = torch.rand(x.shape, generator=gen) <= float(c)
    salted = torch.rand(x.shape, generator=gen) <= 0.5
    out = x.clone()
    out[flipped & salted] = 1.0
    out[flipped & ~salted] = 0.0
    return out


@_register("speckle_noise", "noise", (0.06, 0.10, 0.12, 0.16, 0.20))
def speckle_noise(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """x + x * N(0, c^2): multiplicative noise."""
    return x + x * float(c) * torch.randn(x.shape, generator=gen, dtype=x.dtype)


# ============ blur ============


def _filter(x: Tensor, kernel: Tensor, mode: str) -> Tensor:
    """Correlate every channel of every image with a 2-D ``kernel`` (odd size), padding by ``mode``."""
    kh, kw = kernel.shape
    n, ch, h, w = x.shape
    padded = F.pad(x.reshape(n * ch, 1, h, w), (kw // 2, kw // 2, kh // 2, kh // 2), mode=mode)
    return F.conv2d(padded, kernel.to(x.dtype)[None, None]).reshape(n, ch, h, w)


def _gauss_1d(sigma: float, radius: int) -> Tensor:
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    return g / g.sum()


@_register("gaussian_blur", "blur", (0.4, 0.6, 0.7, 0.8, 1.0))
def gaussian_blur(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """Gaussian blur of standard deviation c pixels per channel (scikit-image ``gaussian``: scipy's
    kernel truncated at 4 sigma, edge pixels repeated)."""
    sigma = float(c)
    g = _gauss_1d(sigma, int(4.0 * sigma + 0.5))
    return _filter(x, torch.outer(g, g), "replicate")


def disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """The defocus kernel: a normalised disk of ``radius`` pixels on a 17 x 17 grid, smoothed by a
    3 x 3 Gaussian of sigma ``alias_blur`` (OpenCV's ``GaussianBlur``), cropped to its support."""
    grid = torch.arange(-8, 9, dtype=torch.float64)
    disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius**2).double()
    disk /= disk.sum()
    g = _gauss_1d(alias_blur, 1)
    # OpenCV pads the 17 x 17 grid by reflection (101); the disk is far from its edge for radius < 7
    k = F.conv2d(F.pad(disk[None, None], (1, 1, 1, 1), mode="reflect"), torch.outer(g, g)[None, None])[0, 0]
    keep = k.abs().sum(0) > 0
    r = int(max(abs(i - 8) for i in keep.nonzero().flatten().tolist()))
    return k[8 - r : 9 + r, 8 - r : 9 + r]


@_register("defocus_blur", "blur", ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)))
def defocus_blur(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """Correlation with :func:`disk_kernel` (radius, alias blur) = c, borders reflected (OpenCV's
    ``filter2D`` default)."""
    radius, alias = c  # type: ignore[misc]
    return _filter(x, disk_kernel(float(radius), float(alias)), "reflect")


# ============ digital ============


@_register("contrast", "digital", (0.75, 0.5, 0.4, 0.3, 0.15))
def contrast(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """(x - m) * c + m, m the mean of each channel of each image."""
    m = x.mean(dim=(2, 3), keepdim=True)
    return (x - m) * float(c) + m


@_register("brightness", "digital", (0.05, 0.1, 0.15, 0.2, 0.3))
def brightness(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """HSV value + c, clipped to [0,1], hue and saturation kept. For one channel the value is the
    pixel (x + c); for RGB, keeping hue and saturation scales the pixel by new value / value."""
    if x.shape[1] == 1:
        return x + float(c)
    v = x.amax(1, keepdim=True)
    v_new = (v + float(c)).clamp(0.0, 1.0)
    return torch.where(v > 0, x * v_new / v.clamp_min(1e-12), v_new.expand_as(x))


@_register("saturate", "digital", ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)), channels=(3,))
def saturate(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """HSV saturation * c[0] + c[1], clipped to [0,1], hue and value kept. With hue and value fixed
    each channel is v - s * v * k(hue), so the new pixel is v - (v - x) * s_new / s; a grey pixel
    (s = 0) has hue 0 (red) in scikit-image's conversion: (v, v (1 - s_new), v (1 - s_new))."""
    scale, shift = (float(t) for t in c)  # type: ignore[union-attr]
    v = x.amax(1, keepdim=True)
    delta = v - x.amin(1, keepdim=True)
    s = torch.where(v > 0, delta / v.clamp_min(1e-12), torch.zeros_like(v))
    s_new = (s * scale + shift).clamp(0.0, 1.0)
    coloured = v - (v - x) * s_new / s.clamp_min(1e-12)
    grey = torch.cat([v, v * (1 - s_new), v * (1 - s_new)], dim=1)
    return torch.where(delta > 0, coloured, grey)


def box_resize_matrix(n_in: int, n_out: int) -> Tensor:
    """Pillow's BOX resampling along one axis as an (n_out, n_in) matrix: output pixel i averages
    the input pixels whose centres fall in its footprint [i, i + 1) * n_in / n_out (at least one)."""
    scale = n_in / n_out
    support = 0.5 * max(scale, 1.0)
    m = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), n_in)
        ss = 1.0 / max(scale, 1.0)
        w = torch.tensor(
            [1.0 if -0.5 <= (j - centre + 0.5) * ss < 0.5 else 0.0 for j in range(lo, hi)],
            dtype=torch.float64,
        )
        if w.sum() == 0:
            w[:] = 1.0
        m[i, lo:hi] = w / w.sum()
    return m


@_register("pixelate", "digital", (0.95, 0.9, 0.85, 0.75, 0.65))
def pixelate(x: Tensor, c: object, gen: torch.Generator) -> Tensor:
    """Pillow BOX resize to int(size * c), then BOX back to the original size (both axes)."""
    h, w = x.shape[-2:]
    hs, ws = max(1, int(h * float(c))), max(1, int(w * float(c)))
    rows = box_resize_matrix(hs, h) @ box_resize_matrix(h, hs)
    cols = box_resize_matrix(ws, w) @ box_resize_matrix(w, ws)
    return torch.einsum("ij,ncjk,lk->ncil", rows.to(x.dtype), x, cols.to(x.dtype))


# ============ entry points ============


def corruption_names(channels: int | None = None) -> list[str]:
    """The corruptions, in registration order (noise, blur, digital); those for ``channels`` only."""
    return [
        n for n in CORRUPTIONS.names() if channels is None or channels in CORRUPTIONS.info(n)["spec"].channels
    ]


def parse_corruptions(value: str | Sequence[str] | None, channels: int | None = None) -> list[str]:
    """``all`` or a comma-separated list (or a list of names) -> corruption names, validated.

    ``all`` means every corruption that applies to ``channels``; a name that does not apply to the
    dataset's channels (``saturate`` on grey images) is a one-line UserError.
    """
    if not value:
        return []
    parts = [p.strip() for v in ([value] if isinstance(value, str) else value) for p in str(v).split(",")]
    if parts == ["all"]:
        return corruption_names(channels)
    known = corruption_names()
    for p in parts:
        if p not in known:
            raise UserError(
                f"unknown corruption {p!r}{did_you_mean(p, known)}; valid choices: all, {', '.join(known)}"
            )
        if channels is not None and channels not in CORRUPTIONS.info(p)["spec"].channels:
            raise UserError(f"corruption {p!r} needs colour images; this dataset has {channels} channel(s)")
    return list(dict.fromkeys(parts))


def parse_severities(value: str | Sequence[int] | None) -> list[int]:
    """``1-5`` (default: every severity), ``3`` or ``1,3,5`` -> sorted severities in 1..5."""
    if value is None or value == "":
        return list(SEVERITIES)
    try:
        if isinstance(value, str):
            out: set[int] = set()
            for part in value.split(","):
                lo, _, hi = part.strip().partition("-")
                if int(hi or lo) < int(lo):  # "5-1" is an empty range, not severities out of 1..5
                    raise UserError(f"severities {value!r}: a range goes up, e.g. {hi}-{lo}")
                out.update(range(int(lo), int(hi or lo) + 1))
        else:
            out = {int(v) for v in value}
    except (TypeError, ValueError):
        raise UserError(f"severities {value!r}: give 1-5, one number or a comma-separated list") from None
    if not out or not out <= set(SEVERITIES):
        raise UserError(f"severities {value!r}: each must be in 1..5")
    return sorted(out)


def corrupt(x: Tensor, name: str, severity: int, seed: int) -> Tensor:
    """``x`` (uint8, (N, C, H, W)) under corruption ``name`` at ``severity``, as uint8.

    Deterministic given ``seed``; computed on the CPU in float64 so that the same seed gives the same
    images everywhere; the result is truncated to uint8 as the published corrupted datasets were.
    """
    fn = CORRUPTIONS.get(name)
    spec: CorruptionInfo = CORRUPTIONS.info(name)["spec"]
    if severity not in SEVERITIES:
        raise UserError(f"severity {severity!r}: must be one of 1..5")
    if x.dtype != torch.uint8 or x.dim() != 4:
        raise UserError("corrupt() takes uint8 images shaped (N, C, H, W)")
    if x.shape[1] not in spec.channels:
        raise UserError(f"corruption {name!r} needs colour images; these have {x.shape[1]} channel(s)")
    gen = torch.Generator().manual_seed(int(seed) % (2**63))
    xf = x.detach().cpu().double() / 255.0
    out = fn(xf, spec.params[severity - 1], gen).clamp(0.0, 1.0)
    # np.uint8(v * 255) truncates; the epsilon keeps exact levels (k / 255 * 255) from falling below k
    return torch.floor(out * 255.0 + 1e-6).to(torch.uint8).to(x.device)


def perturbation_size(x: Tensor, name: str, severity: int, seed: int) -> float:
    """Mean absolute change of the pixels (in [0,1] units) a corruption makes: a severity's size."""
    return float((corrupt(x, name, severity, seed).double() - x.double()).abs().mean() / 255.0)


__all__ = [
    "CORRUPTIONS",
    "SEVERITIES",
    "CorruptionInfo",
    "box_resize_matrix",
    "corrupt",
    "corruption_names",
    "disk_kernel",
    "parse_corruptions",
    "parse_severities",
    "perturbation_size",
]
