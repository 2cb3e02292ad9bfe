"""The reference leaderboard's headroom (report/headroom.py): the arithmetic and its interval on a
hand-computable case, the rule that refuses a ratio over a span within noise, the section's lines on
hand-made manifests and rows, the control's fit, and the pilot's learning curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from robustbench_nacl.errors import UserError
from robustbench_nacl.report import headroom as hr

DATASET = "fashion-mnist:0-4"
T_975_DF2 = 4.302653  # Student's t, 97.5 % quantile, 2 degrees of freedom (any t table)


def _manifest(loss: str, seed: int, init: float = 0.70, final: float = 0.80) -> dict:
    return {
        "loss": loss,
        "dataset": DATASET,
        "seed": seed,
        "weights_sha256": f"{loss}{seed}",
        "knn_acc_init": init,
        "knn_acc": final,
    }


def _rows(
    sha: str, seed: int, clean: float, aa: float | None, *, control: bool = False, **extra
) -> list[dict]:
    """A checkpoint's SLF in-domain rows: a PGD row, and the AutoAttack row at 0.032 unless ``aa`` is None."""
    base = {
        "checkpoint_sha256": sha,
        "setting": "in-domain",
        "dataset": DATASET,
        "control": control,
        "loss": "random-init" if control else sha.rstrip("0123456789"),
        "seed": seed,
        "train_seed": seed,
        "clean_acc": clean,
        "n_examples_evaluated": 500,
        "norm": "Linf",
        "probe_train_acc": extra.pop("train", 0.8),
        "knn_acc": extra.pop("knn", 0.75),
    }
    out = [{**base, "attack": "pgd", "eps": 0.032, "robust_acc": 0.0}]
    if aa is not None:
        out.append({**base, "attack": "autoattack", "eps": 0.032, "robust_acc": aa})
        # AutoAttack at another ε and under ALF are not the headline SLF row
        out.append({**base, "attack": "autoattack", "eps": 0.016, "robust_acc": 0.99})
        out.append(
            {
                **base,
                "attack": "autoattack",
                "eps": 0.032,
                "robust_acc": 0.99,
                "finetune": {"protocol": "alf"},
            }
        )
    return out


def test_a_post_processed_family_gains_kNN_from_its_parents_initialisation() -> None:
    """A ++ manifest records its kNN after post-processing only; before training is its parent's."""
    parents = [{**_manifest("dynacl", s, init=0.60 + s / 100), "id": f"d{s}"} for s in range(2)]
    post = [
        {**_manifest("dynacl++", s, final=0.75), "id": f"p{s}", "post": {"recipe": "dynacl++"},
         "parent": {"id": f"d{s}"}}
        for s in range(2)
    ]  # fmt: skip
    for m in post:
        del m["knn_acc_init"]
    fams = {f.name: f for f in hr.headroom([*parents, *post], []).families}
    assert fams["dynacl++"].knn_init == pytest.approx(0.605) == fams["dynacl"].knn_init
    assert fams["dynacl++"].knn_gain == pytest.approx(14.5)
    with pytest.raises(UserError, match="p0 is post-processed from d0: give its manifest too"):
        hr.headroom(post, [])


def test_the_headroom_is_the_mean_of_the_seed_pairs_ratios_with_a_t_interval_over_them() -> None:
    control, supervised = {0: 0.80, 1: 0.80, 2: 0.80}, {0: 0.90, 1: 0.90, 2: 0.90}
    s = hr.scale({0: 0.85, 1: 0.86, 2: 0.84}, control, supervised)
    assert s is not None and s.pairs == 3
    # ratios 50, 60, 40 %: mean 50, standard deviation 10, so 50 ± t(0.975, 2) · 10 / √3
    half = T_975_DF2 * 10 / math.sqrt(3)  # 24.84
    assert s.ratio == pytest.approx(50.0)
    assert s.ratio_ci == pytest.approx((50 - half, 50 + half), abs=1e-4)
    # points above the control: 5, 6, 4, the same interval a tenth as wide in points
    assert s.above == pytest.approx(0.05) and s.above_ci == pytest.approx(
        (0.05 - half / 1000, 0.05 + half / 1000)
    )
    # only the seeds all three share pair up; a family and a control with no seed in common: None
    two = hr.scale({0: 0.85, 1: 0.86}, control, {0: 0.90, 2: 0.90})
    assert two is not None and two.pairs == 2 and two.ratio == pytest.approx(50.0) and two.ratio_ci is None
    assert hr.scale({5: 0.9}, control, supervised) is None
    no_ratio = hr.scale({0: 0.85}, control, None)
    assert no_ratio is not None and no_ratio.ratio is None and no_ratio.above_ci is None


