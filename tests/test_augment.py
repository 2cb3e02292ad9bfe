"""Batched per-sample augmentation: equality with torchvision's functional ops, sampler distribution,
per-sample diversity, reproducibility, DACL mixes, ArCL shifts and the view-maker registry."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF

import robustbench_nacl.augment as A
from robustbench_nacl.errors import UserError

TV_OPS = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
SIZES = (8, 28, 32)
CHANNELS = (1, 3)

# Tightest bounds found (CPU, float32, 9,600 random-noise samples per setting) and why:
# * colour ops and grayscale given the same input: bitwise equal (0.0); the bound only allows for
#   other SIMD paths.
# * crop + resize: <= 1.8e-7 when the size is a power of two (the scale h / size is exact in binary),
#   <= 3.4e-6 at 28 (both sides round the source coordinate (i + 0.5) * h / 28 - 0.5 differently:
#   torchvision in float32, we in float64 followed by grid_sample's float32 un-normalisation).
# * the whole view: the crop's rounding differences pass through up to 3 blends (factors up to 1.8)
#   and the hue round trip, whose float32 ``h / 6 + 1`` then ``fmod`` quantises h to 2^-24 and whose
#   hsv -> rgb scales an h error by 6 * (max - min); an input change of 1 ulp can then move an output
#   by ~20 ulp. Observed maxima: 4.1e-6 (32), 2.7e-6 (8), 1.8e-5 (28).
OP_TOL = 1e-6
CROP_TOL = {8: 5e-7, 32: 5e-7, 28: 6e-6}
VIEW_TOL = {8: 1e-5, 32: 1e-5, 28: 3e-5}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(b: int, c: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, c, s, s, generator=_gen(seed + 1000))


def _tv_view(x: torch.Tensor, p: A.AugParams) -> torch.Tensor:
    """torchvision's functional ops, sample by sample, with the given parameters."""
    out = []
    for b in range(x.shape[0]):
        img = TF.resized_crop(
            x[b],
            int(p.top[b]),
            int(p.left[b]),
            int(p.height[b]),
            int(p.width[b]),
            list(p.size),
            antialias=True,
        )
        if p.flip[b]:
            img = TF.hflip(img)
        if p.jitter[b]:
            for op in p.order[b].tolist():
                if op in p.jitter_ops:
                    factor = (p.brightness, p.contrast, p.saturation, p.hue)[op][b].item()
                    img = TV_OPS[op](img, factor)
        if p.gray[b] and img.shape[0] == 3:
            img = TF.rgb_to_grayscale(img, num_output_channels=3)
        out.append(img)
    return torch.stack(out)


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- equality with torchvision


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("s", SIZES)
def test_resized_crop_and_flip_match_torchvision(c: int, s: int) -> None:
    b = 24
    x = _images(b, c, s)
    top, left, h, w = A.sample_crop_boxes(b, s, s, (0.08, 1.0), (3 / 4, 4 / 3), _gen(1))
    # edge cases: the whole image, a single pixel, a one-row strip at the bottom-right corner
    top[:3] = torch.tensor([0, s // 2, s - 1])
    left[:3] = torch.tensor([0, s // 3, 0])
    h[:3] = torch.tensor([s, 1, 1])
    w[:3] = torch.tensor([s, 1, s])
    flip = torch.arange(b) % 2 == 0
    ours = A.resized_crop(x, top, left, h, w, s, flip=flip)
    ref = torch.stack(
        [
            TF.resized_crop(x[i], int(top[i]), int(left[i]), int(h[i]), int(w[i]), [s, s], antialias=True)
            for i in range(b)
        ]
    )
    ref = torch.where(flip[:, None, None, None], TF.hflip(ref), ref)
    assert _maxdiff(ours, ref) <= CROP_TOL[s]


def test_resized_crop_to_other_output_size() -> None:
    # upsampling to a non-square output larger than the image: still torchvision's result
    x = _images(6, 3, 12)
    top, left, h, w = A.sample_crop_boxes(6, 12, 12, (0.08, 1.0), (3 / 4, 4 / 3), _gen(2))
    ours = A.resized_crop(x, top, left, h, w, (20, 16))
    ref = torch.stack(
        [
            TF.resized_crop(x[i], int(top[i]), int(left[i]), int(h[i]), int(w[i]), [20, 16], antialias=True)
            for i in range(6)
        ]
    )
    assert _maxdiff(ours, ref) <= 1e-5


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("s", SIZES)
def test_colour_ops_match_torchvision(c: int, s: int) -> None:
    b = 12
    x = _images(b, c, s)
    g = _gen(3)
    factors = [torch.rand(b, generator=g) * 2.0 for _ in range(3)] + [torch.rand(b, generator=g) - 0.5]
    for f in factors[:3]:
        f[:2] = torch.tensor([0.0, 1.0])  # extremes: full blend to the target, identity
    factors[3][:2] = torch.tensor([-0.5, 0.5])
    ours_fns = (A.adjust_brightness, A.adjust_contrast, A.adjust_saturation, A.adjust_hue)
    for ours_fn, tv_fn, f in zip(ours_fns, TV_OPS, factors, strict=True):
        ref = torch.stack([tv_fn(x[i], f[i].item()) for i in range(b)])
        assert _maxdiff(ours_fn(x, f), ref) <= OP_TOL, tv_fn.__name__
    gray_ref = torch.stack([TF.rgb_to_grayscale(x[i], num_output_channels=c) for i in range(b)])
    mask = torch.ones(b, dtype=torch.bool)
    assert _maxdiff(A.random_grayscale(x, mask), gray_ref) <= OP_TOL


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("s", SIZES)
def test_color_jitter_in_per_sample_order_matches_torchvision(c: int, s: int) -> None:
    b = 16
    x = _images(b, c, s)
    g = _gen(4)
    bri, con, sat, hue, order = A.sample_jitter(b, (0.8, 0.8, 0.8, 0.2), g)
    mask = torch.rand(b, generator=g) < 0.8
    ours = A.color_jitter(x, bri, con, sat, hue, order, mask=mask)
    ref = []
    for i in range(b):
        img = x[i]
        if mask[i]:
            for op in order[i].tolist():
                img = TV_OPS[op](img, (bri, con, sat, hue)[op][i].item())
        ref.append(img)
    assert _maxdiff(ours, torch.stack(ref)) <= OP_TOL


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("s", SIZES)
def test_apply_matches_torchvision_composition(c: int, s: int) -> None:
    b = 16
    x = _images(b, c, s)
    for cfg in (A.SimCLRAug(), A.SimCLRAug(p_jitter=1.0, p_gray=0.5)):
        p = A.sample_params(cfg, b, s, s, _gen(5))
        ours = A.apply(x, p)
        assert ours.shape == x.shape and ours.dtype == x.dtype
        assert _maxdiff(ours, _tv_view(x, p)) <= VIEW_TOL[s]


def test_cpu_slice_and_mask_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    # the CPU path sorts the samples and runs each jitter slot on its samples only; the GPU path runs
    # every slot on the whole batch with per-sample masks: the same values, bit for bit
    x = _images(32, 3, 16)
    p = A.sample_params(A.SimCLRAug(), 32, 16, 16, _gen(6))
    sliced = A.apply(x, p)
    monkeypatch.setattr("robustbench_nacl.augment.ops._use_slices", lambda x: False)
    assert torch.equal(A.apply(x, p), sliced)


def test_zero_strength_disables_jitter_like_torchvision() -> None:
    x = _images(8, 3, 8)
    cfg = A.SimCLRAug(strength=0.0, p_jitter=1.0, p_gray=0.0)
    p = A.sample_params(cfg, 8, 8, 8, _gen(7))
    assert p.jitter_ops == ()
    crop = A.resized_crop(x, p.top, p.left, p.height, p.width, 8, flip=p.flip)
    assert torch.equal(A.apply(x, p), crop)


# ---------------------------------------------------------------- crop-parameter sampler


def test_crop_sampler_matches_torchvision_distribution() -> None:
    n, hh, ww = 4000, 24, 32
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    top, left, h, w = A.sample_crop_boxes(n, hh, ww, scale, ratio, _gen(8))
    torch.manual_seed(0)
    img = torch.empty(1, hh, ww)
    ref = torch.tensor([T.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)])

    def stats(t, l, hb, wb):
        hb, wb = hb.double(), wb.double()
        return (
            (hb * wb / (hh * ww)).mean().item(),
            torch.log(wb / hb).mean().item(),
            (t / (hh - hb + 1)).mean().item(),
            (l / (ww - wb + 1)).mean().item(),
        )

    ours_stats = stats(top, left, h, w)
    ref_stats = stats(ref[:, 0], ref[:, 1], ref[:, 2], ref[:, 3])
    # standard errors at n=4000 are ~0.005 (area), ~0.002 (log ratio), ~0.005 (offsets)
    for o, r, tol in zip(ours_stats, ref_stats, (0.02, 0.012, 0.025, 0.025), strict=True):
        assert abs(o - r) < tol, (ours_stats, ref_stats)


@pytest.mark.parametrize(("hh", "ww"), [(32, 32), (8, 8), (5, 40), (40, 5), (1, 1), (3, 7)])
def test_crop_boxes_are_valid(hh: int, ww: int) -> None:
    top, left, h, w = A.sample_crop_boxes(2000, hh, ww, (0.08, 1.0), (3 / 4, 4 / 3), _gen(9))
    assert top.dtype == torch.int64
    assert bool(((h >= 1) & (w >= 1) & (top >= 0) & (left >= 0)).all())
    assert bool(((top + h <= hh) & (left + w <= ww)).all())


def test_crop_fallback_is_torchvision_central_crop() -> None:
    # every candidate is too wide -> torchvision's central-crop fallback
    for hh, ww, scale, ratio in [(20, 20, (1.0, 1.0), (2.0, 2.0)), (10, 40, (0.95, 1.0), (3 / 4, 4 / 3))]:
        top, left, h, w = A.sample_crop_boxes(50, hh, ww, scale, ratio, _gen(10))
        img = torch.empty(1, hh, ww)
        expected = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
        boxes = set(zip(top.tolist(), left.tolist(), h.tolist(), w.tolist(), strict=True))
        assert boxes == {tuple(expected)}


# ---------------------------------------------------------------- randomness


def test_per_sample_diversity() -> None:
    # torchvision v2 on a whole batch gives 1 distinct output for 64 identical inputs
    x = _images(1, 3, 32).expand(64, 3, 32, 32).contiguous()
    (v,) = A.simclr_views(x, 1, _gen(11))
    assert torch.unique(v.flatten(1), dim=0).shape[0] == 64
    xg = _images(1, 1, 28).expand(64, 1, 28, 28).contiguous()
    (vg,) = A.simclr_views(xg, 1, _gen(11))
    assert torch.unique(vg.flatten(1), dim=0).shape[0] == 64


def test_same_seed_same_views_different_seed_different() -> None:
    x = (_images(16, 3, 16) * 255).to(torch.uint8)
    a = A.simclr_views(x, 2, _gen(12))
    b = A.simclr_views(x, 2, _gen(12))
    c = A.simclr_views(x, 2, _gen(13))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])  # the views of one call are independent


def test_uint8_converted_once_like_float() -> None:
    x = (_images(8, 3, 16) * 255).to(torch.uint8)
    a = A.simclr_views(x, 2, _gen(14))
    b = A.simclr_views(x.float() / 255, 2, _gen(14))
    assert all(torch.equal(u, v) and u.dtype == torch.float32 for u, v in zip(a, b, strict=True))


def test_params_live_on_generator_device() -> None:
    p = A.sample_params(A.SimCLRAug(), 4, 8, 8, _gen(15))
    assert p.top.device == torch.device("cpu") and p.order.shape == (4, 4) and len(p) == 4
    assert bool((p.order.sort(dim=1).values == torch.arange(4)).all())  # permutations
    assert bool(((p.brightness >= 0.2) & (p.brightness <= 1.8) & (p.hue.abs() <= 0.2)).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_same_params() -> None:
    x = _images(32, 3, 32)
    p = A.sample_params(A.SimCLRAug(p_jitter=1.0), 32, 32, 32, _gen(16))
    gpu = A.apply(x.cuda(), p.to("cuda"))
    assert gpu.device.type == "cuda"
    assert _maxdiff(gpu.cpu(), A.apply(x, p)) <= VIEW_TOL[32]
    gen = torch.Generator(device="cuda").manual_seed(0)
    views = A.VIEW_MAKERS.get("dacl_plus")(x.cuda(), 2, gen)
    assert all(v.device.type == "cuda" and v.shape == x.shape for v in views)


def test_config_validation() -> None:
    for bad in ({"scale": (0.0, 1.0)}, {"ratio": (2.0, 1.0)}, {"strength": 3.0}, {"p_gray": 1.5}):
        with pytest.raises(UserError):
            A.SimCLRAug(**bad)
    with pytest.raises(ValueError):
        A.apply(torch.zeros(2, 2, 8, 8), A.sample_params(A.SimCLRAug(), 2, 8, 8, _gen()))


# ---------------------------------------------------------------- DACL mixes


def test_partners_differ_from_self() -> None:
    for b in (2, 3, 17):
        idx = A.random_partners(b, _gen(b))
        assert bool((idx != torch.arange(b)).all()) and bool(((idx >= 0) & (idx < b)).all())
    gen = _gen(17)
    idx = torch.stack([A.random_partners(5, gen) for _ in range(400)])
    assert bool((idx != torch.arange(5)).all())
    assert len(set(idx[:, 0].tolist())) == 4  # every other sample occurs as a partner
    with pytest.raises(ValueError):
        A.random_partners(1, _gen())


def test_linear_mix_lies_between_self_and_a_partner() -> None:
    b = 16
    x = torch.rand(b, 3, 8, 8, generator=_gen(18))
    gen = _gen(19)
    idx = A.random_partners(b, _gen(19))
    out = A.linear_mix(x, gen, alpha=0.6)
    xp = x[idx]
    lo, hi = torch.minimum(x, xp), torch.maximum(x, xp)
    assert bool(((out >= lo - 1e-6) & (out <= hi + 1e-6)).all())
    lam = ((out - xp) / (x - xp)).flatten(1)  # the same lambda for every value of a sample
    assert bool((lam.std(dim=1) < 1e-3).all()) and bool(
        ((lam.mean(1) >= 0.6 - 1e-4) & (lam.mean(1) <= 1)).all()
    )
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device


def test_geometric_mix_finite_and_between() -> None:
    x = torch.rand(16, 3, 8, 8, generator=_gen(20))
    x[0, 0] = 0.0  # zeros are fine (0^lam = 0, x~^0 = 1)
    x[1] = 0.0
    idx = A.random_partners(16, _gen(21))
    out = A.geometric_mix(x, _gen(21), alpha=0.5)
    xp = x[idx]
    assert bool(torch.isfinite(out).all())
    assert bool(((out >= torch.minimum(x, xp) - 1e-6) & (out <= torch.maximum(x, xp) + 1e-6)).all())
    with pytest.raises(ValueError):
        A.geometric_mix(x - 0.5, _gen(), alpha=0.5)


def test_binary_mix_takes_each_value_from_self_or_partner() -> None:
    x = torch.rand(16, 3, 16, 16, generator=_gen(22))
    idx = A.random_partners(16, _gen(23))
    out = A.binary_mix(x, _gen(23), rho=0.3)
    xp = x[idx]
    from_partner = out == xp
    assert bool((from_partner | (out == x)).all())
    assert abs(from_partner.float().mean().item() - 0.3) < 0.02  # rho = fraction from the partner (default)
    # DACL as printed: m ~ Bernoulli(rho) keeps the anchor's own value, so 70 % come from the partner.
    keep = A.binary_mix(x, _gen(23), rho=0.3, mode="keep")
    assert abs((keep == xp).float().mean().item() - 0.7) < 0.02
    with pytest.raises(ValueError, match="mix_rho_mode"):
        A.binary_mix(x, _gen(23), rho=0.3, mode="partner")


def test_dacl_view_makers_pass_the_rho_mode() -> None:
    x = (torch.rand(32, 1, 8, 8, generator=_gen(40)) * 255).to(torch.uint8)
    for name in ("dacl_binary", "dacl_plus"):
        maker = A.VIEW_MAKERS.get(name)
        a = maker(x, 2, _gen(41), mix_rho=0.0, mix_rho_mode="from_partner")
        b = maker(x, 2, _gen(41), mix_rho=0.0, mix_rho_mode="keep")
        assert not torch.equal(a[0], b[0])  # rho = 0 keeps everything in one mode, nothing in the other


def test_dacl_plus_choices() -> None:
    x = torch.rand(8, 3, 8, 8, generator=_gen(24))
    for choice in (0, 1):  # lambda ~ U(1, 1) = 1 -> the sample itself
        out = A.dacl_plus_mix(x, _gen(), alpha=1.0, rho=0.5, choice=torch.full((8,), choice))
        assert torch.equal(out, x)
    out = A.dacl_plus_mix(x, _gen(), alpha=1.0, rho=1.0, choice=torch.full((8,), 2))
    assert not bool((out == x).any())  # rho = 1: every value from the partner
    out = A.dacl_plus_mix(x, _gen(25), alpha=0.5, rho=0.5)
    assert out.shape == x.shape and bool(((out >= 0) & (out <= 1)).all())


def test_gaussian_noise_unclamped() -> None:
    x = torch.full((64, 3, 16, 16), 0.5)
    out = A.gaussian_noise(x, _gen(26), scale=0.3)
    noise = out - x
    assert abs(noise.mean().item()) < 0.01 and abs(noise.std().item() - 0.3) < 0.01
    assert out.min() < 0 and out.max() > 1  # additive noise, not clamped (docs/decisions.md)


def test_mixes_work_on_feature_vectors_and_mix_with() -> None:
    z = torch.rand(10, 7, generator=_gen(27))
    zp = torch.rand(10, 7, generator=_gen(28))
    for fn in (
        lambda: A.linear_mix(z, _gen(), 0.5),
        lambda: A.geometric_mix(z, _gen(), 0.5),
        lambda: A.binary_mix(z, _gen(), 0.5),
        lambda: A.gaussian_noise(z, _gen(), 0.1),
    ):
        assert fn().shape == z.shape
    torch.testing.assert_close(A.mix_with(z, zp, 0.7), 0.7 * z + 0.3 * zp)
    lam = torch.linspace(0, 1, 10)
    torch.testing.assert_close(A.mix_with(z, zp, lam), lam[:, None] * z + (1 - lam[:, None]) * zp)
    with pytest.raises(UserError):
        A.linear_mix(z, _gen(), 1.5)


# ---------------------------------------------------------------- view makers and shifts


@pytest.mark.parametrize("name", A.VIEW_MAKERS.names())
@pytest.mark.parametrize("c", CHANNELS)
def test_view_makers_return_n_views_of_input_shape(name: str, c: int) -> None:
    x = (_images(8, c, 12) * 255).to(torch.uint8)
    params = {"strength": 0.5, "scale_min": 0.2, "mix_alpha": 0.7, "mix_rho": 0.3, "noise_scale": 0.1}
    params |= {"x": 1, "n_views": 99, "gen": None, "loss": "nca"}  # unknown keys are ignored
    views = A.VIEW_MAKERS.get(name)(x, 3, _gen(29), **params)
    assert len(views) == 3
    for v in views:
        assert v.shape == x.shape and v.dtype == torch.float32 and bool(torch.isfinite(v).all())
        if A.VIEW_MAKERS.info(name)["bounded"]:
            assert bool(((v >= 0) & (v <= 1)).all())
    again = A.VIEW_MAKERS.get(name)(x, 3, _gen(29), **params)
    assert all(torch.equal(u, v) for u, v in zip(views, again, strict=True))


def test_view_makers_registry() -> None:
    expected = {"simclr", "crop_flip", "identity", "dacl", "dacl_geometric", "dacl_binary", "dacl_plus"}
    assert expected | {"gaussian", "acl", "acl_original", "pad_crop_flip"} == set(A.VIEW_MAKERS.names())
    x = (_images(4, 3, 8) * 255).to(torch.uint8)
    ident = A.VIEW_MAKERS.get("identity")(x, 2, _gen())
    assert all(torch.equal(v, x.float() / 255) for v in ident)
    with pytest.raises(UserError, match="valid choices"):
        A.VIEW_MAKERS.get("simclr2")


@pytest.mark.parametrize("name", A.SHIFTS.names())
@pytest.mark.parametrize("c", CHANNELS)
def test_shifts_in_range_and_shape(name: str, c: int) -> None:
    x = _images(16, c, 16)
    out = A.SHIFTS.get(name)(x, _gen(30))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert bool(((out >= 0) & (out <= 1)).all())
    assert torch.equal(out, A.SHIFTS.get(name)(x, _gen(30)))
    if "grayscale" in name and c == 3:
        assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    if name == "grayscale" and c == 1:
        assert torch.equal(out, x)


def test_shift_names_and_semantics() -> None:
    assert A.SHIFTS.names() == ["grayscale", "crop", "flip", "jitter", "grayscale+jitter"]
    x = _images(64, 3, 8)
    flipped = A.SHIFTS.get("flip")(x, _gen(31))
    is_flip = (flipped == x.flip(-1)).flatten(1).all(1)
    assert bool((is_flip | (flipped == x).flatten(1).all(1)).all()) and 10 < int(is_flip.sum()) < 54
    gray = A.SHIFTS.get("grayscale")(x, _gen())
    assert _maxdiff(gray, TF.rgb_to_grayscale(x, num_output_channels=3)) <= OP_TOL
    assert not torch.equal(A.SHIFTS.get("jitter")(x, _gen(32)), x)
