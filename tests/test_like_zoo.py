"""``eval --like-zoo ZOO``: a checkpoint evaluated as a zoo's manifests evaluate their entries, so its
rows share the zoo's protocols (the same row ids as ``zoo eval`` writes for that checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_zoo_completeness import tiny_entry

from robustbench_nacl import cli

pytestmark = pytest.mark.usefixtures("single_thread")


def _ids(board: Path) -> set[str]:
    return {p.stem for p in (board / "rows").glob("*.json")}


def test_eval_like_zoo_writes_the_rows_zoo_eval_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    e = tiny_entry(tmp_path / "zoo", "simclr", seed=1, transfer="digits:5-9", shift="flip")
    ck, board = tmp_path / "ck", tmp_path / "board"
    argv = ["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-controls"]
    assert cli.main([*argv, "--no-progress"]) == 0
    mine = tmp_path / "mine"
    assert cli.main(["eval", str(ck / e.id), "--like-zoo", "t", "--seed", "1", "--out", str(mine)]) == 0
    assert _ids(mine) == _ids(board) and len(_ids(mine)) > 10  # in-domain, transfer and the shift
    # without --seed, the zoo's own checkpoint is evaluated with its entry's seed: its rows again
    again = tmp_path / "again"
    assert cli.main(["eval", str(ck / e.id), "--like-zoo", "t", "--out", str(again)]) == 0
    assert _ids(again) == _ids(board)
    # another evaluation seed: the same protocol otherwise, so different rows of the same settings
    other = tmp_path / "other"
    assert cli.main(["eval", str(ck / e.id), "--like-zoo", "t", "--seed", "2", "--out", str(other)]) == 0
    rows = [json.loads(p.read_text()) for p in (other / "rows").glob("*.json")]
    assert {r["seed"] for r in rows} == {2} and {r["n_examples"] for r in rows} == {20}
    assert {r["suite"] for r in rows} == {"quick"} and not _ids(other) & _ids(board)
    # --setting-suite: one kind of setting re-attacked with another suite, the others as the zoo does
    mixed = tmp_path / "mixed"
    flags = ["--like-zoo", "t", "--setting-suite", "shift=fashion-mnist-light", "--out", str(mixed)]
    assert cli.main(["eval", str(ck / e.id), *flags]) == 0
    rows = [json.loads(p.read_text()) for p in (mixed / "rows").glob("*.json")]
    assert {r["suite"] for r in rows if r["setting"] == "shift"} == {"fashion-mnist-light"}
    zoo_rows = {r["row_id"] for r in rows if r["setting"] != "shift"}
    assert zoo_rows and zoo_rows <= _ids(board) and not {r["row_id"] for r in rows} <= _ids(board)


def test_like_zoo_label_free_rows_are_the_boards_label_free_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's checkpoint measured label-free as the zoo does shares the board's protocol id, so its
    line lands in the board's label-free table (README section 4)."""
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    e = tiny_entry(tmp_path / "zoo", "simclr", protocol="slf,label-free", n_examples=12)
    ck, board = tmp_path / "ck", tmp_path / "board"
    argv = ["zoo", "run", "--zoo", "t", "--out", str(ck), "--leaderboard", str(board), "--no-controls"]
    assert cli.main([*argv, "--no-progress"]) == 0
    mine = tmp_path / "mine"
    flags = ["--like-zoo", "t", "--protocol", "label-free", "--out", str(mine)]
    assert cli.main(["eval", str(ck / e.id), *flags]) == 0
    rows = [json.loads(p.read_text()) for p in (board / "rows").glob("*.json")]
    label_free = {r["row_id"] for r in rows if (r.get("finetune") or {}).get("protocol") == "label-free"}
    assert label_free and _ids(mine) == label_free  # every label-free row of the board, and only those


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--suite", "quick"], "--like-zoo t sets --suite as the zoo evaluates its entries; drop it"),
        (["--n-examples", "5", "--probe-epochs", "3"], "sets --n-examples, --probe-*"),
        (["--alf-epochs", "3"], "sets --alf-*"),
    ],
)
def test_a_flag_like_zoo_sets_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list, msg: str
) -> None:
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    tiny_entry(tmp_path / "zoo", "simclr")
    assert cli.main(["eval", str(tmp_path / "no-such-checkpoint"), "--like-zoo", "t", *extra]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_an_unknown_zoo_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eval", str(tmp_path / "x"), "--like-zoo", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and err.count("\n") == 1


def test_train_like_zoo_trains_the_zoos_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    e = tiny_entry(tmp_path / "zoo", "simclr")
    ck = tmp_path / "ck"
    assert cli.main(["zoo", "train", "--zoo", "t", "--out", str(ck), "--no-progress"]) == 0
    mine = tmp_path / "mine"
    assert (
        cli.main(["train", "--loss", "simclr", "--like-zoo", "t", "--out", str(mine), "--no-progress"]) == 0
    )
    theirs = json.loads((ck / e.id / "manifest.json").read_text())
    ours = json.loads((mine / "manifest.json").read_text())
    # the zoo's recipe, so the same recipe id; on one thread of one machine, the same weights too
    assert ours["recipe_sha256"] == theirs["recipe_sha256"]
    assert ours["weights_sha256"] == theirs["weights_sha256"]
    capsys.readouterr()
    assert (
        cli.main(
            ["train", "--loss", "simclr", "--like-zoo", "t", "--epochs", "3", "--out", str(tmp_path / "x")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--like-zoo t sets --epochs as the zoo trains its entries; drop it" in err and err.count("\n") == 1
