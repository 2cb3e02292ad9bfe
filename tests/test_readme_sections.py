"""The reference README's generated sections (report/readme.py): ``beside`` picks the families with
the highest and lowest difference to SimCLR per main table from ``compare --json`` alone, ``cost``
adds up the recorded timings, and ``regenerate`` rewrites every marked section and nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from robustbench_nacl.errors import UserError
from robustbench_nacl.report import claims, headroom, readme
from robustbench_nacl.report.aggregate import CONTROL_LABEL
from robustbench_nacl.report.compare import main_compare
from robustbench_nacl.results.rows import load_rows

ROWS = Path(__file__).parent / "data" / "leaderboard" / "rows"


def _c(candidate: str, diff: float, *, pid: str = "p-slf", metric: str = "clean", n: int = 3, **kw) -> dict:
    lo, hi = kw.pop("lo", diff - 0.02), kw.pop("hi", diff + 0.02)
    return {
        "setting": kw.pop("setting", "in-domain"), "protocol_id": pid, "metric": metric,
        "metric_label": metric, "candidate": candidate, "diff": diff, "lo": lo, "hi": hi,
        "n_pairs": n, "interval": "t over seeds" if n > 1 else "wald over examples",
        "p_holm": kw.pop("p", 0.0004),
    }  # fmt: skip


def test_beside_takes_the_extremes_of_each_table_and_applies_the_boards_rule() -> None:
    data: dict[str, Any] = {
        "baseline": "simclr",
        "n_tests": 1234,
        "protocols": {"p-slf": "slf", "p-alf": "alf", "p-aff": "aff"},
        "comparisons": [
            _c("acl", -0.10),
            _c("supervised", 0.08),
            _c(CONTROL_LABEL, -0.40),  # the control is not a family: never an extreme
            _c("nca", 0.01, lo=-0.01, hi=0.03),
            _c("acl", 0.20, pid="p-alf", metric="worst_case_Linf_0.032", p=0.2),
            _c("dynacl", 0.05, pid="p-alf", metric="worst_case_Linf_0.032", lo=-0.01, hi=0.11),
            _c("acl", 0.30, pid="p-aff", n=1),
            _c("rocl", 0.10, pid="p-aff", n=1),
        ],
    }
    text = readme.beside(data)
    lines = text.splitlines()
    assert lines[2] == (
        "| in-domain | SLF | clean | supervised +8.0 [+6.0, +10.0] (Holm p < 0.001; established) "
        "| acl -10.0 [-12.0, -8.0] (Holm p < 0.001; established) |"
    )
    assert lines[3] == (
        "| in-domain | ALF | worst_case_Linf_0.032 | acl +20.0 [+18.0, +22.0] (Holm p = 0.2; not established)"
        " | dynacl +5.0 [-1.0, +11.0] (Holm p < 0.001; not established) |"
    )
    assert (
        lines[4].startswith("| in-domain | AFF | clean | acl +30.0")
        and "one seed: no seed interval" in lines[4]
    )
    assert lines[0] == "| setting | protocol | metric | highest Δ vs simclr | lowest Δ vs simclr |"
    assert lines[5] == "" and "all 1,234 tests" in " ".join(lines[6:])  # no transfer rows: no transfer line
    assert max(map(len, lines[5:])) <= 100  # the legend wrapped like the README around it
    with pytest.raises(UserError, match="not simclr"):
        readme.beside({**data, "baseline": "nca"})


def test_beside_on_real_rows_reads_compare_json() -> None:
    data = json.loads(main_compare([ROWS], "simclr", as_json=True))
    assert set(data["protocols"].values()) == {"slf"}
    text = readme.beside(data)
    clean = [c for c in data["comparisons"] if c["setting"] == "in-domain" and c["metric"] == "clean"]
    best = max((c for c in clean if c["candidate"] != CONTROL_LABEL), key=lambda c: c["diff"])
    assert f"| in-domain | SLF | clean | {best['candidate']} " in text


def _manifests(folder: Path) -> Path:
    """One checkpoint manifest per trained checkpoint of the fixture rows (kNN before and after)."""
    for r in load_rows(ROWS):
        if r["control"]:
            continue
        d = folder / r["checkpoint_id"]
        d.mkdir(parents=True, exist_ok=True)
        manifest = {"loss": r["loss"], "dataset": r["pretrain_dataset"], "seed": r["train_seed"],
                    "weights_sha256": r["checkpoint_sha256"], "knn_acc_init": 0.6,
                    "knn_acc": 0.75, "wall_s": 10.0}  # fmt: skip
        (d / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_regenerate_rewrites_every_marked_section_and_leaves_the_prose(tmp_path: Path) -> None:
    board = tmp_path / "board"
    shutil.copytree(ROWS, board / "rows")
    marks = list(readme.sections())
    prose = [f"hand-written paragraph {i}\n" for i in range(len(marks) + 1)]
    text = prose[0] + "".join(f"{b}\nstale\n{e}\n{p}" for (b, e), p in zip(marks, prose[1:], strict=True))
    (board / "README.md").write_text(text)
    manifests = _manifests(tmp_path / "models")
    assert readme.main([str(board), str(manifests)]) == 0
    out = (board / "README.md").read_text()
    assert "stale" not in out and all(p in out for p in prose)
    nacl = claims.reading(json.loads(claims.main_claims([board], "nacl", output="json")))
    assert f"{claims.BEGIN}\n{nacl}{claims.END}" in out
    robust = claims.reading(json.loads(claims.main_claims([board], "robust-ssl", output="json")))
    begin, end = claims.markers("robust-ssl")
    assert f"{begin}\n{robust}{end}" in out
    h = headroom.headroom_markdown(headroom.headroom(headroom.read_manifests(manifests), load_rows(board)))
    assert f"{headroom.BEGIN}\n{h}{headroom.END}" in out and "(+15.0)" in h  # 0.60 -> 0.75 kNN
    assert readme.regenerate(board, manifests) == out  # made again: the same text
    # a README without one of the sections is a one-line error, and nothing is written
    (board / "README.md").write_text(text.replace(readme.BESIDE[0], ""))
    assert readme.main([str(board), str(manifests)]) == 2
    assert (board / "README.md").read_text() == text.replace(readme.BESIDE[0], "")
    assert readme.main([str(board)]) == 2


def test_cost_counts_each_setting_once_and_the_worst_case_rows_not_at_all() -> None:
    def row(
        sha: str, dataset: str, attack: str, wall: float, fit: float, protocol: str | None = None
    ) -> dict:
        ft = {"finetune": {"protocol": protocol}} if protocol else {}
        return {"checkpoint_sha256": sha, "dataset": dataset, "attack": attack, "wall_s": wall,
                "probe_wall_s": fit, **ft}  # fmt: skip

    rows = [
        row("a", "in", "fgsm", 1.0, 7.0),
        row("a", "in", "autoattack", 100.0, 7.0),
        row("a", "in", "worst_case", 101.0, 7.0),  # the sum of the two above: not counted again
        row("a", "tr", "fgsm", 2.0, 5.0),
        row("b", "in", "fgsm", 3.0, 9.0),
        row("a", "in", "fgsm", 4.0, 170.0, "alf"),
    ]
    text = readme.cost([{"wall_s": 80.0}, {"wall_s": 100.0}], rows)
    lines = text.splitlines()
    assert lines[2] == "| training | 2 | – | 180 s (0.1 h) | – | 90 s |"
    # SLF: a = 1 + 100 + 2 + 7 + 5 = 115, b = 3 + 9 = 12; AutoAttack 100
    assert lines[3] == "| SLF evaluation | 2 | 3 | 127 s (0.0 h) | 100 s (0.0 h) | 64 s |"
    assert lines[4] == "| ALF evaluation | 1 | 1 | 174 s (0.0 h) | 0 s (0.0 h) | 174 s |"
    assert lines[5] == "| all | | | 481 s (0.1 h) | | |"
    assert "about 0.1 hours" in text
    # a ++ entry's manifest: its wall_s is the post-processing, a stage of its own
    lines = readme.cost(
        [{"wall_s": 80.0}, {"wall_s": 100.0}, {"wall_s": 40.0, "post": {"recipe": "x"}}], rows
    )
    assert lines.splitlines()[3] == "| ++ post-processing | 1 | – | 40 s (0.0 h) | – | 40 s |"
    assert "| all | | | 521 s (0.1 h) | | |" in lines


def test_cost_counts_a_record_with_two_torch_threads_as_two_cores() -> None:
    two = "cpu (x86_64, AVX512, 2 torch threads)"
    assert readme.cores({"device": two}) == 2
    assert readme.cores({"device": "cpu (x86_64, AVX512, 1 torch thread)"}) == 1
    assert readme.cores({"device": "NVIDIA H100 80GB HBM3"}) == readme.cores({}) == 1
    rows = [
        {"checkpoint_sha256": "a", "dataset": "in", "attack": "fgsm", "wall_s": 3.0, "probe_wall_s": 7.0,
         "device": two},
        {"checkpoint_sha256": "b", "dataset": "in", "attack": "fgsm", "wall_s": 3.0, "probe_wall_s": 7.0},
    ]  # fmt: skip
    lines = readme.cost([{"wall_s": 80.0, "device": two}, {"wall_s": 100.0}], rows).splitlines()
    assert lines[2] == "| training | 2 | – | 260 s (0.1 h) | – | 130 s |"
    assert lines[3] == "| SLF evaluation | 2 | 2 | 30 s (0.0 h) | 0 s (0.0 h) | 15 s |"
    comp = {"attack": "autoattack", "wall_s": 50.0, "aa_components": "apgd-ce", "n_clean_correct": 4,
            "aa_n_robust_after_apgd_ce": 1, "aa_wall_s_apgd_ce": 40.0,
            "aa_forward_examples_apgd_ce": 9}  # fmt: skip
    line = readme.aa_split([{**comp, "device": two}]).splitlines()[-1]
    assert line == "| SLF | 1 | 0 s | 3 decided; 80 s, 9 forwarded | 20 s |"


def test_family_parameters_are_what_every_recipe_of_a_family_shares_beyond_the_nacl_ones(
    tmp_path: Path,
) -> None:
    from robustbench_nacl.report.aggregate import family_parameters

    recipes = [
        ("acl", "views=acl acl_mode=ds attack_eps=0.03 attack_steps=5"),
        ("acl", "views=acl acl_mode=a2a attack_eps=0.03 attack_steps=5"),
        ("mixnca", "G1=g2 M=3 lam=0.5"),  # NaCl parameters only: shown in every cell, as before
        ("plug", "scale=2.0"),
    ]
    assert family_parameters(recipes) == {"acl": "attack_eps=0.03 attack_steps=5", "plug": "scale=2.0"}
    # on a board: the cell keeps the NaCl parameters, the legend lists the family's shared ones once
    from robustbench_nacl.packaged import published_dir
    from robustbench_nacl.report.aggregate import aggregate
    from robustbench_nacl.report.leaderboard import render_leaderboard

    rows = [r.to_json() for r in load_rows(published_dir() / "demo") if r["loss"] == "simclr"]
    rows = [{**r, "loss": "acl", "key_params": "views=acl attack_steps=5"} for r in rows]
    entries, _ = aggregate(rows)
    assert {e.recipe.key_params for e in entries if not e.recipe.control} == {"views=acl"}
    page = render_leaderboard(rows, tmp_path)["LEADERBOARD.md"].read_text()
    assert "- **family parameters**: " in page and "acl: `attack_steps=5`" in page
    assert "| acl           | views=acl " in page


def test_the_cost_table_splits_autoattack_by_component_and_keeps_old_rows_apart() -> None:
    comp = {"aa_components": "apgd-ce,square", "n_clean_correct": 10, "aa_n_robust_after_apgd_ce": 4,
            "aa_n_robust_after_square": 3}  # fmt: skip
    split = {"aa_wall_s_apgd_ce": 30.0, "aa_wall_s_square": 60.0,
             "aa_forward_examples_apgd_ce": 4000, "aa_forward_examples_square": 250000}  # fmt: skip
    rows = [
        {"attack": "autoattack", "wall_s": 100.0, **comp, **split},
        {"attack": "autoattack", "wall_s": 50.0, **comp},  # written before issue 35
        {"attack": "fgsm", "wall_s": 7.0},
    ]
    lines = readme.aa_split(rows).splitlines()
    assert lines[3].split(" | ")[3:] == ["apgd-ce", "square", "rest (checks, clean and deciding forwards) |"]
    want = (
        "| SLF | 2 | 50 s | 12 decided; 30 s, 4,000 forwarded | 2 decided; 60 s, 250,000 forwarded | 10 s |"
    )
    assert lines[5] == want
    assert readme.aa_split([rows[1]]).splitlines()[-1] == "| SLF | 1 | 50 s | 6 decided | 1 decided | – |"
    assert readme.aa_split(rows[2:]) == ""
