"""How numbers are written in every output: percentages with intervals, differences in points,
p-values, and the rounding of machine-readable files."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import UserError
from .stats import Stat

MISSING = "–"


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal (``–`` when absent)."""
    return MISSING if x is None else f"{100 * x:.1f}"


def fmt_interval(s: Stat) -> str:
    """The 95 % interval in percent, ``[69.1, 73.5]``; empty when there is none."""
    return "" if s.lo is None or s.hi is None else f"[{pct(s.lo)}, {pct(s.hi)}]"


def is_clipped(s: Stat) -> tuple[bool, bool]:
    """Whether a t-interval's (lower, upper) bound was clipped to [0, 1] (:meth:`.stats.Stat.of`):
    a bound at 0 (1) with the mean above (below) it can only come from the clip; Wilson intervals
    never leave [0, 1]."""
    if s.interval != "t" or s.mean is None or s.lo is None or s.hi is None:
        return False, False
    return s.lo == 0.0 < s.mean, s.hi == 1.0 > s.mean


def n_clipped(stats: Iterable[Stat]) -> int:
    """How many interval bounds among ``stats`` were clipped to [0, 1]."""
    return sum(sum(is_clipped(s)) for s in stats)


def fmt_stat(s: Stat) -> str:
    """Percent with its 95 % interval: ``71.3 [69.1, 73.5]``; the mean alone without one; ``–`` absent."""
    if s.mean is None:
        return MISSING
    ci = fmt_interval(s)
    return f"{pct(s.mean)} {ci}" if ci else pct(s.mean)


def fmt_with_n(s: Stat, n_runs: int) -> str:
    """``fmt_stat``, plus ``(n=k)`` when the metric was measured on fewer runs than the recipe has."""
    text = fmt_stat(s)
    return f"{text} (n={s.n})" if s.mean is not None and s.n != n_runs else text


def fmt_points(x: float | None, sign: bool = True) -> str:
    """A difference of accuracies in percentage points, ``+4.4``."""
    return "–" if x is None else f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


def fmt_p(p: float | None) -> str:
    """``0.012``, ``<0.001``, ``1`` (two significant digits); ``–`` without a test."""
    if p is None:
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.2g}"


def fmt_diff(diff: float | None, lo: float | None, hi: float | None) -> str:
    """``+4.4 [+1.1, +7.8]``; the difference alone where it has no interval."""
    if lo is None or hi is None:
        return fmt_points(diff)
    return f"{fmt_points(diff)} [{fmt_points(lo)}, {fmt_points(hi)}]"


def p_label(p: float | None) -> str:
    """``p=0.012``, ``p<0.001``, or ``p –`` without a test (the Δ cells' p)."""
    text = fmt_p(p)
    return "p –" if p is None else f"p{'' if text.startswith('<') else '='}{text}"


def round6(x: float | None) -> float | None:
    """A number for CSV/JSON/HTML data: 6 decimals (None stays None)."""
    return None if x is None else round(x, 6)


def splice(text: str, section: str, begin: str, end: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``section`` (a
    generated section of a hand-written page: the claims' reading, the reference's headroom)."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise UserError(f"expected one {begin} ... {end} pair")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{section}{end}{rest.split(end, 1)[1]}"
