"""Datasets as uint8 tensors: registry, spec grammar, loaders, file formats, shifts.

A dataset is addressed by a spec ``name[:classes][@shift]`` (data/spec.py), parsed once into a
:class:`DatasetSpec`; :func:`load_dataset` reads one split of it. Importing the package registers
the built-in loaders (data/loaders.py, data/released.py).
"""

from . import loaders as _loaders  # noqa: F401  # registers the built-in datasets in DATASETS
from . import released as _released  # noqa: F401  # registers stl10-32 (the benchmark's STL-10)
from .catalog import DATASETS, SPLITS, Loader, dataset_names
from .formats import read_idx, restricted_unpickle
from .load import ENV_VAR, ImageData, clear_cache, data_root, load_dataset
from .spec import DatasetSpec, canonical_spec, normalization, parse_spec

__all__ = [
    "DATASETS",
    "ENV_VAR",
    "SPLITS",
    "DatasetSpec",
    "ImageData",
    "Loader",
    "canonical_spec",
    "clear_cache",
    "data_root",
    "dataset_names",
    "load_dataset",
    "normalization",
    "parse_spec",
    "read_idx",
    "restricted_unpickle",
]
