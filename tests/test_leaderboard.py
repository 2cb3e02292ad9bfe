"""Leaderboard rendering from the hand-written fixture rows in tests/data/leaderboard/rows/.

The fixture: digits:0-4 encoders (convnet_small), 200 test examples, suite `paper`:
simclr (train seeds 0 and 1), nca G1=g2 with M=2 and M=5 (an M grid), intnacl (its PGD row fails
a sanity check) and a random-init control; in-domain FGSM sweep + PGD + worst case, transfer to
digits:5-9 (FGSM, PGD), shift (grayscale, flip) for simclr, intnacl and the control.

LEADERBOARD.md and results.csv are compared byte for byte with tests/data/leaderboard/golden/.
After an intentional change to the rendering, regenerate them with

    ROBUSTBENCH_NACL_UPDATE_GOLDEN=1 python -m pytest tests/test_leaderboard.py

then read the diff (`git diff tests/data/leaderboard/golden`) before committing it. When the row
format changes, bring the fixture rows up to date first (tests/data/leaderboard/README.md).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from robustbench_nacl.errors import UserError
from robustbench_nacl.report.aggregate import aggregate
from robustbench_nacl.report.leaderboard import build_context, main_leaderboard, render_leaderboard
from robustbench_nacl.report.markdown import render_markdown
from robustbench_nacl.results.rows import LegacyRowError, ResultRow, load_rows, stamp_ids, write_row

DATA = Path(__file__).parent / "data" / "leaderboard"
ROWS = DATA / "rows"
GOLDEN = DATA / "golden"
COMMAND = "robustbench-nacl leaderboard --rows tests/data/leaderboard/rows --out leaderboard"


def update_golden(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether to rewrite the golden files: asked for, and never under CI (where a stray variable
    would make the comparison pass by writing what it compares with). CI sets CI (GitHub, GitLab,
    most others; .ci/run exports it too)."""
    asked = environ.get("ROBUSTBENCH_NACL_UPDATE_GOLDEN") == "1"
    return asked and environ.get("CI", "").strip().lower() in ("", "0", "false", "no")


