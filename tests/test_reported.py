"""The RobustSSL benchmark's published numbers as reported entries (files/reported/robustssl.json):
equal to their source, flagged where the source's cells are no measurement, rendered beside a
measured CIFAR-10 row by ``leaderboard --reported robustssl``, and never in ``compare``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from robustbench_nacl.cli import main
from robustbench_nacl.report.compare import main_compare
from robustbench_nacl.report.leaderboard import render_leaderboard
from robustbench_nacl.results.reported import load_reported, placement, placement_for_card
from robustbench_nacl.results.rows import ResultRow, stamp_ids, write_row

ROWS = Path(__file__).parent / "data" / "leaderboard" / "rows"
SITE = "RobustSSL/RobustSSL.github.io"


def _find(**kw: object) -> list:
    return [r for r in load_reported("robustssl") if all(getattr(r, k) == v for k, v in kw.items())]


# Values written here from the source files (RobustSSL/RobustSSL.github.io at 7a45d66):
# leaderboard/cifar10-cifar10-SLF.js (last changed in 7a45d66), row 1:
#   { paper: 'Enhancing Adversarial Contrastive Learning via Adversarial Invariant Regularization', ...
#     comment: 'Using post-processing', ra1: 46.99, ca1: 72.11, sa1: 81.80,
#     ra2: 45.40, ca2: 74.55, sa2: 83.52}
# row 9 (ACL): ra1: 39.17, ca1: 70.72, sa1: 78.22, ra2: 37.92, ca2: 72.65, sa2: 80.65
# row 10 (TARO): comment: 'Code is not released. The results are copied from the original paper.',
#   ra1: 35.81, ca1: 0, sa1: 78.45
# leaderboard/cifar10-stl10-SLF.js (last changed in 0785484), row 7 (DeACL): ra1: 11.04, ca1: 0, sa1: 38.49
# leaderboard/cifar100-cifar100-AFF.js (last changed in 88ae99e): its first row.
@pytest.mark.parametrize(
    ("file", "row", "finetuning", "method", "values"),
    [
        ("cifar10-cifar10-SLF", 1, "vanilla", "DynACL-AIR++", (46.99, 72.11, 81.80)),
        ("cifar10-cifar10-SLF", 1, "autolora", "DynACL-AIR++", (45.40, 74.55, 83.52)),
        ("cifar10-cifar10-SLF", 9, "vanilla", "ACL", (39.17, 70.72, 78.22)),
        ("cifar10-cifar10-SLF", 10, "vanilla", "TARO", (35.81, 0.0, 78.45)),
        ("cifar10-stl10-SLF", 7, "vanilla", "DeACL", (11.04, 0.0, 38.49)),
    ],
)
def test_reported_numbers_equal_the_source_files(file, row, finetuning, method, values) -> None:
    pre, ds, proto = file.split("-")
    (r,) = _find(pretrain_dataset=pre, dataset=ds, protocol=proto.lower(), row=row, finetuning=finetuning)
    assert r.method == method
    assert (r.values["autoattack"], r.values["corruption"], r.values["clean"]) == values
    assert r.source["repository"] == SITE and r.source["file"] == f"leaderboard/{file}.js"
    commits = {"cifar10-cifar10-SLF": "7a45d66", "cifar10-stl10-SLF": "0785484"}
    assert r.source["commit"].startswith(commits[file])


def test_copied_and_zero_cells_are_flagged_never_measurements() -> None:
    # ACL, TARO and RoCL share 37.92 / 72.65 / 80.65 in the second column group of cifar10-cifar10-SLF
    shared = _find(pretrain_dataset="cifar10", dataset="cifar10", protocol="slf", finetuning="autolora")
    copied = {r.method for r in shared if r.values["autoattack"] == 37.92}
    assert {"ACL", "TARO", "RoCL"} <= copied
    assert all(
        "is also row(s)" in r.copied and r.flags["autoattack"][0].startswith("repeated:")
        for r in shared
        if r.method in copied
    )
    (taro,) = _find(
        pretrain_dataset="cifar10", dataset="cifar10", protocol="slf", method="TARO", finetuning="vanilla"
    )
    assert "copied from the original paper" in taro.copied and taro.value("corruption") is None
    assert taro.flags["corruption"] == ["zero"] and taro.value("autoattack") == 35.81


def test_every_entry_names_its_source_and_protocol() -> None:
    entries = load_reported("robustssl")
    assert len(entries) == 228  # 15 files, two column groups each
    for r in entries:
        assert r.source["repository"] == SITE and re.fullmatch(r"[0-9a-f]{40}", r.source["commit"])
        assert r.protocol in ("slf", "alf", "aff") and r.finetuning in ("vanilla", "autolora")
        assert r.pretrain_dataset in ("cifar10", "cifar100", "stl10") and set(r.values) == {
            "autoattack", "corruption", "clean",
        }  # fmt: skip
    assert {(r.pretrain_dataset, r.dataset) for r in entries} == {
        ("cifar10", "cifar10"), ("cifar100", "cifar100"), ("stl10", "stl10"), ("cifar10", "stl10"),
        ("cifar100", "stl10"),
    }  # fmt: skip


def _cifar_rows(aa: float = 0.4123) -> list[dict]:
    """One user's CIFAR-10 checkpoint evaluated with the benchmark's suite (robust-ssl), SLF."""
    base = json.loads(sorted(ROWS.glob("*.json"))[0].read_text())
    rows = []
    for attack, acc in (("pgd", 0.45), ("autoattack", aa), ("worst_case", aa)):
        r = {
            **base, "checkpoint_id": "my-acl", "checkpoint_sha256": "c" * 64, "encoder": "resnet18_cifar",
            "loss": "my-acl", "control": False, "key_params": "", "pretrain_dataset": "cifar10",
            "dataset": "cifar10", "setting": "in-domain", "attack": attack, "norm": "Linf", "eps": 8 / 255,
            "clean_acc": 0.8012, "robust_acc": acc, "n_examples": 1000, "n_examples_evaluated": 1000,
            "recipe": {"kind": "foreign", "sha256": "c" * 64}, "attack_params": {},
        }  # fmt: skip
        rows.append(stamp_ids(r))
    return rows


def test_leaderboard_reported_adds_the_section_and_changes_nothing_else(tmp_path: Path) -> None:
    rows = _cifar_rows()
    plain = render_leaderboard(rows, tmp_path / "plain")
    marked = render_leaderboard(rows, tmp_path / "marked", reported="robustssl")
    assert set(plain) == set(marked)
    for name in plain:
        if name != "LEADERBOARD.md":  # json, csv, html, figures: byte-identical
            assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "marked" / name).read_bytes(), name
    before = (tmp_path / "plain" / "LEADERBOARD.md").read_text()
    after = (tmp_path / "marked" / "LEADERBOARD.md").read_text()
    assert "reported" not in before.lower() or "Reported by" not in before
    assert after.startswith(before.rstrip("\n"))
    section = after[after.index("## Reported by the RobustSSL benchmark") :]
    assert "### cifar10 → cifar10 · SLF" in section
    assert "| reported | DynACL-AIR++ | NeurIPS 2023 | 46.99 | 81.80 | 72.11 |" in section
    assert "| measured | my-acl | this board | 41.2 | 80.1 |" in section
    between = "rank 9 of 12, between A-InfoNCE (42.72) and ACL (39.17)"
    assert f"- my-acl: AutoAttack 41.2 (1000 test examples), {between}." in section
    assert "| reported | TARO |" in section and "copied from the original paper" in section
    assert "cifar10 → stl10" not in section  # no transfer rows on this board


def test_no_reported_number_enters_compare(tmp_path: Path) -> None:
    for r in _cifar_rows():
        write_row(tmp_path / "rows-dir", ResultRow.from_json(r))
    text = main_compare(tmp_path / "rows-dir", "my-acl", as_json=True)
    assert "DynACL" not in text and "reported" not in text.lower()


def test_cli_leaderboard_reported_and_an_unknown_set(tmp_path: Path, capsys) -> None:
    for r in _cifar_rows():
        write_row(tmp_path / "rows-dir", ResultRow.from_json(r))
    code = main(
        [
            "leaderboard",
            "--rows",
            str(tmp_path / "rows-dir"),
            "--out",
            str(tmp_path / "b"),
            "--reported",
            "robustssl",
        ]
    )
    assert code == 0 and "## Reported by" in (tmp_path / "b" / "LEADERBOARD.md").read_text()
    capsys.readouterr()
    code = main(
        [
            "leaderboard",
            "--rows",
            str(tmp_path / "rows-dir"),
            "--out",
            str(tmp_path / "c"),
            "--reported",
            "robustbench",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "unknown reported set 'robustbench'" in err
    assert not (tmp_path / "c" / "LEADERBOARD.md").exists()


def test_placement_for_a_model_card() -> None:
    lines = placement_for_card(_cifar_rows(aa=0.50))
    top = "above every reported entry (highest: DynACL-AIR++ 46.99)"
    assert lines == [f"cifar10 → cifar10 SLF: AutoAttack 50.0 (1000 test examples), rank 1 of 12, {top}"]
    assert placement(
        10.0, _find(pretrain_dataset="cifar10", dataset="stl10", protocol="slf", finetuning="vanilla")
    ).startswith("rank 8 of 8, below every reported entry")


def test_eval_prints_where_its_autoattack_falls(tmp_path: Path, monkeypatch, capsys) -> None:
    """``eval`` of a CIFAR-10 checkpoint with AutoAttack at 8/255 says where it falls (the
    evaluation itself is replaced by the rows it would return)."""
    import robustbench_nacl.eval.evaluate as evaluate_module

    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **kw: _cifar_rows())
    (tmp_path / "mine.pt").write_bytes(b"unused")
    assert (
        main(["eval", str(tmp_path / "mine.pt"), "--dataset", "cifar10", "--out", str(tmp_path / "o")]) == 0
    )
    out = capsys.readouterr().out
    between = "rank 9 of 12, between A-InfoNCE (42.72) and ACL (39.17)"
    assert "beside the RobustSSL benchmark's reported entries: cifar10 → cifar10 SLF: AutoAttack 41.2" in out
    assert between in out