def test_the_span_floor_is_two_binomial_standard_errors_of_the_difference() -> None:
    # 2 · √((0.9 · 0.1 + 0.8 · 0.2) / 500) = 2 · √0.0005
    assert hr.span_floor(0.90, 0.80, 500) == pytest.approx(0.044721, abs=1e-6)


def _board(sup_clean: tuple[float, float, float]) -> tuple[list[dict], list[dict]]:
    manifests = [_manifest("supervised", s, 0.70, 0.85) for s in range(3)]
    manifests += [_manifest("simclr", s, 0.70, 0.74) for s in range(3)]
    manifests += [_manifest("acl", s, 0.70, 0.76) for s in range(2)]
    rows: list[dict] = []
    for s in range(3):
        rows += _rows(f"ctl{s}", s, 0.80, 0.02, control=True, train=0.82, knn=0.75)
        rows += _rows(f"supervised{s}", s, sup_clean[s], 0.12)
        rows += _rows(f"simclr{s}", s, (0.85, 0.86, 0.84)[s], (0.07, 0.08, 0.06)[s])
    rows += _rows("acl0", 0, 0.82, 0.32) + _rows("acl1", 1, 0.84, None)  # acl seed 1: no AutoAttack row
    return manifests, rows


def test_the_section_places_each_family_between_the_control_and_the_supervised_baseline() -> None:
    h = hr.headroom(*_board((0.90, 0.90, 0.90)))
    assert [f.name for f in h.families] == ["acl", "simclr", "supervised"] and h.control.seeds == 3
    md = hr.headroom_markdown(h)
    assert "| random-init control (0 %) | 3 | – | 80.0 | – | 0 | 2.0 | – | 0 |" in md
    assert (
        "| supervised (100 %) | 3 | 70.0 → 85.0 (+15.0) | 90.0 | +10.0 [+10.0, +10.0] | 100 | 12.0 "
        "| +10.0 [+10.0, +10.0] | 100 |"
    ) in md
    # the hand-computed case above, on both metrics: AutoAttack 7, 8, 6 against 2 and 12
    assert (
        "| simclr | 3 | 70.0 → 74.0 (+4.0) | 85.0 | +5.0 [+2.5, +7.5] | 50 [25, 75] | 7.0 "
        "| +5.0 [+2.5, +7.5] | 50 [25, 75] |" in md
    )
    # acl: two seeds for clean (20 %, 40 %; t with 1 degree of freedom), one for AutoAttack (300 %)
    acl = h.scaled(h.families[0], "clean")
    assert acl is not None and acl.ratio_ci == pytest.approx((30 - 12.7062 * 10, 30 + 12.7062 * 10), abs=1e-3)
    assert (
        "| acl | 2 | 70.0 → 76.0 (+6.0) | 83.0 | +3.0 [-9.7, +15.7] | 30 [-97, 157] "
        "| 32.0 (n=1) | +30.0 | 300 |" in md
    )
    assert "every pair above its floor, so the ratio is given" in md and "below the floor" not in md
    assert "SLF clean headroom from 30 % (acl) to 50 % (simclr)" in md
    assert "at least 2 standard errors of that difference in every seed pair" in md


