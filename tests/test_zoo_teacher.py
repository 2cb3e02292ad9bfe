"""DeACL in the zoos: an entry names its stage-1 teacher by zoo entry; `zoo train` and `run_entries`
train the teacher first and record it in the student's manifest; a missing teacher is one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from robustbench_nacl import launch, pipeline, zoo
from robustbench_nacl.cli import main
from robustbench_nacl.errors import UserError
from robustbench_nacl.training import recipe_sha256, train, training_config

RECIPE = {
    "epochs": 1,
    "batch_size": 32,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 96,
}


def _pair(root: Path) -> tuple[zoo.ZooEntry, zoo.ZooEntry]:
    """A tiny zoo 't': a SimCLR teacher and the DeACL student that names it (written under root)."""
    common = {
        "zoo": "t",
        "encoder": "convnet_small",
        "dataset": "digits:0-1",
        "seed": 0,
        "recipe": dict(RECIPE),
        "encoder_kwargs": {"width": 4},
    }
    teacher = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", "simclr", "digits:0-1", 0), loss="simclr", **common
    )
    student = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", "deacl", "digits:0-1", 0),
        loss="deacl",
        overrides={"attack_steps": 2},
        teacher=teacher.id,
        **common,
    )
    for e in (teacher, student):
        zoo.write_entry(e, root)
    return teacher, student


def test_the_generated_zoos_hold_deacl_with_the_simclr_entry_of_its_seed() -> None:
    for name in ("demo", "paper", "fashion-mnist"):
        entries = {e.id: e for e in zoo.load_zoo(name)}  # load_zoo checks every teacher (check_teachers)
        students = [e for e in entries.values() if e.loss == "deacl"]
        assert students and all(entries[e.teacher].loss == "simclr" for e in students)
        assert all(entries[e.teacher].seed == e.seed for e in students)
    # only a teacher-bearing manifest has the field: every other one is what it was
    assert all(("teacher" in e.to_dict()) == (e.loss == "deacl") for e in zoo.load_zoo("fashion-mnist"))


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"teacher": None}, "needs a stage-1 teacher: set field 'teacher'"),
        ({"loss": "simclr", "overrides": {}}, "field 'teacher' is only for a loss that distils"),
        ({"overrides": {"teacher": "."}}, "name the teacher once"),  # an existing path: it resolves
        ({"teacher": "convnet_small.deacl_digits-0-1_s0"}, "must be the id of another entry"),
        ({"teacher": "../up"}, "must be the id of another entry"),
    ],
)
def test_invalid_teacher_fields_are_one_line_errors(tmp_path: Path, patch: dict, fragment: str) -> None:
    data = {**_pair(tmp_path)[1].to_dict(), **patch}
    with pytest.raises(UserError) as e:
        zoo.parse_entry(data, "x.json")
    assert fragment in str(e.value) and "x.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"zoo": "other"}, "which is no entry of zoo 't'"),
        ({"encoder_kwargs": {"width": 8}}, "whose encoder differs"),
    ],
)
def test_a_teacher_outside_the_zoo_or_with_another_encoder_is_refused(
    tmp_path: Path, change: dict, fragment: str
) -> None:
    teacher, _ = _pair(tmp_path / "zoo")
    (tmp_path / "zoo" / "t" / f"{teacher.id}.json").unlink()
    zoo.write_entry(dataclasses.replace(teacher, **change), tmp_path / "zoo")
    with pytest.raises(UserError, match=fragment):
        zoo.load_zoo(None, tmp_path / "zoo")


def test_training_waves_put_teachers_first_and_refuse_a_missing_one(tmp_path: Path) -> None:
    teacher, student = _pair(tmp_path / "zoo")
    assert pipeline.training_waves([student, teacher], [teacher, student], tmp_path) == [[teacher], [student]]
    # the teacher's own rows complete (not to do) but its checkpoint gone: it trains for its student
    assert pipeline.training_waves([student], [teacher, student], tmp_path) == [[teacher], [student]]
    with pytest.raises(UserError, match=f"distils entry {teacher.id}, which is neither among") as e:
        pipeline.training_waves([student], [student], tmp_path)
    assert "\n" not in str(e.value)
    # the launcher's order: a waiting launcher trains teachers first; Slurm holds the student back
    tasks = launch.make_tasks([student, teacher], "train", tmp_path / "ck", tmp_path / "board")
    first, held = launch.teacher_order(tasks, waits=True)
    assert [t.entry for t in first] == [teacher] and [t.entry for t in held] == [student]
    with pytest.raises(UserError, match="nor trained by this command"):
        launch.teacher_order(tasks[:1], waits=True)
    assert [t.entry for t in launch.teacher_order(tasks[:1], waits=False)[1]] == [student]


def test_zoo_train_trains_the_teacher_first_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    teacher, student = _pair(tmp_path / "zoo")
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    out = tmp_path / "ckpts"
    # the student alone, its teacher untrained: one line, exit 2, nothing trained
    assert main(["zoo", "train", student.id, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"distils entry {teacher.id}" in err[0]
    assert not zoo.is_trained(student, out) and not zoo.is_trained(teacher, out)
    # listed student first: the teacher trains first all the same
    assert main(["zoo", "train", student.id, teacher.id, "--out", str(out), "--no-progress"]) == 0
    recorded = json.loads((out / student.id / "manifest.json").read_text())["teacher"]
    t_manifest = json.loads((out / teacher.id / "manifest.json").read_text())
    assert recorded["id"] == teacher.id and recorded["loss"] == "simclr"
    assert recorded["weights_sha256"] == t_manifest["weights_sha256"]
    assert Path(recorded["checkpoint"]) == (out / teacher.id).resolve()


def test_a_students_recipe_names_its_teacher_by_recipe_not_by_path(tmp_path: Path) -> None:
    teacher, student = _pair(tmp_path / "zoo")
    dirs = []
    for seed, lr in ((0, 3e-3), (1, 3e-3), (0, 1e-3)):  # two seeds of one recipe, then another recipe
        t = dataclasses.replace(teacher, seed=seed, recipe={**teacher.recipe, "lr": lr})
        dirs.append(train(t.train_config(), tmp_path / f"t{seed}-{lr}", progress=False))
    configs = [
        training_config(
            dataclasses.replace(student, teacher=None, overrides={"teacher": str(d)}).train_config()
        )
        for d in dirs
    ]
    recipes = [recipe_sha256(c) for c in configs]
    assert recipes[0] == recipes[1] != recipes[2]
    t_recipe = json.loads((dirs[0] / "manifest.json").read_text())["recipe_sha256"]
    assert configs[0]["loss_params"]["extra"]["teacher"] == {"recipe_sha256": t_recipe}


def test_the_leaderboard_names_a_teacher_by_its_folder_not_by_the_path_it_had_here() -> None:
    from robustbench_nacl.eval.recipe import key_params

    params = {"extra": {"teacher": "/home/someone/runs/convnet_small.simclr_digits-0-4_s0", "trades_k": 2}}
    assert key_params(params) == "teacher=convnet_small.simclr_digits-0-4_s0 trades_k=2"
    assert key_params({"extra": {"teacher": "relative/dir"}}) == "teacher=relative/dir"  # as given
