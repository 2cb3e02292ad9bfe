"""User-facing errors: one line that says what is wrong and how to fix it, exit code 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment (not a bug). The CLI prints it as one line."""

    exit_code = 2

    def __init__(self, message: str = "") -> None:
        # Messages quote user input (option names, paths, manifest fields), which may itself hold
        # line breaks; the one-line contract is kept here rather than at every raise.
        super().__init__(" ".join(str(message).splitlines()))


class DatasetNotFound(UserError):
    """A named dataset is neither on disk nor downloadable."""


class CheckpointError(UserError):
    """A checkpoint is missing, corrupt, mismatched or unsafe."""


class NonFiniteLoss(UserError):
    """Training produced a NaN or Inf loss."""

    exit_code = 3


class SanityError(Exception):
    """An evaluation invariant that must never fail (perturbation outside the ball, robust > clean)."""


def one_line(text: object, limit: int = 200, *, with_type: bool = False) -> str:
    """``text`` (a message or an exception) on one line, cut to ``limit`` characters with "...".

    ``with_type`` prefixes an exception's class name (for errors raised by someone else's code,
    where the class is half the message).
    """
    if with_type and isinstance(text, BaseException):
        text = f"{type(text).__name__}: {text}"
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
