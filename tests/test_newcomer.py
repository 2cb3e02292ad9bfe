"""A newcomer's first hour: file modes that follow the umask, output folders outside the tracked
tree, messages that say what is wrong and what is closest, a provenance line without local paths,
and CLI flags generated from the config dataclasses."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _models import one_thread
from _reliability import TINY, cli, eval_args, one_line_error, train_args

from robustbench_nacl import cli as cli_module
from robustbench_nacl import demo, zoo
from robustbench_nacl.cli import train as cli_train
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.io import (
    REFERENCE_ENV,
    atomic_open,
    refuse_reference_dir,
    repository_root,
    write_bytes_atomic,
    write_json_atomic,
)
from robustbench_nacl.registry import Registry, did_you_mean
from robustbench_nacl.training import TrainConfig, train
from robustbench_nacl.utils import cpu_threads, device_name

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(TINY, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def file_modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


# ============ file modes follow the umask ============


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=lambda m: f"umask-{m:03o}")
def test_atomic_writes_get_the_mode_open_would_give(mask: int, tmp_path: Path) -> None:
    with umask(mask):
        write_bytes_atomic(tmp_path / "a.bin", b"x")
        write_json_atomic(tmp_path / "b.json", {"a": 1})
        with atomic_open(tmp_path / "c.txt", "w") as f:
            # the temporary file has its final mode before it appears under its name (atomicity kept)
            assert stat.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o666 & ~mask
            assert not (tmp_path / "c.txt").exists()
            f.write("x")
        with open(tmp_path / "plain", "w"):
            pass
    modes = file_modes(tmp_path)
    assert modes == dict.fromkeys(["a.bin", "b.json", "c.txt", "plain"], 0o666 & ~mask)


def _tiny_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's code path on one zoo entry, 1 epoch and 20 test examples: seconds, not minutes."""
    plan = demo.DemoPlan("digits:0-4", "digits:5-9", 1, 64, probe_epochs=10, n_examples=20, max_train=None)
    plans: Registry[dict[str, demo.DemoPlan]] = Registry("demo dataset")
    plans.add("digits", {"quick": dataclasses.replace(plan, shift=None)})
    monkeypatch.setattr(demo, "DEMOS", plans)
    monkeypatch.setattr(
        demo, "demo_zoo", lambda: [dataclasses.replace(zoo.demo_zoo()[0], encoder_kwargs={"width": 8})]
    )


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o022, 0o077], ids=lambda m: f"umask-{m:03o}")
def test_every_file_train_eval_leaderboard_and_demo_write_follows_the_umask(
    mask: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_demo(monkeypatch)
    with umask(mask):
        assert cli(train_args(tmp_path / "run", 1), capsys)[0] == 0
        assert cli(eval_args(tmp_path / "run", tmp_path / "lb"), capsys)[0] == 0
        assert (
            cli(["leaderboard", "--rows", str(tmp_path / "lb"), "--out", str(tmp_path / "lb")], capsys)[0]
            == 0
        )
        rc, _, err = cli(["demo", "--quick", "--workers", "1", "--out", str(tmp_path / "demo")], capsys)
        assert rc == 0, err
    modes = file_modes(tmp_path)
    names = {Path(p).name for p in modes}
    assert {"weights.safetensors", "manifest.json", "LEADERBOARD.md", "index.html"} <= names
    assert any(n.endswith(".png") for n in names) and any(p.startswith("lb/rows/") for p in modes)
    assert any(p.startswith("demo/quick/checkpoints/") for p in modes)
    assert any(p.startswith("demo/quick/leaderboard/") for p in modes)
    wrong = {p: oct(m) for p, m in modes.items() if m != 0o666 & ~mask}
    assert not wrong, wrong


# ============ output folders: the user's, never the repository's reference ============


def test_default_output_folders_are_under_robustbench_out() -> None:
    parser = cli_module.build_parser()
    outs = {
        "eval --out": parser.parse_args(["eval", "ckpt"]).out,
        "leaderboard --rows": parser.parse_args(["leaderboard"]).rows[0],
        "leaderboard --out": parser.parse_args(["leaderboard"]).out,
        "zoo --out": parser.parse_args(["zoo", "verify"]).out,
        "demo --out": parser.parse_args(["demo"]).out,
        "run_demo(out=)": str(inspect.signature(demo.run_demo).parameters["out"].default),
    }
    for what, out in outs.items():
        assert Path(out).parts[0] == "robustbench_out", (what, out)
    # eval writes where leaderboard reads: the two commands chain with no flags
    assert outs["eval --out"] == outs["leaderboard --rows"]
    assert parser.parse_args(["leaderboard"]).rows == [outs["eval --out"]]
    # --rows given replaces the default folder (it is not ranked beside it), and repeats
    assert parser.parse_args(["leaderboard", "--rows", "a", "--rows", "b"]).rows == ["a", "b"]


def test_default_output_folders_are_ignored_by_git() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout with git installed: .gitignore cannot be asked")
    written = [
        "robustbench_out/leaderboard/rows/0a1b.json",
        "robustbench_out/demo/quick/leaderboard/index.html",
    ]
    written += ["robustbench_out/zoo/x/weights.safetensors", "runs/intnacl/manifest.json", "demo_out/x"]
    for path in written:
        res = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True)
        assert res.returncode == 0, f"{path} would be an untracked file in the clone"
    res = subprocess.run(["git", "check-ignore", "-q", "leaderboard/rows/0a1b.json"], cwd=REPO)
    assert res.returncode == 1  # the reference leaderboard's own rows can be committed


