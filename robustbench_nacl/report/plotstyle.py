"""Styles and direct labels for the leaderboard figures.

Seventeen loss families do not fit a 10-colour palette, and a legend beside 17 look-alike markers
is unreadable. Each recipe gets a colour, a marker and a line style (17 colours, 11 markers and 4
line styles, cycled together: the first 17 recipes differ in colour, and where a later one repeats a
colour its marker and line style differ) and every point or line is labelled directly: points by a
greedy placement that keeps labels off each other and off the points, lines by their value at the
right end, spread apart in a strip beside the axes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .aggregate import Recipe

# Dark, well-separated colours (Okabe-Ito and Tol's, light ones left out so labels in the same colour
# stay readable on white), ordered so that look-alike hues sit at positions that differ in marker and
# line style too; 17, 11 and 4 are pairwise coprime, so (colour, marker, line style) repeats only
# after 748 recipes.
PALETTE = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#332288",  # indigo
    "#882255",  # wine
    "#117733",  # green
    "#56B4E9",  # sky blue
    "#999933",  # olive
    "#AA4499",  # purple
    "#000000",  # black
    "#8C564B",  # brown
    "#44AA99",  # teal
    "#EE3377",  # magenta
    "#661100",  # dark brown
    "#6A5ACD",  # slate blue
)
MARKERS = "osD^vP*<>ph"
LINESTYLES = ("-", "--", "-.", ":")
CONTROL_COLOR = "#777777"
CONTROL_MARKERS = "Xx+1234"
FONT = 7  # label size in points


@dataclass(frozen=True)
class Style:
    """How one recipe is drawn in every figure of a render."""

    color: str
    marker: str
    label: str
    linestyle: str = "-"


def _short_labels(recipes: Sequence[Recipe]) -> dict[Recipe, str]:
    # the family, plus what tells recipes of one family apart (key parameters that differ, else
    # the `differs` text, else the recipe id)
    by_family: dict[str, list[Recipe]] = defaultdict(list)
    for r in recipes:
        by_family[r.family].append(r)
    out = {}
    for family, members in by_family.items():
        name = "random-init" if members[0].control else family
        if len(members) == 1:
            out[members[0]] = name
            continue
        tokens = [set(r.key_params.split()) for r in members]
        shared = set.intersection(*tokens)
        for r in members:
            extra = " ".join(t for t in r.key_params.split() if t not in shared) or r.differs
            out[r] = f"{name} {extra or r.recipe_id[:6]}"
    return out


def styles(recipes: Iterable[Recipe]) -> dict[Recipe, Style]:
    """A distinct (colour, marker, line style) and a short label per recipe; controls are grey
    crosses on dashed lines."""
    unique = sorted(set(recipes), key=lambda r: (r.control, r.family, r.key_params, r.differs, r.recipe_id))
    labels = _short_labels(unique)
    trained = [r for r in unique if not r.control]
    out = {
        r: Style(
            PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)], labels[r], LINESTYLES[i % len(LINESTYLES)]
        )
        for i, r in enumerate(trained)
    }
    controls = [r for r in unique if r.control]
    for i, r in enumerate(controls):
        out[r] = Style(CONTROL_COLOR, CONTROL_MARKERS[i % len(CONTROL_MARKERS)], labels[r], "--")
    return out


# ============ direct labels ============


def _text_size(ax: Any, text: str, renderer: Any) -> tuple[float, float]:
    t = ax.text(0, 0, text, fontsize=FONT)
    bb = t.get_window_extent(renderer)
    t.remove()
    return bb.width, bb.height


def _box(px: float, py: float, dx: float, dy: float, w: float, h: float) -> tuple[float, float, float, float]:
    # the label's box when its anchor sits at (px + dx, py + dy), on the side facing away from the point
    x0 = px + dx - (0 if dx > 0.5 else w if dx < -0.5 else w / 2)
    y0 = py + dy - (0 if dy > 0.5 else h if dy < -0.5 else h / 2)
    return (x0, y0, x0 + w, y0 + h)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return max(0.0, w) * max(0.0, h)


_ANGLES = (0, 35, -35, 70, -70, 180, 145, -145, 110, -110, 90, -90)
_RADII = (6, 11, 17, 25, 35, 47, 62, 80)


def _best_offset(
    px: float, py: float, w: float, h: float, taken: list[tuple[float, ...]], frame: tuple[float, ...]
) -> tuple[float, float, tuple[float, ...]]:
    """The nearest free spot (offset in pixels and box) for one label; the least crowded if none is."""
    best, best_cost = (_RADII[0], 0.0, _box(px, py, _RADII[0], 0, w, h)), math.inf
    for r in _RADII:
        for a in _ANGLES:
            dx, dy = r * math.cos(math.radians(a)), r * math.sin(math.radians(a))
            box = _box(px, py, dx, dy, w, h)
            inside = box[0] >= frame[0] and box[1] >= frame[1] and box[2] <= frame[2] and box[3] <= frame[3]
            cost = sum(_overlap(box, t) for t in taken) + (
                0.0 if inside else 4 * (w * h - _overlap(box, frame))
            )
            if cost < 1e-6:
                return dx, dy, box
            if cost + r < best_cost:
                best, best_cost = (dx, dy, box), cost + r
    return best


def label_points(
    ax: Any,
    points: Sequence[tuple[float, float, str, str]],
    renderer: Any,
    clear: Sequence[float] = (),
    first: Sequence[bool] = (),
) -> None:
    """Label scatter points ``(x, y, text, colour)`` (data coordinates) directly, without overlaps
    where the panel has room; labels far from their point get a thin leader line. ``clear``: the
    half-width in pixels kept free around each point (default 5: a marker); ``first``: points whose
    labels are placed before the others (long labels in a corner, which have the fewest spots)."""
    frame = tuple(ax.get_window_extent(renderer).extents)
    disp = [tuple(ax.transData.transform((x, y))) for x, y, _, _ in points]
    half = list(clear) or [5.0] * len(points)
    taken: list[tuple[float, ...]] = [
        (px - h, py - h, px + h, py + h) for (px, py), h in zip(disp, half, strict=True)
    ]
    # crowded points first: they have the fewest free spots
    crowd = [sum(math.hypot(px - qx, py - qy) < 40 for qx, qy in disp) for px, py in disp]
    early = list(first) or [False] * len(points)
    for i in sorted(range(len(points)), key=lambda i: (not early[i], -crowd[i], disp[i][1])):
        (x, y, text, color), (px, py) = points[i], disp[i]
        w, h = _text_size(ax, text, renderer)
        dx, dy, box = _best_offset(px, py, w + 2, h + 1, taken, frame)
        taken.append(box)
        far = math.hypot(dx, dy) > 12
        ax.annotate(
            text,
            xy=(x, y),
            xytext=(dx, dy),
            textcoords="offset pixels",
            ha="left" if dx > 0.5 else "right" if dx < -0.5 else "center",
            va="bottom" if dy > 0.5 else "top" if dy < -0.5 else "center",
            fontsize=FONT,
            color=color,
            arrowprops={
                "arrowstyle": "-",
                "lw": 0.5,
                "color": color,
                "alpha": 0.6,
                "shrinkA": 0,
                "shrinkB": 3,
            }
            if far
            else None,
        )


def spread(ys: Sequence[float], gap: float, lo: float, hi: float) -> list[float]:
    """Positions as close to ``ys`` as possible, at least ``gap`` apart, inside [lo, hi] where they fit
    (same order as given): the label column beside the right end of line plots."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    n = len(order)
    if n > 1 and (n - 1) * gap > hi - lo:  # they do not fit: squeeze the gap
        gap = (hi - lo) / (n - 1)
    pos = [min(max(ys[i], lo), hi) for i in order]
    for k in range(1, n):  # push up until every gap holds...
        pos[k] = max(pos[k], pos[k - 1] + gap)
    if n and pos[-1] > hi:  # ...then pull down from the top where that overshot
        pos[-1] = hi
        for k in range(n - 2, -1, -1):
            pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [0.0] * len(ys)
    for k, i in enumerate(order):
        out[i] = pos[k]
    return out


def label_line_ends(ax: Any, ends: Sequence[tuple[float, float, str, str]], renderer: Any) -> None:
    """Label lines at their right end ``(x, y, text, colour)``: a column of labels right of the axes,
    each at its line's height where there is room, joined to the line's end by a thin line."""
    if not ends:
        return
    frame = ax.get_window_extent(renderer)
    disp = [ax.transData.transform((x, y)) for x, y, _, _ in ends]
    h = _text_size(ax, "Ag", renderer)[1] + 1
    ys = spread([float(d[1]) for d in disp], h, frame.y0 + h / 2, frame.y1 - h / 2)
    to_axes = ax.transAxes.inverted()
    for (x, y, text, color), y_label in zip(ends, ys, strict=True):
        ax_x, ax_y = to_axes.transform((frame.x1 + 14, y_label))
        ax.annotate(
            text,
            xy=(x, y),
            xytext=(ax_x, ax_y),
            textcoords="axes fraction",
            ha="left",
            va="center",
            fontsize=FONT,
            color=color,
            annotation_clip=False,
            arrowprops={
                "arrowstyle": "-",
                "lw": 0.5,
                "color": color,
                "alpha": 0.5,
                "shrinkA": 1,
                "shrinkB": 2,
            },
        )
