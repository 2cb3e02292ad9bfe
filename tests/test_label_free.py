"""The label-free protocol: representation attacks checked against a per-example transcription of
the authors' loop, its read-outs, its sanity flag, an unlabeled image folder, the refusal of the
labelled protocols there, and the generated correlation paragraph pinned to hand-computed numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _models import digits_data, digits_model, one_thread
from torch import Tensor, nn

from robustbench_nacl.attack import representation as rep
from robustbench_nacl.attack.rng import rand
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval import label_free as lf
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.report import label_free as report
from robustbench_nacl.results.label_free import MEASURES, LabelFreeConfig, per_example

pytestmark = pytest.mark.usefixtures("single_thread")
CFG = LabelFreeConfig(eps="0.05", steps=3, sanity_n=16)


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    """The digits classifier without its last layer: images in [0,1] -> 512 features."""
    return nn.Sequential(*list(digits_model().children())[:-1]).eval()


def _transcribed(
    encoder: nn.Module, x: Tensor, target: Tensor | None, delta0: Tensor, eps: float, alpha: float, steps: int
) -> Tensor:
    """Petrov et al.'s ``utils/pgd_attack.py`` for one image, as written there (perturbation.grad,
    MSELoss(reduction='none').sum(1), ball clamp, then torch.maximum/minimum into [0,1])."""
    targeted = target is not None
    with torch.no_grad():
        ref = target if targeted else encoder(x)
    perturbation = delta0.clone().requires_grad_(True)
    for _ in range(steps):
        pred = encoder(x + perturbation)
        loss = nn.MSELoss(reduction="none")(pred, ref).sum(dim=1).sum()
        loss.backward()
        with torch.no_grad():
            perturbation.add_((-1 if targeted else 1) * alpha * perturbation.grad.sign())
            perturbation.clamp_(min=-eps, max=eps)
            perturbation.grad.zero_()
            torch.maximum(perturbation, 0 - x, out=perturbation)
            torch.minimum(perturbation, 1 - x, out=perturbation)
    return (x + perturbation).detach()


def test_batched_attack_is_the_authors_loop_example_by_example(encoder: nn.Module) -> None:
    x = digits_data()[2][:6]
    eps, alpha, steps = 0.1, 0.02, 4
    delta0 = (rand(x, torch.Generator().manual_seed(3)) * 2 - 1) * eps
    for target in (None, rep.embed(encoder, x.flip(0))):
        got = rep.representation_pgd(
            encoder, x, eps=eps, step_size=alpha, steps=steps, objective="l2", target=target,
            gen=torch.Generator().manual_seed(3), batch_size=4,
        )  # fmt: skip
        for i in range(len(x)):
            t = None if target is None else target[i : i + 1]
            want = _transcribed(encoder, x[i : i + 1], t, delta0[i : i + 1], eps, alpha, steps)
            torch.testing.assert_close(got[i : i + 1], want, rtol=0, atol=1e-6)


def test_untargeted_moves_away_targeted_moves_toward_and_a_flipped_sign_fails(encoder: nn.Module) -> None:
    x = digits_data()[2][:20]
    z = rep.embed(encoder, x)
    kw = {"eps": 0.1, "step_size": 0.025, "steps": 5, "gen": torch.Generator().manual_seed(0)}
    noise = (rand(x, torch.Generator().manual_seed(0)) * 2 - 1) * 0.1
    d_noise = (rep.embed(encoder, (x + noise).clamp(0, 1)) - z).norm(dim=1)
    for objective in ("l2", "cos"):
        away = rep.embed(encoder, rep.representation_pgd(encoder, x, objective=objective, **kw))
        # further than its own random start: a flipped sign (descent) would end nearer than the noise
        assert ((away - z).norm(dim=1) > d_noise).float().mean() >= 0.9, objective
    target = z.roll(1, 0)
    to = rep.embed(encoder, rep.representation_pgd(encoder, x, target=target, **kw))
    ignored = rep.embed(encoder, rep.representation_pgd(encoder, x, target=z.roll(2, 0), **kw))
    # the attack reaches its own target, not another image's: ignoring the target would not
    assert ((to - target).norm(dim=1) < (z - target).norm(dim=1)).all()
    assert ((to - target).norm(dim=1) < (ignored - target).norm(dim=1)).float().mean() >= 0.9


def test_quantiles_come_from_the_clean_embeddings_alone() -> None:
    g = torch.Generator().manual_seed(0)
    bank = torch.randn(300, 8, generator=g)
    q = rep.clean_quantiles(bank, torch.Generator().manual_seed(1))
    # the authors' computation: pdist within shuffled batches of 256, numpy's quantiles on the grid
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(1))
    d = torch.cat([torch.pdist(bank[perm][i : i + 256]) for i in (0, 256)]).double().numpy()
    np.testing.assert_allclose(q, np.quantile(d, rep.QUANTILE_LEVELS))
    med = rep.clean_median(q)
    assert rep.universal_quantile(np.array([med]), q)[0] == pytest.approx(0.5)
    assert rep.universal_quantile(np.array([1e9]), q)[0] == pytest.approx(0.999)


def test_the_normalisation_does_not_read_the_attacked_embeddings(encoder: nn.Module) -> None:
    x, y = digits_data()[2][:24], digits_data()[3][:24]
    data = lf.LabelFreeData("digits-test", (x * 255).round().to(torch.uint8), y)
    kw = {"seed": 0, "n_examples": 12, "probe": ProbeConfig(seed=0), "device": torch.device("cpu")}
    first = lf.measure(encoder, data, CFG, **kw)
    bank = rep.embed(encoder, data.x.float() / 255)
    med = rep.clean_median(rep.clean_quantiles(bank, lf._gen(0, "digits-test", "quantiles")))
    row = next(r for r in first if r["attack"] == "repr_pgd_l2")
    adv = rep.representation_pgd(
        encoder, data.x[:12].float() / 255, eps=0.05, step_size=0.0125, steps=3, objective="l2",
        gen=lf._gen(0, "digits-test", "untargeted", "l2", 0.05),
    )  # fmt: skip
    dist = (rep.embed(encoder, adv) - bank[:12]).norm(dim=1).numpy()
    np.testing.assert_allclose(per_example(row, "dist"), dist / med, rtol=1e-5)

    def numbers(rows: list[dict]) -> list[dict]:  # the measured fields, the timings left out
        return [{k: v for k, v in r.items() if k != "attack_wall_s"} for r in rows]

    assert numbers(first) == numbers(lf.measure(encoder, data, CFG, **kw))  # reproducible from the seed
    assert numbers(first) != numbers(lf.measure(encoder, data, CFG, **{**kw, "seed": 1}))


def test_a_pair_of_identical_images_has_no_margin_ratio_and_the_mean_skips_it(encoder: nn.Module) -> None:
    x = digits_data()[2][torch.arange(12) % 4]  # 4 images 3 times each: some pairs coincide
    data = lf.LabelFreeData("digits-twins", (x * 255).round().to(torch.uint8))
    kw = {"seed": 0, "n_examples": 12, "probe": ProbeConfig(seed=0), "device": torch.device("cpu")}
    row = next(r for r in lf.measure(encoder, data, CFG, **kw) if r["attack"] == "margin")
    margin = per_example(row, "margin")
    twins = np.isnan(margin)
    assert twins.any() and not twins.all() and np.isfinite(margin[~twins]).all()  # NaN, never inf
    assert row["n_robust"] == int((margin[~twins] >= 0).sum())  # a coinciding pair already overlaps
    assert MEASURES.get("margin").read(row) == pytest.approx(float(margin[~twins].mean()))


def test_an_encoder_with_zero_gradients_fires_the_unbounded_flag(encoder: nn.Module) -> None:
    class Frozen(nn.Module):  # the embedding of a rounded image: no gradient reaches the input
        def forward(self, x: Tensor) -> Tensor:
            return encoder((x * 4).round().detach() / 4)

    x = digits_data()[2][:16]
    ok = lf._sanity(encoder, x, CFG, 0, 64)
    masked = lf._sanity(Frozen(), x, CFG, 0, 64)
    assert ok["sanity_unbounded_moves_embedding"] and ok["sanity_nonzero_gradients"]
    assert masked["sanity_unbounded_moves_embedding"] is False and masked["sanity_nonzero_gradients"] is False


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from robustbench_nacl.training import TrainConfig, train

    cfg = TrainConfig(
        loss="simclr", dataset="digits:0-4", encoder="convnet_small", encoder_kwargs={"width": 4},
        epochs=1, batch_size=64, max_train=128,
    )  # fmt: skip
    with one_thread():
        return train(cfg, tmp_path_factory.mktemp("lf") / "run", progress=False)


def test_an_unlabeled_folder_is_this_protocols_data_and_the_labelled_ones_refuse_it(
    ckpt: Path, tmp_path: Path
) -> None:
    from PIL import Image

    folder = tmp_path / "images" / "any-subfolder"
    folder.mkdir(parents=True)
    x = digits_data()[2][:10]
    for i, img in enumerate(x):
        Image.fromarray((img[0].numpy() * 255).astype(np.uint8)).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    cfg = LabelFreeConfig(eps="0.05", steps=2, sanity_n=8)
    kw = {"dataset": str(tmp_path / "images"), "out": tmp_path / "out", "progress": False}
    rows = evaluate(ckpt, protocol="label-free", label_free=cfg, **kw)
    assert {r["attack"] for r in rows} == {"repr_pgd_cos", "repr_pgd_l2", "impersonation", "margin"}
    assert all(r["dataset"].startswith("images:images@") and r["n_examples_evaluated"] == 10 for r in rows)
    assert all(r["n_bank"] == 10 and r["finetune"]["protocol"] == "label-free" for r in rows)
    again = evaluate(ckpt, protocol="label-free", label_free=cfg, **kw)
    assert again.computed == 0 and [r.row_id for r in again] == [r.row_id for r in rows]
    for protocol in ("slf", "label-free,alf"):
        with pytest.raises(UserError, match=r"unlabeled image folder: only --protocol label-free reads one"):
            evaluate(ckpt, protocol=protocol, **kw)


def test_the_cli_writes_rows_and_a_table_and_refuses_the_folder_for_slf(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from robustbench_nacl.cli import main

    lf_flags = ["--label-free-eps", "0.05", "--label-free-steps", "2", "--label-free-sanity-n", "8"]
    args = ["eval", str(ckpt), "--protocol", "label-free", *lf_flags, "--n-examples", "12"]
    args += ["--out", str(tmp_path / "o"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "repr_pgd_cos" in out and "knn_repr_l2" in out and "result rows computed" in out
    assert len(list((tmp_path / "o" / "rows").glob("*.json"))) == 6
    assert main(["leaderboard", "--rows", str(tmp_path / "o"), "--out", str(tmp_path / "board")]) == 0
    page = " ".join((tmp_path / "board" / "LEADERBOARD.md").read_text().split())
    assert "From 6 label-free rows of 1 encoder, apart from the rows of the accuracy tables." in page
    (tmp_path / "imgs").mkdir()
    assert main(["eval", str(ckpt), "--dataset", str(tmp_path / "imgs"), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unlabeled image folder" in err[0]


# ============ the generated paragraph, on fixture rows ============


def _lines(values: dict[str, list[tuple[float, float]]]) -> list[report.Line]:
    """One Line per family: per seed (self-retrieval under the cos attack, SLF AutoAttack)."""
    from robustbench_nacl.report.aggregate import Recipe

    out = []
    for family, runs in values.items():
        line = report.Line(Recipe("enc", "ds", family, "", False, family), n_examples=100)
        line.values["self_retrieval_cos"] = {(family, s): m for s, (m, _) in enumerate(runs)}
        line.reference = {(family, s): a for s, (_, a) in enumerate(runs)}
        out.append(line)
    return out


def test_the_paragraph_is_pinned_to_the_numbers() -> None:
    found = _lines(
        {
            "a": [(0.9, 0.50), (0.8, 0.52)],
            "b": [(0.6, 0.40), (0.7, 0.38)],
            "c": [(0.2, 0.30), (0.3, 0.31)],
            "d": [(0.95, 0.10), (0.85, 0.12)],
        }
    )
    c = report.correlation(found, "self_retrieval_cos")
    assert c is not None and c.n_recipes == 4
    # means a .85 b .65 c .25 d .90 vs a .51 b .39 c .305 d .11: ranks (2, 3, 4, 1) vs (1, 2, 3, 4)
    assert c.rho == pytest.approx(np.corrcoef([2, 3, 4, 1], [1, 2, 3, 4])[0, 1]) == pytest.approx(-0.2)
    assert c.ranks == {"a": (2.0, 1.0), "b": (3.0, 2.0), "c": (4.0, 3.0), "d": (1.0, 4.0)}
    text = report.paragraph(found, 0.032, "ds")
    label = MEASURES.get("self_retrieval_cos").label
    assert text.startswith(
        f"Across the 4 recipes with both readings on ds, the label-free measure at ε = 0.032 that ranks "
        f"them most like SLF AutoAttack at 0.032 is {label}: Spearman's ρ = -0.20 [{c.lo:.2f}, {c.hi:.2f}]"
    )
    assert -1 <= c.lo <= c.rho <= c.hi <= 1
    assert (
        f"Where they disagree most: d ranks 1 of 4 by {label} but 4 by SLF AutoAttack (robust in the "
        "representation, not through the probe); a ranks 2 by"
    ) in text
    assert report.correlation(found[:2], "self_retrieval_cos") is None  # fewer than 3 recipes


def test_the_paragraph_says_which_measures_the_paired_bootstrap_tells_apart_from_the_best() -> None:
    """A copy of the best measure is not told apart from it (difference 0 on every resample); a
    measure that ranks the recipes backwards is."""
    aa = {"a": (0.50, 0.52), "b": (0.40, 0.41), "c": (0.30, 0.31), "d": (0.20, 0.22), "e": (0.10, 0.12)}
    found = _lines({f: [(a, a) for a in refs] for f, refs in aa.items()})
    for line in found:  # self-retrieval (cos) follows AutoAttack; its L2 twin copies it; cosine reverses it
        line.values["self_retrieval_l2"] = dict(line.values["self_retrieval_cos"])
        line.values["cos_sim"] = {k: 1 - v for k, v in line.values["self_retrieval_cos"].items()}
    twin = report.rho_difference(found, "self_retrieval_cos", "self_retrieval_l2")
    assert twin == (0.0, 0.0, 0.0)
    backwards = report.rho_difference(found, "self_retrieval_cos", "cos_sim")
    assert backwards is not None and backwards[0] == pytest.approx(2.0) and backwards[1] > 0
    text = report.paragraph(found, 0.032, "ds")
    best, l2, cos = (MEASURES.get(m).label for m in ("self_retrieval_cos", "self_retrieval_l2", "cos_sim"))
    assert f"ranks them most like SLF AutoAttack at 0.032 is {best}: Spearman's ρ = 1.00" in text
    assert (
        f"Paired on the same resamples, {best}'s ρ is not told apart (the 95 % interval of the difference "
        f"reaches 0) from {l2} (+0.00 [+0.00, +0.00]); it is above {cos} (+2.00 [{backwards[1]:+.2f}, "
        f"{backwards[2]:+.2f}])."
    ) in text
    assert report.rho_difference(found[:2], "self_retrieval_cos", "cos_sim") is None
    for line in found:  # without the twin, the best is above every other measure
        del line.values["self_retrieval_l2"]
    assert (
        f"Paired on the same resamples, {best}'s ρ is above every other's (the 95 % interval of each "
        f"difference excludes 0): {cos} (+2.00 ["
    ) in report.paragraph(found, 0.032, "ds")


def test_an_interval_stays_in_its_measures_range() -> None:
    """Three seeds' cosines near 1 give a t-interval above 1 and breakaway risks near 0 one below
    0; the table clips each to the values the measure can take, and leaves an unbounded one alone."""
    from robustbench_nacl.report.aggregate import Recipe
    from robustbench_nacl.report.stats import t_interval

    line = report.Line(Recipe("enc", "ds", "f", "", False, "f"), n_examples=100)
    runs = {"cos_sim": [0.999, 0.90, 0.95], "breakaway": [0.001, 0.06, 0.03], "margin": [-0.2, 0.4, 0.1]}
    for name, values in runs.items():
        line.values[name] = {("f", s): v for s, v in enumerate(values)}
    raw = {name: t_interval(values) for name, values in runs.items()}
    assert raw["cos_sim"][1] > 1 and raw["breakaway"][0] < 0  # what the clipping is for
    cos, brk, margin = (report.stat(line, n) for n in ("cos_sim", "breakaway", "margin"))
    assert (cos.lo, cos.hi) == (pytest.approx(raw["cos_sim"][0]), 1.0)
    assert (brk.lo, brk.hi) == (0.0, pytest.approx(raw["breakaway"][1]))
    assert (margin.lo, margin.hi) == (pytest.approx(raw["margin"][0]), pytest.approx(raw["margin"][1]))
    assert report.fmt_measure("cos_sim", cos).endswith(", 1.000]")
