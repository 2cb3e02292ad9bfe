"""Paired comparisons with a baseline (`robustbench-nacl compare` and the leaderboard's Δ column), on
fixture rows with known per-example outcomes (tests/data/leaderboard/families.py), checked against
scipy's computations of the same quantities and against exact sums.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from robustbench_nacl.errors import UserError
from robustbench_nacl.report.compare import Comparison, compare, compare_json, format_compare, main_compare
from robustbench_nacl.report.leaderboard import build_context, render_leaderboard
from robustbench_nacl.report.markdown import render_markdown
from robustbench_nacl.results.bits import encode_bits
from robustbench_nacl.results.rows import ResultRow, stamp_ids, write_row

sys.path.insert(0, str(Path(__file__).parent / "data" / "leaderboard"))
import families  # the fixture generator beside the fixture rows

N = families.N
METRIC = ("worst_case", 0.032)
# (b, c) per training seed: b = simclr right and nca wrong, c = the reverse
KNOWN = {0: (3, 11), 1: (5, 9)}


def _pair(b: int, c: int, both: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Baseline and candidate outcomes with exactly b, c discordant and ``both`` concordant-right examples."""
    base, cand = np.zeros(N, bool), np.zeros(N, bool)
    base[:b] = True
    cand[b : b + c] = True
    base[b + c : b + c + both] = cand[b + c : b + c + both] = True
    perm = np.random.default_rng(seed).permutation(N)
    return base[perm], cand[perm]


def _set(rows: list[dict[str, Any]], loss: str, seed: int, outcome: np.ndarray, metric=METRIC) -> None:
    """Give the in-domain row of one recipe, training seed and metric these per-example outcomes."""
    (i,) = [
        i
        for i, r in enumerate(rows)
        if (r["loss"], r["train_seed"], r["setting"], r["attack"], r["eps"])
        == (loss, seed, "in-domain", *metric)
    ]
    rows[i] = {**rows[i], "robust_bits": encode_bits(outcome), "robust_acc": float(outcome.sum() / N)}


@pytest.fixture(scope="module")
def known() -> list[dict[str, Any]]:
    rows = families.make_rows()
    for seed, (b, c) in KNOWN.items():
        base, cand = _pair(b, c, 140, seed)
        _set(rows, "simclr", seed, base)
        _set(rows, "nca", seed, cand)
    return rows


def _one(
    comps: list[Comparison], loss: str, setting: str = "in-domain", metric: str = "worst_case_Linf_0.032"
):
    (c,) = [
        c for c in comps if c.candidate.split()[0] == loss and c.setting == setting and c.metric == metric
    ]
    return c


