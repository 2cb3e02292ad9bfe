"""Acceptance: recipes are told apart by their full training configuration, protocols by everything
that changes a measurement, and one dataset has one spelling (real training, evaluation, rendering).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from robustbench_nacl.data import canonical_spec
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.report.leaderboard import render_leaderboard
from robustbench_nacl.results.rows import load_rows
from robustbench_nacl.training import TrainConfig, train

QUICK: dict[str, Any] = {"n_examples": 40, "probe": ProbeConfig(epochs=20, lr=1e-2), "progress": False}
# four 1-epoch... runs of one loss and seed: three widths at 1 epoch, and width 4 at 2 epochs
VARIANTS = [(4, 1), (6, 1), (8, 1), (4, 2)]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("ckpts")
    out = []
    for width, epochs in VARIANTS:
        cfg = TrainConfig(
            loss="simclr",
            dataset="digits:0-4",
            encoder_kwargs={"width": width},
            epochs=epochs,
            batch_size=64,
            max_train=200,
            knn_every=0,
            seed=0,
        )
        out.append(train(cfg, base / f"w{width}_e{epochs}", progress=False))
    return out


def _in_domain(md: str) -> list[str]:
    return [s for s in md.split("\n## ") if s.startswith("In-domain: probe on digits:0-4")]


def _body(table: str) -> list[list[str]]:
    lines = [ln for ln in table.splitlines() if ln.startswith("|")][2:]
    return [[c.strip() for c in ln.split("|")[1:-1]] for ln in lines]


def test_checkpoints_differing_only_in_width_or_epochs_are_separate_recipes(
    ckpts: list[Path], tmp_path: Path
) -> None:
    for c in ckpts:
        evaluate(c, suite="quick", out=tmp_path, **QUICK)
    rows = load_rows(tmp_path)
    assert len({r.recipe_id for r in rows}) == 4 and {r.loss for r in rows} == {"simclr"}
    written = render_leaderboard(rows, tmp_path / "board")
    (table,) = _in_domain(written["LEADERBOARD.md"].read_text())
    body = _body(table)
    assert len(body) == 4 and all(cells[1] == "simclr" and cells[4] == "1" for cells in body)  # n = 1
    assert table.splitlines()[2].split("|")[4].strip() == "differs"
    assert sorted(cells[3] for cells in body) == [
        "width=4 epochs=1",
        "width=4 epochs=2",
        "width=6 epochs=1",
        "width=8 epochs=1",
    ]
    with open(written["results.csv"], newline="") as f:
        recs = [r for r in csv.DictReader(f) if r["setting"] == "in-domain"]
    assert (
        len(recs) == 4 and {r["n_seeds"] for r in recs} == {"1"} and all(r["clean_std"] == "" for r in recs)
    )


@pytest.mark.parametrize(
    ("second", "notice"),
    [
        ({"n_examples": 30}, "n_examples 30"),
        ({"suite": {"name": "fgsm-only", "attack": [{"name": "fgsm", "eps": [0.002]}]}}, "suite `fgsm-only`"),
    ],
)
def test_one_checkpoint_under_two_protocols_lands_in_two_tables(
    ckpts: list[Path], tmp_path: Path, second: dict[str, Any], notice: str
) -> None:
    first = evaluate(ckpts[0], suite="quick", out=tmp_path, **QUICK)
    other = evaluate(ckpts[0], out=tmp_path, **({"suite": "quick"} | QUICK | second))
    assert {r.protocol_id for r in first}.isdisjoint({r.protocol_id for r in other})
    assert {r.recipe_id for r in first} == {r.recipe_id for r in other}
    md = render_leaderboard(load_rows(tmp_path), tmp_path / "board")["LEADERBOARD.md"].read_text()
    tables = _in_domain(md)
    assert len(tables) == 2 and all(len(_body(t)) == 1 for t in tables)
    notices = [ln for t in tables for ln in t.splitlines() if ln.startswith("> Not ranked with the other")]
    assert (
        len(notices) == 2 and sum(notice in ln for ln in notices) == 1
    )  # one line each, saying what differs
    n_runs = {_body(t)[0][3] for t in tables}
    assert n_runs == {"1"}  # never averaged across protocols, never silently deduplicated


def test_two_spellings_of_one_dataset_are_one_dataset(ckpts: list[Path], tmp_path: Path) -> None:
    assert canonical_spec("digits:5,6,7,8,9") == canonical_spec("digits:5-9") == "digits:5-9"
    a = evaluate(ckpts[0], transfer="digits:5,6,7,8,9", suite="quick", out=tmp_path, **QUICK)
    b = evaluate(
        ckpts[0], dataset="digits:0,1,2,3,4", transfer="digits:5-9", suite="quick", out=tmp_path, **QUICK
    )
    assert b.computed == 0 and "nothing recomputed" in b.summary  # the same rows, found by their address
    assert [r.row_id for r in a] == [r.row_id for r in b]
    assert {r.dataset for r in a if r.setting == "transfer"} == {"digits:5-9"}
    md = render_leaderboard(load_rows(tmp_path), tmp_path / "board")["LEADERBOARD.md"].read_text()
    assert md.count("## Transfer: probe on digits:5-9") == 1 and "5,6,7,8,9" not in md


def test_every_probe_and_knn_parameter_is_recorded_and_part_of_the_protocol(
    ckpts: list[Path], tmp_path: Path
) -> None:
    probe = ProbeConfig(
        epochs=15,
        lr=2e-2,
        batch_size=64,
        weight_decay=1e-4,
        max_train=150,
        knn_k=7,
        knn_t=0.2,
        standardize=True,
    )
    rows = evaluate(ckpts[0], suite="quick", out=tmp_path, n_examples=40, probe=probe, seed=3, progress=False)
    recorded = rows[0].probe_config
    assert recorded == dataclasses.asdict(dataclasses.replace(probe, seed=3))  # seed None -> the eval seed
    assert set(recorded) == {f.name for f in dataclasses.fields(ProbeConfig)}
    assert rows[0]["n_train"] == 150
    default = evaluate(ckpts[0], suite="quick", out=tmp_path, seed=3, **QUICK)
    assert rows[0].protocol_id != default[0].protocol_id
