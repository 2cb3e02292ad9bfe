"""DACL positives (docs/decisions.md, 'DACL positives'): every sample mixed with a random *other*
sample of the batch (:func:`linear_mix`, :func:`geometric_mix`, :func:`binary_mix`,
:func:`dacl_plus_mix`, :func:`mix_with` for MIXNCA), and Gaussian-noise positives (:func:`gaussian_noise`)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UserError
from .ops import bcast
from .simclr import uniform

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


def check_unit(name: str, v: float) -> None:
    if not 0.0 <= float(v) <= 1.0:
        raise UserError(f"{name} must be in [0, 1], got {v}")


def _lambdas(x: Tensor, gen: torch.Generator, alpha: float) -> Tensor:
    check_unit("mix alpha", alpha)
    return uniform(gen, x.shape[0], float(alpha), 1.0).to(x.device, x.dtype)


def mix_with(x: Tensor, partners_x: Tensor, lam: float | Tensor) -> Tensor:
    """Linear mixing ``lam * x + (1 - lam) * partners_x``; ``lam`` a float or a per-sample ``(B,)`` tensor.

    Works for any ``(B, ...)`` shape (images or feature vectors). Used for MIXNCA (fixed ``lam``).
    """
    if partners_x.shape != x.shape:
        raise ValueError(f"partners shape {tuple(partners_x.shape)} != {tuple(x.shape)}")
    if isinstance(lam, Tensor) and lam.ndim == 1:
        lam = bcast(lam.to(x.dtype), x)
    return lam * x + (1.0 - lam) * partners_x


def linear_mix(x: Tensor, gen: torch.Generator, alpha: float) -> Tensor:
    """Linear-Mixup positive ``lam x + (1 - lam) x~``, ``lam ~ U(alpha, 1)`` per sample, partner != self."""
    return mix_with(x, _partners(x, gen), _lambdas(x, gen, alpha))


def _geometric(x: Tensor, xp: Tensor, lam: Tensor) -> Tensor:
    lam = bcast(lam, x)
    return x.pow(lam) * xp.pow(1.0 - lam)


def check_nonneg(x: Tensor) -> None:
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
        check_nonneg(x)
    return _geometric(x, _partners(x, gen), _lambdas(x, gen, alpha))


#: How ``rho`` reads in Binary-Mixup: "from_partner" (default: the fraction of values taken from the
#: partner) or "keep" (DACL as printed: m ~ Bernoulli(rho) keeps the anchor's own values).
RHO_MODES = ("from_partner", "keep")


def _binary_mask(x: Tensor, gen: torch.Generator, rho: float, mode: str = "from_partner") -> Tensor:
    """True where a value comes from the partner."""
    check_unit("mix rho", rho)
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
        check_nonneg(x)
    b = x.shape[0]
    if choice is None:
        choice = torch.randint(0, 3, (b,), generator=gen, device=gen.device)
    xp = _partners(x, gen)
    lam = _lambdas(x, gen, alpha)
    mask = _binary_mask(x, gen, rho, mode)
    c = bcast(choice.to(x.device), x)
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
