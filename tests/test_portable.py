"""No path of the machine that made them in what ships (issue 49): the package's data files hold no
absolute path, and ``hub/portable.py``, which rewrote the shipped rows, manifests and cards, names a
checkpoint by its place in the package (a control by its id) and a DeACL teacher by id and sha256,
keeps every row, recipe and protocol id, and refuses, writing nothing, where one would change.
Everything here reads the shipped demo set or a few of its rows: no training, no evaluation."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from robustbench_nacl import io
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.recipe import _source, key_params
from robustbench_nacl.eval.source import CheckpointInfo
from robustbench_nacl.hub import portable
from robustbench_nacl.hub.portable import main, portable_row, published_index
from robustbench_nacl.io import REFERENCE_ENV, write_json_atomic
from robustbench_nacl.packaged import files_dir, published_dir
from robustbench_nacl.results.rows import protocol_hash, protocol_of, read_row_pack
from robustbench_nacl.untrusted import gunzip_bounded

DEACL = "convnet_small.deacl_digits-0-4_s0"
ELSEWHERE = "/home/someone/runs"  # where the rows' checkpoints lay on the machine that made them


def _machine_folders() -> list[bytes]:
    """Absolute folders no shipped file may name: the usual homes and scratch folders, and this
    machine's home, working, temporary and checkout folders."""
    here = [Path.home(), Path.cwd(), Path(tempfile.gettempdir()), Path(__file__).resolve().parents[1]]
    found = {"/work/", "/home/", "/tmp/", "/root/", "/Users/"}
    found |= {f"{p.resolve().as_posix().rstrip('/')}/" for p in here if p.resolve() != Path("/")}
    return sorted(s.encode() for s in found)


