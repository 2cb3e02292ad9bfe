"""The parts every leaderboard table shares: the Markdown table itself, the columns that say which
recipe a line is, and the heading. Their own module so that markdown.py and corruption_table.py
both import them, and neither imports the other's helpers back (no import circle)."""

from __future__ import annotations

from tabulate import tabulate

from .aggregate import Entry
from .context import Context
from .fmt import MISSING
from .tables import Table


def table_md(headers: list[str], body: list[list[str]], align: list[str]) -> str:
    """A GitHub Markdown table, numbers kept as written."""
    return tabulate(body, headers=headers, tablefmt="github", colalign=align, disable_numparse=True)


def show_differs(entries: list[Entry]) -> bool:
    """Whether the table needs a ``differs`` column (recipes of one family that differ)."""
    return any(e.recipe.differs for e in entries)


def ident_cols(ctx: Context, e: Entry, differs: bool) -> list[str]:
    """The cells that say which recipe a line is (rank, family, parameters, ...)."""
    cols = [str(e.rank), e.recipe.family, e.recipe.key_params or MISSING]
    if differs:
        cols.append(e.recipe.differs or MISSING)
    if ctx.show_encoder:
        cols.append(e.recipe.encoder)
    if ctx.show_dataset and e.setting != "in-domain":
        cols.append(e.recipe.pretrain_dataset)
    return cols


def ident_headers(ctx: Context, setting: str, differs: bool) -> tuple[list[str], list[str]]:
    """The headers of :func:`ident_cols` and their alignment."""
    heads = ["rank", "loss family", "key parameters"]
    if differs:
        heads.append("differs")
    if ctx.show_encoder:
        heads.append("encoder")
    if ctx.show_dataset and setting != "in-domain":
        heads.append("pretrained on")
    return heads, ["right"] + ["left"] * (len(heads) - 1)


def heading(text: str, table: Table, ranked_by: str) -> list[str]:
    """A table's heading lines: its title, the ranking metric, and how its protocol differs."""
    # the heading names the ranking metric; a table whose dataset is also measured under another
    # protocol says how its protocol differs
    text = f"{text}, ranked by {ranked_by}"
    if not table.note:
        return [text, ""]
    return [f"{text} — {table.note}", "", f"> Not ranked with the other {table.dataset} tables: "
            f"their protocols differ ({table.note} here).", ""]  # fmt: skip