def test_the_reference_leaderboard_folder_is_refused(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert repository_root() == REPO
    monkeypatch.chdir(REPO)
    monkeypatch.delenv(REFERENCE_ENV, raising=False)
    ref = REPO / "leaderboard"
    before = sorted(ref.rglob("*")) if ref.exists() else None
    attempts = [
        eval_args(ckpt, "leaderboard"),  # the README's old command, run in the clone
        ["leaderboard", "--rows", str(tmp_path), "--out", "leaderboard"],
        ["leaderboard", "--rows", str(tmp_path), "--out", str(ref / "mine")],
        train_args(ref / "run", 1),
        ["demo", "--quick", "--out", "leaderboard/demo"],
        ["zoo", "train", "--zoo", "demo", "--out", "./leaderboard/../leaderboard/zoo"],
    ]
    for args in attempts:
        rc, _, err = cli(args, capsys)
        one_line_error(rc, err, "reference leaderboard/ folder", "a folder of your own", command=args[0])
    assert (sorted(ref.rglob("*")) if ref.exists() else None) == before  # nothing written there
    refuse_reference_dir(tmp_path / "leaderboard")  # a folder of the user's may be called leaderboard
    monkeypatch.setenv(REFERENCE_ENV, "1")
    refuse_reference_dir(ref)  # a deliberate regeneration of the reference


# ============ messages ============


def test_unknown_names_suggest_the_closest_valid_one() -> None:
    assert did_you_mean("simclrr", ["simclr", "nca", "mixnca"]) == " (did you mean 'simclr'?)"
    assert did_you_mean("NCA", ["simclr", "nca"]) == " (did you mean 'nca'?)"
    assert did_you_mean("zzz", ["simclr", "nca"]) == ""
    reg: Registry[int] = Registry("widget")
    reg.add("resnet18_cifar", 1)
    reg.add("resnet50_cifar", 2)
    with pytest.raises(
        Exception, match=r"unknown widget 'resnet18-cifar' \(did you mean 'resnet18_cifar'"
    ) as e:
        reg.get("resnet18-cifar")
    assert "valid choices: resnet18_cifar, resnet50_cifar" in str(e.value)


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--loss", "simclrr", "did you mean 'simclr'"),
        ("--encoder", "convnet-small", "did you mean 'convnet_small'"),
        ("--dataset", "digitz", "did you mean 'digits'"),
    ],
)
def test_a_mistyped_train_name_gets_a_suggestion(
    flag: str, value: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = cli([*train_args(tmp_path / "run", 1), flag, value], capsys)
    one_line_error(rc, err, fragment, command="train")
    assert not (tmp_path / "run").exists()


def _table(text: str) -> list[dict[str, str]]:
    """The first markdown table of ``text`` (``losses`` prints the adversarial presets in a second one)."""
    block = text[text.index("\n|") + 1 :].split("\n\n")[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("|") and not ln.startswith("|--")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[1:]]


def test_losses_shows_the_view_maker_and_the_aggregator_under_their_own_headers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, _ = cli(["losses"], capsys)
    assert rc == 0
    table = {row["preset"]: row for row in _table(out)}
    assert table["var"]["positives"] == "var" and table["var"]["views"] == "simclr"
    assert table["arcl"]["positives"] == "worst_pair" and table["arcl"]["views"] == "simclr"
    assert table["dacl"]["views"] == "dacl" and table["dacl"]["positives"] == "nca"
    assert table["gaussian"]["views"] == "gaussian"


def test_the_leaderboard_records_the_command_without_local_paths(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, out = tmp_path / "lb", tmp_path / "board"
    assert cli(eval_args(ckpt, rows), capsys)[0] == 0
    rc, _, err = cli(["leaderboard", "--rows", str(rows), "--out", str(out)], capsys)
    assert rc == 0, err
    md = (out / "LEADERBOARD.md").read_text()
    assert f"`robustbench-nacl leaderboard --rows {rows} --out {out}`" in md
    assert sys.prefix not in md and sys.executable not in md  # no virtual environment's path


def test_device_names_count_threads_in_words() -> None:
    with cpu_threads(1):
        assert device_name("cpu").endswith(", 1 torch thread)")
    with cpu_threads(2):
        assert device_name("cpu").endswith(", 2 torch threads)")


def test_eval_says_when_nothing_was_recomputed_and_names_the_control(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lb"
    args = [*eval_args(ckpt, out), "--probe-lr", "0.002"]
    rc, first, err = cli(args, capsys)
    assert rc == 0, err
    rows = [json.loads(p.read_text()) for p in (out / "rows").glob("*.json")]
    assert rows and all(
        r["probe_config"]["lr"] == 0.002 for r in rows
    )  # the generated flag reaches the probe
    rc, again, _ = cli(args, capsys)
    assert rc == 0 and "nothing recomputed" in again.splitlines()[-1] and "nothing recomputed" not in first
    rc, control, _ = cli([*args, "--control"], capsys)
    assert rc == 0 and "random-init control" in control.splitlines()[-1]


# ============ flags generated from the config dataclasses ============


def _flags(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in cli_module.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: a for a in sub.choices[command]._actions for opt in a.option_strings}


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def test_every_probe_config_field_is_an_eval_flag_with_its_default() -> None:
    flags = _flags("eval")
    for f in dataclasses.fields(ProbeConfig):
        assert flags[f"--probe-{f.name.replace('_', '-')}"].default == _default(f), f.name
    parser = cli_module.build_parser()
    plain = parser.parse_args(["eval", "ckpt"])
    assert ProbeConfig(**cli_module.config_values(ProbeConfig, plain, prefix="probe-")) == ProbeConfig()
    set_ = parser.parse_args(["eval", "ckpt", "--probe-lr", "0.01", "--probe-epochs", "7"])
    got = ProbeConfig(**cli_module.config_values(ProbeConfig, set_, prefix="probe-"))
    assert got == dataclasses.replace(ProbeConfig(), lr=0.01, epochs=7)


def test_every_train_config_field_is_a_train_flag_with_its_default() -> None:
    flags = _flags("train")
    special = {
        "loss": "--loss",
        "overrides": "--set",
        "encoder_kwargs": "--encoder-arg",
        "optimizer_kwargs": "--optimizer-arg",
        "schedule_kwargs": "--schedule-arg",
    }
    for f in dataclasses.fields(TrainConfig):
        flag = special.get(f.name, f"--{f.name.replace('_', '-')}")
        assert flag in flags, f.name
        if f.name not in special:
            assert flags[flag].default == _default(f), f.name
    args = cli_module.build_parser().parse_args(["train", "--loss", "simclr", "--out", "x"])
    values = cli_module.config_values(TrainConfig, args, skip=cli_train._TRAIN_SPECIAL)
    assert TrainConfig(loss="simclr", **values) == TrainConfig()


def test_a_new_config_field_becomes_a_flag_without_editing_the_cli() -> None:
    @dataclasses.dataclass(frozen=True)
    class Recipe:
        rate: float = 0.5  # how fast it learns, in %
        # where it goes
        name: str | None = None
        on: bool = True
        table: dict[str, int] = dataclasses.field(default_factory=dict)  # not a scalar: no flag

    p = argparse.ArgumentParser()
    cli_module.add_config_flags(p, Recipe, prefix="x-")
    args = p.parse_args(["--x-rate", "0.25", "--no-x-on", "--x-name", "a"])
    assert Recipe(**cli_module.config_values(Recipe, args, prefix="x-")) == Recipe(
        rate=0.25, name="a", on=False
    )
    text = " ".join(p.format_help().split())
    assert "how fast it learns, in % (default: 0.5)" in text and "where it goes" in text
    assert "--x-table" not in text


# ============ the layers contract ============


def test_the_one_way_import_layers_hold() -> None:
    """pyproject.toml's [tool.importlinter] layers (cli > demo > zoo > ... > errors), checked on every
    test run rather than only by whoever remembers to run `lint-imports`."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    assert "0 broken" in res.stdout
