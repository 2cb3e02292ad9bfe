"""The leaderboard figures scale to the seventeen lines of the demo zoo (tests/data/leaderboard/families.py).

The figures are checked as drawn (matplotlib artists found by their gid): every recipe has a
(colour, marker) pair no other recipe has, in every figure; labels sit beside their points and
lines without overlapping; one panel per table, each with a y = x line; significant differences
are filled.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Annotation, Text

from robustbench_nacl.report import figures
from robustbench_nacl.report.aggregate import Context
from robustbench_nacl.report.leaderboard import build_context, render_leaderboard
from robustbench_nacl.report.plotstyle import spread, styles
from robustbench_nacl.results.rows import ResultRow, stamp_ids

sys.path.insert(0, str(Path(__file__).parent / "data" / "leaderboard"))
import families  # the fixture generator beside the fixture rows


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return families.make_rows()


@pytest.fixture(scope="module")
def ctx(rows: list[dict[str, Any]]) -> Context:
    return build_context(rows)[0]


def _drawn(fig: Any, prefix: str) -> dict[str, list[Any]]:
    """Artists whose gid starts with ``prefix``, by the rest of the gid (an entry's uid), per axes."""
    out: dict[str, list[Any]] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            gid = line.get_gid() or ""
            if gid.startswith(prefix):
                out.setdefault(gid[len(prefix) :], []).append(line)
    return out


def _style_of(line: Any) -> tuple[str, str]:
    return to_hex(line.get_markeredgecolor()), str(line.get_marker())


def _labels(fig: Any) -> list[Any]:
    return [t for ax in fig.axes for t in ax.get_children() if isinstance(t, Annotation)]


def _text_box(t: Annotation, renderer: Any) -> Any:
    return Text.get_window_extent(t, renderer)  # the text alone (an Annotation's own box includes its leader)


def _overlapping(fig: Any) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), _text_box(t, renderer)) for t in _labels(fig)]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


# ============ styles ============


def test_seventeen_families_get_seventeen_distinct_styles(ctx: Context) -> None:
    recipes = {e.recipe for e in ctx.entries}
    assert len(recipes) == 17
    st = styles(recipes)
    pairs = {(s.color, s.marker) for s in st.values()}
    assert len(pairs) == 17  # no two alike
    assert len({s.label for s in st.values()}) == 17


def test_every_figure_draws_each_recipe_in_its_own_style(ctx: Context) -> None:
    # the old figures cycled a 10-colour palette and drew every robust-vs-eps line with circles
    for fig in (figures.draw_standard_vs_robust(ctx), figures.draw_robust_vs_eps(ctx)):
        drawn = {**_drawn(fig, "point:"), **_drawn(fig, "line:")}
        by_recipe: dict[str, set[tuple[str, str]]] = {}
        for e in ctx.entries:
            for line in drawn.get(e.uid, []):
                by_recipe.setdefault(e.recipe.recipe_id, set()).add(_style_of(line))
        assert len(by_recipe) == 17 and all(len(s) == 1 for s in by_recipe.values())  # one style per recipe
        assert len({next(iter(s)) for s in by_recipe.values()}) == 17  # and no two recipes share one


def test_recipes_of_one_family_are_told_apart_in_labels(ctx: Context) -> None:
    recipes = [e.recipe for e in ctx.entries]
    nca = next(r for r in recipes if r.loss == "nca")
    twin = type(nca)(
        **{**nca.__dict__, "key_params": "G1=g2 M=5 tau_plus=0.01 beta=1.0", "recipe_id": "x" * 16}
    )
    labels = {s.label for r, s in styles([*recipes, twin]).items() if r.loss == "nca"}
    assert labels == {"nca M=3", "nca M=5"}


# ============ standard vs robust ============


def test_one_panel_per_table_with_a_y_equals_x_line(ctx: Context, rows: list[dict[str, Any]]) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title().split(":")[0] for ax in panels] == ["in-domain", "transfer", "shift"]
    for ax in panels:
        (diag,) = [ln for ln in ax.get_lines() if ln.get_gid() == "y=x"]
        assert list(diag.get_xdata()) == list(diag.get_ydata())
        lo, hi = ax.get_ylim()
        assert lo < max(diag.get_ydata()) and min(diag.get_ydata()) < hi  # it crosses the panel
    # rows of a second protocol are a point set of their own: a fourth panel, never mixed in
    other = [stamp_ids({**r, "n_examples": 90}) for r in rows if r["setting"] == "in-domain"]
    two = build_context([*rows, *other])[0]
    panels = [ax for ax in figures.draw_standard_vs_robust(two).axes if ax.axison]
    assert len(panels) == 4 and sum("n_examples 90" in ax.get_title() for ax in panels) == 1


def test_points_are_labelled_directly_without_overlaps(ctx: Context) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    fig.canvas.draw()
    texts = [t.get_text() for t in _labels(fig)]
    assert len(texts) == 3 * 17 and texts.count("simclr (baseline)") == 2  # no Δ in the shift panel
    assert not _overlapping(fig)


def test_significant_differences_are_filled(ctx: Context) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    points = _drawn(fig, "point:")
    in_domain = {e.recipe.loss: e for e in ctx.entries if e.setting == "in-domain"}
    control, debiased = in_domain["random-init"], in_domain["debiased"]
    assert ctx.comparisons[control.uid].p_holm < 0.05 < ctx.comparisons[debiased.uid].p_holm
    (c,) = points[control.uid]
    (d,) = points[debiased.uid]
    assert to_hex(c.get_markerfacecolor()) == to_hex(c.get_markeredgecolor())  # filled
    assert to_hex(d.get_markerfacecolor()) == "#ffffff"  # hollow
    assert len(_drawn(fig, "baseline-ring")[""]) == 2  # in-domain and transfer


# ============ robust accuracy vs eps ============


def test_lines_are_labelled_at_their_end_without_overlaps(ctx: Context) -> None:
    fig = figures.draw_robust_vs_eps(ctx)
    fig.canvas.draw()
    lines = _drawn(fig, "line:")
    assert len(lines) == 17
    labels = _labels(fig)
    assert len(labels) == 17 and not _overlapping(fig)
    renderer = fig.canvas.get_renderer()
    right = fig.axes[0].get_window_extent(renderer).x1
    assert all(_text_box(t, renderer).x0 > right for t in labels)  # in the column beside the axes
    assert all(_text_box(t, renderer).x1 <= fig.bbox.x1 for t in labels)  # inside the figure


def test_spread_keeps_order_and_gap() -> None:
    ys = [10.0, 11.0, 11.5, 50.0, 99.0]
    out = spread(ys, gap=4.0, lo=0.0, hi=100.0)
    assert out == sorted(out) and all(b - a >= 4.0 - 1e-9 for a, b in itertools.pairwise(out))
    assert out[3] == 50.0 and max(out) <= 100.0  # a label with room stays where its line ends
    squeezed = spread([5.0] * 30, gap=4.0, lo=0.0, hi=58.0)
    assert min(squeezed) >= 0.0 and max(squeezed) <= 58.0 + 1e-9


# ============ files ============


def test_rendered_sizes(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    from matplotlib.image import imread

    written = render_leaderboard([ResultRow.from_json(r) for r in rows], tmp_path)
    assert imread(written["standard_vs_robust.png"]).shape[:2] == (585, 1500)  # three panels in a row
    assert imread(written["robust_vs_eps.png"]).shape[:2] == (460, 620)
    assert figures.figure_size("standard_vs_robust.png", 4) == (1500, 1045)  # a second row of panels
