"""A zoo entry is complete when every row its manifest asks for is present, not when the count matches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from robustbench_nacl import cli, pipeline, zoo
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval import evaluate as ev

RECIPE = {
    "epochs": 1,
    "batch_size": 64,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 128,
}
EVAL = {"suite": "quick", "n_examples": 20, "probe_epochs": 5, "probe_max_train": 100}


def tiny_entry(root: Path, loss: str, seed: int = 0, **eval_changes: object) -> zoo.ZooEntry:
    """A digits entry that trains and evaluates in about a second (written under ``root``)."""
    e = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", loss, "digits:0-4", seed),
        zoo="t",
        encoder="convnet_small",
        loss=loss,
        dataset="digits:0-4",
        seed=seed,
        recipe=dict(RECIPE),
        encoder_kwargs={"width": 4},
        eval={**EVAL, **eval_changes},
    )
    zoo.write_entry(e, root)
    return e


def _mtimes(board: Path, ckpt_id: str) -> dict[str, int]:
    out = {}
    for p in (board / "rows").glob("*.json"):
        if json.loads(p.read_text())["checkpoint_id"] == ckpt_id:
            out[p.name] = p.stat().st_mtime_ns
    return out


def test_the_keys_come_from_evaluates_identity_function(tmp_path: Path) -> None:
    e = tiny_entry(tmp_path, "simclr")
    args = pipeline.eval_arguments(e)
    ids = ev.planned_identities(e.dataset, **args)
    assert pipeline.row_keys(e) == {pipeline.row_key(i) for i in ids} and len(ids) == pipeline.expected_rows(
        e
    )
    changed = tiny_entry(tmp_path, "simclr", n_examples=21)
    assert pipeline.row_keys(changed).isdisjoint(pipeline.row_keys(e))  # the protocol is in every key


def test_a_changed_entry_recomputes_only_its_rows_and_the_board_shows_the_new_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    a, b = tiny_entry(tmp_path / "zoo", "simclr"), tiny_entry(tmp_path / "zoo", "debiased")
    board, ck = tmp_path / "board", tmp_path / "ck"
    argv = ["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress"]
    assert cli.main(argv) == 0
    b_before = _mtimes(board, b.id)
    a_before = _mtimes(board, a.id)
    assert len(a_before) == len(b_before) == pipeline.expected_rows(a)
    # the same number of rows under another protocol: the count alone said "complete"
    tiny_entry(tmp_path / "zoo", "simclr", n_examples=25)
    capsys.readouterr()
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    # the changed entry and the random-init control at its new protocol; the other entry is skipped
    assert "0 trained" in out and "2 evaluations" in out and "1 already complete" in out, out
    assert f"{len(a_before)} result rows of these entries were computed under another" in err
    assert _mtimes(board, b.id) == b_before  # the unchanged entry's files were not touched
    a_after = _mtimes(board, a.id)
    assert len(a_after) == len(a_before) and not set(a_after) & set(a_before)
    assert sorted(os.listdir(board / pipeline.SUPERSEDED_DIR)) == sorted(a_before)  # kept aside
    results = json.loads((board / "leaderboard.json").read_text())["results"]
    shown = {(r["loss"], r["n_examples"]) for r in results}
    assert {n for loss, n in shown if loss == "simclr"} == {25}  # the board has the new n only
    assert {n for loss, n in shown if loss == "debiased"} == {20}


def _retrain(zoo_dir: Path, entry: zoo.ZooEntry, ck: Path) -> None:
    """Train ``entry`` again under ``ck`` with another learning rate (as a preset's new defaults
    would): the same id and row keys, other weights."""
    retrained = tiny_entry(zoo_dir, entry.loss)
    retrained.recipe["lr"] = 1e-3
    zoo.write_entry(retrained, zoo_dir)
    (ck / entry.id / "manifest.json").unlink()  # not trained any more: `zoo train` trains it again
    assert cli.main(["zoo", "train", "--zoo", "t", "--out", str(ck), "--no-progress", entry.id]) == 0


def test_a_retrained_entry_sets_its_old_rows_aside_and_is_evaluated_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a row's key leaves the weights out: an entry trained again (here with another learning rate,
    # as a preset's new defaults would) has the same keys, so its old rows looked complete and
    # stayed beside the new checkpoint; they are another checkpoint's, so they are set aside
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    a = tiny_entry(tmp_path / "zoo", "simclr")
    board, ck = tmp_path / "board", tmp_path / "ck"
    argv = ["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress"]
    assert cli.main(argv) == 0
    before = _mtimes(board, a.id)
    old_sha = pipeline.trained_sha256(a, ck)
    assert old_sha is not None and pipeline.superseded_rows([a], board, ckpts=ck) == []
    _retrain(tmp_path / "zoo", a, ck)
    assert pipeline.trained_sha256(a, ck) not in (None, old_sha)
    # without the checkpoints (rows committed alone), the rows stand for them: nothing is stale
    assert pipeline.superseded_rows([a], board) == []
    assert len(pipeline.superseded_rows([a], board, ckpts=ck)) == len(before)
    capsys.readouterr()
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "0 trained" in out and "1 evaluations" in out, out
    assert f"{len(before)} result rows of these entries" in err and "retrained since" in err
    after = _mtimes(board, a.id)
    assert len(after) == len(before) and not set(after) & set(before)
    assert sorted(os.listdir(board / pipeline.SUPERSEDED_DIR)) == sorted(before)
    rows = [json.loads(p.read_text()) for p in (board / "rows").glob("*.json")]
    assert {r["checkpoint_sha256"] for r in rows if r["checkpoint_id"] == a.id} == {
        pipeline.trained_sha256(a, ck)
    }


def test_zoo_eval_does_not_count_a_retrained_entrys_old_rows_as_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `zoo eval` (and `zoo status`) judge an entry done from its rows' keys, which leave the weights
    # out: a retrained entry's old rows said "complete" and its new checkpoint was never evaluated
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    a = tiny_entry(tmp_path / "zoo", "simclr")
    board, ck = tmp_path / "board", tmp_path / "ck"
    where = ["--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress", "--no-controls"]
    assert cli.main(["zoo", "run", *where]) == 0
    old_sha, n = pipeline.trained_sha256(a, ck), len(_mtimes(board, a.id))
    _retrain(tmp_path / "zoo", a, ck)
    new_sha = pipeline.trained_sha256(a, ck)
    assert new_sha not in (None, old_sha)
    current = pipeline.current_sha256([a], ck)
    assert current == {a.id: new_sha} and a.id not in pipeline.rows_done(board, current)
    assert pipeline.row_keys(a) <= pipeline.rows_done(board)[a.id]  # by key alone: "complete"
    capsys.readouterr()
    assert cli.main(["zoo", "eval", *where]) == 0
    assert "complete: not evaluated again" not in capsys.readouterr().out
    rows = [json.loads(p.read_text()) for p in (board / "rows").glob("*.json")]
    shas = [r["checkpoint_sha256"] for r in rows if r["checkpoint_id"] == a.id]
    assert shas.count(new_sha) == shas.count(old_sha) == n  # the old stay until `zoo run` sets them aside
    assert cli.main(["zoo", "eval", *where]) == 0
    assert "complete: not evaluated again" in capsys.readouterr().out


def test_rows_held_only_in_a_row_pack_count_as_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a published set keeps its rows as one pack (rows.jsonl.gz) and no rows/ folder: `zoo run` over
    # it must see them as done, not evaluate every entry again
    from robustbench_nacl.results.rows import ROW_PACK, load_rows, write_row_pack

    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    a = tiny_entry(tmp_path / "zoo", "simclr")
    board, ck = tmp_path / "board", tmp_path / "ck"
    where = ["--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-progress", "--no-controls"]
    assert cli.main(["zoo", "run", *where]) == 0
    packed = tmp_path / "packed"
    write_row_pack(packed, load_rows(board))
    assert (packed / ROW_PACK).is_file() and not (packed / "rows").exists()
    assert pipeline.is_complete(a, pipeline.rows_done(packed))
    (packed / ROW_PACK).write_bytes(b"not gzip")  # a damaged pack counts as nothing, never trusted
    assert not pipeline.is_complete(a, pipeline.rows_done(packed))


def test_a_zoo_entry_can_name_the_robustssl_finetuning_recipe(tmp_path: Path) -> None:
    # eval.finetune_recipe: the entry's ALF rows are the RobustSSL benchmark's recipe, planned and
    # evaluated as such (its rows' finetune identity names it), and `--like-zoo` uses it too
    e = tiny_entry(tmp_path, "acl", protocol="alf", finetune_recipe="robustssl")
    assert zoo.load_zoo("t", root=tmp_path)[0].eval["finetune_recipe"] == "robustssl"
    args = pipeline.eval_arguments(e)
    assert args["finetune_recipe"] == "robustssl"
    alf = [i for i in ev.planned_identities(e.dataset, **args, loss="acl") if i.get("finetune")]
    assert alf and {dict(i["finetune"]["recipe"])["name"] for i in alf} == {"robustssl"}
    # a named recipe sets ALF itself: an entry that also gives ALF settings is refused in one line
    bad = {**e.to_dict(), "eval": {**e.eval, "alf": {"epochs": 3}}}
    with pytest.raises(UserError, match=r"eval.finetune_recipe: finetune recipe robustssl sets ALF"):
        zoo.parse_entry(bad, "bad.json")