UPDATE = update_golden(os.environ)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (width, height) in pixels (report.figures sizes x dpi): three tables (in-domain, transfer, shift) in
# three columns of two panels; an in-domain and a transfer table side by side
PNG_SIZES = {
    "standard_vs_robust.png": (1620, 1160),
    "robust_vs_eps.png": (1400, 520),
    "ablation_M.png": (1100, 400),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return main_leaderboard(ROWS, tmp_path_factory.mktemp("leaderboard"), command=COMMAND)


@pytest.fixture(scope="module")
def results(rendered: dict[str, Path]) -> list[dict[str, str]]:
    with open(rendered["results.csv"], newline="") as f:
        return list(csv.DictReader(f))


def _find(results: list[dict[str, str]], setting: str, loss: str, key: str | None = None) -> dict[str, str]:
    (rec,) = [
        r for r in results if (r["setting"], r["loss"]) == (setting, loss) and key in (None, r["key_params"])
    ]
    return rec


def _rows() -> list[ResultRow]:
    return load_rows(ROWS)


def _changed(row: ResultRow, **changes: Any) -> ResultRow:
    """A copy of ``row`` with some fields changed and its ids recomputed (as evaluate would)."""
    return ResultRow.from_json(stamp_ids({**row.to_json(), **changes}))


def _tables(md: str, heading: str) -> list[str]:
    """The Markdown sections whose heading starts with ``heading``."""
    return [s for s in md.split("\n## ") if s.startswith(heading)]


# ============ golden files ============


@pytest.mark.parametrize("name", ["LEADERBOARD.md", "results.csv"])
def test_matches_golden(rendered: dict[str, Path], name: str) -> None:
    got = rendered[name].read_bytes()
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        (GOLDEN / name).write_bytes(got)
    want = (GOLDEN / name).read_bytes()
    assert got == want, f"{name} differs from the golden file; see this module's docstring to regenerate"


def test_the_golden_update_is_not_honoured_under_ci() -> None:
    ask = {"ROBUSTBENCH_NACL_UPDATE_GOLDEN": "1"}
    assert update_golden(ask) and update_golden({**ask, "CI": "false"})
    assert not update_golden({**ask, "CI": "true"}) and not update_golden({**ask, "CI": "1"})
    assert not update_golden({})
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        assert not UPDATE  # this run's own setting


def test_output_does_not_depend_on_row_order(rendered: dict[str, Path], tmp_path: Path) -> None:
    written = render_leaderboard(list(reversed(_rows())), tmp_path, command=COMMAND)
    for name in ("LEADERBOARD.md", "results.csv", "rows.csv", "leaderboard.json", "index.html"):
        assert written[name].read_bytes() == rendered[name].read_bytes(), name


# ============ numbers ============


def test_mean_std_and_intervals_by_hand(results: list[dict[str, str]], rendered: dict[str, Path]) -> None:
    # simclr seeds: clean 0.93 / 0.95, FGSM@0.002 0.41 / 0.45 -> sample std sqrt(2 * 0.01**2 / 1)
    rec = _find(results, "in-domain", "simclr")
    assert rec["n_seeds"] == "2" and rec["clean_n"] == "2"
    assert float(rec["clean_mean"]) == pytest.approx(0.94)
    assert float(rec["clean_std"]) == pytest.approx(math.sqrt(2 * 0.01**2), abs=1e-6)
    assert float(rec["fgsm_Linf_0.002_mean"]) == pytest.approx(0.43)
    assert float(rec["fgsm_Linf_0.002_std"]) == pytest.approx(math.sqrt(2 * 0.02**2), abs=1e-6)
    # two seeds: a t-interval over seeds (scipy's), clipped to [0, 1]
    lo, hi = stats.t.interval(0.95, 1, loc=0.43, scale=stats.sem([0.41, 0.45]))
    assert rec["fgsm_Linf_0.002_interval"] == "t"
    assert (float(rec["fgsm_Linf_0.002_lo"]), float(rec["fgsm_Linf_0.002_hi"])) == pytest.approx(
        (lo, hi), abs=1e-6
    )
    assert float(rec["clean_hi"]) == 1.0  # 0.94 + 12.7 * 0.01 lies above 1
    md = rendered["LEADERBOARD.md"].read_text()
    assert f"43.0 [{100 * lo:.1f}, {100 * hi:.1f}]" in md and "94.0 [81.3, 100.0]" in md
    # one seed: no spread, and a Wilson interval over the 200 test examples (scipy's), labelled as such
    single = _find(results, "in-domain", "random-init")
    assert single["n_seeds"] == "1" and single["clean_std"] == "" and single["clean_interval"] == "wilson"
    ci = stats.binomtest(180, 200).proportion_ci(confidence_level=0.95, method="wilson")
    assert (float(single["clean_lo"]), float(single["clean_hi"])) == pytest.approx(
        (ci.low, ci.high), abs=1e-6
    )
    assert f"90.0 [{100 * ci.low:.1f}, {100 * ci.high:.1f}]" in md
    assert "Wilson over the 200 test examples where n = 1" in md


def _clipped(results: list[dict[str, str]]) -> int:
    """Bounds of t-intervals in results.csv at 0 (1) with the mean above (below): clipped, counted here."""
    n = 0
    for rec in results:
        for key in (
            k.removesuffix("_interval") for k, v in rec.items() if k.endswith("_interval") and v == "t"
        ):
            mean, lo, hi = (float(rec[f"{key}_{x}"]) for x in ("mean", "lo", "hi"))
            n += (lo == 0.0 < mean) + (hi == 1.0 > mean)
    return n


def test_the_legend_says_that_bounds_are_clipped_and_how_many(
    results: list[dict[str, str]], rendered: dict[str, Path]
) -> None:
    legend = rendered["LEADERBOARD.md"].read_text().split("\n## ")[0]
    n = _clipped(results)
    assert n >= 1  # simclr's clean upper bound, 0.94 + 12.7 * 0.01 (above)
    assert "Interval bounds are clipped to [0, 100] in these tables and in results.csv" in legend
    assert f": {n} bound{'s' if n > 1 else ''} of this board {'were' if n > 1 else 'was'} clipped" in legend
    # one seed each: Wilson intervals, which never leave [0, 1], so nothing is clipped
    one = [r for r in _rows() if r.get("train_seed") in (0, None)]
    assert "none of this board's bounds was clipped" in _md(one).split("\n## ")[0]


def test_ranking_by_the_worst_case_at_the_largest_eps_then_clean(results: list[dict[str, str]]) -> None:
    def order(setting: str) -> list[str]:
        recs = sorted((r for r in results if r["setting"] == setting), key=lambda r: int(r["rank"]))
        return [r["loss"] + ("" if "M=" not in r["key_params"] else " M=" + r["key_params"][8]) for r in recs]

    # in-domain: the fixture has worst-case rows at 0.002 only: 58.0, 46.0, 44.0, 39.0, 8.0
    assert order("in-domain") == ["intnacl M=5", "nca M=5", "nca M=2", "simclr", "random-init"]
    assert {r["rank_by"] for r in results if r["setting"] == "in-domain"} == {"worst_case_Linf_0.002"}
    # transfer has no worst-case rows: FGSM at its largest eps; both nca recipes reach 40.00 and the
    # higher clean accuracy (M=5: 91.0 vs 90.5) ranks first
    assert order("transfer") == ["intnacl M=5", "nca M=5", "nca M=2", "simclr", "random-init"]
    assert {r["rank_by"] for r in results if r["setting"] == "transfer"} == {"fgsm_Linf_0.002"}
    assert [int(r["rank"]) for r in results if r["setting"] == "in-domain"] == [1, 2, 3, 4, 5]


def test_control_row_is_ranked_and_marked(rendered: dict[str, Path]) -> None:
    md = rendered["LEADERBOARD.md"].read_text()
    control_lines = [
        line for line in md.splitlines() if "random-init (control)" in line and line.startswith("|")
    ]
    assert len(control_lines) == 3  # in-domain, transfer, shift
    assert control_lines[0].split("|")[1].strip() == "5"


def test_sanity_failure_is_flagged(rendered: dict[str, Path], results: list[dict[str, str]]) -> None:
    md = rendered["LEADERBOARD.md"].read_text()
    in_domain = md.split("## In-domain", 1)[1].split("## Transfer", 1)[0]
    flagged = [ln for ln in in_domain.splitlines() if ln.startswith("|") and "⚠" in ln]
    assert len(flagged) == 1 and "| intnacl " in flagged[0] and flagged[0].rstrip(" |").endswith("⚠ 1")
    assert "- ⚠ 1: intnacl, in-domain digits:0-4: `convnet_small.intnacl_digits-0-4_s0` seed 0, pgd" in md
    rec = _find(results, "in-domain", "intnacl")
    assert rec["sanity_ok"] == "False" and rec["sanity_failed"] == "attack_beats_noise"
    assert _find(results, "transfer", "simclr")["sanity_ok"] == "True"


def test_header_states_provenance(rendered: dict[str, Path]) -> None:
    head = rendered["LEADERBOARD.md"].read_text().split("## ", 1)[0]
    for needle in (
        COMMAND,
        "first 200 test examples",
        "training seeds 0, 1",
        "suite `paper` (sha256 `",
        "robustbench_nacl 0.1.0",
        "0.51/255",
        "[0,1] pixel units",
    ):
        assert needle in head, needle


# ============ flat outputs ============


def test_json_and_raw_rows(rendered: dict[str, Path], results: list[dict[str, str]]) -> None:
    def no_nan(x: str) -> None:
        raise AssertionError(f"non-JSON number {x} in leaderboard.json")

    data = json.loads(rendered["leaderboard.json"].read_text(), parse_constant=no_nan)
    assert len(data["results"]) == len(results)
    assert data["headline_eps"] == 0.002 and data["headline_eps_label"] == "0.51/255"
    assert "ablation_lam.png" in data["skipped"] and "ablation_M.png" in data["figures"]
    with open(rendered["rows.csv"], newline="") as f:
        raw = list(csv.DictReader(f))
    assert len(raw) == len(_rows())
    nca = next(r for r in raw if r["loss"] == "nca")
    assert nca["param_M"] in {"2", "5"} and json.loads(nca["versions"])["robustbench_nacl"] == "0.1.0"
    assert not list(rendered["results.csv"].parent.glob(".*.tmp"))  # atomic writes left nothing behind


# ============ figures ============


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("name", sorted(PNG_SIZES))
def test_figures_are_valid_pngs(rendered: dict[str, Path], name: str) -> None:
    from matplotlib.image import imread

    path = rendered[name]
    assert path.stat().st_size > 1000
    assert _png_size(path) == PNG_SIZES[name]
    assert imread(path).shape[:2] == PNG_SIZES[name][::-1]  # decodes completely


def test_ablation_only_where_a_grid_exists(rendered: dict[str, Path], tmp_path: Path) -> None:
    assert "ablation_M.png" in rendered  # nca M=2 and M=5 differ only in M
    assert (
        "ablation_lam.png" not in rendered
        and not (rendered["results.csv"].parent / "ablation_lam.png").exists()
    )
    rows = [r for r in _rows() if r["key_params"] != "G1=g2 M=2 tau_plus=0.01 beta=1.0"]
    (tmp_path / "ablation_M.png").write_bytes(b"stale")  # from an earlier render with a grid
    written = render_leaderboard(rows, tmp_path)
    assert "ablation_M.png" not in written and not (tmp_path / "ablation_M.png").exists()
    assert "`ablation_M.png` not drawn: no M grid" in written["LEADERBOARD.md"].read_text()


# ============ aggregation details ============


def test_an_exact_duplicate_counts_once_and_the_newest_is_kept() -> None:
    rows = _rows()
    row = next(r for r in rows if r["loss"] == "simclr" and r["attack"] == "fgsm" and r["eps"] == 0.002)
    newer = ResultRow.from_json(
        {**row.to_json(), "robust_acc": 0.0, "created_at": "2027-01-01T00:00:00+00:00"}
    )
    entries, dropped = aggregate([*rows, newer])
    assert dropped == 1
    simclr = next(e for e in entries if e.recipe.loss == "simclr" and e.setting == "in-domain")
    assert simclr.stat("fgsm_Linf_0.002").mean == pytest.approx((0.0 + 0.45) / 2)  # the newer row of seed 0


def _simclr_rows(setting: str = "in-domain") -> list[ResultRow]:
    return [r for r in _rows() if r["loss"] == "simclr" and r["setting"] == setting]


@pytest.mark.parametrize(
    ("changes", "differs"),
    [
        ({"n_examples": 50, "n_examples_evaluated": 50}, "n_examples 50"),
        ({"suite": "quick", "suite_sha256": "ab" * 32}, "suite `quick` (sha256 `abababababab`)"),
    ],
)
def test_rows_of_another_protocol_are_ranked_in_their_own_table(
    changes: dict[str, Any], differs: str, tmp_path: Path
) -> None:
    # one checkpoint evaluated again under another protocol: its rows must neither be averaged with
    # nor silently replace the original ones (the old renderer kept the row with most examples)
    other = [_changed(r, robust_acc=0.0, **changes) for r in _simclr_rows() if r["train_seed"] == 0]
    md = render_leaderboard([*_rows(), *other], tmp_path)["LEADERBOARD.md"].read_text()
    tables = _tables(md, "In-domain: probe on digits:0-4")
    assert len(tables) == 2
    (small,) = [t for t in tables if differs in t.splitlines()[0]]
    (full,) = [t for t in tables if t is not small]
    assert "Not ranked with the other digits:0-4 tables" in small and " — " in full.splitlines()[0]
    body = [ln for ln in small.splitlines() if ln.startswith("|") and "| simclr" in ln]
    cells = [c.strip() for c in body[0].split("|")]
    assert len(body) == 1 and cells[1:3] == ["1", "simclr"] and cells[4] == "1"
    assert cells[5].startswith("93.0 [") and cells[6].startswith("0.0 [")  # clean, worst case: one seed
    assert len([ln for ln in small.splitlines() if ln.startswith("|")]) == 3  # header, rule, simclr alone
    # the original table is untouched: both seeds, FGSM 43.0 over two seeds
    assert "43.0 [17.6, 68.4]" in full
    assert "| intnacl" in full
    assert "- **Protocols**" in md


def test_recipes_that_differ_beyond_key_params_are_separate_lines(tmp_path: Path) -> None:
    # seed 1 of "simclr" turns out to have been trained with another width: two recipes of n = 1
    rows = []
    for r in _rows():
        if r["loss"] == "simclr" and r["train_seed"] == 1:
            recipe = json.loads(json.dumps(r.recipe))
            recipe["config"]["encoder_kwargs"] = {"width": 8}
            r = _changed(r, recipe=recipe)
        rows.append(r)
    written = render_leaderboard(rows, tmp_path)
    md = written["LEADERBOARD.md"].read_text()
    (table,) = _tables(md, "In-domain: probe on digits:0-4")
    lines = [ln for ln in table.splitlines() if "| simclr" in ln]
    assert len(lines) == 2 and "differs" in table.splitlines()[2]
    assert {ln.split("|")[4].strip() for ln in lines} == {"width=8", "width=–"}
    assert all(ln.split("|")[5].strip() == "1" for ln in lines)  # n = 1 each: never averaged
    with open(written["results.csv"], newline="") as f:
        recs = [r for r in csv.DictReader(f) if r["loss"] == "simclr" and r["setting"] == "in-domain"]
    assert (
        len(recs) == 2 and {r["n_seeds"] for r in recs} == {"1"} and len({r["recipe_id"] for r in recs}) == 2
    )
    assert {r["clean_mean"] for r in recs} == {"0.930000", "0.950000"}


def test_rows_reach_the_renderer_typed_and_grouped_by_their_ids() -> None:
    entries, dropped = aggregate(_rows())
    assert dropped == 0 and len(entries) == 16
    simclr = [e for e in entries if e.recipe.loss == "simclr"]
    assert len({e.recipe.recipe_id for e in simclr}) == 1 and {len(e.runs) for e in simclr} == {2}
    assert all(isinstance(r, ResultRow) for e in entries for r in e.rows)


# ============ errors ============


def test_missing_key_is_one_line_user_error(tmp_path: Path) -> None:
    shutil.copytree(ROWS, tmp_path / "rows")
    victim = sorted((tmp_path / "rows").glob("*.json"))[3]
    row = json.loads(victim.read_text())
    del row["clean_acc"]
    victim.write_text(json.dumps(row))
    with pytest.raises(UserError) as err:
        main_leaderboard(tmp_path / "rows", tmp_path / "out")
    msg = str(err.value)
    assert "\n" not in msg and row["row_id"] in msg and "clean_acc" in msg and str(tmp_path / "rows") in msg
    assert not (tmp_path / "out").exists()  # nothing rendered from a broken row set


def test_non_numeric_accuracy_is_user_error() -> None:
    rows = _rows()
    rows[0] = {**rows[0], "robust_acc": "0.41"}
    with pytest.raises(UserError, match=r"robust_acc must be a finite number, got '0\.41'"):
        render_leaderboard(rows, "/nonexistent/never-written")


def test_empty_rows_dir_is_user_error(tmp_path: Path) -> None:
    (tmp_path / "rows").mkdir()
    with pytest.raises(UserError, match=r"no result rows in .*robustbench-nacl eval"):
        main_leaderboard(tmp_path / "rows", tmp_path / "out")
    with pytest.raises(UserError, match=r"no such directory, published set .* or model"):
        main_leaderboard(tmp_path / "missing", tmp_path / "out")


def _legacy(row: ResultRow) -> dict[str, Any]:
    """A row as the previous row format wrote it (no recipe or protocol identity)."""
    drop = {"row_format", "recipe_id", "protocol_id", "recipe", "attack_versions", "n_examples_evaluated"}
    return {k: v for k, v in row.to_json().items() if k not in drop}


def test_legacy_rows_fail_with_one_line_saying_how_to_rerun(tmp_path: Path) -> None:
    shutil.copytree(ROWS, tmp_path / "rows")
    victims = sorted((tmp_path / "rows").glob("*.json"))[:3]
    for v in victims:
        v.write_text(json.dumps(_legacy(ResultRow.from_json(json.loads(v.read_text())))))
    with pytest.raises(LegacyRowError) as err:
        main_leaderboard(tmp_path / "rows", tmp_path / "out")
    msg = str(err.value)
    assert "\n" not in msg and "3 of 62 result rows" in msg and "older robustbench-nacl" in msg
    assert "re-run `robustbench-nacl eval CHECKPOINT --out NEW_DIR`" in msg and "zoo/convnet_small." in msg
    assert not (tmp_path / "out").exists()
    with pytest.raises(LegacyRowError, match=r"re-run `robustbench-nacl eval zoo/convnet_small\."):
        render_leaderboard([_legacy(_rows()[0])], tmp_path / "out")


def test_a_row_whose_identity_was_edited_is_refused() -> None:
    rows = _rows()
    edited = {**rows[0].to_json(), "n_examples": 50}  # protocol field changed, ids not recomputed
    with pytest.raises(UserError, match=r"protocol_id .* does not match its fields"):
        render_leaderboard([edited], "/nonexistent/never-written")
    recipe = json.loads(json.dumps(rows[0].recipe)) | {"kind": "edited"}
    with pytest.raises(UserError, match=r"recipe_id .* does not match its fields"):
        render_leaderboard([{**rows[0].to_json(), "recipe": recipe}], "/nonexistent/never-written")


# ============ ranking by robustness, not clean accuracy (17 lines: data/leaderboard/families.py) ============


def _families() -> list[dict[str, Any]]:
    sys.path.insert(0, str(DATA))
    import families

    return families.make_rows()


def _order_by(rows: list[dict[str, Any]], attack: str, eps: float) -> list[str]:
    """In-domain recipes by mean accuracy on one metric (ties by mean clean), computed from the raw rows."""
    acc: dict[str, list[float]] = {}
    clean: dict[str, list[float]] = {}
    for r in rows:
        if r["setting"] == "in-domain" and r["attack"] == attack and r["eps"] == eps:
            acc.setdefault(r["loss"], []).append(r["robust_acc"])
            clean.setdefault(r["loss"], []).append(r["clean_acc"])
    mean = {k: sum(v) / len(v) for k, v in acc.items()}
    mean_clean = {k: sum(v) / len(v) for k, v in clean.items()}
    return sorted(mean, key=lambda k: (-round(mean[k], 9), -round(mean_clean[k], 9), k))


def _md(rows: list[Any], **kw: Any) -> str:
    """LEADERBOARD.md alone (no figures: the 17-family renders are the slow part)."""
    ctx, dropped = build_context(rows, **kw)
    return render_markdown(ctx, title="t", command=None, dropped=dropped, figures={}, skipped={})


def _in_domain_order(md: str) -> list[str]:
    (table,) = _tables(md, "In-domain: probe on digits:0-4")
    body = [ln for ln in table.splitlines() if ln.startswith("|")][2:]
    return [ln.split("|")[2].strip().replace("random-init (control)", "random-init") for ln in body]


def test_the_default_ranking_is_the_worst_case_at_the_largest_eps(tmp_path: Path) -> None:
    rows = _families()
    md = render_leaderboard(rows, tmp_path)["LEADERBOARD.md"].read_text()
    worst = _order_by(rows, "worst_case", 0.032)
    assert _in_domain_order(md) == worst
    assert worst != _order_by(rows, "fgsm", 0.002)  # the old headline ranking is a different one
    assert worst[-1] == "random-init"  # robust accuracy separates the control; clean accuracy does not
    assert "## In-domain: probe on digits:0-4, ranked by worst case@0.032 (8.16/255)" in md
    header = next(ln for ln in md.splitlines() if ln.startswith("|   rank"))
    assert "worst case@0.032 (8.16/255) ▼" in header and "marked ▼ (here worst case@0.032 (8.16/255);" in md


def test_rank_by_picks_another_column() -> None:
    rows = _families()
    text = _md(rows, rank_by="fgsm@0.002")
    # equal example counts tie (and clean accuracy decides) whatever the float sums' last bits
    assert _in_domain_order(text) == _order_by(rows, "fgsm", 0.002)
    assert "ranked by FGSM@0.002 (0.51/255)" in text and "chosen with `--rank-by fgsm@0.002`" in text
    assert "ranked by FGSM@0.032 (8.16/255)" in _md(rows, rank_by="fgsm@8.16/255")
    clean = _md(rows, rank_by="clean")
    assert "ranked by clean" in clean and _in_domain_order(clean)[0] == "nca"


@pytest.mark.parametrize(
    ("rank_by", "message"),
    [
        ("fgsm@", r"--rank-by 'fgsm@': expected clean or ATTACK@EPS"),
        ("fgsm@big", r"--rank-by 'fgsm@big': ε must be a number, k/255 or max"),
        ("pgd@0.032", r"--rank-by pgd@0.032: no table measured it; measured: clean, fgsm@0.002, .*pgd@0.002"),
    ],
)
def test_a_bad_rank_by_is_one_line_user_error(rank_by: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        render_leaderboard(_rows(), "/nonexistent/never-written", rank_by=rank_by)
    assert "\n" not in str(err.value)


def test_a_rank_by_some_tables_lack_falls_back_and_says_so() -> None:
    md = _md(_rows(), rank_by="worst_case@0.002")
    (transfer,) = _tables(md, "Transfer: probe on digits:5-9")
    assert "ranked by FGSM@0.002 (0.51/255)" in transfer.splitlines()[0]
    assert "`--rank-by worst_case@0.002` was not measured in this table; ranked by FGSM@0.002" in transfer


def test_the_leaderboard_says_what_its_differences_can_and_cannot_show(rendered: dict[str, Path]) -> None:
    md = rendered["LEADERBOARD.md"].read_text()
    item = next(
        ln for ln in md.splitlines() if ln.startswith("- **What the differences can and cannot show**")
    )
    assert "first 200 test examples (one example = 0.50 points)" in item and "cannot show" in item
    assert "not the variation between training runs" in item  # some recipes have a single seed
    assert "What the differences can and cannot show" in rendered["index.html"].read_text()


# ============ your rows beside the reference rows ============


def _write(rows: list[Any], out: Path) -> Path:
    for r in rows:
        write_row(out, ResultRow.from_json(r))
    return out


def test_your_rows_are_ranked_beside_the_reference_only_under_its_protocol(tmp_path: Path) -> None:
    ref_rows = [r for r in _families() if r["setting"] != "shift"]
    ref = _write(ref_rows, tmp_path / "reference")
    # "mine": a 20-epoch simclr under the reference protocol, and the same checkpoint on 50 examples
    mine_rows = []
    for r in ref_rows:
        if r["loss"] == "simclr" and r["train_seed"] == 0 and r["setting"] in ("in-domain", "transfer"):
            recipe = json.loads(json.dumps(r["recipe"]))
            recipe["config"]["epochs"] = 20
            same = stamp_ids({**r, "recipe": recipe, "checkpoint_sha256": "f" * 64, "checkpoint_id": "mine"})
            mine_rows.append(same)
            if r["setting"] == "in-domain":
                mine_rows.append(stamp_ids({**same, "n_examples": 50}))
    mine = _write(mine_rows, tmp_path / "mine")
    said: list[str] = []
    written = main_leaderboard([mine, ref], tmp_path / "board", notify=said.append)
    md = written["LEADERBOARD.md"].read_text()
    (notice,) = said
    assert "\n" not in notice and notice.startswith(
        f"left out 11 of {len(mine_rows)} rows of {mine} (in-domain"
    )
    assert "n_examples 50 vs 180" in notice and f"reference rows of {ref}" in notice
    assert f"- **Left out**: {notice}" in md
    # the matching rows are ranked in the reference's tables; the mismatched ones in none
    assert len(_tables(md, "In-domain: probe on digits:0-4")) == 1
    assert len([ln for ln in _in_domain_order(md) if ln == "simclr"]) == 2  # the reference's and mine
    assert json.loads(written["leaderboard.json"].read_text())["left_out"] == [notice]
    # one directory: nothing is left out, a second protocol gets its own table as before
    alone = main_leaderboard([mine], tmp_path / "alone")["LEADERBOARD.md"].read_text()
    assert len(_tables(alone, "In-domain: probe on digits:0-4")) == 2 and "Left out" not in alone
