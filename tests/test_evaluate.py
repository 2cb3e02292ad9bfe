"""Evaluation: settings, content-addressed rows that make a rerun a no-op, controls, CLI contract."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest
import torch
from conftest import run_cli

import robustbench_nacl.eval.runner as runner_module
from robustbench_nacl.cli import main as cli_main
from robustbench_nacl.data import DatasetSpec, clear_cache, download, parse_spec
from robustbench_nacl.errors import DatasetNotFound, UserError
from robustbench_nacl.eval.config import DataOptions, EvalConfig, OutputOptions
from robustbench_nacl.eval.evaluate import evaluate, planned_identities
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.eval.settings import settings_for, transfer_default
from robustbench_nacl.eval.source import random_init_like
from robustbench_nacl.models.foreign import load_encoder
from robustbench_nacl.results.rows import IDENTITY, REQUIRED, ResultRow, load_rows
from robustbench_nacl.training import TrainConfig, train

QUICK = {"n_examples": 40, "probe": ProbeConfig(epochs=30, lr=1e-2), "progress": False}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = TrainConfig(
        loss="simclr",
        dataset="digits:0-4",
        encoder="convnet_small",
        encoder_kwargs={"width": 8},
        epochs=2,
        batch_size=64,
        lr=3e-3,
        knn_every=2,
    )
    return train(cfg, tmp_path_factory.mktemp("ckpt") / "run", progress=False)


def test_settings_and_transfer_default() -> None:
    assert transfer_default("digits:0-4") == "digits:5-9"  # canonical spelling
    assert transfer_default("digits") is None
    s = settings_for("digits:0-4", "digits:5-9", "all")
    assert [x.name for x in s] == ["in-domain", "transfer"] + ["shift"] * 5
    assert s[2].dataset == "digits:0-4@grayscale"
    # one dataset in two spellings is one setting
    assert settings_for("digits:0,1,2,3,4", ["digits:5,6,7,8,9", "digits:5-9"], None) == settings_for(
        "digits:0-4", "digits:5-9", None
    )


def test_settings_take_a_parsed_spec_and_keep_the_canonical_string() -> None:
    spec = parse_spec("digits:0,1,2,3,4")
    assert settings_for(spec, "digits:5-9", "flip") == settings_for("digits:0-4", "digits:5-9", "flip")
    assert [s.dataset for s in settings_for(spec, None, "flip")] == ["digits:0-4", "digits:0-4@flip"]
    assert transfer_default(spec) == "digits:5-9"
    assert str(DatasetSpec("digits", tuple(range(10))).canonical()) == "digits"


def test_the_config_form_is_the_keyword_form() -> None:
    keywords = {"transfer": "digits:5-9", "suite": "quick", "n_examples": 40, "seed": 1}
    config = EvalConfig.from_keywords(dataset="digits:0-4", **keywords)
    assert config.data == DataOptions("digits:0-4", "digits:5-9", n_examples=40) and config.seed == 1
    assert config.output == OutputOptions() and config.attack.suite == "quick"
    assert planned_identities(parse_spec("digits:0-4"), **keywords) == planned_identities(
        "digits:0-4", **keywords
    )
    with pytest.raises(UserError, match="pass either config= or keyword arguments, not both"):
        evaluate("no-such-checkpoint", config, seed=2)


def test_rows_carry_provenance_and_pass_sanity(ckpt: Path, tmp_path: Path) -> None:
    rows = evaluate(ckpt, transfer="digits:5-9", shift="grayscale", suite="quick", out=tmp_path, **QUICK)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert {r["setting"] for r in rows} == {"in-domain", "transfer", "shift"}
    for r in rows:
        assert isinstance(r, ResultRow) and ResultRow.from_json(r.to_json()) == r
        for k in (
            *IDENTITY,
            *REQUIRED,
            "row_id",
            "checkpoint_id",
            "clean_acc",
            "robust_acc",
            "eps_label",
            "versions",
            "device",
            "wall_s",
            "sanity_ok",
            "probe_test_acc",
            "knn_acc",
            "created_at",
        ):
            assert k in r, k
        assert r["checkpoint_sha256"] == manifest["weights_sha256"]
        assert r["robust_acc"] <= r["clean_acc"] and isinstance(r["eps"], float)
        assert r["sanity_ok"], {k: v for k, v in r.items() if k.startswith("sanity_")}
    on_disk = load_rows(tmp_path)
    assert sorted(r["row_id"] for r in on_disk) == sorted(r["row_id"] for r in rows)
    assert len({r["row_id"] for r in rows}) == len(rows)  # content addresses are distinct


def test_rerun_writes_nothing_says_so_and_force_recomputes(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = evaluate(ckpt, transfer="digits:5-9", suite="quick", out=tmp_path, **QUICK)
    assert first.summary.endswith(f"{len(first)} result rows computed into {tmp_path / 'rows'}")
    files = sorted((tmp_path / "rows").glob("*.json"))
    stamps = {p: p.stat().st_mtime_ns for p in files}

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a re-run probed or attacked again")

    with monkeypatch.context() as m:  # a re-run neither probes, nor attacks, nor loads data
        for name in ("fit_linear_probe", "benchmark", "load_dataset"):
            m.setattr(runner_module, name, no_work)
        again = evaluate(ckpt, transfer="digits:5-9", suite="quick", out=tmp_path, **QUICK)
    assert sorted((tmp_path / "rows").glob("*.json")) == files
    assert all(p.stat().st_mtime_ns == stamps[p] for p in files)  # nothing rewritten
    assert len(again) == len(files) and (again.computed, again.reused) == (0, len(files))
    rows_dir = tmp_path / "rows"
    assert again.summary.endswith(
        f"all {len(files)} result rows already exist in {rows_dir}; nothing recomputed (--force to recompute)"
    )
    assert "\n" not in again.summary
    # a different eval seed is a different measurement: new rows, old ones untouched
    evaluate(ckpt, suite="quick", out=tmp_path, seed=1, **QUICK)
    assert len(list((tmp_path / "rows").glob("*.json"))) > len(files)
    forced = evaluate(ckpt, suite="quick", out=tmp_path, force=True, **QUICK)
    assert forced.computed == len(forced) and "nothing recomputed" not in forced.summary
    assert any(
        p.stat().st_mtime_ns != stamps[p] for p in files if p.name[:-5] in {r["row_id"] for r in forced}
    )


def test_random_init_control_is_marked_and_hashed(ckpt: Path, tmp_path: Path) -> None:
    rows = evaluate(ckpt, suite="quick", out=tmp_path, control=True, **QUICK)
    trained = evaluate(ckpt, suite="quick", out=tmp_path, **QUICK)
    assert all(r["control"] and r["loss"] == "random-init" for r in rows)
    assert "random-init" in rows[0]["checkpoint_id"]
    assert rows.summary.startswith("random-init control (") and "random-init" not in trained.summary
    assert rows[0]["checkpoint_sha256"] != trained[0]["checkpoint_sha256"]
    assert rows[0].recipe_id != trained[0].recipe_id and rows[0].recipe["kind"] == "random-init"
    again = evaluate(ckpt, suite="quick", out=tmp_path, control=True, **QUICK)  # same seed, same weights
    assert again[0]["checkpoint_sha256"] == rows[0]["checkpoint_sha256"]
    assert again.summary.startswith("random-init control (") and "nothing recomputed" in again.summary


def test_random_init_control_leaves_the_global_rng_alone(ckpt: Path) -> None:
    encoder, info = load_encoder(ckpt)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    a = random_init_like(encoder, info, seed=7)
    assert torch.equal(torch.rand(4), expected)  # the caller's stream continues as if nothing ran
    b = random_init_like(encoder, info, seed=7)
    c = random_init_like(encoder, info, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # the weights depend on the seed alone
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_a_missing_dataset_fails_before_any_row_is_written(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # offline: cifar10 can be neither found under the empty data root nor downloaded
    monkeypatch.setattr(download, "_download", lambda *a: urllib.error.URLError("no network"))
    clear_cache()
    with pytest.raises(DatasetNotFound, match="cifar10"):
        evaluate(
            ckpt, transfer="cifar10", shift="flip", suite="quick", out=tmp_path / "out",
            data_root=str(tmp_path / "data"), **QUICK,
        )  # fmt: skip
    assert not list((tmp_path / "out").rglob("*.json"))  # the in-domain rows were not written first


def test_eval_cli_twice_second_run_writes_nothing(
    ckpt: Path, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    args = [
        "eval",
        str(ckpt),
        "--transfer",
        "auto",
        "--shift",
        "flip",
        "--suite",
        "paper",
        "--out",
        str(tmp_path),
        "--n-examples",
        "40",
        "--probe-epochs",
        "30",
        "--no-progress",
    ]
    first = run_cli(args, cli_env)
    assert first.returncode == 0, first.stderr
    n = len(list((tmp_path / "rows").glob("*.json")))
    assert n == 3 * (6 + 5)  # 3 settings x (5 FGSM + 1 PGD rows, 5 worst-case eps)
    second = run_cli(args, cli_env)
    assert second.returncode == 0 and len(list((tmp_path / "rows").glob("*.json"))) == n
    assert f"{n} result rows" in second.stdout
    assert "nothing recomputed (--force to recompute)" in second.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["train", "--loss", "nope", "--out", "X"], "valid choices: simclr"),
        (["train", "--loss", "simclr", "--encoder", "vgg", "--out", "X"], "valid choices"),
        (["train", "--loss", "simclr", "--dataset", "imagenet", "--out", "X"], "digits"),
        (["train", "--loss", "mixnca", "--set", "M=0", "--out", "X"], "M must be >= 1"),
        (["train", "--loss", "mixnca", "--set", "lam=2", "--out", "X"], "lam must lie in [0, 1]"),
        (["train", "--loss", "simclr", "--batch-size", "1", "--out", "X"], "at least 2 images"),
        (["train", "--loss", "simclr", "--dataset", "digits:20-30", "--out", "X"], "class"),
        (["eval", "nowhere", "--suite", "quick", "--out", "X"], "nowhere"),
        (["losses", "nope"], "valid choices"),
        (["train", "--loss", "simclr"], "--out"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    args, fragment, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (the CLI's ``main``, as the console script calls it); the first case also as
    a real process below, which shows no traceback reaches the terminal."""
    args = [str(tmp_path / "X") if a == "X" else a for a in args]
    monkeypatch.setenv("ROBUSTBENCH_NACL_DATA", str(tmp_path / "data"))
    try:
        code = cli_main(args)
    except SystemExit as e:  # argparse's errors (one line, see cli.common.Parser) exit this way
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err
    assert not (tmp_path / "X").exists()


