"""ResultRow: one typed row, flat JSON on disk, ids that are hashes of its own fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from robustbench_nacl.errors import UserError
from robustbench_nacl.results.rows import (
    IDENTITY,
    REQUIRED,
    RESULT_KEYS,
    ROW_FORMAT,
    LegacyRowError,
    ResultRow,
    load_rows,
    protocol_id,
    protocol_of,
    read_valid_row,
    recipe_id,
    row_id,
    row_path,
    rows_read_once,
    stamp_ids,
    write_row,
)

ROWS = Path(__file__).parent / "data" / "leaderboard" / "rows"


def _row() -> ResultRow:
    return load_rows(ROWS)[0]


def _json(**changes: Any) -> dict[str, Any]:
    return stamp_ids({**_row().to_json(), **changes})


def test_required_keys_are_the_typed_fields_and_include_the_identity() -> None:
    assert set(IDENTITY) <= set(REQUIRED) and set(RESULT_KEYS) == set(REQUIRED) - set(IDENTITY)
    assert {"row_id", "recipe_id", "protocol_id", "clean_acc", "robust_acc", "sanity_ok"} <= set(RESULT_KEYS)


def test_round_trip_and_dict_access(tmp_path: Path) -> None:
    row = _row()
    data = row.to_json()
    assert ResultRow.from_json(data) == row == data  # a row compares equal to its JSON object
    assert row["clean_acc"] == row.clean_acc and row.get("suite") == "paper" and "knn_acc" in row
    assert row.get("no_such_key") is None and dict(row) == data and len(row) == len(data)
    assert list(row)[: len(REQUIRED)] == list(REQUIRED)  # typed fields first, provenance after
    write_row(tmp_path, row)
    on_disk = json.loads(row_path(tmp_path, row.row_id).read_text())
    assert on_disk == data and all(not isinstance(v, ResultRow) for v in on_disk.values())
    assert read_valid_row(row_path(tmp_path, row.row_id), row.row_id) == row


def test_rows_read_once_reads_a_directory_once_inside_the_block_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import robustbench_nacl.results.rows as rows_mod

    one, two = load_rows(ROWS)[:2]
    write_row(tmp_path, one)
    reads: list[Path] = []
    real = rows_mod.read_row
    monkeypatch.setattr(rows_mod, "read_row", lambda p: reads.append(p) or real(p))
    with rows_read_once():
        first = load_rows(tmp_path)
        write_row(tmp_path, two)  # inside the block the directory is not read again
        again = load_rows(str(tmp_path / "."))  # the same folder, spelt another way
        assert first == again == [one] and first is not again and len(reads) == 1
    assert {r.row_id for r in load_rows(tmp_path)} == {one.row_id, two.row_id} and len(reads) == 3
    assert {r.row_id for r in load_rows(tmp_path)} == {one.row_id, two.row_id} and len(reads) == 5


def test_ids_are_hashes_of_the_rows_own_fields() -> None:
    row = _row()
    assert (
        row.recipe_id == recipe_id(row.recipe)
        and row.protocol_id == protocol_id(row)
        and row.row_id == row_id(row)
    )
    protocol = protocol_of(row)
    assert set(protocol) == {"dataset", "setting", "suite_sha256", "probe", "n_examples", "attack_versions"}
    assert "seed" not in protocol["probe"] and {"knn_k", "knn_t", "lr", "batch_size", "max_train"} <= set(
        protocol["probe"]
    )
    # the probe seed (a run dimension) changes the row but not its protocol
    reseeded = _json(probe_config={**row.probe_config, "seed": 9})
    assert reseeded["protocol_id"] == row.protocol_id and reseeded["row_id"] != row.row_id
    for change in (
        {"n_examples": 50},
        {"suite_sha256": "0" * 64},
        {"attack_versions": {"robustbench_nacl": "9.9"}},
        {"probe_config": {**row.probe_config, "knn_k": 20}},
        {"probe_config": {**row.probe_config, "knn_t": 0.07}},
        {"probe_config": {**row.probe_config, "lr": 0.5}},
        {"probe_config": {**row.probe_config, "max_train": 100}},
    ):
        assert _json(**change)["protocol_id"] != row.protocol_id, change
    assert _json(train_seed=3, checkpoint_id="x")["recipe_id"] == row.recipe_id  # provenance only


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"clean_acc": "0.9"}, "clean_acc must be a finite number, got '0.9'"),
        ({"robust_acc": float("nan")}, "robust_acc must be a finite number"),
        ({"robust_acc": 1.5}, r"robust_acc must lie in \[0, 1\]"),
        ({"setting": "sideways"}, "unknown setting 'sideways'; valid: in-domain, transfer, shift"),
        ({"control": "yes"}, "control must be true or false"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"recipe": [1]}, "recipe must be a JSON object"),
        ({"row_format": 99}, "row_format 99 is not 2"),
    ],
)
def test_bad_fields_are_one_line_user_errors_naming_the_row(changes: dict[str, Any], message: str) -> None:
    data = {**_row().to_json(), **changes}
    with pytest.raises(UserError, match=message) as err:
        ResultRow.from_json(data, source="somewhere")
    assert (
        "\n" not in str(err.value) and data["row_id"] in str(err.value) and "in somewhere" in str(err.value)
    )


def test_missing_keys_are_named() -> None:
    data = _row().to_json()
    del data["recipe"], data["sanity_ok"]
    with pytest.raises(UserError, match=r"lacks required key\(s\) sanity_ok, recipe$"):
        ResultRow.from_json(data)


def test_legacy_and_edited_rows(tmp_path: Path) -> None:
    row = _row()
    legacy = {k: v for k, v in row.to_json().items() if k not in ("row_format", "recipe_id", "protocol_id")}
    with pytest.raises(LegacyRowError, match=r"older robustbench-nacl .* re-run `robustbench-nacl eval zoo/"):
        ResultRow.from_json(legacy)
    path = row_path(tmp_path, row.row_id)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(legacy))
    assert read_valid_row(path, row.row_id) is None  # evaluate recomputes it instead of trusting it
    path.write_text(json.dumps({**row.to_json(), "dataset": "digits:0,1,2,3,4"}))  # edited, ids stale
    assert read_valid_row(path, row.row_id) is None
    with pytest.raises(UserError, match=r"protocol_id .* does not match its fields .* delete it and re-run"):
        load_rows(tmp_path)
    path.write_text(json.dumps(row.to_json()))
    assert load_rows(tmp_path) == [row]
    assert row.to_json()["row_format"] == ROW_FORMAT
