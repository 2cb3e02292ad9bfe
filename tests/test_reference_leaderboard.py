"""The published reference leaderboard (leaderboard/): its outputs are what the renderer makes of its
committed rows, and the rows cover what the reference protocol promises (docs/decisions.md,
'Reference leaderboard')."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from robustbench_nacl.losses import PRESETS
from robustbench_nacl.report.leaderboard import render_leaderboard
from robustbench_nacl.results.rows import load_rows

BOARD = Path(__file__).resolve().parents[1] / "leaderboard"


@pytest.fixture(scope="module")
def rows() -> list:
    return load_rows(BOARD)


def test_committed_markdown_and_csv_are_what_the_renderer_makes_of_the_committed_rows(
    rows: list, tmp_path: Path
) -> None:
    meta = json.loads((BOARD / "leaderboard.json").read_text())  # how the committed board was rendered
    render_leaderboard(rows, tmp_path, command=meta["command"], rank_by=meta["rank_by"])
    for name in ("LEADERBOARD.md", "results.csv"):
        assert (tmp_path / name).read_text() == (BOARD / name).read_text(), f"{name} differs: re-render it"


def test_rows_cover_every_preset_and_the_control_with_three_seeds_in_every_setting(rows: list) -> None:
    seeds: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for r in rows:
        seeds[(r["loss"], r["setting"], r["dataset"])].add(r["train_seed"] if not r["control"] else r["seed"])
    families = {loss for loss, _, _ in seeds}
    # the reference declares what it covers: a preset added since is "not in the reference yet"
    declared = set(json.loads((BOARD / "coverage.json").read_text())["presets"])
    assert families == declared | {"random-init"}
    assert declared <= set(PRESETS.names())
    if missing := sorted(set(PRESETS.names()) - declared):
        print(f"not in the reference yet: {', '.join(missing)}")
    datasets = {
        ("in-domain", "fashion-mnist:0-4"),
        ("transfer", "fashion-mnist:5-9"),
        ("shift", "fashion-mnist:0-4@crop"),
        ("shift", "fashion-mnist:0-4@flip"),
        ("shift", "fashion-mnist:0-4@jitter"),
    }
    for family in families:
        for setting, dataset in datasets:
            assert len(seeds[(family, setting, dataset)]) >= 3, (family, setting, dataset)
    assert {r["n_examples"] for r in rows} == {1000}
    assert {r["n_examples_evaluated"] for r in rows} == {1000}
    # one protocol per setting: every family is ranked in the same tables
    assert len({r["protocol_id"] for r in rows}) == len(datasets)


def test_the_legend_names_each_pgd_setting_of_the_suite_with_its_epsilons(rows: list) -> None:
    legend = (BOARD / "LEADERBOARD.md").read_text().split("\n## ")[0]
    for params, eps in (
        ("restarts=2, step_size=0.01", "0.51/255"),
        ("step_size=0.008, steps=10", "8.16/255"),
    ):
        assert f"{params}" in legend and f" at {eps}" in legend
    settings = {json.dumps(r["attack_params"], sort_keys=True) for r in rows if r["attack"] == "pgd"}
    assert len(settings) == 3 == legend.count("early_stop=True")
