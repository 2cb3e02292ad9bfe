"""The zoo pipeline: train, evaluate (with controls) and skip what is complete, even without checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from robustbench_nacl import pipeline, zoo

TINY_RECIPE = {"epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0}
TINY_EVAL = {
    "transfer": "digits:5-9",
    "shift": "crop",
    "suite": "quick",
    "n_examples": 30,
    "probe_epochs": 20,
    "probe_max_train": 200,
}


def _entries(root: Path, seeds: tuple[int, ...] = (0,)) -> list[zoo.ZooEntry]:
    out = []
    for loss in ("simclr", "debiased"):
        for s in seeds:
            e = zoo.ZooEntry(
                id=zoo.expected_id("convnet_small", loss, "digits:0-4", s),
                zoo="t",
                encoder="convnet_small",
                loss=loss,
                dataset="digits:0-4",
                seed=s,
                recipe={**TINY_RECIPE, "max_train": 256},
                encoder_kwargs={"width": 8},
                eval=dict(TINY_EVAL),
            )
            zoo.write_entry(e, root)
            out.append(e)
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "rows").glob("*.json"))]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[zoo.ZooEntry], pipeline.ZooRun]:
    tmp = tmp_path_factory.mktemp("pipeline")
    entries = _entries(tmp / "zoo", seeds=(0, 1))
    run = pipeline.run_entries(entries, tmp / "ckpts", tmp / "board", workers=1, progress=False)
    return tmp, entries, run


def test_every_entry_and_one_control_per_seed_is_evaluated_as_its_manifest_says(ran) -> None:
    tmp, entries, run = ran
    assert (run.trained, run.evaluated, run.skipped) == (4, 6, 0)  # 4 entries + controls of seeds 0 and 1
    rows = _rows(tmp / "board")
    per_ckpt: dict[str, list[dict]] = {}
    for r in rows:
        per_ckpt.setdefault(r["checkpoint_id"], []).append(r)
    controls = {c for c in per_ckpt if ".random-init_" in c}
    assert controls == {pipeline.control_id(e) for e in entries if e.loss == "simclr"}
    for e in entries:
        mine = per_ckpt[e.id]
        assert len(mine) == pipeline.expected_rows(e)  # in-domain, transfer, crop x (3 attack rows + 2 worst)
        assert {r["setting"] for r in mine} == {"in-domain", "transfer", "shift"}
        assert {r["n_examples"] for r in mine} == {30} and {r["seed"] for r in mine} == {e.seed}
        assert {r["probe_config"]["epochs"] for r in mine} == {20}
        assert {r["probe_config"]["max_train"] for r in mine} == {200}
        manifest = json.loads((zoo.checkpoint_dir(e, tmp / "ckpts") / "manifest.json").read_text())
        assert manifest["config"]["max_train"] == 256  # the recipe's max_train reached the trainer
    # the three random networks differ: the control's weights follow the seed
    assert len({per_ckpt[c][0]["checkpoint_sha256"] for c in controls}) == len(controls)


def test_a_complete_zoo_is_skipped_even_without_its_checkpoints(ran) -> None:
    tmp, entries, _ = ran
    again = pipeline.run_entries(entries, tmp / "ckpts", tmp / "board", workers=1, progress=False)
    assert (again.trained, again.evaluated, again.skipped) == (0, 0, len(entries))
    moved = tmp / "elsewhere"
    shutil.move(tmp / "ckpts", moved)  # a fresh machine: the rows were committed, the checkpoints are gone
    before = sorted(p.name for p in (tmp / "board" / "rows").glob("*.json"))
    fresh = pipeline.run_entries(entries, tmp / "ckpts", tmp / "board", workers=1, progress=False)
    assert (fresh.trained, fresh.evaluated) == (0, 0) and not (tmp / "ckpts").exists()
    assert sorted(p.name for p in (tmp / "board" / "rows").glob("*.json")) == before
    # an entry with a missing row is trained again and only that row is recomputed
    victim = next(p for p in (tmp / "board" / "rows").glob("*.json") if entries[0].id in p.read_text())
    victim.unlink()
    redo = pipeline.run_entries(entries, tmp / "ckpts", tmp / "board", workers=1, progress=False)
    assert (redo.trained, redo.evaluated) == (1, 1)
    assert sorted(p.name for p in (tmp / "board" / "rows").glob("*.json")).count(victim.name) == 1
    shutil.rmtree(tmp / "ckpts")
    shutil.move(moved, tmp / "ckpts")


def test_work_another_process_finished_is_not_reported_as_done_here(
    ran, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `zoo run` that planned work, then waited for the locks while another run did it, reports it
    as the other run's (issue 36), not as trained and evaluated here."""
    tmp, entries, _ = ran
    assert pipeline.train_entry(entries[0], tmp / "ckpts") is None  # trained before: nothing done here
    assert pipeline.eval_entry(entries[0], tmp / "ckpts", tmp / "board") is None
    monkeypatch.setattr(pipeline, "rows_done", lambda out, **_: {})  # planned before the other run finished
    run = pipeline.run_entries(entries, tmp / "ckpts", tmp / "board", workers=1, progress=False)
    assert (run.trained, run.evaluated, run.waited) == (0, 0, 6)  # 4 entries + 2 controls, all found done


def test_zoo_eval_and_run_on_the_command_line(tmp_path: Path, cli_env: dict[str, str]) -> None:
    _entries(tmp_path / "zoo")
    cli_env["ROBUSTBENCH_NACL_ZOO"] = str(tmp_path / "zoo")
    ck, board = str(tmp_path / "ck"), str(tmp_path / "board")
    none = run_cli(["zoo", "eval", "--zoo", "t", "--out", ck, "--leaderboard", board], cli_env)
    assert none.returncode == 2 and "none of the 2 entries is trained" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1
    res = run_cli(["zoo", "run", "--zoo", "t", "--out", ck, "--leaderboard", board], cli_env)
    assert res.returncode == 0, res.stderr
    assert "2 entries: 2 trained" in res.stdout and (tmp_path / "board" / "LEADERBOARD.md").is_file()
    table = (tmp_path / "board" / "LEADERBOARD.md").read_text()
    assert "random-init" in table and "debiased" in table and "simclr" in table
    again = run_cli(["zoo", "eval", "--zoo", "t", "--out", ck, "--leaderboard", board], cli_env)
    assert again.returncode == 0 and again.stdout.count("rows in") == 2  # re-evaluation reuses the rows
    per_entry = pipeline.expected_rows(zoo.load_zoo("t", tmp_path / "zoo")[0])
    assert len(_rows(tmp_path / "board")) == 3 * per_entry  # 2 entries + 1 control
