"""Common corruptions (robustbench_nacl.data.corruptions): the CIFAR-10-C formulas batched on
tensors, checked against imagecorruptions (the maintained packaging of Hendrycks & Dietterich's
code) or, where its function no longer runs with today's scikit-image, the primitive it calls."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from robustbench_nacl.cli import main
from robustbench_nacl.data import corruptions as C
from robustbench_nacl.data import load_dataset
from robustbench_nacl.errors import UserError


def _digits(n: int = 64) -> torch.Tensor:
    return load_dataset("digits", "test").x[:n]


def _rgb32(n: int = 4) -> np.ndarray:
    """Smooth random 32x32 RGB images (uint8, N x H x W x C): textures like natural images'."""
    from scipy.ndimage import uniform_filter

    rng = np.random.default_rng(0)
    raw = rng.random((n, 32, 32, 3)) * 255
    return np.stack([uniform_filter(i, (5, 5, 1)) for i in raw]).astype(np.uint8)


def _mine(x: np.ndarray, name: str, c: object) -> np.ndarray:
    """Our formula with parameter ``c`` on NHWC uint8 images, quantised as corrupt() does."""
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).double() / 255
    out = C.CORRUPTIONS.get(name)(xt, c, torch.Generator().manual_seed(0)).clamp(0, 1)
    return torch.floor(out * 255 + 1e-6).permute(0, 2, 3, 1).numpy().astype(int)


@pytest.mark.parametrize("name", C.corruption_names(channels=1))
def test_shapes_range_determinism_and_severity_order_on_digits(name: str) -> None:
    x = _digits()
    outs = [C.corrupt(x, name, s, seed=7) for s in C.SEVERITIES]
    for out in outs:
        assert out.shape == x.shape and out.dtype == torch.uint8  # uint8: [0, 255] = [0, 1]
    assert torch.equal(outs[2], C.corrupt(x, name, 3, seed=7))  # same seed, same images
    sizes = [C.perturbation_size(x, name, s, seed=7) for s in C.SEVERITIES]
    assert sizes[0] > 0 and sizes[-1] > sizes[0], sizes
    # monotone up to the sampling noise of a random corruption at neighbouring severities
    assert all(b >= a * 0.97 for a, b in itertools.pairwise(sizes)), sizes


def test_noise_depends_on_the_seed_and_colour_only_corruptions_refuse_grey() -> None:
    x = _digits()
    assert not torch.equal(C.corrupt(x, "gaussian_noise", 3, 0), C.corrupt(x, "gaussian_noise", 3, 1))
    assert "saturate" not in C.corruption_names(channels=1)
    with pytest.raises(UserError, match="colour"):
        C.corrupt(x, "saturate", 1, 0)
    assert C.parse_corruptions("all", 3) == C.corruption_names(3)


@pytest.fixture(scope="module")
def icc():
    return pytest.importorskip(
        "imagecorruptions.corruptions",
        reason="imagecorruptions is not installed (the test extra brings it); the formulas are unchecked",
    )


