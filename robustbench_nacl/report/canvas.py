"""A matplotlib Figure on an Agg canvas (no display, no global pyplot state), fixed margins, PNG bytes:
what every leaderboard figure is drawn on."""

from __future__ import annotations

import io
from typing import Any

DPI = 100  # fixed pixel sizes (inches x dpi), so figures are comparable between renders


def new_figure(size: tuple[float, float], nrows: int, ncols: int) -> tuple[Any, list[Any]]:
    """A Figure of ``size`` inches with an ``nrows`` x ``ncols`` grid of axes (flattened, row by row)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def set_margins(
    fig: Any, nrows: int, ncols: int, *, lrbt: tuple[float, ...], gaps: tuple[float, float]
) -> None:
    """Fixed margins and gaps in inches (tight_layout would cost a draw and move panels between
    renders): ``lrbt`` = left, right, bottom, top; ``gaps`` = between columns, between rows."""
    w, h = fig.get_figwidth(), fig.get_figheight()
    left, right, bottom, top = lrbt
    ax_w = (w - left - right - (ncols - 1) * gaps[0]) / ncols
    ax_h = (h - bottom - top - (nrows - 1) * gaps[1]) / nrows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h)
    fig.subplots_adjust(wspace=gaps[0] / ax_w, hspace=gaps[1] / ax_h)


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    # no Software (version) metadata: re-rendering unchanged rows rewrites identical bytes
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def pct(x: float | None) -> float:
    """A fraction as a percentage for plotting (None: 0)."""
    return 100 * (x or 0.0)
