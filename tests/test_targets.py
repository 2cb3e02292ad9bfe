"""The reference leaderboard's training targets (report/targets.py): the arithmetic and the verdicts
on hand-made manifests and rows, and the one-line error for an empty folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robustbench_nacl.errors import UserError
from robustbench_nacl.report import targets as tg

DATASET = "fashion-mnist:0-4"


def _manifest(loss: str, seed: int, init: float, final: float) -> dict:
    return {
        "loss": loss,
        "dataset": DATASET,
        "seed": seed,
        "weights_sha256": f"{loss}{seed}",
        "knn_acc_init": init,
        "knn_acc": final,
    }


def _row(sha: str, clean: float, *, control: bool = False, seed: int = 0, **extra) -> dict:
    return {
        "checkpoint_sha256": sha,
        "setting": "in-domain",
        "dataset": DATASET,
        "control": control,
        "seed": seed,
        "clean_acc": clean,
        "probe_train_acc": extra.pop("train", 0.8),
        "knn_acc": extra.pop("knn", 0.75),
        **extra,
    }


def test_targets_are_means_over_seeds_and_each_verdict_follows_its_threshold() -> None:
    manifests = [
        _manifest("simclr", 0, 0.70, 0.84),
        _manifest("simclr", 1, 0.72, 0.80),  # simclr: +11 kNN points on average
        _manifest("acl", 0, 0.70, 0.75),
    ]
    rows = [
        _row("simclr0", 0.90),
        _row("simclr0", 0.90, attack="pgd"),  # a second row of one checkpoint counts once
        _row("simclr1", 0.94),
        _row("acl0", 0.85),
        _row("acl0", 0.10, finetune={"protocol": "alf"}),  # ALF rows are not SLF's clean accuracy
        _row("ctl0", 0.80, control=True, seed=0, train=0.82, knn=0.75),
        _row("ctl1", 0.82, control=True, seed=1, train=0.60, knn=0.76),
    ]
    t = tg.targets(manifests, rows)
    acl, simclr = t.families
    assert (simclr.family, simclr.seeds) == ("simclr", 2)
    assert simclr.knn_gain == pytest.approx(11.0) and acl.knn_gain == pytest.approx(5.0)
    assert t.control_clean == pytest.approx(0.81)
    assert t.above_control(simclr) == pytest.approx(11.0) and t.above_control(acl) == pytest.approx(4.0)
    md = tg.targets_markdown(t)
    assert "| simclr | 2 | 71.0 | 82.0 | +11.0 | yes | 92.0 | +11.0 | yes |" in md
    assert "| acl | 1 | 70.0 | 75.0 | +5.0 | **no** | 85.0 | +4.0 | **no** |" in md
    assert "kNN gain of at least 10 points: 1 of 2 families" in md
    # seed 1's probe stops 16 points below kNN: the control's fit fails
    assert "fitted (train accuracy within 10 points of kNN" in md and ": **no**; seed 0" in md
    text = f"a\n{tg.BEGIN}\nold\n{tg.END}\nb\n"
    assert tg.splice(text, md) == f"a\n{tg.BEGIN}\n{md}{tg.END}\nb\n"


def test_a_family_without_slf_rows_for_every_seed_has_no_clean_verdict(tmp_path: Path) -> None:
    t = tg.targets(
        [_manifest("simclr", 0, 0.7, 0.8), _manifest("simclr", 1, 0.7, 0.8)], [_row("simclr0", 0.9)]
    )
    assert t.families[0].clean is None and t.above_control(t.families[0]) is None
    assert "| – | – |" in tg.targets_markdown(t)
    with pytest.raises(UserError, match="no checkpoint manifests"):
        tg.read_manifests(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(_manifest("acl", 0, 0.7, 0.8)))
    assert tg.read_manifests(tmp_path)[0]["loss"] == "acl"


def _log(folder: Path, name: str, curve: list[tuple[float, float]]) -> None:
    (folder / name).mkdir(parents=True)
    lines = [
        json.dumps({"epoch": e, "test_knn_acc": k, "test_probe_acc": p}) for e, (k, p) in enumerate(curve)
    ]
    (folder / name / "log.jsonl").write_text("\n".join(lines) + "\n")


def test_the_pilot_table_gives_each_curves_best_gain_over_initialisation(tmp_path: Path) -> None:
    _log(tmp_path, "full_simclr", [(0.70, 0.80), (0.78, 0.83), (0.75, 0.86)])  # best kNN at epoch 1
    _log(tmp_path, "full_intcl", [(0.70, 0.80), (0.72, 0.79)])  # the probe only falls: gain -1.0
    md = tg.pilot_markdown(tmp_path)
    assert "| full_simclr | 2 | 70.0 | 78.0 (1) | +8.0 | 80.0 | 86.0 (2) | +6.0 |" in md
    assert "| full_intcl | 1 | 70.0 | 72.0 (1) | +2.0 | 80.0 | 79.0 (1) | -1.0 |" in md
    assert "kNN +8.0 points, quick probe +6.0 points" in md
    (tmp_path / "full_intcl" / "log.jsonl").write_text(json.dumps({"epoch": 1, "test_knn_acc": 0.7}) + "\n")
    with pytest.raises(UserError, match="not a learning curve from initialisation"):
        tg.pilot_markdown(tmp_path)
    _log(tmp_path, "only_init", [(0.7, 0.8)])  # nothing after initialisation: no gain to read
    (tmp_path / "full_intcl" / "log.jsonl").unlink()
    with pytest.raises(UserError, match="to a later epoch"):
        tg.pilot_markdown(tmp_path)
    with pytest.raises(UserError, match="no learning curves"):
        tg.pilot_markdown(tmp_path / "elsewhere")
