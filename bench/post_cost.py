"""Figure ``post_cost``: what the "++" post-processing (robustbench_nacl/post/) costs, against one
SLF evaluation of the same encoder, measured on digits.

A DynACL parent (convnet_small, width 32, 1 epoch on the digits training images: timing only) is
post-processed with each recipe at the authors' settings (10 LP epochs, 25 AFT epochs of TRADES
with 10 steps, batch 512, drop_last: 2 batches per epoch on digits' 1437 training images); each
stage is timed (the manifest's ``post.wall_s``). The denominator is the SLF probe of the same
parent, ``fit_linear_probe`` with its defaults (features once, then the head on the cache), timed
whole: what ``eval`` spends per setting before attacking.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import log


def _parent(root: Path) -> Path:
    from robustbench_nacl.training import TrainConfig, train

    cfg = TrainConfig(
        loss="dynacl", dataset="digits", encoder="convnet_small", epochs=1, batch_size=256, knn_every=0
    )
    return train(cfg, root / "parent", device="cpu", progress=False)


def _slf(parent: Path) -> float:
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.eval.probe import fit_linear_probe
    from robustbench_nacl.models.foreign import load_encoder

    encoder, _ = load_encoder(parent)
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    t0 = time.perf_counter()
    fit_linear_probe(encoder, train, test)
    return time.perf_counter() - t0


def _post(parent: Path, recipe: str, out: Path) -> dict[str, float]:
    from robustbench_nacl.post import post_process

    t0 = time.perf_counter()
    post_process(parent, recipe, out, device="cpu", progress=False)
    walls = json.loads((out / "manifest.json").read_text())["post"]["wall_s"]
    return {**walls, "total": round(time.perf_counter() - t0, 2)}


def _n_train() -> int:
    from robustbench_nacl.data import load_dataset

    return len(load_dataset("digits", "train"))


def run(args: Any) -> dict[str, Any]:
    """Both recipes, each between two SLF probes (the machine's load drifts: each ratio uses the
    mean of the probes beside it); the value is dynacl++'s total over one SLF probe."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log("post_cost: training the parent")
        parent = _parent(root)
        _slf(parent)  # warm-up (lazy imports, first kernels)
        cases, slf = {}, [_slf(parent)]
        for recipe in ("dynacl++", "air++"):
            log(f"post_cost: {recipe}")
            cases[recipe] = _post(parent, recipe, root / recipe.replace("+", "p"))
            slf.append(_slf(parent))
    ratios = {r: round(c["total"] / ((slf[i] + slf[i + 1]) / 2), 1) for i, (r, c) in enumerate(cases.items())}
    return {
        "figure": "post_cost",
        "value": ratios["dynacl++"],
        "unit": "x: post-processing (pseudo-labels + LP + AFT) time / one SLF probe, convnet_small on digits",
        "target": "report only",
        "met": True,
        "config": {
            "slf_s": [round(t, 2) for t in slf],
            "post_s": cases,
            "over_slf": ratios,
            "threads": torch.get_num_threads(),
            "n_train": _n_train(),
        },
    }
