"""The user's cache of downloaded weights, and the one way a file enters it: an http(s) download whose
sha256 is checked before it is moved into place (docs/decisions.md, 'Packaged data and published
models').

A downloaded file's name in the cache is chosen here, never by the URL or by a submission's
manifest, so no download can land outside the cache; ``file://``, ``ftp://`` and other schemes
are refused, so a URL cannot read a local file; a file that does not match its pinned sha256 is
deleted before it reaches the cache, so a wrong URL fails once and a corrected one then works.
"""

from __future__ import annotations

import os
import re
import shutil
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


def download(url: str, target: Path, sha256: str, fix: str) -> None:
    """Download ``url`` to ``target`` atomically; a file that does not have ``sha256`` is deleted
    before it reaches ``target``, so the cache never holds a damaged or wrong download."""
    check_url(url)
    tmp = target.with_name(f".{target.name}.part")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            if urllib.parse.urlsplit(response.geturl()).scheme.lower() not in SCHEMES:
                raise ValueError(f"redirected to {response.geturl()[:80]}")  # never off http(s)
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, urllib.error.HTTPError):
            reason: object = f"HTTP {e.code} {e.reason}"
        else:
            reason = getattr(e, "reason", None) or e
        raise UserError(f"cannot download {url} ({' '.join(str(reason).split())[:120]}); {fix}") from None
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
