"""The user's cache of downloaded weights, and the one way a file enters it: an http(s) download whose
sha256 is checked before it is moved into place (docs/decisions.md, 'Packaged data and published
models').

A downloaded file's name in the cache is chosen here, never by the URL or by a submission's
manifest, so no download can land outside the cache; ``file://``, ``ftp://`` and other schemes
are refused, so a URL cannot read a local file; a file that does not match its pinned sha256 is
deleted before it reaches the cache, so a wrong URL fails once and a corrected one then works.
"""

from __future__ import annotations

import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import UserError
from ..io import sha256_file

CACHE_ENV = "ROBUSTBENCH_NACL_CACHE"
SCHEMES = ("http", "https")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """The user's cache for downloaded weights: $ROBUSTBENCH_NACL_CACHE, else ~/.cache/robustbench_nacl."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "robustbench_nacl"
    return base.expanduser() / "models"


def sha_folder(sha256: str) -> Path:
    """The cache folder of the weights with this sha256 (refused unless it is 64 hex digits: it names
    a folder, so it must not be a path)."""
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise UserError(f"weights_sha256 {str(sha256)[:80]!r} is not a sha256 (64 lowercase hex digits)")
    return cache_dir() / sha256


def check_url(url: str, what: str = "the URL") -> str:
    """``url`` when it is http(s) with a host; a one-line error naming ``what`` otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in SCHEMES or not parts.netloc:
        raise UserError(
            f"{what} {url[:120]!r}: only http:// and https:// URLs are downloaded (a file:// or other "
            "scheme could read any local file); give local weights as a folder, not a URL"
        )
    return url


#: The most bytes one download may bring (published weights are a few MB; the largest encoder a zoo
#: trains is under 100 MB): a server that streams for ever fills no disk.
MAX_DOWNLOAD = 1 << 30
#: Seconds one download may take in all: a server sending a byte every few seconds (under any
#: per-read timeout) is cut off all the same.
DOWNLOAD_DEADLINE_S = 600.0
#: Seconds one read may wait (the deadline bounds the whole).
READ_TIMEOUT_S = 60.0


def download(url: str, target: Path, sha256: str, fix: str, *, max_bytes: int | None = None) -> None:
    """Download ``url`` to ``target`` atomically; a file that does not have ``sha256`` is deleted
    before it reaches ``target``, so the cache never holds a damaged or wrong download.

    At most ``max_bytes`` (default :data:`MAX_DOWNLOAD`; a larger declared Content-Length is refused
    before a byte is read) within :data:`DOWNLOAD_DEADLINE_S` seconds; the ``.part`` file is removed
    on every way out but a kill (the next download overwrites it).
    """
    check_url(url)
    limit = MAX_DOWNLOAD if max_bytes is None else max_bytes
    tmp = target.with_name(f".{target.name}.part")
    target.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + DOWNLOAD_DEADLINE_S
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as response, open(tmp, "wb") as f:
            if urllib.parse.urlsplit(response.geturl()).scheme.lower() not in SCHEMES:
                raise ValueError(f"redirected to {response.geturl()[:80]}")  # never off http(s)
            declared = response.headers.get("Content-Length")
            if declared and declared.strip().isdigit() and int(declared) > limit:
                raise ValueError(f"it declares {int(declared)} bytes, over the {limit}-byte limit")
            size = 0
            # read1: at most one read from the socket per call, so the deadline is looked at between
            # every few bytes a slow server sends, not only once a whole block has arrived
            while block := response.read1(1 << 20):
                size += len(block)
                if size > limit:
                    raise ValueError(f"it sends more than the {limit}-byte limit")
                if time.monotonic() > deadline:
                    raise ValueError(f"it took more than {DOWNLOAD_DEADLINE_S:g} s")
                f.write(block)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, urllib.error.HTTPError):
            reason: object = f"HTTP {e.code} {e.reason}"
        else:
            reason = getattr(e, "reason", None) or e
        raise UserError(f"cannot download {url} ({' '.join(str(reason).split())[:120]}); {fix}") from None
    except BaseException:  # an interrupt: no .part left behind
        tmp.unlink(missing_ok=True)
        raise
    if (actual := sha256_file(tmp)) != sha256:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"{url} has sha256 {actual[:12]}... but the model card pins {sha256[:12]}...: the server holds "
            f"a damaged file or another model's (nothing was cached); {fix}"
        )
    os.replace(tmp, target)


def cached_download(url: str, sha256: str, name: str, fix: str) -> Path:
    """The file ``name`` of the weights ``sha256`` in the cache, downloaded from ``url`` when absent;
    a cached copy damaged since is a one-line error naming it."""
    target = sha_folder(sha256) / name
    if not target.is_file():
        download(url, target, sha256, fix)
    elif (actual := sha256_file(target)) != sha256:
        raise UserError(
            f"the cached weights {target} have sha256 {actual[:12]}... but the card pins {sha256[:12]}... "
            f"(damaged since they were downloaded): delete {target} to download them again"
        )
    return target