@pytest.mark.parametrize("severity", [1, 3])
@pytest.mark.parametrize("name", ["contrast", "brightness", "saturate", "defocus_blur"])
def test_deterministic_formulas_match_imagecorruptions(icc, name: str, severity: int) -> None:
    """imagecorruptions holds the ImageNet-C parameters: our formula is run with the same one."""
    from PIL import Image

    x = _rgb32()
    params = {
        "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
        "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
        "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
        "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    }[name][severity - 1]
    ref = np.stack([np.uint8(getattr(icc, name)(Image.fromarray(i), severity)) for i in x]).astype(int)
    assert np.abs(_mine(x, name, params) - ref).max() <= 1  # uint8 truncation of float differences


def test_blur_and_pixelate_match_the_primitives_they_call(icc) -> None:
    """imagecorruptions' gaussian_blur passes scikit-image's removed ``multichannel``: compare with
    ``skimage.filters.gaussian`` per channel; pixelate is two Pillow BOX resizes (CIFAR-10-C)."""
    from PIL import Image
    from skimage.filters import gaussian

    x = _rgb32()
    for sigma in (0.4, 1.0):
        ref = np.stack(
            [np.uint8(np.clip(gaussian(i / 255.0, sigma=sigma, channel_axis=-1), 0, 1) * 255) for i in x]
        )
        assert np.abs(_mine(x, "gaussian_blur", sigma) - ref.astype(int)).max() <= 1
    for c in (0.95, 0.65):
        small = (int(32 * c),) * 2
        ref = np.stack(
            [np.array(Image.fromarray(i).resize(small, Image.BOX).resize((32, 32), Image.BOX)) for i in x]
        )
        assert np.abs(_mine(x, "pixelate", c) - ref.astype(int)).max() <= 1


@pytest.mark.parametrize("name", ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"])
def test_noise_has_imagecorruptions_statistics(icc, name: str) -> None:
    """Random draws differ between generators: compare the distribution of the change instead
    (mean and spread of the per-pixel difference on the same images, severity 3 of ImageNet-C)."""
    from PIL import Image

    x = np.repeat(_rgb32(2), 8, axis=0)  # 16 images, ~50k values
    c = {"gaussian_noise": 0.18, "shot_noise": 12, "impulse_noise": 0.09, "speckle_noise": 0.35}[name]
    np.random.seed(0)
    ref = np.stack([np.uint8(getattr(icc, name)(Image.fromarray(i), 3)) for i in x]).astype(int) - x
    ours = _mine(x, name, c) - x
    assert abs(ours.mean() - ref.mean()) < 0.5
    assert abs(ours.std() - ref.std()) < 0.03 * ref.std()
    if name == "impulse_noise":  # the fraction of values set to 0 or 255
        frac = [np.isin(d + x, (0, 255)).mean() for d in (ours, ref)]
        assert abs(frac[0] - frac[1]) < 0.01


def test_cli_unknown_corruption_is_one_line_with_a_suggestion(capsys, tmp_path) -> None:
    code = main(["eval", str(tmp_path / "none"), "--dataset", "digits:0-4", "--corruptions", "gausian_noise"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "unknown corruption 'gausian_noise'" in err and "did you mean 'gaussian_noise'" in err


def test_corruption_setting_rows_and_the_per_severity_table(tmp_path) -> None:
    """evaluate(corruptions=...) writes one setting per (corruption, severity) with the in-domain
    probe; the rows carry both, and the leaderboard averages over corruptions per severity."""
    from _models import one_thread
    from _reliability import TINY

    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.eval.probe import ProbeConfig
    from robustbench_nacl.report.leaderboard import render_leaderboard
    from robustbench_nacl.results.rows import stamp_ids
    from robustbench_nacl.training import train

    with one_thread():
        ckpt = train(TINY, tmp_path / "ck", progress=False)
        kw = {"suite": "quick", "n_examples": 60, "probe": ProbeConfig(epochs=20, lr=1e-2), "progress": False}
        rows = evaluate(
            ckpt, out=tmp_path / "out", corruptions="contrast,gaussian_blur", severities="1,5", **kw
        )
    corrupted = [r for r in rows if r["setting"] == "corruption"]
    assert {(r["corruption"], r["severity"]) for r in corrupted} == {
        (c, s) for c in ("contrast", "gaussian_blur") for s in (1, 5)
    }
    assert len({r.row_id for r in rows}) == len(rows) and len({r.protocol_id for r in corrupted}) == 4
    clean = {(r["corruption"], r["severity"]): r["clean_acc"] for r in corrupted if r["attack"] == "fgsm"}
    assert all(r.get("corruption") is None for r in rows if r["setting"] == "in-domain")
    render_leaderboard([dict(r) for r in rows], tmp_path / "board")
    md = (tmp_path / "board" / "LEADERBOARD.md").read_text()
    table = md[md.index("## Corruptions") :].split("\n\n")[1].splitlines()
    cells = [c.strip() for c in table[2].split("|")[1:-1]]
    head = [c.strip() for c in table[0].split("|")[1:-1]]
    for s in (1, 5):
        want = 100 * (clean[("contrast", s)] + clean[("gaussian_blur", s)]) / 2
        assert float(cells[head.index(f"s{s} clean")]) == pytest.approx(want, abs=0.051)
    # clean accuracy at chance under a corruption: one note per corruption and severity, read as what
    # the corruption does (every attack's row of it shares the clean accuracy)
    at_chance = {"sanity_ok": False, "sanity_failed": "clean_above_chance"}
    flagged = [
        {**r, **at_chance} if (r.get("corruption"), r.get("severity")) == ("contrast", 5) else dict(r)
        for r in rows
    ]
    assert sum(r.get("sanity_failed") == "clean_above_chance" for r in flagged) >= 2
    # a second run of the recipe (another training seed), at chance under the same corruption
    seed = flagged[0]["train_seed"]
    again = [
        stamp_ids({**r, "checkpoint_sha256": "e" * 64, "checkpoint_id": "again", "train_seed": seed + 1})
        for r in flagged
    ]
    render_leaderboard([*flagged, *again], tmp_path / "flagged")
    md = (tmp_path / "flagged" / "LEADERBOARD.md").read_text()
    notes = [line for line in md.splitlines() if line.startswith("- ⚠ ")]
    assert len(notes) == 1 and "corruption contrast severity 5" in notes[0]  # one note names both runs
    family = flagged[0]["loss"]
    assert f"at chance under this corruption for 2 runs ({family} s{seed}, {family} s{seed + 1})" in notes[0]
    assert "a clean accuracy at chance is listed too" in md


def test_robust_ssl_suite_is_pgd20_and_autoattack_standard_at_8_255() -> None:
    from robustbench_nacl.attack.suites import load_suite

    suite = load_suite("robust-ssl")
    assert [(s.name, s.norm, s.eps) for s in suite.attacks] == [
        ("pgd", "Linf", (8 / 255,)),
        ("autoattack", "Linf", (8 / 255,)),
    ]
    assert suite.attacks[0].params["steps"] == 20 and suite.attacks[0].params["step_size"] == pytest.approx(
        2 / 255
    )
    assert suite.attacks[1].params["version"] == "standard"
