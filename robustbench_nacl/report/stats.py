"""Uncertainty and paired significance for accuracies measured on the same test examples.

- :func:`wilson_interval`: a 95 % interval for one accuracy over test examples (one seed);
- :func:`t_interval`: a 95 % interval for the mean accuracy over training seeds (n >= 2);
- :func:`mcnemar`: McNemar's exact test of two classifiers on the same examples, from their
  per-example outcomes; :func:`mcnemar_combined` pools the discordant pairs of several seeds (seed
  s of the candidate against seed s of the baseline) into one exact test;
- :func:`paired_difference`: the accuracy difference with its interval (over seeds, or over
  examples for one seed);
- :func:`holm`: Holm's step-down correction across the comparisons of a table;
- :func:`tost_paired`: two one-sided t-tests of equivalence within a margin, over seed-paired
  differences (the "no cost" claims);
- :class:`Stat`: one metric over runs (mean, std, 95 % interval), as the tables show it.

scipy provides the distributions; nothing here is approximate where an exact test exists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


def wilson_interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n`` (accuracy of one seed over examples)."""
    if n <= 0:
        return (math.nan, math.nan)
    z = float(stats.norm.ppf(0.5 + conf / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def t_interval(values: Sequence[float], conf: float = 0.95) -> tuple[float, float]:
    """Student-t interval for the mean of ``values`` (seeds); NaN bounds for fewer than two values."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    mean, sem = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    q = float(stats.t.ppf(0.5 + conf / 2, df=len(x) - 1))
    return (mean - q * sem, mean + q * sem)


@dataclass(frozen=True)
class McNemar:
    """Discordant counts and the exact two-sided p-value.

    ``b``: the baseline right and the candidate wrong; ``c``: the reverse.
    """

    b: int
    c: int
    p: float


def _exact_p(b: int, c: int) -> float:
    # Under H0 each discordant example is equally likely to favour either model: c ~ Bin(b + c, 1/2).
    return 1.0 if b + c == 0 else float(stats.binomtest(c, b + c, 0.5).pvalue)


def discordant(baseline: np.ndarray, candidate: np.ndarray) -> tuple[int, int]:
    """(b, c) for two boolean per-example outcome vectors of the same examples."""
    base, cand = np.asarray(baseline, dtype=bool), np.asarray(candidate, dtype=bool)
    if base.shape != cand.shape:
        raise ValueError(f"outcome vectors differ in length: {base.shape} vs {cand.shape}")
    return int((base & ~cand).sum()), int((~base & cand).sum())


def mcnemar(baseline: np.ndarray, candidate: np.ndarray) -> McNemar:
    """McNemar's exact test for one seed."""
    b, c = discordant(baseline, candidate)
    return McNemar(b, c, _exact_p(b, c))


def mcnemar_combined(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> McNemar:
    """McNemar's exact test over seeds: discordant pairs pooled over (baseline, candidate) pairs.

    Conditioning on the discordant examples of every seed, each favours either model with
    probability 1/2 under H0 independently, so the pooled ``c`` is Bin(b + c, 1/2).
    """
    bs, cs = zip(*(discordant(b, c) for b, c in pairs), strict=True) if pairs else ((), ())
    b, c = int(sum(bs)), int(sum(cs))
    return McNemar(b, c, _exact_p(b, c))


def paired_difference(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], conf: float = 0.95
) -> tuple[float, float, float, str]:
    """Candidate minus baseline accuracy, with its interval and how it was made.

    Two or more seeds: a t-interval over the per-seed paired differences ("t over seeds"). One
    seed: the Wald interval of a paired difference of proportions over examples ("wald over
    examples"), ``(c - b)/n +- z sqrt(b + c - (c - b)^2/n)/n``.
    """
    if not pairs:
        return (math.nan, math.nan, math.nan, "none")
    diffs = []
    for base, cand in pairs:
        b, c = discordant(base, cand)
        diffs.append((c - b) / len(base))
    if len(pairs) >= 2:
        lo, hi = t_interval(diffs, conf)
        return (float(np.mean(diffs)), lo, hi, "t over seeds")
    base, cand = pairs[0]
    b, c = discordant(base, cand)
    n = len(base)
    z = float(stats.norm.ppf(0.5 + conf / 2))
    half = z * math.sqrt(max(0.0, b + c - (c - b) ** 2 / n)) / n
    d = (c - b) / n
    return (d, d - half, d + half, "wald over examples")


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given); NaN p-values stay NaN."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m = len(order)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class Tost:
    """Two one-sided t-tests (Schuirmann 1987) that the mean paired difference lies in (-margin, margin).

    ``p_lower`` tests H0: mean <= -margin, ``p_upper`` H0: mean >= margin; ``p`` (the larger)
    rejects non-equivalence at level alpha exactly when the (1 - 2 alpha) t-interval lies inside
    the margin.
    """

    mean: float
    margin: float
    n: int
    p_lower: float
    p_upper: float

    @property
    def p(self) -> float:
        """The TOST p-value: the larger of the two one-sided p-values."""
        return max(self.p_lower, self.p_upper)


def tost_paired(diffs: Sequence[float], margin: float) -> Tost | None:
    """TOST over paired differences (one per seed pair); None for fewer than two pairs.

    Identical differences (zero spread) leave no t statistic: each one-sided p is then 0 when the
    mean lies strictly inside that side of the margin and 1 otherwise.
    """
    if not margin > 0:
        raise ValueError(f"equivalence margin must be positive, not {margin!r}")
    x = np.asarray(diffs, dtype=float)
    if len(x) < 2:
        return None
    mean, sem, df = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))), len(x) - 1
    if sem == 0:
        return Tost(mean, margin, len(x), float(mean <= -margin), float(mean >= margin))
    p_lower = float(stats.t.sf((mean + margin) / sem, df))
    p_upper = float(stats.t.cdf((mean - margin) / sem, df))
    return Tost(mean, margin, len(x), p_lower, p_upper)


@dataclass(frozen=True)
class Stat:
    """Mean, sample std (None for a single run) and 95 % interval of one metric over runs.

    ``interval``: ``"t"`` (Student-t over seeds, n >= 2), ``"wilson"`` (Wilson score over the test
    examples, one seed) or ``""`` (none). Bounds are clipped to [0, 1], where accuracy lives (see
    docs/decisions.md, 'Leaderboard intervals').
    """

    mean: float | None
    std: float | None
    n: int
    lo: float | None = None
    hi: float | None = None
    interval: str = ""

    @staticmethod
    def of(values: Iterable[float], n_examples: int = 0, bounds: tuple[float, float] = (0.0, 1.0)) -> Stat:
        """The statistics of per-run accuracies measured on ``n_examples`` test examples each; the
        interval is clipped to ``bounds``, the values a run can take (an accuracy's by default)."""
        v = np.asarray(list(values), dtype=float)
        if v.size == 0:
            return Stat(None, None, 0)
        mean = float(v.mean())
        if v.size > 1:
            (lo, hi), kind = t_interval(v), "t"
        elif n_examples > 0:
            (lo, hi), kind = wilson_interval(round(mean * n_examples), n_examples), "wilson"
        else:
            return Stat(mean, None, 1)
        std = float(v.std(ddof=1)) if v.size > 1 else None
        return Stat(mean, std, int(v.size), max(bounds[0], lo), min(bounds[1], hi), kind)
