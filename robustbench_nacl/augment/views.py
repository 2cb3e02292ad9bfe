"""The names a preset or a dataset spec gives: :data:`VIEW_MAKERS` (name ->
``fn(x, n_views, gen, **params) -> list[Tensor]``, used by the trainer) and :data:`SHIFTS`, the ArCL
distribution-shift transformations Aug1..Aug5 (docs/decisions.md, 'Settings').

Everything works on float tensors ``(B, C, H, W)`` in [0, 1] with ``C`` in {1, 3} (uint8 is converted),
on whatever device they live on, with every random draw from the generator passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserError
from ..registry import Registry
from .mixup import binary_mix, check_nonneg, dacl_plus_mix, gaussian_noise, geometric_mix, linear_mix
from .ops import check_images, color_jitter, hflip, resized_crop, rgb_to_grayscale, to_float
from .simclr import SimCLRAug, check_n_views, rand, sample_crop_boxes, sample_jitter, simclr_views

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


@VIEW_MAKERS.register("acl_original", params=("aug_strength",), bounded=True)
def _acl_original_maker(
    x: Tensor, n_views: int, gen: torch.Generator, /, aug_strength: float = 1.0, **_: Any
) -> list[Tensor]:
    """``n_views - 1`` ACL views at strength s, then the un-augmented images (AIR's ``ori_inputs``)."""
    return [*_acl_maker(x, n_views - 1, gen, aug_strength=aug_strength), to_float(x)]


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
    check_n_views(n_views)
    xf = to_float(x)
    check_images(xf)
    pad = max(1, round(xf.shape[-1] / 8))
    out = []
    for _ in range(n_views):
        v = pad_crop(xf, gen, pad)
        out.append(hflip(v, rand(gen, v.shape[0]) < 0.5))
    return out


def _float_views(x: Tensor, n_views: int) -> Tensor:
    check_n_views(n_views)
    xf = to_float(x)
    if xf.ndim < 2:
        raise ValueError(f"expected a batch (B, ...), got shape {tuple(xf.shape)}")
    return xf


def _nonneg_views(x: Tensor, n_views: int) -> Tensor:
    """``_float_views``, checked non-negative once per call; uint8 images (the trainer's) are by their
    type, so the check, a host sync, is skipped for them."""
    xf = _float_views(x, n_views)
    if x.dtype != torch.uint8:
        check_nonneg(xf)
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
    check_images(x)


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
    return hflip(x, rand(gen, x.shape[0]) < 0.5)


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
