"""Finding a dataset's files under the data root, or downloading them (with torchvision's
downloaders, into a temporary directory moved into place on success, so a failed download leaves
nothing behind); a dataset that cannot be had is a one-line :class:`DatasetNotFound`."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import socket
import tempfile
import urllib.error
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import DatasetNotFound, one_line
from .catalog import DATASETS

__all__ = ["obtain", "torchvision_fetch"]

log = logging.getLogger(__name__)

#: Seconds before a stalled connection gives up; without it an offline machine can hang forever.
DOWNLOAD_TIMEOUT_S = 10.0


def _places(paths: Iterable[Path]) -> str:
    items = [str(p) for p in paths]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _not_found(name: str, looked: Iterable[Path], why: str) -> DatasetNotFound:
    how = DATASETS.info(name)["how_to_get"]
    return DatasetNotFound(
        f"{name} not found under {_places(looked)} and {why}; {how}, or pass --data-root DIR"
    )


def _makedirs_tracked(path: Path) -> list[Path]:
    """mkdir -p that returns the directories it created (outermost first), so a failure can undo them."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[Path] = []
    for d in reversed(missing):
        d.mkdir()
        created.append(d)
    return created


def _download(root: Path, dest_name: str, fetch: Callable[[Path], Path]) -> Exception | None:
    """Download into a temp dir under ``root`` and move ``fetch``'s result to ``root/dest_name``.

    Returns None on success, the exception otherwise; on failure nothing is left on disk (not the
    temp dir, not ``root`` itself if this call created it). The temp dir sits under ``root`` so the
    final move is a same-filesystem rename, atomic with respect to other readers.
    """
    created: list[Path] = []
    tmp: Path | None = None
    ok = False
    old_timeout = socket.getdefaulttimeout()
    try:
        created = _makedirs_tracked(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest_name}.download-", dir=root))
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        log.info("downloading %s into %s", dest_name, root)
        # torchvision prints each mirror it tries; the outcome is reported by the caller instead.
        with contextlib.redirect_stdout(io.StringIO()):
            src = fetch(tmp)
        if not src.is_dir():
            raise RuntimeError(f"the download produced no {src.name}/")
        dest = root / dest_name
        if not dest.exists():  # another process may have won the race; its copy is as good
            os.rename(src, dest)
        ok = True
        return None
    except Exception as e:  # anything (DNS, timeout, md5, disk): reported as "could not be downloaded"
        return e
    finally:
        socket.setdefaulttimeout(old_timeout)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()


def torchvision_fetch(cls_name: str, folder: str, **kwargs: Any) -> Callable[[Path], Path]:
    """A fetch function for :func:`_download` using torchvision's downloader for ``cls_name``."""

    def fetch(tmp: Path) -> Path:
        import torchvision.datasets as tvd

        getattr(tvd, cls_name)(str(tmp), download=True, **kwargs)
        return tmp / folder

    return fetch


def obtain(
    name: str,
    root: Path,
    looked: list[Path],
    find: Callable[[], Any],
    download: bool,
    dest_name: str,
    fetch: Callable[[Path], Path] | None,
) -> Any:
    """``find()`` (None when absent); else download if allowed and ``find()`` again; else DatasetNotFound."""
    found = find()
    if found is not None:
        return found
    dest = root / dest_name
    if fetch is None:
        raise _not_found(name, looked, "cannot be downloaded automatically")
    if not download:
        raise _not_found(name, looked, "downloading is disabled")
    if dest.exists():
        # Never overwrite what the user put there: a partial copy must be fixed by hand.
        raise _not_found(name, looked, f"{dest} exists but is incomplete (delete it to re-download)")
    err = _download(root, dest_name, fetch)
    if err is not None:
        offline = isinstance(err, (urllib.error.URLError, TimeoutError, ConnectionError)) or (
            "urlopen error" in str(err)  # torchvision's MNIST wraps the URLError in a RuntimeError
        )
        hint = "; no network?" if offline else ""
        why = f"could not be downloaded ({type(err).__name__}: {one_line(str(err), 120)}{hint})"
        raise _not_found(name, looked, why)
    found = find()
    if found is None:
        raise _not_found(name, looked, "the download did not contain the expected files")
    return found