def test_a_span_within_noise_in_one_seed_pair_gives_points_and_no_ratio() -> None:
    # seed 1: the supervised baseline 3 points above the control, under its floor of
    # 2 · √((0.83 · 0.17 + 0.8 · 0.2) / 500) = 4.9 points
    h = hr.headroom(*_board((0.90, 0.83, 0.90)))
    sp = h.span("clean")
    assert (
        not sp.ok and sp.spans[1] == pytest.approx(0.03) and sp.floors[1] == pytest.approx(0.049080, abs=1e-6)
    )
    md = hr.headroom_markdown(h)
    assert (
        "| simclr | 3 | 70.0 → 74.0 (+4.0) | 85.0 | +5.0 [+2.5, +7.5] | – | 7.0 "
        "| +5.0 [+2.5, +7.5] | 50 [25, 75] |" in md
    )
    assert "| random-init control (0 %) | 3 | – | 80.0 | – | – | 2.0 | – | 0 |" in md
    assert "seed 1 +3.0 (floor 4.9)" in md and "seed pair 1 is below the floor, so no ratio is given" in md
    assert "SLF clean from +3.0 (acl) to +5.0 (simclr) points above the control" in md
    # below the control (a negative span) is under any floor: no ratio either
    assert not hr.headroom(*_board((0.70, 0.70, 0.70))).span("clean").ok
    assert "seed pairs 0, 1, 2 are below the floor" in hr.headroom_markdown(
        hr.headroom(*_board((0.70, 0.70, 0.70)))
    )


def test_without_a_supervised_baseline_there_is_no_scale_and_the_fit_line_stays(tmp_path: Path) -> None:
    manifests = [_manifest("simclr", 0)]
    rows = _rows("simclr0", 0, 0.85, None) + _rows("ctl0", 0, 0.80, None, control=True, train=0.60, knn=0.76)
    md = hr.headroom_markdown(hr.headroom(manifests, rows))
    assert "| simclr | 1 | 70.0 → 80.0 (+10.0) | 85.0 | +5.0 | – | – | – | – |" in md
    assert "SLF clean: no seed with both the supervised baseline and the control measured" in md
    # the control's probe stops 16 points below kNN: it is not fitted
    assert "fitted (train accuracy within 10 points of kNN" in md and ": **no**; seed 0" in md
    text = f"a\n{hr.BEGIN}\nold\n{hr.END}\nb\n"
    assert hr.splice(text, md) == f"a\n{hr.BEGIN}\n{md}{hr.END}\nb\n"
    with pytest.raises(UserError, match="no checkpoint manifests"):
        hr.read_manifests(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(_manifest("acl", 0)))
    assert hr.read_manifests(tmp_path)[0]["loss"] == "acl"
    with pytest.raises(UserError, match="span 2 pretraining datasets"):
        hr.headroom([_manifest("acl", 0), {**_manifest("acl", 1), "dataset": "digits:0-4"}], rows)


def _log(folder: Path, name: str, curve: list[tuple[float, float]]) -> None:
    (folder / name).mkdir(parents=True)
    lines = [
        json.dumps({"epoch": e, "test_knn_acc": k, "test_probe_acc": p}) for e, (k, p) in enumerate(curve)
    ]
    (folder / name / "log.jsonl").write_text("\n".join(lines) + "\n")


def test_the_pilot_table_gives_each_curves_best_gain_over_initialisation(tmp_path: Path) -> None:
    _log(tmp_path, "full_simclr", [(0.70, 0.80), (0.78, 0.83), (0.75, 0.86)])  # best kNN at epoch 1
    _log(tmp_path, "full_intcl", [(0.70, 0.80), (0.72, 0.79)])  # the probe only falls: gain -1.0
    md = hr.pilot_markdown(tmp_path)
    assert "| full_simclr | 2 | 70.0 | 78.0 (1) | +8.0 | 80.0 | 86.0 (2) | +6.0 |" in md
    assert "| full_intcl | 1 | 70.0 | 72.0 (1) | +2.0 | 80.0 | 79.0 (1) | -1.0 |" in md
    assert "kNN +8.0 points, quick probe +6.0 points" in md
    (tmp_path / "full_intcl" / "log.jsonl").write_text(json.dumps({"epoch": 1, "test_knn_acc": 0.7}) + "\n")
    with pytest.raises(UserError, match="not a learning curve from initialisation"):
        hr.pilot_markdown(tmp_path)
    _log(tmp_path, "only_init", [(0.7, 0.8)])  # nothing after initialisation: no gain to read
    (tmp_path / "full_intcl" / "log.jsonl").unlink()
    with pytest.raises(UserError, match="to a later epoch"):
        hr.pilot_markdown(tmp_path)
    with pytest.raises(UserError, match="no learning curves"):
        hr.pilot_markdown(tmp_path / "elsewhere")
