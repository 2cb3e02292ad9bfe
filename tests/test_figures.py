"""The leaderboard figures scale to the seventeen lines of the demo zoo (tests/data/leaderboard/families.py).

The figures are checked as drawn (matplotlib artists found by their gid): every recipe has a
(colour, marker, line style) no other recipe has, and a colour of its own among the first 17, in
every figure; labels sit beside their points and lines without overlapping; Fig. 1 has two panels
per table (FGSM at the headline ε, the ranking metric), each naming what it plots, with a y = x
line and x and y intervals; a marker is filled only where the board's rule holds (Holm p < 0.05
and a seed interval excluding 0); Fig. S1 has a numeric ε axis, interval bars, and in-domain and
transfer panels.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Annotation, Text

from robustbench_nacl.report import figures
from robustbench_nacl.report.compare import Comparison
from robustbench_nacl.report.context import Context
from robustbench_nacl.report.leaderboard import build_context, render_leaderboard
from robustbench_nacl.report.plotstyle import PALETTE, spread, styles
from robustbench_nacl.report.tables import panel_note
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


def _look(line: Any) -> tuple[str, str, str]:
    return to_hex(line.get_markeredgecolor()), str(line.get_marker()), str(line.get_linestyle())


def test_seventeen_families_get_seventeen_distinct_styles(ctx: Context) -> None:
    recipes = {e.recipe for e in ctx.entries}
    assert len(recipes) == 17
    st = styles(recipes)
    assert len({(s.color, s.marker, s.linestyle) for s in st.values()}) == 17  # no two alike
    assert len({s.label for s in st.values()}) == 17
    # no colour twice among the trained recipes (arcl and supervised were both orange)
    trained = [s.color for r, s in st.items() if not r.control]
    assert len(trained) == 16 and len(set(trained)) == 16


def test_beyond_the_palette_a_repeated_colour_comes_with_another_marker_and_line_style(ctx: Context) -> None:
    base = next(e.recipe for e in ctx.entries if e.recipe.loss == "nca")
    many = [dataclasses.replace(base, key_params=f"M={m}", recipe_id=f"{m:016d}") for m in range(40)]
    st = list(styles(many).values())
    assert len({s.color for s in st[: len(PALETTE)]}) == len(PALETTE)
    for a, b in itertools.combinations(st, 2):
        if a.color == b.color:
            assert a.marker != b.marker and a.linestyle != b.linestyle, (a, b)


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
    lines = _drawn(figures.draw_robust_vs_eps(ctx), "line:")
    looks = {e.recipe.recipe_id: {_look(ln) for ln in lines.get(e.uid, [])} for e in ctx.entries}
    assert all(len(v) == 1 for v in looks.values())  # in-domain and transfer: the same look
    assert len({next(iter(v)) for v in looks.values()}) == 17


def test_recipes_of_one_family_are_told_apart_in_labels(ctx: Context) -> None:
    recipes = [e.recipe for e in ctx.entries]
    nca = next(r for r in recipes if r.loss == "nca")
    twin = type(nca)(
        **{**nca.__dict__, "key_params": "G1=g2 M=5 tau_plus=0.01 beta=1.0", "recipe_id": "x" * 16}
    )
    labels = {s.label for r, s in styles([*recipes, twin]).items() if r.loss == "nca"}
    assert labels == {"nca M=3", "nca M=5"}


# ============ standard vs robust ============


def _panels(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.axison and ax.get_title()]


def test_two_panels_per_table_each_naming_what_it_plots(ctx: Context, rows: list[dict[str, Any]]) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    panels = _panels(fig)
    # a column per table: FGSM at the paper's eps above, the ranking metric below
    assert [ax.get_title().split(":")[0] for ax in panels] == ["in-domain", "transfer", "shift"] * 2
    for ax in panels[:3]:
        assert "FGSM at ε = 0.002 (0.51/255)" in ax.get_title() and "FGSM at ε = 0.002" in ax.get_ylabel()
    for ax in panels[3:]:
        what = "worst case over the suite at ε = 0.032 (8.16/255)"
        assert what in ax.get_title() and what in ax.get_ylabel()
    assert all(ax.get_xlabel() == "clean accuracy [%]" for ax in panels)
    for ax in panels:
        (diag,) = [ln for ln in ax.get_lines() if ln.get_gid() == "y=x"]
        assert list(diag.get_xdata()) == list(diag.get_ydata())
        lo, hi = ax.get_ylim()
        assert lo < max(diag.get_ydata()) and min(diag.get_ydata()) < hi  # it crosses the panel
    # rows of a second protocol are a point set of their own: a fourth column, never mixed in
    other = [stamp_ids({**r, "n_examples": 90}) for r in rows if r["setting"] == "in-domain"]
    two = build_context([*rows, *other])[0]
    panels = _panels(figures.draw_standard_vs_robust(two))
    assert len(panels) == 8 and sum("n_examples 90" in ax.get_title() for ax in panels) == 2


def test_points_are_labelled_directly_without_overlaps(ctx: Context) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    fig.canvas.draw()
    texts = [t.get_text() for t in _labels(fig)]
    assert len(texts) == 6 * 17 and texts.count("simclr (baseline)") == 4  # no Δ in the shift panels
    assert not _overlapping(fig)


def test_points_carry_intervals_on_both_axes(ctx: Context) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    xs, ys = _drawn(fig, "xinterval:"), _drawn(fig, "yinterval:")
    simclr = next(e for e in ctx.entries if e.recipe.loss == "simclr" and e.setting == "in-domain")
    clean, fgsm = simclr.stat("clean"), simclr.stat(ctx.fgsm)
    (x,), (y,) = xs[simclr.uid][:1], ys[simclr.uid][:1]  # the upper panel's
    assert list(x.get_xdata()) == pytest.approx([100 * clean.lo, 100 * clean.hi])
    assert list(y.get_ydata()) == pytest.approx([100 * fgsm.lo, 100 * fgsm.hi])
    # every in-domain and transfer entry has both in both of its panels (one seed: Wilson's)
    for e in ctx.entries:
        if e.setting in ("in-domain", "transfer") and not e.recipe.control:
            assert len(xs[e.uid]) == len(ys[e.uid]) == 2, e.recipe.loss


def test_a_control_far_below_the_cluster_sits_on_the_edge_with_its_values(ctx: Context) -> None:
    fig = figures.draw_standard_vs_robust(ctx)
    ax = _panels(fig)[3]  # in-domain, the ranking metric: the control keeps 40 % against 76-89 %
    control = next(e for e in ctx.entries if e.recipe.control and e.setting == "in-domain")
    (point,) = [ln for ln in ax.get_lines() if ln.get_gid() == f"point:{control.uid}"]
    lo, hi = ax.get_ylim()
    assert lo <= point.get_ydata()[0] <= hi  # on the panel's edge
    assert 100 * control.stat("worst_case_Linf_0.032").mean < lo  # though its accuracy lies below it
    (label,) = [t for t in ax.get_children() if isinstance(t, Annotation) and "random-init" in t.get_text()]
    clean, worst = 100 * control.stat("clean").mean, 100 * control.stat("worst_case_Linf_0.032").mean
    assert label.get_text() == f"random-init ({clean:.1f}, {worst:.1f}: off scale)"


def _comparison(
    uid: str, *, p_holm: float, lo: float, hi: float, interval: str = "t over seeds"
) -> Comparison:
    return Comparison("in-domain", "d", "p", "m", "m", "b", "b", "c", "c", uid, 180, 3, "by seed",
                      (lo + hi) / 2, lo, hi, interval, 1, 9, 0.001, p_holm)  # fmt: skip


def test_the_board_rule_needs_holm_and_a_seed_interval_excluding_zero() -> None:
    assert figures.established(_comparison("x", p_holm=0.01, lo=0.01, hi=0.05))
    assert figures.established(_comparison("x", p_holm=0.01, lo=-0.05, hi=-0.01))  # against: established too
    assert not figures.established(_comparison("x", p_holm=0.01, lo=-0.05, hi=0.12))  # McNemar alone
    assert not figures.established(_comparison("x", p_holm=0.2, lo=0.01, hi=0.05))
    # one seed pair: its interval covers the test examples, not training runs
    assert not figures.established(
        _comparison("x", p_holm=0.01, lo=0.01, hi=0.05, interval="wald over examples")
    )
    assert not figures.established(None)


def _faces(fig: Any, uid: str) -> list[str]:
    return [str(ln.get_markerfacecolor()) for ln in _drawn(fig, "point:")[uid]]


def test_markers_follow_the_board_rule_not_mcnemar_alone(ctx: Context) -> None:
    in_domain = {e.recipe.loss: e for e in ctx.entries if e.setting == "in-domain"}
    control, nca = in_domain["random-init"], in_domain["nca"]
    # the control differs beyond doubt on these examples (McNemar), but it has one seed: hollow
    assert ctx.comparisons[control.uid].p_holm < 0.05 and ctx.comparisons[control.uid].n_pairs == 1
    fig = figures.draw_standard_vs_robust(ctx)
    assert _faces(fig, control.uid) == ["none", "none"]
    assert len(_drawn(fig, "baseline-ring")[""]) == 4  # in-domain and transfer, both panels
    # the same comparison with a seed interval excluding 0 is filled; spanning 0, hollow
    for lo, hi, face in ((0.02, 0.09, "filled"), (-0.02, 0.09, "none")):
        ranked = dataclasses.replace(ctx, comparisons=dict(ctx.comparisons))
        ranked.comparisons[nca.uid] = dataclasses.replace(
            ctx.comparisons[nca.uid], p_holm=1e-6, lo=lo, hi=hi, interval="t over seeds"
        )
        upper, lower = _faces(figures.draw_standard_vs_robust(ranked), nca.uid)
        assert (lower != "none") == (face == "filled") and upper == "none"


def test_a_difference_established_over_three_seeds_is_filled_in_both_panels() -> None:
    # simclr and the control with three seeds each: the control's FGSM and worst-case losses are
    # large and stable, so both its panels' tests hold under the rule
    saved = dict(families.FAMILIES)
    try:
        for name in ("simclr", "random-init"):
            key, accs, _ = families.FAMILIES[name]
            families.FAMILIES[name] = (key, accs, (0, 1, 2))
        ctx3 = build_context(families.make_rows())[0]
    finally:
        families.FAMILIES.clear()
        families.FAMILIES.update(saved)
    control = next(e for e in ctx3.entries if e.recipe.control and e.setting == "in-domain")
    debiased = next(e for e in ctx3.entries if e.recipe.loss == "debiased" and e.setting == "in-domain")
    fig = figures.draw_standard_vs_robust(ctx3)
    assert all(f != "none" for f in _faces(fig, control.uid))
    assert _faces(fig, debiased.uid) == ["none", "none"]  # one seed


# ============ robust accuracy vs eps ============


def test_lines_are_labelled_at_their_end_without_overlaps(ctx: Context) -> None:
    fig = figures.draw_robust_vs_eps(ctx)
    fig.canvas.draw()
    lines = _drawn(fig, "line:")
    assert len(lines) == 2 * 17  # in-domain and transfer
    labels = _labels(fig)
    assert len(labels) == 2 * 17 and not _overlapping(fig)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:2]:
        right = ax.get_window_extent(renderer).x1
        mine = [t for t in labels if t.axes is ax]
        assert len(mine) == 17 and all(_text_box(t, renderer).x0 > right for t in mine)  # beside the axes
    assert all(_text_box(t, renderer).x1 <= fig.bbox.x1 for t in labels)  # inside the figure


def test_the_eps_axis_is_numeric_with_clean_at_zero_and_intervals(ctx: Context) -> None:
    fig = figures.draw_robust_vs_eps(ctx)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in panels] == ["in-domain", "transfer"]
    simclr = next(e for e in ctx.entries if e.recipe.loss == "simclr" and e.setting == "transfer")
    (line,) = _drawn(fig, "line:")[simclr.uid]
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    assert xs == [0.0, 0.002, 0.004, 0.008, 0.016, 0.032]  # at their values, not evenly spaced
    assert ys[0] == pytest.approx(100 * simclr.stat("clean").mean)
    assert panels[1].get_xscale() == "linear"
    measured = [0.002, 0.004, 0.008, 0.016, 0.032]
    assert list(panels[1].get_xticks(minor=True)) == measured  # marked by minor ticks...
    assert list(panels[1].get_xticks()) != measured  # ...under a plain, evenly spaced scale
    (bars,) = [c for c in panels[1].collections if c.get_gid() == f"interval:{simclr.uid}"]
    segs = bars.get_segments()
    worst = simclr.stat("worst_case_Linf_0.032")
    assert [*segs[-1][0], *segs[-1][1]] == pytest.approx([0.032, 100 * worst.lo, 0.032, 100 * worst.hi])


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
    w, h = figures.figure_size("standard_vs_robust.png", 3)
    assert imread(written["standard_vs_robust.png"]).shape[:2] == (h, w) == (1160, 1620)  # three columns
    assert imread(written["robust_vs_eps.png"]).shape[:2] == (520, 1400)  # in-domain and transfer
    # a fourth table: a second pair of rows
    assert figures.figure_size("standard_vs_robust.png", 4) == (1620, 1160 + 2 * 480)


def test_panel_titles_drop_parameter_lists_unless_two_tables_would_then_read_the_same() -> None:
    def table(setting: str, note: str) -> Any:  # panel_note reads these three fields of a Table
        return SimpleNamespace(setting=setting, dataset="fashion-mnist:0-4", note=note)

    params = "batch_size 128, epochs 25, eps 0.0313725, gamma 0.1, lr 0.01, max_train 1024, steps 10"
    slf, alf = table("in-domain", "protocol SLF"), table("in-domain", f"protocol ALF ({params})")
    alf_transfer = table("transfer", "protocol ALF (batch_size 64)")
    assert panel_note(alf, [slf, alf, alf_transfer]) == "protocol ALF"  # LEADERBOARD.md has the rest
    assert panel_note(slf, [slf, alf]) == "protocol SLF"
    twin = table("in-domain", "protocol ALF (batch_size 64)")
    full = panel_note(alf, [slf, alf, twin])  # "protocol ALF" twice would hide what differs
    assert full.replace("\n", " ") == alf.note and "\n" in full
    assert all(len(line) <= 60 for line in full.splitlines())


def test_the_protocol_figure_draws_what_was_measured_and_no_bar_for_what_was_not(rows: list) -> None:
    from robustbench_nacl.report import protocols
    from robustbench_nacl.results.finetune import AlfConfig

    alf = [
        stamp_ids({**r, "finetune": AlfConfig().identity()})  # the same outcomes under another protocol
        for r in rows
        if r["setting"] == "in-domain" and r["loss"] in ("simclr", "intcl")
    ]
    both = build_context([*rows, *alf])[0]
    ((_, _, _), by), *_ = protocols.groups(both).items()
    metric = protocols.robust_metric([e for v in by.values() for e in v.values()], both.headline_eps)[0]
    ax = protocols.draw(both).axes[0]
    bars = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("bar:")}
    drawn = {gid.split(":", 2)[1] for gid in bars}
    assert drawn == {"SLF", "ALF"} and len(bars) == len(by) + 2  # every recipe under SLF, two under ALF
    none = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("none:ALF")]
    assert none == ["ALF: not measured"] * (len(by) - 2)  # no bar at 0 for what was not measured
    gids = {line.get_gid() for line in ax.get_lines()}
    slf_tops = []
    for columns in by.values():
        for column, e in columns.items():
            gid = f"{column}:{e.uid}"
            bar = bars[f"bar:{gid}"]
            assert bar.get_width() == pytest.approx(100 * e.stat(metric).mean)  # the robust accuracy
            assert f"interval:{gid}" in gids and f"clean:{gid}" in gids
            if column == "SLF":
                slf_tops.append((bar.get_y(), e.stat(metric).mean))
    # recipes in the order of the first protocol's robust accuracy, best on top (y grows downward)
    assert [m for _, m in sorted(slf_tops)] == sorted((m for _, m in slf_tops), reverse=True)
    assert ax.get_ylim()[0] > ax.get_ylim()[1]
    assert protocols.draw(build_context(rows)[0]) is None  # one protocol: nothing to put side by side
