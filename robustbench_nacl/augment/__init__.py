"""Batched augmentation: SimCLR views, DACL mixups, Gaussian positives, ArCL shifts.

Modules: ``ops`` (batched image ops with per-sample parameters), ``simclr`` (the SimCLR/CLAE
policy and its per-sample draws), ``mixup`` (DACL positives, Gaussian noise) and ``views`` (the
named view makers and distribution shifts).
"""

from .mixup import (
    RHO_MODES,
    binary_mix,
    dacl_plus_mix,
    gaussian_noise,
    geometric_mix,
    linear_mix,
    mix_with,
    random_partners,
)
from .ops import (
    BRIGHTNESS,
    CONTRAST,
    GRAY_WEIGHTS,
    HUE,
    SATURATION,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    color_jitter,
    hflip,
    random_grayscale,
    resized_crop,
    rgb_to_grayscale,
    to_float,
)
from .simclr import AugParams, SimCLRAug, apply, sample_crop_boxes, sample_jitter, sample_params, simclr_views
from .views import SHIFTS, VIEW_MAKERS, Shift, ViewMaker, pad_crop

__all__ = [
    "BRIGHTNESS",
    "CONTRAST",
    "GRAY_WEIGHTS",
    "HUE",
    "RHO_MODES",
    "SATURATION",
    "SHIFTS",
    "VIEW_MAKERS",
    "AugParams",
    "Shift",
    "SimCLRAug",
    "ViewMaker",
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
    "pad_crop",
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
