"""The ++ post-processing in the zoos: an entry's ``post`` step names its parent entry and recipe;
the manifest checks, the order (parent first, a missing parent refused before anything runs),
`zoo train` / `zoo eval` / `zoo list` / `zoo status` on a tiny post entry, and the shipped zoos."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from _models import one_thread
from _reliability import cli, one_line_error

from robustbench_nacl import launch, pipeline, zoo
from robustbench_nacl.errors import UserError
from robustbench_nacl.zoo.generated import keep_pin

RECIPE = {
    "epochs": 1,
    "batch_size": 32,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 96,
}
#: the post-processing at a budget of seconds: one LP and one AFT epoch of 3 batches, 2 attack steps
TINY_POST = {"lp_epochs": 1, "aft_epochs": 1, "batch_size": 32, "steps": 2}
EVAL = {"transfer": None, "shift": None, "suite": "quick", "n_examples": 20, "probe_epochs": 5}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def _zoo(root: Path) -> tuple[zoo.ZooEntry, zoo.ZooEntry]:
    """A tiny zoo 't' under root: a DynACL parent and its dynacl++ post entry."""
    common = {
        "zoo": "t",
        "encoder": "convnet_small",
        "dataset": "digits:0-1",
        "seed": 0,
        "recipe": dict(RECIPE),
        "encoder_kwargs": {"width": 4},
        "eval": dict(EVAL),
    }
    parent = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", "dynacl", "digits:0-1", 0),
        loss="dynacl",
        overrides={"attack_steps": 2},
        **common,
    )
    post = zoo.ZooEntry(
        id=zoo.expected_id("convnet_small", "dynacl++", "digits:0-1", 0),
        loss="dynacl++",
        overrides=dict(TINY_POST),
        post={"parent": parent.id, "recipe": "dynacl++"},
        **common,
    )
    for e in (parent, post):
        zoo.write_entry(e, root)
    return parent, post


# ============ the shipped zoos ============


def test_the_shipped_zoos_are_what_the_generators_make() -> None:
    for name, make in zoo.GENERATED_ZOOS.items():
        folder = zoo.zoo_root() / name
        generated = make()
        assert {p.name for p in folder.glob("*.json")} == {f"{e.id}.json" for e in generated}, name
        for e in generated:  # byte for byte what `zoo regenerate` writes (the published pins kept)
            path = folder / f"{e.id}.json"
            assert json.loads(path.read_text()) == keep_pin(e, path).to_dict(), e.id


def test_fashion_mnist_and_the_gpu_zoo_hold_the_plus_plus_of_each_seeds_dynacl_entries() -> None:
    for name, seeds in (("fashion-mnist", {0, 1, 2}), ("robust-ssl-cifar10", {0})):
        entries = {e.id: e for e in zoo.load_zoo(name)}  # load_zoo checks every parent (check_posts)
        posts = [e for e in entries.values() if e.post is not None]
        made = {(e.loss, e.post["recipe"], entries[e.post["parent"]].loss, e.seed) for e in posts}
        assert made == {
            (loss + "++", recipe, loss, s) for loss, recipe in zoo.POST_OF.items() for s in seeds
        }, name
        for e in posts:  # the parent's seed, data, recipe and evaluation; the authors' settings
            p = entries[e.post["parent"]]
            assert (e.seed, e.dataset, e.recipe, e.eval, e.overrides) == (
                p.seed,
                p.dataset,
                p.recipe,
                p.eval,
                {},
            )
    # the demo (2-core minutes) and the NaCl paper zoo have none; only a post entry has the field
    for name in ("demo", "paper"):
        assert not any(e.post for e in zoo.load_zoo(name))
    assert all(("post" in e.to_dict()) == e.loss.endswith("++") for e in zoo.load_zoo("fashion-mnist"))


# ============ manifest checks ============


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"post": {"parent": "x", "recipe": "nope++"}}, "unknown post-processing recipe 'nope++'"),
        ({"post": {"parent": "x", "recipe": "dynacl++", "k": 1}}, "and nothing else"),
        ({"post": {"parent": "../up", "recipe": "dynacl++"}}, "post.parent must be the id of another entry"),
        ({"post": {"parent": "convnet_small.dynacl++_digits-0-1_s0", "recipe": "dynacl++"}}, "another entry"),
        ({"post": {"parent": 3, "recipe": "dynacl++"}}, "post.parent must be the id"),
        ({"loss": "dynacl"}, "must be its parent's preset + '++'"),
        ({"loss": "nope++"}, "unknown loss preset 'nope'"),
        ({"overrides": {"aft_epochs": 0}}, "aft_epochs 0 must be an integer >= 1"),
        ({"overrides": {"attack_steps": 2}}, "unknown setting 'attack_steps'"),
        ({"teacher": "convnet_small.simclr_digits-0-1_s0"}, "a post entry has no 'teacher'"),
        ({"post": None}, "unknown loss preset 'dynacl++'"),  # without a post step, '++' is no preset
    ],
)
def test_invalid_post_fields_are_one_line_errors(tmp_path: Path, patch: dict, fragment: str) -> None:
    data = {**_zoo(tmp_path)[1].to_dict(), **patch}
    with pytest.raises(UserError) as e:
        zoo.parse_entry(data, "x.json")
    assert fragment in str(e.value) and "x.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"post": {"parent": "convnet_small.nope_digits-0-1_s0", "recipe": "dynacl++"}},
            "no entry of zoo 't'",
        ),
        ({"zoo": "other"}, "which is no entry of zoo 'other'"),  # the parent is in zoo t
        ({"loss": "acl++"}, "its loss must be 'dynacl++'"),
        ({"seed": 1}, "differs from its parent"),
        ({"recipe": {**RECIPE, "max_train": 64}}, "differs from its parent"),
    ],
)
def test_a_post_entry_that_does_not_follow_its_parent_is_refused(
    tmp_path: Path, change: dict, fragment: str
) -> None:
    _, post = _zoo(tmp_path)
    (tmp_path / "t" / f"{post.id}.json").unlink()
    zoo.write_entry(dataclasses.replace(post, **change), tmp_path)
    with pytest.raises(UserError) as e:
        zoo.load_zoo(None, tmp_path)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_parent_that_is_a_post_entry_or_has_no_dual_bn_is_refused(tmp_path: Path) -> None:
    parent, post = _zoo(tmp_path)
    # a post entry of a post entry ('dynacl++++' is no preset + '++': its loss names the grandparent)
    again = dataclasses.replace(post, id=f"{post.id}-again", post={"parent": post.id, "recipe": "air++"})
    zoo.write_entry(again, tmp_path)
    with pytest.raises(UserError, match=re.escape(f"post-processes {post.id}, a post entry itself")):
        zoo.load_zoo("t", tmp_path)
    (tmp_path / "t" / f"{again.id}.json").unlink()
    # a parent without dual BatchNorm: simclr, and dynacl trained with dual_bn off
    for loss, overrides in (("simclr", {}), ("dynacl", {"attack_steps": 2, "dual_bn": False})):
        zoo.write_entry(dataclasses.replace(parent, loss=loss, overrides=overrides), tmp_path)
        zoo.write_entry(dataclasses.replace(post, loss=f"{loss}++"), tmp_path)
        with pytest.raises(UserError, match="which has no dual BatchNorm") as e:
            zoo.load_zoo("t", tmp_path)
        assert "\n" not in str(e.value)


# ============ order ============


def test_training_waves_put_the_parent_first_and_refuse_a_missing_one(tmp_path: Path) -> None:
    parent, post = _zoo(tmp_path / "zoo")
    assert pipeline.training_waves([post, parent], [parent, post], tmp_path) == [[parent], [post]]
    # the parent's rows complete (not to do) but its checkpoint gone: it is made again, first
    assert pipeline.training_waves([post], [parent, post], tmp_path) == [[parent], [post]]
    with pytest.raises(
        UserError, match=re.escape(f"post-processes entry {parent.id}, which is neither among")
    ) as e:
        pipeline.training_waves([post], [post], tmp_path)
    assert "\n" not in str(e.value)
    # the launchers: a waiting one makes the parent first; Slurm holds the post entry back
    tasks = launch.make_tasks([post, parent], "train", tmp_path / "ck", tmp_path / "board")
    first, held = launch.teacher_order(tasks, waits=True)
    assert [t.entry for t in first] == [parent] and [t.entry for t in held] == [post]
    with pytest.raises(UserError, match=r"post-processes entry .* nor trained by this command"):
        launch.teacher_order(tasks[:1], waits=True)
    assert [t.entry for t in launch.teacher_order(tasks[:1], waits=False)[1]] == [post]


def test_a_post_entry_has_no_training_configuration_and_plans_the_rows_of_its_checkpoint(
    tmp_path: Path,
) -> None:
    _, post = _zoo(tmp_path)
    with pytest.raises(UserError, match=r"post-processes entry .*: it has no training configuration"):
        post.train_config()
    assert pipeline._checkpoint_facts(post) == {"loss": "dynacl++", "dual_bn": True}


# ============ zoo train / eval / list / status ============


def test_zoo_train_makes_the_parent_first_then_post_processes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parent, post = _zoo(tmp_path / "zoo")
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    out, board = tmp_path / "ckpts", tmp_path / "board"
    # the post entry alone, its parent untrained: one line, exit 2, nothing made
    rc, _, err = cli(["zoo", "train", post.id, "--out", str(out), "--no-progress"], capsys)
    one_line_error(rc, err, f"post-processes entry {parent.id}", "nor trained by this command")
    assert not out.exists() or not any(out.iterdir())
    # listed post entry first: the parent trains first all the same
    rc, stdout, err = cli(["zoo", "train", post.id, parent.id, "--out", str(out), "--no-progress"], capsys)
    assert rc == 0, err
    made = json.loads((out / post.id / "manifest.json").read_text())
    p_manifest = json.loads((out / parent.id / "manifest.json").read_text())
    assert made["id"] == post.id  # the entry's id, as train's checkpoints carry theirs
    assert made["loss"] == "dynacl++" and made["post"]["recipe"] == "dynacl++"
    assert (
        made["parent"]["id"] == parent.id and made["parent"]["weights_sha256"] == p_manifest["weights_sha256"]
    )
    assert (
        made["training_config"]["post"]["aft_epochs"] == 1
    )  # the entry's overrides are the recipe's settings
    assert not (out / post.id / "post-state").exists()
    rc, stdout, _ = cli(["zoo", "train", "--zoo", "t", "--out", str(out), "--no-progress"], capsys)
    assert rc == 0 and f"{post.id}: already trained" in stdout
    rc, stdout, _ = cli(["zoo", "list", "--zoo", "t", "--out", str(out)], capsys)
    assert rc == 0 and any(
        post.id in line and "dynacl++" in line and "yes" in line for line in stdout.splitlines()
    )
    # evaluated like any entry: its rows carry the family dynacl++ and complete what its manifest asks
    rc, _, err = cli(
        [
            "zoo",
            "eval",
            post.id,
            "--out",
            str(out),
            "--leaderboard",
            str(board),
            "--no-controls",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, err
    rows = [json.loads(p.read_text()) for p in (board / "rows").glob("*.json")]
    assert rows and {(r["checkpoint_id"], r["loss"]) for r in rows} == {(post.id, "dynacl++")}
    assert pipeline.is_complete(post, pipeline.rows_done(board))
    rc, _, err = cli(["leaderboard", "--rows", str(board), "--out", str(board), "--no-progress"], capsys)
    assert rc == 0, err
    assert "dynacl++" in (board / "LEADERBOARD.md").read_text()
    rc, stdout, _ = cli(["zoo", "status", post.id, "--out", str(out), "--leaderboard", str(board)], capsys)
    assert rc == 0 and "train 1 done" in stdout and "eval 1 done" in stdout


def test_zoo_status_reads_a_killed_post_processing_as_partial_work(tmp_path: Path) -> None:
    _, post = _zoo(tmp_path / "zoo")
    ckpts, board = tmp_path / "ckpts", tmp_path / "board"

    def train_state() -> str:
        return next(st.state for st in launch.zoo_status([post], ckpts, board) if st.task.action == "train")

    assert train_state() == "not started"
    (zoo.checkpoint_dir(post, ckpts) / "post-state").mkdir(parents=True)  # what post_process resumes from
    assert train_state() == "interrupted"
