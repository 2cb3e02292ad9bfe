"""Zoo: shipped manifests validate, ids are unique, train/verify round trip detects changed weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import run_cli

from robustbench_nacl import pipeline, zoo
from robustbench_nacl.cli import main
from robustbench_nacl.errors import UserError
from robustbench_nacl.training import train


def test_shipped_zoos_validate_and_match_their_generators() -> None:
    demo, paper = zoo.load_zoo("demo"), zoo.load_zoo("paper")
    stale = "the shipped manifests are not what the generators make: run `robustbench-nacl zoo regenerate`"
    generated = sorted((e.to_dict() for e in zoo.demo_zoo()), key=lambda d: d["id"])
    assert [e.to_dict() for e in demo] == generated, stale
    assert {e.id for e in paper} == {e.id for e in zoo.paper_zoo()}, stale
    assert {e.loss for e in demo} == {e.loss for e in paper}  # one demo entry per family of the paper zoo
    assert {e.seed for e in paper} == {0, 1, 2, 3, 4}
    assert all(e.dataset == "cifar100" and e.encoder == "resnet18_cifar" for e in paper)
    assert all(e.recipe["epochs"] == 100 and e.recipe["batch_size"] == 256 for e in paper)
    grid = {(e.overrides.get("M"), e.overrides.get("lam")) for e in paper if e.loss == "mixnca"}
    assert {(m, lam) for m in (2, 3, 4, 5) for lam in (0.5, 0.6, 0.7, 0.8, 0.9)} <= grid


def test_the_reference_zoo_is_every_preset_on_fashion_mnist_with_three_seeds() -> None:
    fm = zoo.load_zoo("fashion-mnist")
    # what the generator makes, with the pins `zoo publish` wrote (regenerate keeps them)
    assert [{**e.to_dict(), "weights_sha256": None} for e in fm] == sorted(
        (e.to_dict() for e in zoo.fashion_mnist_zoo()), key=lambda d: d["id"]
    )
    # every shipped preset (the robust-SSL families too) x 3 seeds, and the ++ post-processing of the
    # dynacl and dynacl_air entries (tests/test_zoo_post.py); DeACL distils the SimCLR entry
    presets = {loss for loss in zoo.package_presets()} | {f"{loss}++" for loss in zoo.POST_OF}
    assert {(e.loss, e.seed) for e in fm} == {(loss, s) for loss in presets for s in (0, 1, 2)}
    assert {e.teacher for e in fm if e.loss == "deacl"} == {
        f"convnet_small.simclr_fashion-mnist-0-4_s{s}" for s in (0, 1, 2)
    }
    assert {e.dataset for e in fm} == {"fashion-mnist:0-4"}
    assert all(e.eval["transfer"] == "fashion-mnist:5-9" and e.eval["n_examples"] >= 500 for e in fm)
    # on one channel grayscale is the identity and grayscale+jitter is jitter: the others are run
    assert {e.eval["shift"] for e in fm} == {"crop,flip,jitter"}
    # SLF, ALF and AFF for every seed (AFF seed intervals, issue 37), label-free too (issue 48); ALF
    # on standardised features at the recipe's epochs; the learning curves recorded every epoch
    assert {(e.seed, e.eval["protocol"]) for e in fm} == {(s, "slf,alf,aff,label-free") for s in (0, 1, 2)}
    assert {e.eval["alf"]["fit"] for e in fm} == {"standardized"}
    assert all(e.recipe["monitor_every"] == 1 and e.recipe["monitor_probe"] for e in fm)
    # a fitted probe (standardised features) and AutoAttack standard in-domain at the headline eps
    assert all(e.eval["probe_standardize"] and e.eval["suite"] == "fashion-mnist-aa" for e in fm)
    # every manifest's evaluation is one evaluate() can plan (suites, kinds and finetune fields exist)
    # label-free: 6 read-outs (4 without labels, 2 kNN) at each of the 5 eps
    assert len(pipeline.row_keys(fm[0])) == 22 + 22 + 3 * 5 + 27 * 2 + 22 + 22 + 6 * 5


def _entry(tmp: Path) -> zoo.ZooEntry:
    e = zoo.ZooEntry(
        id="convnet_small.simclr_digits-0-2_s0",
        zoo="t",
        encoder="convnet_small",
        loss="simclr",
        dataset="digits:0-2",
        seed=0,
        recipe={"epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0},
        encoder_kwargs={"width": 8},
    )
    zoo.write_entry(e, tmp / "zoo")
    return e


def test_train_then_verify_detects_a_changed_weights_file(tmp_path: Path, cli_env: dict[str, str]) -> None:
    _entry(tmp_path)
    cli_env["ROBUSTBENCH_NACL_ZOO"] = str(tmp_path / "zoo")
    out = str(tmp_path / "ckpts")
    res = run_cli(["zoo", "train", "--zoo", "t", "--out", out], cli_env)
    assert res.returncode == 0, res.stderr
    again = run_cli(["zoo", "train", "--zoo", "t", "--out", out], cli_env)
    assert "already trained" in again.stdout  # trained entries are skipped
    ok = run_cli(["zoo", "verify", "--zoo", "t", "--out", out], cli_env)
    assert ok.returncode == 0 and ok.stdout.startswith("ok")
    weights = tmp_path / "ckpts" / "convnet_small.simclr_digits-0-2_s0" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # flip one bit of one weight
    weights.write_bytes(bytes(data))
    bad = run_cli(["zoo", "verify", "--zoo", "t", "--out", out], cli_env)
    assert bad.returncode == 1 and "changed" in bad.stdout
    listed = run_cli(["zoo", "list", "--zoo", "t", "--out", out], cli_env)
    assert "convnet_small.simclr_digits-0-2_s0" in listed.stdout and "yes" in listed.stdout


def test_a_pinned_sha_that_differs_is_reported(tmp_path: Path) -> None:
    e = _entry(tmp_path)
    train(e.train_config(), zoo.checkpoint_dir(e, tmp_path / "c"), progress=False)
    assert zoo.verify_entry(e, tmp_path / "c")[0] == "ok"
    pinned = dataclasses.replace(e, weights_sha256="0" * 64)
    assert zoo.verify_entry(pinned, tmp_path / "c")[0] == "unpinned-mismatch"


def test_verify_with_nothing_trained_says_so_and_fails(tmp_path: Path, cli_env: dict[str, str]) -> None:
    e = _entry(tmp_path)
    cli_env["ROBUSTBENCH_NACL_ZOO"] = str(tmp_path / "zoo")
    out = tmp_path / "nothing-here"
    res = run_cli(["zoo", "verify", "--zoo", "t", "--out", str(out)], cli_env)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"missing            {e.id}  no checkpoint at {out / e.id}" in res.stdout
    assert "verified 0 of 1 entries" in res.stdout
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "verified none of the 1 entries of zoo 't'" in err[0] and str(out) in err[0]


def test_verify_counts_what_it_verified_and_lists_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    e = _entry(tmp_path)
    other = dataclasses.replace(e, id="convnet_small.simclr_digits-0-2_s1", seed=1)
    zoo.write_entry(other, tmp_path / "zoo")
    out = tmp_path / "c"
    train(e.train_config(), zoo.checkpoint_dir(e, out), progress=False)
    report = zoo.verify_entries([e, other], out)
    assert [r[:2] for r in report.results] == [(e, "ok")] and report.missing == [other] and not report.bad
    assert (
        report.summary() == f"verified 1 of 2 entries under {out}: 1 ok, 0 changed, 1 missing (no checkpoint)"
    )
    monkeypatch.setenv("ROBUSTBENCH_NACL_ZOO", str(tmp_path / "zoo"))
    capsys.readouterr()
    assert main(["zoo", "verify", "--zoo", "t", "--out", str(out)]) == 0  # some verified, all of them ok
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"ok                 {e.id}") and lines[1].startswith(
        f"missing            {other.id}"
    )
    assert lines[-1] == report.summary()
    # ids after the options are ids too (argparse alone would refuse them as unrecognized)
    assert main(["zoo", "verify", "--zoo", "t", "--out", str(out), e.id]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("verified 1 of 1 entries")
    with pytest.raises(SystemExit) as stop:
        main(["zoo", "verify", "--zoo", "t", "--out", str(out), e.id, "--no-such-flag"])
    assert stop.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"encoder": "vgg"}, "valid choices"),
        ({"loss": "nope"}, "valid choices"),
        ({"overrides": {"M": 0}}, "M must be >= 1"),
        ({"dataset": "digits:40-50"}, "digits"),
        ({"seed": "0"}, "must be a int"),
        ({"extra": 1}, "unknown field"),
        ({"recipe": {"epochs": 0, "batch_size": 64}}, "epochs must be >= 1"),
        ({"weights_sha256": "xyz"}, "64 lowercase hex"),
        ({"recipe": {"epochs": 1, "batch_size": 64, "max_train": 0}}, "recipe.max_train must be a whole"),
        ({"eval": {"probe_epochs": 1.5}}, "wrong type"),
        ({"eval": {"probe_max_train": -3}}, "eval.probe_max_train must be a whole"),
        ({"eval": {"probe_lr": 0}}, "eval.probe_lr must be a number > 0"),
        ({"eval": {"setting_suites": {"corruption": 3}}}, "eval.setting_suites must map"),
        ({"eval": {"alf": {"max_trian": 5}}}, "unknown eval.alf field 'max_trian'"),
    ],
)
def test_invalid_manifests_are_one_line_errors(patch: dict, fragment: str) -> None:
    data = zoo.demo_zoo()[0].to_dict()
    data.update(patch)
    with pytest.raises(UserError) as e:
        zoo.parse_entry(data, "x.json")
    assert fragment in str(e.value) and "x.json" in str(e.value) and "\n" not in str(e.value)


def test_a_zoo_run_evaluates_every_slf_job_before_any_alf_job_and_aff_last() -> None:
    demo = zoo.demo_zoo()[:3]
    entries = [
        dataclasses.replace(e, eval={**e.eval, "protocol": p})
        for e, p in zip(demo, ("aff,slf", "alf,slf", "slf"), strict=True)
    ]
    jobs = pipeline.by_protocol(entries)
    a, b, c = (e.id for e in demo)
    assert [(e.id, e.eval["protocol"]) for e in jobs] == [
        (a, "slf"), (b, "slf"), (c, "slf"), (b, "alf"), (a, "aff"),
    ]  # fmt: skip
    # one protocol's job expects exactly that protocol's share of the entry's rows
    both = pipeline.row_keys(entries[0])
    assert pipeline.row_keys(jobs[0]) | pipeline.row_keys(jobs[-1]) == both
    assert pipeline.row_keys(jobs[0]).isdisjoint(pipeline.row_keys(jobs[-1]))


def test_duplicate_ids_and_bad_json_are_refused(tmp_path: Path) -> None:
    e = _entry(tmp_path)
    (tmp_path / "zoo" / "t" / "copy.json").write_text(json.dumps(e.to_dict()))
    with pytest.raises(UserError, match="duplicate id"):
        zoo.load_zoo("t", tmp_path / "zoo")
    (tmp_path / "zoo" / "t" / "copy.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        zoo.load_zoo("t", tmp_path / "zoo")
    with pytest.raises(UserError, match="unknown zoo"):
        zoo.load_zoo("nope", tmp_path / "zoo")