def test_a_bad_input_is_one_line_in_a_real_process(tmp_path: Path, cli_env: dict[str, str]) -> None:
    res = run_cli(["train", "--loss", "mixnca", "--set", "M=0", "--out", str(tmp_path / "X")], cli_env)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "M must be >= 1" in res.stderr and not (tmp_path / "X").exists()


def test_losses_json_lists_every_preset_with_params(capsys: pytest.CaptureFixture[str]) -> None:
    def losses(*args: str) -> str:
        capsys.readouterr()
        assert cli_main(["losses", *args]) == 0
        return capsys.readouterr().out

    entries = json.loads(losses("--json"))
    names = {e["name"] for e in entries}
    assert {"simclr", "intnacl", "arcl", "dacl_plus", "supervised", "var", "nca_mixnca"} <= names
    intnacl = next(e for e in entries if e["name"] == "intnacl")["params"]
    assert (intnacl["G1"], intnacl["M"], intnacl["lam"], intnacl["alpha"], intnacl["w"]) == (
        "g2",
        5,
        0.5,
        1.0,
        "w_hat",
    )
    p = json.loads(losses("mixnca", "--set", "M=3", "--set", "lam=0.9", "--json"))[0]["params"]
    assert (p["M"], p["lam"]) == (3, 0.9)
    table = losses()
    assert "MIXNCA" in table and "w_hat" in table
