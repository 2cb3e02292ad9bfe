"""Claims in three kinds (`compare --claims`): TOST against scipy, each verdict made to happen on
fixture rows with known per-example outcomes, bad claims files as one-line errors, and the reading
in leaderboard/README.md equal to what the generator makes of the committed rows."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from robustbench_nacl.cli import main as cli_main
from robustbench_nacl.errors import UserError
from robustbench_nacl.report.claims import BEGIN, END, load_claims, main_claims, markers, reading, splice
from robustbench_nacl.report.fmt import fmt_diff
from robustbench_nacl.report.stats import holm, tost_paired
from robustbench_nacl.results.bits import decode_bits, encode_bits
from robustbench_nacl.results.rows import ResultRow, write_row

sys.path.insert(0, str(Path(__file__).parent / "data" / "leaderboard"))
import families  # the fixture generator beside the fixture rows

N = families.N
BOARD = Path(__file__).resolve().parents[1] / "leaderboard"
THREE_SEEDS = ("simclr", "nca", "intnacl", "mixnca", "intcl")


# ============ TOST ============


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("margin", [0.01, 0.02, 0.05])
def test_tost_is_two_one_sided_t_tests_as_scipy_computes_them(seed: int, margin: float) -> None:
    rng = np.random.default_rng(seed)
    diffs = rng.normal(rng.uniform(-0.03, 0.03), rng.uniform(0.002, 0.03), size=3 + seed % 3)
    t = tost_paired(diffs, margin)
    lower = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    assert (t.p_lower, t.p_upper) == pytest.approx((lower, upper), rel=1e-10)
    assert t.p == pytest.approx(max(lower, upper), rel=1e-10) and t.n == len(diffs)
    # equivalent at 0.05 exactly when the 90 % t-interval lies inside the margin
    lo, hi = stats.t.interval(0.90, len(diffs) - 1, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert (t.p < 0.05) == (-margin < lo and hi < margin)


def test_tost_edge_cases() -> None:
    assert tost_paired([0.01], 0.02) is None  # one seed pair: no spread to test against
    same = tost_paired([0.01, 0.01, 0.01], 0.02)
    assert (same.p_lower, same.p_upper, same.p) == (0.0, 0.0, 0.0)
    assert tost_paired([0.03, 0.03], 0.02).p == 1.0
    with pytest.raises(ValueError, match="margin"):
        tost_paired([0.0, 0.01], 0.0)


# ============ fixture rows with known outcomes ============


def _runs(rows: list[dict[str, Any]], loss: str, seed: int) -> list[int]:
    return [
        i
        for i, r in enumerate(rows)
        if (r["loss"], r["train_seed"], r["setting"]) == (loss, seed, "in-domain")
    ]


def _bits(row: dict[str, Any], key: str) -> np.ndarray:
    return decode_bits(row[key], N).astype(bool)


def _set_clean(rows: list[dict[str, Any]], loss: str, seed: int, clean: np.ndarray) -> None:
    """Give every in-domain row of one run these clean outcomes (robust sets stay inside them)."""
    for i in _runs(rows, loss, seed):
        robust = _bits(rows[i], "robust_bits") & clean
        rows[i] = {**rows[i], "clean_bits": encode_bits(clean), "clean_acc": float(clean.sum() / N),
                   "n_clean_correct": int(clean.sum()), "n_attacked": int(clean.sum()),
                   "robust_bits": encode_bits(robust), "robust_acc": float(robust.sum() / N),
                   "n_robust": int(robust.sum())}  # fmt: skip


def _set_robust(rows: list[dict[str, Any]], loss: str, seed: int, robust: np.ndarray) -> None:
    (i,) = [
        i for i in _runs(rows, loss, seed) if (rows[i]["attack"], rows[i]["eps"]) == ("worst_case", 0.032)
    ]
    rows[i] = {**rows[i], "robust_bits": encode_bits(robust), "robust_acc": float(robust.sum() / N),
               "n_robust": int(robust.sum())}  # fmt: skip


def _moved(base: np.ndarray, b: int, c: int) -> np.ndarray:
    """``base`` with ``b`` of its right examples made wrong and ``c`` of its wrong ones right."""
    out = base.copy()
    right, wrong = np.flatnonzero(base), np.flatnonzero(~base)
    assert len(right) >= b and len(wrong) >= c
    out[right[:b]] = False
    out[wrong[:c]] = True
    return out


def _base_of(rows: list[dict[str, Any]], seed: int, key: str) -> np.ndarray:
    idx = _runs(rows, "simclr", seed)
    if key == "clean_bits":
        return _bits(rows[idx[0]], key)
    (i,) = [i for i in idx if (rows[i]["attack"], rows[i]["eps"]) == ("worst_case", 0.032)]
    return _bits(rows[i], key)


# (b, c) per seed against simclr: b = simclr right and the candidate wrong, c = the reverse
ROBUST = {"nca": [(2, 14), (1, 13), (2, 15)], "intnacl": [(8, 9), (9, 8), (6, 10)]}
CLEAN = {"mixnca": [(2, 2), (2, 2), (2, 3)], "intcl": [(20, 2), (22, 3), (21, 1)]}  # simclr misses few


@pytest.fixture(scope="module")
def known() -> list[dict[str, Any]]:
    saved = dict(families.FAMILIES)
    try:
        for loss in THREE_SEEDS:
            params, accs, _ = families.FAMILIES[loss]
            families.FAMILIES[loss] = (params, accs, (0, 1, 2))
        rows = families.make_rows()
    finally:
        families.FAMILIES.clear()
        families.FAMILIES.update(saved)
    for seed in range(3):
        for loss, bc in ROBUST.items():
            _set_clean(rows, loss, seed, np.ones(N, bool))
            _set_robust(rows, loss, seed, _moved(_base_of(rows, seed, "robust_bits"), *bc[seed]))
        for loss, bc in CLEAN.items():
            _set_clean(rows, loss, seed, _moved(_base_of(rows, seed, "clean_bits"), *bc[seed]))
    return rows


CLAIMS = """
name = "test"
paper = "a test paper"