def _exact_two_sided(b: int, c: int) -> float:
    """The textbook exact McNemar p-value, from binomial coefficients (no scipy)."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n) if n else 1.0


def _holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment written out (the reference for the library's)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


# ============ the numbers ============


def test_mcnemar_over_seeds_and_difference_interval_match_scipy(known: list[dict[str, Any]]) -> None:
    result = compare(known, "simclr")
    c = _one(result.comparisons, "nca")
    assert (c.b, c.c, c.n_pairs, c.pairing) == (8, 20, 2, "by seed")  # pooled over the two seed pairs
    assert c.p == pytest.approx(stats.binomtest(20, 28, 0.5).pvalue, rel=1e-12)
    assert c.p == pytest.approx(_exact_two_sided(8, 20), rel=1e-12)
    diffs = [(11 - 3) / N, (9 - 5) / N]
    lo, hi = stats.t.interval(0.95, 1, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert c.interval == "t over seeds" and c.diff == pytest.approx(np.mean(diffs))
    assert (c.lo, c.hi) == pytest.approx((lo, hi))
    # Holm over every comparison of the call
    tested = [x for x in result.comparisons if x.p is not None]
    assert [x.p_holm for x in tested] == pytest.approx(_holm([x.p for x in tested]))
    assert all(x.p_holm >= x.p for x in tested)


def test_one_seed_pair_gets_a_wald_interval_over_examples(known: list[dict[str, Any]]) -> None:
    rows = [r for r in known if not (r["loss"] == "nca" and r["train_seed"] == 1)]
    c = _one(compare(rows, "simclr").comparisons, "nca")
    b, cc = KNOWN[0]
    assert (c.b, c.c, c.n_pairs) == (b, cc, 1) and c.pairing == "by seed; unpaired seeds: baseline 1"
    half = stats.norm.ppf(0.975) * math.sqrt(b + cc - (cc - b) ** 2 / N) / N
    assert c.interval == "wald over examples"
    assert (c.diff, c.lo, c.hi) == pytest.approx(((cc - b) / N, (cc - b) / N - half, (cc - b) / N + half))
    assert c.p == pytest.approx(stats.binomtest(cc, b + cc, 0.5).pvalue)


def test_the_leaderboard_column_tests_the_ranking_metric_holm_over_its_table(
    known: list[dict[str, Any]], tmp_path: Path
) -> None:
    written = render_leaderboard(known, tmp_path)
    recs = [
        r
        for r in json.loads(written["leaderboard.json"].read_text())["results"]
        if r["setting"] == "in-domain"
    ]
    nca = next(r for r in recs if r["loss"] == "nca")
    assert nca["rank_by"] == "worst_case_Linf_0.032" and nca["baseline"] == "simclr"
    assert (nca["vs_baseline_b"], nca["vs_baseline_c"]) == (8, 20)
    assert nca["vs_baseline_p"] == pytest.approx(stats.binomtest(20, 28, 0.5).pvalue, rel=1e-5)
    tested = [r for r in recs if r["vs_baseline_p"] is not None]
    assert len(tested) == 16 and next(r for r in recs if r["loss"] == "simclr")["is_baseline"]
    holm = _holm([r["vs_baseline_p"] for r in tested])
    assert [r["vs_baseline_p_holm"] for r in tested] == pytest.approx(holm, rel=1e-5)
    md = written["LEADERBOARD.md"].read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("|") and "| nca " in ln)
    p = f"p={nca['vs_baseline_p_holm']:.2g}" if nca["vs_baseline_p_holm"] >= 0.001 else "p<0.001"
    assert f"+{100 * nca['vs_baseline_diff']:.1f} ({p})" in line


# ============ pairing, older rows, baselines ============


def test_runs_are_paired_in_sorted_seed_order_when_the_seeds_differ(known: list[dict[str, Any]]) -> None:
    rows = [stamp_ids({**r, "train_seed": r["train_seed"] + 7}) if r["loss"] == "nca" else r for r in known]
    result = compare(rows, "simclr")
    c = _one(result.comparisons, "nca")
    assert (c.b, c.c) == (8, 20)  # seed 7 with seed 0, seed 8 with seed 1
    assert c.pairing == "by sorted seed order (seeds differ: baseline 0, 1; candidate 7, 8)"
    assert any("paired by sorted seed order" in note for note in result.notes)


def test_rows_without_outcomes_get_intervals_but_no_p(known: list[dict[str, Any]], tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k not in ("robust_bits", "clean_bits")} for r in known]
    result = compare(rows, "simclr")
    c = _one(result.comparisons, "nca")
    assert c.p is None and c.b is None and c.p_holm is None and "no per-example outcomes" in c.note
    assert c.diff is not None and c.lo is not None  # two seed pairs: a t-interval from the accuracies
    text = format_compare(result)
    line = next(ln for ln in text.splitlines() if "| nca" in ln and "worst case@0.032" in ln)
    assert line.rstrip(" |").endswith("–") and "–: no per-example outcomes" in text
    md = render_leaderboard(rows, tmp_path)["LEADERBOARD.md"].read_text()
    assert "(p –)" in md and "- p –: no per-example outcomes in these rows" in md


def test_a_baseline_family_with_several_recipes_needs_a_choice(known: list[dict[str, Any]]) -> None:
    # a second simclr recipe (20 epochs) with the same (default) key parameters: no way to choose
    other = []
    for r in known:
        if r["loss"] == "simclr" and r["train_seed"] == 0:
            recipe = json.loads(json.dumps(r["recipe"]))
            recipe["config"]["epochs"] = 20
            other.append(stamp_ids({**r, "recipe": recipe}))
    with pytest.raises(UserError) as err:
        compare([*known, *other], "simclr")
    assert (
        "\n" not in str(err.value) and "--baseline-recipe" in str(err.value) and "epochs=20" in str(err.value)
    )
    rid = next(ResultRow.from_json(r).recipe_id for r in other)
    result = compare([*known, *other], "simclr", baseline_recipe=rid[:6])
    assert {c.baseline_recipe_id for c in result.comparisons} == {rid}
    # one of them with key parameters of its own: the family's default recipe is picked, and said so
    tuned = [stamp_ids({**r, "key_params": "t=0.2"}) for r in other]
    picked = compare([*known, *tuned], "simclr")
    assert {c.baseline_recipe_id for c in picked.comparisons}.isdisjoint({rid})
    assert any("default key parameters" in n for n in picked.notes)


def test_unknown_baseline_and_corrupt_outcomes_are_one_line_errors(known: list[dict[str, Any]]) -> None:
    with pytest.raises(
        UserError, match=r"--baseline simclrr: no rows of that loss family; families here: adv"
    ):
        compare(known, "simclrr")
    bad = list(known)
    _set(bad, "nca", 0, _pair(3, 11, 140, 0)[1])
    i = next(
        i
        for i, r in enumerate(bad)
        if r["loss"] == "nca" and r["attack"] == "worst_case" and r["eps"] == 0.032
    )
    bad[i] = {**bad[i], "robust_acc": 0.5}  # the outcomes no longer count to the accuracy
    with pytest.raises(UserError, match=r"per-example outcomes count \d+ of 180 but its accuracy is 0.5"):
        compare(bad, "simclr")


# ============ output ============


def test_main_compare_json_and_text(known: list[dict[str, Any]], tmp_path: Path) -> None:
    for r in known:
        write_row(tmp_path / "a", ResultRow.from_json(r))
    data = json.loads(main_compare([tmp_path / "a"], "simclr", as_json=True))
    assert data["baseline"] == "simclr" and data["n_tests"] == len(data["comparisons"])
    first = data["comparisons"][0]
    assert {"b", "c", "p", "p_holm", "diff", "lo", "hi", "metric", "setting", "dataset", "pairing"} <= set(
        first
    )
    # every setting, attack and eps, clean accuracy included, for each of the 16 other recipes
    metrics = {(c["setting"], c["metric"]) for c in data["comparisons"]}
    assert ("in-domain", "clean") in metrics and ("shift", "fgsm_Linf_0.008") in metrics
    assert len(data["comparisons"]) == 16 * 4 * 12
    text = main_compare([tmp_path / "a"], "simclr")
    assert text.startswith("Each recipe against simclr on the same test examples")
    assert f"adjusted over the {data['n_tests']} tests below" in text
    assert compare_json(compare(known, "simclr"))["comparisons"][0] == first


def test_a_baseline_recipe_that_matches_nothing_is_one_line_error(known: list[dict[str, Any]]) -> None:
    with pytest.raises(UserError, match=r"--baseline-recipe ffff: no recipe of simclr matches it"):
        compare(known, "simclr", baseline_recipe="ffff")
    with pytest.raises(
        UserError, match=r"--baseline-recipe ffff: no recipe of simclr in any table matches it"
    ):
        render_leaderboard(known, "/nonexistent/never-written", baseline_recipe="ffff")


def test_the_leaderboard_baseline_can_be_named_or_switched_off(known: list[dict[str, Any]]) -> None:
    ctx, _ = build_context(known, baseline="nca")
    assert ctx.baseline_family == "nca" and len(ctx.baselines) == 2  # in-domain and transfer tables
    assert all(c.baseline.startswith("nca") for c in ctx.comparisons.values())
    off, _ = build_context(known, baseline="none")
    assert off.baseline_family is None and not off.comparisons
    md = render_markdown(off, title="t", command=None, dropped=0, figures={}, skipped={})
    assert "Δ vs" not in md
    with pytest.raises(UserError, match=r"--baseline nope: no rows of that loss family; families here: adv"):
        build_context(known, baseline="nope")
    # no simclr rows at all: the default baseline is simply absent, no error
    quiet, _ = build_context([r for r in known if r["loss"] != "simclr"])
    assert quiet.baseline_family is None


def test_dual_bn_trades_rows_rank_and_compare_with_the_other_aff_rows(known: list[dict[str, Any]]) -> None:
    # AFF resolves dual_bn against the encoder: dual-BN TRADES on a dual-BN encoder (rows carry
    # dual_bn "on", another identity), TRADES otherwise. One protocol, as the RobustSSL benchmark's
    # AFF tables rank them: nca (dual-BN here) is ranked and compared with simclr (single-BN)
    from robustbench_nacl.results.finetune import AffConfig

    aff = AffConfig(max_train=64).identity()
    domain = [r for r in known if r["setting"] == "in-domain"]

    def as_aff(r: dict[str, Any], dual: bool) -> dict[str, Any]:
        return stamp_ids({**r, "finetune": {**aff, "dual_bn": "on"} if dual else dict(aff)})

    rows = [as_aff(r, r["loss"] == "nca") for r in domain]
    assert len({r["protocol_id"] for r in rows}) == 2  # the rows keep what they computed
    ctx, _ = build_context(rows)
    (table,) = ctx.tables
    assert {"nca", "simclr"} <= {e.recipe.loss for e in table.entries}
    assert sorted(e.rank for e in table.entries) == list(range(1, len(table.entries) + 1))
    # compared as if every row were single-BN: the same differences and tests
    merged = compare(rows, "simclr").comparisons
    plain = compare([as_aff(r, False) for r in domain], "simclr").comparisons
    for metric in ("clean", "worst_case_Linf_0.032"):
        a, b = _one(merged, "nca", metric=metric), _one(plain, "nca", metric=metric)
        assert (a.diff, a.p, a.p_holm) == (b.diff, b.p, b.p_holm) and a.p is not None
    # the same recipe under both readings (--aff-dual-bn off beside auto): two tables, as before
    both = rows + [as_aff(r, False) for r in domain if r["loss"] == "nca"]
    ctx, _ = build_context(both)
    assert len(ctx.tables) == 2 and all(
        sum(e.recipe.loss == "nca" for e in t.entries) == 1 for t in ctx.tables
    )


def test_a_recipe_under_both_aff_readings_gets_two_side_by_side_columns(known: list[dict[str, Any]]) -> None:
    # the side-by-side table names no dual_bn in its columns; one recipe measured under both readings
    # would put two entries in one cell, and one of them would vanish from the table
    from robustbench_nacl.report import protocols
    from robustbench_nacl.results.finetune import AffConfig

    aff = AffConfig(max_train=64).identity()
    domain = [r for r in known if r["setting"] == "in-domain"]
    dual = [stamp_ids({**r, "finetune": {**aff, "dual_bn": "on"}}) for r in domain if r["loss"] == "nca"]
    single = [stamp_ids({**r, "finetune": dict(aff)}) for r in domain]
    ctx, _ = build_context(domain + dual + single)
    (by,) = protocols.groups(ctx).values()
    columns = {rid: sorted(cols) for rid, cols in by.items()}
    nca = next(e.recipe.recipe_id for e in ctx.entries if e.recipe.loss == "nca")
    dual_col, single_col = "AFF (max_train 64, dual-BN)", "AFF (max_train 64, single-BN)"
    assert columns[nca] == [dual_col, single_col, "SLF"]
    assert all(cols == ["AFF (max_train 64)", "SLF"] for rid, cols in columns.items() if rid != nca)
    assert {by[nca][dual_col].protocol_id, by[nca][single_col].protocol_id} == {
        r["protocol_id"] for r in dual + single if r["loss"] == "nca"
    }
    md = "\n".join(protocols.markdown_section(ctx))
    assert f"{dual_col} clean" in md and f"{single_col} clean" in md
