"""How epsilon is written for humans: the /255 label shown beside the [0,1] float (which is the truth)."""

from __future__ import annotations

import math


def eps_label(eps: float) -> str:
    """0.002 -> '0.51/255', 8/255 -> '8/255': epsilon in /255 units, two decimals unless whole."""
    v = eps * 255
    return f"{round(v)}/255" if math.isclose(v, round(v), abs_tol=1e-9) else f"{v:.2f}/255"
