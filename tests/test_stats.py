"""Intervals and paired tests against independent computations (scipy's own routines, exact sums)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from robustbench_nacl.report.stats import (
    Stat,
    discordant,
    holm,
    mcnemar,
    mcnemar_combined,
    paired_difference,
    t_interval,
    wilson_interval,
)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (170, 180), (512, 1000)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)


def test_t_interval_matches_scipy() -> None:
    x = [0.71, 0.74, 0.69, 0.73, 0.70]
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert t_interval(x) == pytest.approx(ref, abs=1e-12)
    assert all(math.isnan(v) for v in t_interval([0.5]))


def _exact_two_sided(b: int, c: int) -> float:
    """The textbook exact McNemar p-value, from binomial coefficients (no scipy)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _outcomes(n: int, b: int, c: int, both: int) -> tuple[np.ndarray, np.ndarray]:
    """Outcome vectors with exactly b (base right, cand wrong), c (reverse), `both` right in both."""
    base = np.zeros(n, bool)
    cand = np.zeros(n, bool)
    base[:b] = True
    cand[b : b + c] = True
    base[b + c : b + c + both] = cand[b + c : b + c + both] = True
    perm = np.random.default_rng(n + b + c).permutation(n)
    return base[perm], cand[perm]


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 5), (7, 2), (30, 45), (12, 12)])
def test_mcnemar_exact_p(b: int, c: int) -> None:
    base, cand = _outcomes(200, b, c, 100)
    r = mcnemar(base, cand)
    assert (r.b, r.c) == (b, c)
    assert r.p == pytest.approx(_exact_two_sided(b, c), rel=1e-12)


def test_mcnemar_combined_pools_discordant_pairs() -> None:
    pairs = [_outcomes(100, 3, 9, 50), _outcomes(100, 4, 8, 60), _outcomes(100, 2, 7, 40)]
    r = mcnemar_combined(pairs)
    assert (r.b, r.c) == (9, 24)
    assert r.p == pytest.approx(_exact_two_sided(9, 24), rel=1e-12)
    assert r.p < 0.05 < mcnemar(*pairs[0]).p  # pooling seeds gives the power one seed lacks


def test_paired_difference_one_seed_and_seeds() -> None:
    base, cand = _outcomes(400, 10, 30, 200)
    d, lo, hi, how = paired_difference([(base, cand)])
    n, b, c = 400, 10, 30
    half = stats.norm.ppf(0.975) * math.sqrt(b + c - (c - b) ** 2 / n) / n
    assert how == "wald over examples"
    assert d == pytest.approx(20 / 400) and (lo, hi) == pytest.approx((d - half, d + half))
    pairs = [_outcomes(100, 3, 9, 50), _outcomes(100, 4, 8, 60), _outcomes(100, 2, 7, 40)]
    d, lo, hi, how = paired_difference(pairs)
    diffs = [0.06, 0.04, 0.05]
    assert how == "t over seeds" and d == pytest.approx(0.05)
    ref = stats.t.interval(0.95, 2, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert (lo, hi) == pytest.approx(ref)


def test_holm_textbook_example() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.2, math.nan, 0.6])
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.6)


def test_discordant_rejects_mismatched_examples() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        discordant(np.ones(3, bool), np.ones(4, bool))


def test_leaderboard_cells_carry_scipys_intervals() -> None:
    # several seeds: Student-t over the seeds; one seed: Wilson over its test examples; clipped to [0, 1]
    seeds = [0.71, 0.74, 0.69]
    s = Stat.of(seeds, n_examples=180)
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(seeds), scale=stats.sem(seeds))
    assert s.interval == "t" and (s.lo, s.hi) == pytest.approx((lo, hi), abs=1e-12) and s.n == 3
    one = Stat.of([171 / 180], n_examples=180)
    ci = stats.binomtest(171, 180).proportion_ci(confidence_level=0.95, method="wilson")
    assert one.interval == "wilson" and (one.lo, one.hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert one.std is None
    wide = Stat.of([0.99, 0.97])  # 0.98 + 12.7 * 0.01 > 1
    assert wide.hi == 1.0 and wide.lo == pytest.approx(0.98 - stats.t.ppf(0.975, 1) * 0.01)
    assert Stat.of([0.5]).interval == "" and Stat.of([]).mean is None  # no example count, nothing measured