[[claim]]
id = "nca-robust"
text = "NCA is more robust than SimCLR"
candidate = "nca"
baseline = "simclr"
kind = "better"
settings = ["in-domain"]
metrics = ["worst_case@0.032"]

[[claim]]
id = "simclr-robust"
text = "SimCLR is more robust than NCA"
candidate = "simclr"
baseline = "nca"
kind = "better"
settings = ["in-domain"]
metrics = ["worst_case@8.16/255"]

[[claim]]
id = "intnacl-robust"
text = "IntNaCl is more robust than SimCLR"
candidate = "intnacl"
baseline = "simclr"
kind = "better"
settings = ["in-domain"]
metrics = ["worst_case@0.032"]

[[claim]]
id = "mixnca-no-cost"
text = "MIXNCA costs nothing"
candidate = "mixnca"
baseline = "simclr"
kind = "no_cost"
settings = ["in-domain"]
metrics = ["clean"]

[[claim]]
id = "intcl-no-cost"
text = "IntCl costs nothing"
candidate = "intcl"
baseline = "simclr"
kind = "no_cost"
settings = ["in-domain"]
metrics = ["clean"]

[[claim]]
id = "one-seed"
text = "Debiased is more accurate than SimCLR"
candidate = "debiased"
baseline = "simclr"
kind = "better"
settings = ["in-domain", "corruption"]
metrics = ["clean"]
source = "nowhere"
"""


@pytest.fixture(scope="module")
def board(known: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("claims")
    for r in known:
        write_row(root / "rows", ResultRow.from_json(r))
    (root / "test.toml").write_text(CLAIMS)
    return root / "rows", root / "test.toml"


def _data(board: tuple[Path, Path], margin: float = 2.0) -> dict[str, Any]:
    return json.loads(main_claims([board[0]], str(board[1]), margin=margin, output="json"))


def _by_id(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in data["claims"]}


# ============ the verdicts ============


def test_each_verdict_happens_where_the_outcomes_put_it(board: tuple[Path, Path]) -> None:
    got = _by_id(_data(board))
    assert list(got) == [
        "nca-robust/in-domain/worst_case@0.032", "simclr-robust/in-domain/worst_case@8.16/255",
        "intnacl-robust/in-domain/worst_case@0.032", "mixnca-no-cost/in-domain/clean",
        "intcl-no-cost/in-domain/clean", "one-seed/in-domain/clean", "one-seed/corruption/clean",
    ]  # fmt: skip
    verdicts = {k.split("/")[0] + "/" + k.split("/")[1]: (v["verdict"], v["reason"]) for k, v in got.items()}
    assert verdicts == {
        "nca-robust/in-domain": ("established", ""),
        "simclr-robust/in-domain": ("contradicted", ""),
        "intnacl-robust/in-domain": ("not established", "Holm p >= 0.05; seed interval spans 0"),
        "mixnca-no-cost/in-domain": ("established", "equivalent within 2 points"),
        "intcl-no-cost/in-domain": ("contradicted", "costs more than 2 points"),
        "one-seed/in-domain": ("not established", "fewer than two seed pairs: no seed interval"),
        "one-seed/corruption": ("not established", "no SLF rows in corruption"),
    }
    nca = got["nca-robust/in-domain/worst_case@0.032"]["comparison"]
    assert (nca["b"], nca["c"], nca["n_pairs"]) == (5, 42, 3)
    assert nca["p"] == pytest.approx(stats.binomtest(42, 47, 0.5).pvalue, rel=1e-12)
    assert nca["diffs"] == pytest.approx([12 / N, 12 / N, 13 / N])


def test_holm_runs_over_the_mcnemar_and_tost_p_values_of_the_claims_file(board: tuple[Path, Path]) -> None:
    data = _data(board)
    rows = data["claims"]
    raw = [r["comparison"]["p"] if r["comparison"] else None for r in rows]
    raw += [r["p_tost"] for r in rows]
    tested = [p for p in raw if p is not None]
    assert data["n_tests"] == len(tested) == 6 + 2  # 6 measured McNemar tests and 2 TOSTs
    adjusted = holm([math.nan if p is None else p for p in raw])
    for i, r in enumerate(rows):
        want = adjusted[i], adjusted[len(rows) + i]
        got = (r["p_holm"], r["p_tost_holm"])
        assert [math.nan if g is None else g for g in got] == pytest.approx(list(want), nan_ok=True)
    mix = _by_id(data)["mixnca-no-cost/in-domain/clean"]
    diffs = np.array([0, 0, 1]) / N
    assert mix["p_tost"] == pytest.approx(
        max(stats.ttest_1samp(diffs, -0.02, alternative="greater").pvalue,
            stats.ttest_1samp(diffs, 0.02, alternative="less").pvalue), rel=1e-10
    )  # fmt: skip


def test_a_claim_on_a_family_without_rows_says_so(board: tuple[Path, Path], tmp_path: Path) -> None:
    claim = CLAIMS.split("[[claim]]")[1].replace("nca", "acl").replace("NCA", "ACL")  # no ACL rows here
    path = tmp_path / "absent.toml"
    path.write_text(CLAIMS.split("[[claim]]")[0] + "[[claim]]" + claim)
    (r,) = json.loads(main_claims([board[0]], str(path), output="json"))["claims"]
    assert r["comparison"] is None and r["reason"] == "no rows of acl here"


def test_the_margin_switches_an_equivalence_off(board: tuple[Path, Path]) -> None:
    mix = _by_id(_data(board, margin=0.5))["mixnca-no-cost/in-domain/clean"]
    assert (mix["verdict"], mix["reason"]) == ("not established", "equivalence within 0.5 points not shown")
    assert _data(board, margin=0.5)["margin_points"] == 0.5


# ============ output ============


def test_reading_is_made_from_the_json_alone(board: tuple[Path, Path]) -> None:
    data = _data(board)
    text = reading(data)
    assert text == main_claims([board[0]], str(board[1]), output="markdown")
    assert max(map(len, text.splitlines())) <= 100  # wrapped like the README around it
    text = " ".join(text.split())  # the sentences as read, without the line breaks
    assert "**Established**" in text and "**Contradicted**" in text and "**Not established**" in text
    nca = _by_id(data)["nca-robust/in-domain/worst_case@0.032"]
    c = nca["comparison"]
    assert f"- NCA is more robust than SimCLR (in-domain, {c['metric_label']}): " in text
    assert f"{fmt_diff(c['diff'], c['lo'], c['hi'])} points over 3 seed pairs" in text
    assert "- Debiased is more accurate than SimCLR (corruption, clean): not measured here" in text
    established = text.split("**Established**")[1].split("**Contradicted**")[0]
    assert "NCA is more robust" in established and "MIXNCA costs nothing" in established
    assert "adjusted over the 8 tests" in text


def test_compare_claims_on_the_command_line(board: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    rows, path = board
    assert cli_main(["compare", "--rows", str(rows), "--claims", str(path), "--json", "--margin", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out) == _data(board, margin=0.5)
    assert cli_main(["compare", "--rows", str(rows), "--claims", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| verdict" in out and "contradicted" in out and "intcl-no-cost/in-domain/clean" in out
    for argv, msg in (
        (["--margin", "2"], "--margin applies to --claims only"),
        (["--markdown"], "--markdown applies to --claims only"),
        (["--claims", "nope"], "neither a file nor a shipped claims file (nacl"),
        (["--claims", str(path), "--margin", "0"], "margin must be between 0 and 100"),
    ):
        assert cli_main(["compare", "--rows", str(rows), *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("edit", "msg"),
    [
        (('kind = "better"', 'kind = "worse"', 1), "kind 'worse' is not one of better, no_cost"),
        (('settings = ["in-domain"]', 'settings = ["indomain"]', 1), "setting 'indomain' is not one of"),
        (('metrics = ["worst_case@0.032"]', 'metrics = ["worst_case"]', 1), "metric 'worst_case' must be"),
        (('metrics = ["worst_case@0.032"]', 'metrics = "clean"', 1), "metrics must be a non-empty list"),
        (('id = "simclr-robust"', 'id = "nca-robust"', 1), "duplicate claim id(s) nca-robust"),
        (('text = "NCA is more robust than SimCLR"\n', "", 1), "claim nca-robust: missing text"),
        (('source = "nowhere"', 'sauce = "nowhere"', 1), "unknown field(s) sauce"),
        (('source = "nowhere"', 'protocol = "ft"', 1), "protocol 'ft' is not one of slf, alf, aff"),
        (('paper = "a test paper"', 'papers = "x"', 1), "unknown top-level key(s) papers"),
        (('name = "test"', 'name = "test', 1), "cannot read"),
    ],
)
def test_bad_claims_files_are_one_line_errors(tmp_path: Path, edit: tuple[str, str, int], msg: str) -> None:
    old, new, count = edit
    assert old in CLAIMS
    path = tmp_path / "bad.toml"
    path.write_text(CLAIMS.replace(old, new, count))
    with pytest.raises(UserError) as err:
        load_claims(str(path))
    assert msg in str(err.value) and "\n" not in str(err.value)


def test_the_shipped_nacl_claims_load() -> None:
    header, claims = load_claims("nacl")
    assert header["name"] == "nacl" and "NaCl" in header["paper"]
    assert {c.kind for c in claims} == {"better", "no_cost"}
    assert all(c.setting in ("in-domain", "transfer") for c in claims)


def test_the_shipped_robust_ssl_claims_load_under_their_protocols() -> None:
    header, claims = load_claims("robust-ssl")
    assert header["name"] == "robust-ssl" and "DynACL" in header["paper"]
    assert {(c.candidate, c.baseline, c.protocol) for c in claims} == {
        ("acl", "simclr", "slf"), ("acl", "simclr", "alf"), ("rocl", "simclr", "slf"),
        ("dynacl", "acl", "slf"), ("dynacl", "acl", "alf"), ("deacl", "acl", "slf"), ("deacl", "acl", "alf"),
        ("acl_air", "acl", "slf"), ("acl_air", "acl", "alf"),
        ("dynacl_air", "dynacl", "slf"), ("dynacl_air", "dynacl", "alf"),
        ("dynacl++", "dynacl", "slf"), ("dynacl++", "dynacl", "alf"),
        ("dynacl_air++", "dynacl_air", "slf"), ("dynacl_air++", "dynacl_air", "alf"),
        ("acl", "simclr", "aff"), ("dynacl", "acl", "aff"), ("dynacl_air", "dynacl", "aff"),
        ("dynacl_air++", "dynacl_air", "aff"),
    }  # fmt: skip
    assert {(c.setting, c.metric, c.kind) for c in claims} == {("in-domain", "autoattack@0.032", "better")}


def test_a_test_under_alf_names_its_protocol_and_the_legend_says_slf_is_the_default(
    board: tuple[Path, Path],
) -> None:
    data = _data(board)
    first = dict(data["claims"][0])
    assert "unless it names" not in reading(data)  # every test under SLF: the legend is what it was
    alf = {**first, "protocol": "alf", "comparison": None, "reason": "no ALF rows in in-domain"}
    text = " ".join(reading({**data, "claims": [*data["claims"], alf]}).split())
    assert "unless it names ALF or AFF" in text
    assert (
        f"({first['setting']}, ALF, {first['metric']}): not measured here (no ALF rows in in-domain)" in text
    )


def test_splice_replaces_only_the_marked_section() -> None:
    text = f"a\n{BEGIN}\nold\n{END}\nb\n"
    assert splice(text, "new\n") == f"a\n{BEGIN}\nnew\n{END}\nb\n"
    with pytest.raises(UserError, match="one <!-- claims:begin -->"):
        splice("no markers", "x")
    begin, end = markers("robust-ssl")
    both = f"{text}{begin}\nold\n{end}\n"
    assert splice(both, "new\n", "robust-ssl") == f"{text}{begin}\nnew\n{end}\n"  # the other file's only
    assert markers("nacl") == (BEGIN, END)


# ============ the reference leaderboard's reading ============


def test_the_readme_reading_is_what_compare_claims_makes_of_the_committed_rows() -> None:
    data = json.loads(
        main_claims([BOARD], "nacl", output="json")
    )  # what `compare --claims nacl --json` prints
    readme = (BOARD / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1
    assert readme.split(BEGIN)[1].split(END)[0] == "\n" + reading(data)


def test_claims_run_where_torch_cannot_be_imported() -> None:
    blocker = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'torchvision', 'timm', 'safetensors'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from robustbench_nacl.cli import main\n"
        "sys.exit(main(['compare', '--rows', sys.argv[1], '--claims', '--json']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker, str(BOARD)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "nacl"
