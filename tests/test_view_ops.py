"""The batched view makers against their previous implementation (one op sequence per view, the hue
at each of the 4 jitter positions), kept below as the reference: the same draws give the same views
bit for bit, on the CPU's path (sorted slices) and the accelerators' (masks); and the ATen ops one
views call dispatches (``bench/view_ops.py``): few, whatever the batch size, and no host sync on the
accelerators' path."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _syncs import count_syncs
from torch import Tensor

import robustbench_nacl.augment as A
from robustbench_nacl.augment import ops

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("single_thread")

# ---------------------------------------------------------------- the previous implementation
# robustbench_nacl.augment as of 50c710e8 (ops.py and simclr.py), trimmed to what a views call runs:
# its CPU path ran the hue on the selected samples only, equal to this all-samples form (it was tested).


def _old_rand(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.rand(shape, generator=gen, device=gen.device)


def _old_crop_boxes(b: int, hh: int, ww: int, scale: tuple, ratio: tuple, gen: torch.Generator) -> tuple:
    area, log_lo, log_hi = float(hh * ww), math.log(ratio[0]), math.log(ratio[1])
    target = area * (scale[0] + (scale[1] - scale[0]) * _old_rand(gen, b, 10).to(torch.float64))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * _old_rand(gen, b, 10).to(torch.float64))
    w = torch.round(torch.sqrt(target * aspect)).long()
    h = torch.round(torch.sqrt(target / aspect)).long()
    valid = (w > 0) & (w <= ww) & (h > 0) & (h <= hh)
    first = valid.to(torch.uint8).argmax(dim=1, keepdim=True)
    found = valid.any(dim=1)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    in_ratio = float(ww) / float(hh)
    if in_ratio < min(ratio):
        fw, fh = ww, round(ww / min(ratio))
    elif in_ratio > max(ratio):
        fw, fh = round(hh * max(ratio)), hh
    else:
        fw, fh = ww, hh
    w, h = torch.where(found, w, torch.full_like(w, fw)), torch.where(found, h, torch.full_like(h, fh))
    top = torch.floor(_old_rand(gen, b).to(torch.float64) * (hh - h + 1)).long()
    left = torch.floor(_old_rand(gen, b).to(torch.float64) * (ww - w + 1)).long()
    top, left = torch.minimum(top, hh - h), torch.minimum(left, ww - w)
    return torch.where(found, top, (hh - h) // 2), torch.where(found, left, (ww - w) // 2), h, w


def _old_jitter_params(b: int, jitter: tuple, gen: torch.Generator) -> tuple:
    order = _old_rand(gen, b, 4).argsort(dim=1)
    los = [max(0.0, 1.0 - v) for v in jitter[:3]] + [-jitter[3]]
    his = [1.0 + v for v in jitter[:3]] + [jitter[3]]
    return (*(lo + (hi - lo) * _old_rand(gen, b) for lo, hi in zip(los, his, strict=True)), order)


def _old_crop(x: Tensor, top: Tensor, left: Tensor, h: Tensor, w: Tensor, flip: Tensor) -> Tensor:
    b, _, ih, iw = x.shape
    top, left, h, w = (t.to(torch.float64) for t in (top, left, h, w))
    ys = (torch.arange(ih, dtype=torch.float64) + 0.5)[None] * (h / ih)[:, None] - 0.5
    xs = (torch.arange(iw, dtype=torch.float64) + 0.5)[None] * (w / iw)[:, None] - 0.5
    ys = torch.minimum(ys.clamp_min(0.0), (h - 1)[:, None])
    xs = torch.minimum(xs.clamp_min(0.0), (w - 1)[:, None])
    xs = torch.where(flip[:, None], xs.flip(1), xs)
    gy = ((2.0 * (top[:, None] + ys) + 1.0) / ih - 1.0).to(x.dtype)
    gx = ((2.0 * (left[:, None] + xs) + 1.0) / iw - 1.0).to(x.dtype)
    grid = torch.stack((gx[:, None, :].expand(b, ih, iw), gy[:, :, None].expand(b, ih, iw)), dim=-1)
    return torch.nn.functional.grid_sample(x, grid, padding_mode="border", align_corners=False)


def _b(v: Tensor, x: Tensor) -> Tensor:
    return v.reshape(-1, *([1] * (x.ndim - 1)))


def _old_gray(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(dim=1)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def _old_blend(img: Tensor, other: Tensor | float, ratio: Tensor) -> Tensor:
    r = _b(ratio.to(img.dtype), img)
    out = r * img
    out += (1.0 - r) * other
    return out.clamp_(0.0, 1.0)


def _old_hue(x: Tensor, factor: Tensor) -> Tensor:
    r, g, b = x.unbind(dim=1)
    maxc, minc = torch.amax(x, dim=1), torch.amin(x, dim=1)
    cr = maxc - minc
    eqc = 1.0 - torch.sign(cr)
    s = cr / (maxc + eqc)
    crd = cr + eqc
    dr, dg, db = maxc - r, maxc - g, maxc - b
    rc, gc, bc = dr / crd, dg / crd, db / crd
    is_r = 1.0 - torch.sign(dr)
    is_g = (1.0 - is_r) * (1.0 - torch.sign(dg))
    is_b = (1.0 - is_r) - is_g
    h = is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc)
    h = torch.fmod((h / 6.0 + 1.0), 1.0)
    h = (h + _b(factor.to(x.dtype), h)) % 1.0
    v = maxc
    i = torch.floor(h * 6.0)
    f = (h * 6.0) - i
    p = torch.clamp((v * (1.0 - s)), 0.0, 1.0)
    q = torch.clamp((v * (1.0 - s * f)), 0.0, 1.0)
    t = torch.clamp((v * (1.0 - s * (1.0 - f))), 0.0, 1.0)
    e1, e2, e3, e4, e5 = (torch.clamp_min(1.0 - (i - k).abs(), 0.0) for k in range(1, 6))
    e0 = 1.0 - ((((e1 + e2) + e3) + e4) + e5)
    red = v * (e0 + e5) + p * (e2 + e3) + q * e1 + t * e4
    green = v * (e1 + e2) + p * (e4 + e5) + t * e0 + q * e3
    blue = v * (e3 + e4) + p * (e0 + e1) + t * e2 + q * e5
    return torch.stack((red, green, blue), dim=1)


def _old_color_jitter(x: Tensor, factors: tuple, order: Tensor, mask: Tensor, ops_on: tuple) -> Tensor:
    """The previous ``color_jitter``: at each of the 4 positions one blend of every sample (ratio 1
    where the position holds no enabled blend) and the hue of the samples whose op it is."""
    ops_on = tuple(op for op in ops_on if x.shape[1] == 3 or op in (0, 1))
    blend_ops = tuple(op for op in ops_on if op != 3)
    stacked = torch.stack(factors[:3], dim=1).to(x.dtype)
    one = torch.ones_like(factors[0], dtype=x.dtype)
    if 3 in ops_on and not blend_ops:
        x = x.clone()
    for pos in range(4):
        op = order[:, pos]
        if blend_ops:
            is_op = [(mask & (op == k)).to(x.dtype) for k in (0, 1, 2)]
            active = sum(is_op[k] for k in blend_ops)
            ratio = sum(is_op[k] * stacked[:, k] for k in blend_ops) + (one - active)
            gray, target = _old_gray(x), 0.0
            if 1 in blend_ops:
                target = _b(is_op[1], x) * gray.mean(dim=(1, 2, 3), keepdim=True)
            if 2 in blend_ops:
                target = target + _b(is_op[2], x) * gray
            x = _old_blend(x, target, ratio)
        if 3 in ops_on:
            x = torch.where(_b(mask & (op == 3), x), _old_hue(x, factors[3]), x)
    return x


def _old_simclr_views(x: Tensor, n_views: int, gen: torch.Generator, cfg: A.SimCLRAug) -> list[Tensor]:
    """The previous ``simclr_views``: per view, its draws, then crop, jitter and grayscale."""
    xf = x.to(torch.float32) / 255.0 if x.dtype == torch.uint8 else x
    b, _, hh, ww = xf.shape
    jitter_ops = tuple(op for op, v in enumerate(cfg.jitter) if v > 0)
    out = []
    for _ in range(n_views):
        top, left, h, w = _old_crop_boxes(b, hh, ww, cfg.scale, cfg.ratio, gen)
        flip, jit = _old_rand(gen, b) < cfg.p_flip, _old_rand(gen, b) < cfg.p_jitter
        *factors, order = _old_jitter_params(b, cfg.jitter, gen)
        gray = _old_rand(gen, b) < cfg.p_gray
        view = _old_crop(xf, top, left, h, w, flip)
        if jitter_ops:
            view = _old_color_jitter(view, tuple(factors), order, jit, jitter_ops)
        if view.shape[1] == 3:
            m = _b(gray.to(view.dtype), view)
            view = _old_gray(view) * m + view * (1.0 - m)
        out.append(view)
    return out


# ---------------------------------------------------------------- the same views, bit for bit


@pytest.fixture(params=["slices", "masks"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both jitter paths on the CPU: the CPU's own (sorted slices) and the accelerators' (masks)."""
    monkeypatch.setattr(ops, "_use_slices", lambda x: request.param == "slices")
    yield request.param