def test_no_file_of_the_package_data_names_a_machine_folder() -> None:
    folders, hits = _machine_folders(), []
    for path in sorted(p for p in files_dir().rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".gz":  # the row packs: what they hold, not their deflated bytes
            data = gunzip_bounded(data, what=str(path))
        hits += [f"{path.relative_to(files_dir())}: {f.decode()}" for f in folders if f in data]
    assert not hits, f"{len(hits)} machine path(s) in the package data: {hits[:5]}"


@pytest.fixture(scope="module")
def shipped() -> list[dict]:
    """The demo set's shipped rows (already portable)."""
    return read_row_pack(published_dir() / "demo" / "rows.jsonl.gz")


def _as_made(row: dict) -> dict:
    """``row`` as the machine that measured it wrote it: checkpoint and teacher by local path."""
    made = dict(row)
    source = row["checkpoint_id"] if not row["control"] else "convnet_small.simclr_digits-0-4_s0"
    made["checkpoint"] = f"{ELSEWHERE}/{source}"
    extra = (row.get("loss_params") or {}).get("extra") or {}
    if isinstance(extra.get("teacher"), dict):
        teacher = f"{ELSEWHERE}/{extra['teacher']['id']}"
        made["loss_params"] = {**row["loss_params"], "extra": {**extra, "teacher": teacher}}
    return made


def _pick(rows: list[dict]) -> list[dict]:
    """A DeACL row, a row of another published model and a control's row."""
    deacl = next(r for r in rows if r["checkpoint_id"] == DEACL)
    other = next(r for r in rows if not r["control"] and r["loss"] == "simclr")
    control = next(r for r in rows if r["control"])
    return [deacl, other, control]


def test_a_row_as_made_becomes_the_shipped_row_with_the_same_ids(shipped: list[dict]) -> None:
    index = published_index()
    for row in _pick(shipped):
        made = _as_made(row)
        assert ELSEWHERE in json.dumps(made)
        assert portable_row(made, index) == row  # ids, numbers and bits untouched
        assert portable_row(row, index) == row  # run again: nothing changes
    deacl = _pick(shipped)[0]
    assert deacl["checkpoint"] == f"demo/models/{DEACL}"
    teacher = deacl["loss_params"]["extra"]["teacher"]
    manifest = json.loads((published_dir() / "demo" / "models" / DEACL / "manifest.json").read_text())
    assert teacher == {
        "id": manifest["teacher"]["id"],
        "weights_sha256": manifest["teacher"]["weights_sha256"],
    }
    assert _pick(shipped)[2]["checkpoint"] == _pick(shipped)[2]["checkpoint_id"]  # a control: its id
    # shown by its id in the key-parameter column, as a teacher path was by its folder name
    assert key_params({"extra": {"teacher": teacher}}) == f"teacher={teacher['id']}"


def test_an_unpublished_checkpoint_is_named_by_its_folder_and_its_teacher_is_refused(
    shipped: list[dict],
) -> None:
    deacl, other, _ = _pick(shipped)
    index = {
        k: v
        for k, v in published_index().items()
        if k not in (deacl["checkpoint_id"], other["checkpoint_id"])
    }
    assert portable_row(_as_made(other), index)["checkpoint"] == other["checkpoint_id"]
    with pytest.raises(UserError, match="is not a published model with these weights"):
        portable_row(_as_made(deacl), index)  # no manifest to take the teacher's sha256 from


def test_new_rows_name_a_published_model_by_content_wherever_it_lies() -> None:
    index = published_index()
    model = index[DEACL]
    copy = CheckpointInfo(
        source=f"{ELSEWHERE}/{DEACL}", format="ours", sha256=model.weights_sha256, encoder="convnet_small"
    )
    assert _source(copy) == copy.source  # no id: nothing says which model it is
    named = CheckpointInfo(**{**copy.__dict__, "checkpoint_id": DEACL})
    assert _source(named) == f"demo/models/{DEACL}"  # a copy of the published weights
    retrained = CheckpointInfo(**{**named.__dict__, "sha256": "0" * 64})
    assert _source(retrained) == retrained.source  # other weights: the user's own checkpoint


def _rows_folder(tmp_path: Path, rows: list[dict]) -> Path:
    for r in rows:
        write_json_atomic(tmp_path / "rows" / f"{r['row_id']}.json", _as_made(r))
    return tmp_path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "rows").iterdir())}


def test_the_command_rewrites_a_rows_folder_once_and_writes_nothing_when_an_id_would_change(
    shipped: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _rows_folder(tmp_path, _pick(shipped))
    before = _files(folder)
    # were the checkpoint part of the protocol, rewriting it would move the row to another table
    monkeypatch.setattr(
        portable, "protocol_id", lambda r: protocol_hash({**protocol_of(r), "checkpoint": r["checkpoint"]})
    )
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "protocol_id would become" in err, err
    assert _files(folder) == before  # every row is checked before any is written
    monkeypatch.undo()
    assert main([str(folder)]) == 0
    assert "3 of 3 rows" in capsys.readouterr().out
    assert {p: json.loads(b) for p, b in _files(folder).items()} == {
        f"{r['row_id']}.json": r for r in _pick(shipped)
    }
    assert main([str(folder)]) == 0 and "0 of 3 rows" in capsys.readouterr().out


def test_the_reference_board_is_rewritten_only_on_purpose(
    shipped: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pyproject.toml").touch()
    monkeypatch.setattr(io, "repository_root", lambda: tmp_path)
    board = _rows_folder(tmp_path / "leaderboard", _pick(shipped)[:1])
    before = _files(board)
    monkeypatch.delenv(REFERENCE_ENV, raising=False)
    assert main([str(board)]) == 2
    assert f"set {REFERENCE_ENV}=1" in capsys.readouterr().err and _files(board) == before
    monkeypatch.setenv(REFERENCE_ENV, "1")
    assert main([str(board)]) == 0 and _files(board) != before
    assert os.listdir(board / "rows") == list(before)  # rewritten in place, no temporary left
