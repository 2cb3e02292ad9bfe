"""The model zoo: one JSON manifest per entry under ``zoo/`` (data shipped in the package, not code).

An entry names an encoder, a loss preset with its overrides, a dataset, a recipe and a seed; once
trained, its checkpoint directory holds ``weights.safetensors`` whose sha256 ``zoo verify``
re-checks. The shipped zoos: ``paper`` (CIFAR-100, resnet18_cifar, the NaCl recipe, every preset and
the ablation grids, 5 seeds; for GPUs), ``robust-ssl-cifar10`` (CIFAR-10, resnet18_cifar, the
robust-SSL methods at their authors' recipes; for GPUs), ``fashion-mnist`` (the reference of
leaderboard/) and ``demo`` (digits, a small convnet, one entry per family).

``entry`` holds the record, ``manifests`` the files (schema checks, load, write), ``verify`` the
sha256 checks and ``generated`` the shipped zoos made from the presets. An entry with a ``post``
field is made by the ++ post-processing of another entry's checkpoint (robustbench_nacl/post/).
"""

from .entry import (
    RECIPE_KEYS,
    ZooEntry,
    checkpoint_dir,
    expected_id,
    is_trained,
    post_parent_dir,
    teacher_dir,
)
from .generated import (
    GENERATED_ZOOS,
    POST_OF,
    TEACHER_PRESET,
    demo_zoo,
    fashion_mnist_zoo,
    is_package_preset,
    package_presets,
    paper_zoo,
    post_entries,
    regenerate,
    teacher_of,
    zoo_presets,
)
from .manifests import (
    EVAL_KEYS,
    ZOO_ENV,
    check_posts,
    check_teachers,
    find_entry,
    has_dual_bn,
    load_zoo,
    no_zoo_error,
    parse_entry,
    write_entry,
    zoo_names,
    zoo_root,
)
from .verify import VerifyReport, verify_entries, verify_entry

__all__ = [
    "EVAL_KEYS",
    "GENERATED_ZOOS",
    "POST_OF",
    "RECIPE_KEYS",
    "TEACHER_PRESET",
    "ZOO_ENV",
    "VerifyReport",
    "ZooEntry",
    "check_posts",
    "check_teachers",
    "checkpoint_dir",
    "demo_zoo",
    "expected_id",
    "fashion_mnist_zoo",
    "find_entry",
    "has_dual_bn",
    "is_package_preset",
    "is_trained",
    "load_zoo",
    "no_zoo_error",
    "package_presets",
    "paper_zoo",
    "parse_entry",
    "post_entries",
    "post_parent_dir",
    "regenerate",
    "teacher_dir",
    "teacher_of",
    "verify_entries",
    "verify_entry",
    "write_entry",
    "zoo_names",
    "zoo_presets",
    "zoo_root",
]
