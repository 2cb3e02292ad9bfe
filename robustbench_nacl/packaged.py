"""Data files that ship inside the package (``robustbench_nacl/files/``), found through importlib.resources.

The zoo manifests, attack suites, published reference models and the model-card schema live in
the package, so a wheel installed anywhere finds them; the repository's top-level ``zoo/`` and
``attacks/`` are symbolic links to these folders (docs/decisions.md, 'Packaged data').
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def files_dir() -> Path:
    """The package's data folder (a real directory: wheels and editable installs unpack to disk)."""
    return Path(str(files("robustbench_nacl") / "files"))


def zoo_dir() -> Path:
    """The shipped zoo manifests: one folder per zoo."""
    return files_dir() / "zoo"


def attacks_dir() -> Path:
    """The shipped attack suites (``*.toml``)."""
    return files_dir() / "attacks"


def published_dir() -> Path:
    """The published reference models: weights, linear heads, result rows and cards."""
    return files_dir() / "published"


def schema_path(name: str) -> Path:
    """A shipped JSON Schema (``files/schemas/<name>.schema.json``)."""
    return files_dir() / "schemas" / f"{name}.schema.json"