def _uint8_images(b: int, c: int, s: int, seed: int) -> Tensor:
    x = torch.randint(0, 256, (b, c, s, s), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    x[:3] = x[:3, :1]  # gray pixels: ties between the channels
    x[3:5] = (x[3:5] // 128) * 255  # saturated colours, ties at 0 and 255
    x[5] = 77  # one flat image
    return x


POLICIES = {  # the view makers' policies: simclr, acl (strength 1 and 0.5), crop_flip
    "simclr": A.SimCLRAug(),
    "acl": A.SimCLRAug(strength=0.5, scale=(0.1, 1.0)),
    "acl_half": A.SimCLRAug(strength=0.25, scale=(0.55, 1.0), p_jitter=0.4, p_gray=0.1),
    "crop_flip": A.SimCLRAug(strength=0.0, p_jitter=0.0, p_gray=0.0),
    "always": A.SimCLRAug(strength=2.0, scale=(0.3, 0.9), p_jitter=1.0, p_gray=0.5),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(("c", "s"), [(3, 12), (1, 10), (3, 7)])
def test_views_equal_the_previous_implementation_bit_for_bit(path: str, policy: str, c: int, s: int) -> None:
    cfg = POLICIES[policy]
    x = _uint8_images(40, c, s, seed=c * s)
    for n_views in (1, 3):
        gen_old, gen_new = torch.Generator().manual_seed(s), torch.Generator().manual_seed(s)
        old = _old_simclr_views(x, n_views, gen_old, cfg)
        new = A.simclr_views(x, n_views, gen_new, cfg)
        assert len(new) == n_views
        for v_old, v_new in zip(old, new, strict=True):
            assert v_new.dtype == torch.float32 and v_new.shape == x.shape
            assert torch.equal(v_old, v_new), (policy, n_views, (v_old - v_new).abs().max().item())
        # the same draws: the generators are left in the same state
        assert torch.equal(gen_old.get_state(), gen_new.get_state())


@pytest.mark.parametrize("c", [3, 1])
def test_color_jitter_equals_the_previous_implementation_for_every_op_set(path: str, c: int) -> None:
    gen = torch.Generator().manual_seed(50 + c)
    x = torch.rand(48, c, 6, 5, generator=gen) * 1.2 - 0.1  # beyond [0, 1] too: the clamps must agree
    *factors, order = A.sample_jitter(48, (0.8, 0.8, 0.8, 0.2), gen)
    mask = torch.rand(48, generator=gen) < 0.7
    for ops_on in [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2), (1, 3), (0, 2, 3), (0, 1, 2, 3)]:
        for m in (mask, torch.ones(48, dtype=torch.bool)):
            old = _old_color_jitter(x, tuple(factors), order, m, ops_on)
            new = A.color_jitter(x, *factors, order, mask=m, ops=ops_on)
            assert torch.equal(old, new), (ops_on, (old - new).abs().max().item())
    # hue alone (no blend clamps the input first): equal for images in [0, 1]
    xin = x.clamp(0.0, 1.0)
    for m in (mask, None):
        ref = _old_color_jitter(
            xin, tuple(factors), order, torch.ones(48, dtype=torch.bool) if m is None else m, (3,)
        )
        assert torch.equal(A.color_jitter(xin, *factors, order, mask=m, ops=(3,)), ref)


def test_shifts_equal_the_previous_implementation() -> None:
    x = torch.rand(30, 3, 9, 9, generator=torch.Generator().manual_seed(60))
    crop = _old_crop(
        x,
        *_old_crop_boxes(30, 9, 9, (0.08, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(61)),
        torch.zeros(30, dtype=torch.bool),
    )
    assert torch.equal(A.SHIFTS.get("crop")(x, torch.Generator().manual_seed(61)), crop)
    gen = torch.Generator().manual_seed(62)
    *factors, order = _old_jitter_params(30, (0.4, 0.4, 0.4, 0.1), gen)
    jitter = _old_color_jitter(x, tuple(factors), order, torch.ones(30, dtype=torch.bool), (0, 1, 2, 3))
    assert torch.equal(A.SHIFTS.get("jitter")(x, torch.Generator().manual_seed(62)), jitter)


def test_views_do_not_change_their_input() -> None:
    x = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(63))
    before = x.clone()
    A.simclr_views(x, 2, torch.Generator().manual_seed(64), POLICIES["always"])
    p = A.sample_params(POLICIES["always"], 16, 8, 8, torch.Generator().manual_seed(65))
    A.apply(x, p)
    A.color_jitter(x, p.brightness, p.contrast, p.saturation, p.hue, p.order)
    assert torch.equal(x, before)


# ---------------------------------------------------------------- dispatched ops and host syncs


@pytest.fixture(scope="module")
def view_ops() -> Iterator[object]:
    sys.path.insert(0, str(ROOT / "bench"))
    sys.modules.pop("view_ops", None)
    import view_ops

    yield view_ops
    sys.path.remove(str(ROOT / "bench"))


def test_a_simclr_views_call_dispatches_a_few_hundred_ops_at_any_batch_size(view_ops) -> None:
    # before (50c710e8): 1,554 ops for one simclr call of 2 views at batches 64 and 256 (1,333 at 8)
    call, maker, n_views = view_ops.view_call(view_ops.load_package(None), "simclr")
    assert (maker, n_views) == ("simclr", 2)
    counts = {b: sum(view_ops.count_ops(call, b).values()) for b in (8, 64)}
    assert counts[8] == counts[64] <= 400, counts
    for c in (1, 3):  # and on the accelerators' path, for both channel counts
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "_use_slices", lambda x: False)
            masked = {b: sum(view_ops.count_ops(call, b, (c, 16, 16)).values()) for b in (8, 64)}
        assert masked[8] == masked[64] <= 400, (c, masked)


def test_view_ops_bench_prints_one_line_per_preset(view_ops, capsys: pytest.CaptureFixture[str]) -> None:
    view_ops.main(["--presets", "simclr,supervised", "--batches", "4,8", "--shape", "1,8,8"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["preset"] for r in lines] == ["simclr", "supervised"]
    assert all(r["constant"] and set(r["ops"]) == {"4", "8"} for r in lines)
    assert lines[1]["views"] == "crop_flip" and lines[1]["per_view"] == lines[1]["ops"]["8"]


def test_the_accelerators_path_makes_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _uint8_images(16, 3, 8, seed=66)
    monkeypatch.setattr(ops, "_use_slices", lambda x: False)
    for name in ("simclr", "acl", "acl_original", "crop_flip"):
        with count_syncs() as syncs:
            A.VIEW_MAKERS.get(name)(x, 2, torch.Generator().manual_seed(67))
        assert syncs.total == 0, (name, syncs.counts)
    monkeypatch.undo()
    with count_syncs() as syncs:  # the CPU's path reads its slice bounds back once per call
        A.VIEW_MAKERS.get("simclr")(x, 2, torch.Generator().manual_seed(67))
    assert syncs.counts == {"tolist": 1}, syncs.counts
