"""Replaying an AutoAttack row with pyautoattack called directly (fra31's code, packaged), example by
example: what an outsider needs to check a published row, and nothing of this package's attack code.

A row's AutoAttack ran as one ``AutoAttack`` call per attacked chunk: the clean-correct examples (of
the first ``subset`` when the suite sets one), in index order, cut into ``aa_chunk_sizes``, the
``k``-th call seeded with ``aa_seeds[k]`` and given ``batch_size`` = its chunk's length. Rows written
before those two fields existed (the reference board's) are replayed from the seeds the benchmark
derives (:func:`derived_seeds`): the same numbers, computed instead of read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..results.bits import decode_bits


def derived_seeds(row: Mapping[str, Any], n_attacked: int) -> tuple[list[int], list[int]]:
    """(seeds, chunk sizes) of a row that does not record them: ``eval.benchmark`` seeds a generator
    with ``derive_seed(seed, attack, norm, attack_params, eps)`` and draws one seed per chunk of the
    row's batch size (``attack_batch_size`` when memory forced a smaller one)."""
    from .rng import derive_seed, seed_from

    bs = int(row.get("attack_batch_size") or row["batch_size"])
    # the generator lives on the attacked device ("cpu (x86_64, ...)" or "cuda ..." in a written row)
    device = torch.device("cuda" if str(row.get("device", "cpu")).startswith("cuda") else "cpu")
    root = derive_seed(row["seed"], row["attack"], row["norm"], dict(row["attack_params"]), row["eps"])
    gen = torch.Generator(device=device).manual_seed(root)
    sizes = [min(bs, n_attacked - i) for i in range(0, n_attacked, bs)]
    return [seed_from(gen) for _ in sizes], sizes


def seeds_and_chunks(row: Mapping[str, Any], n_attacked: int) -> tuple[list[int], list[int], bool]:
    """(seeds, chunk sizes, recorded): the row's own ``aa_seeds``/``aa_chunk_sizes`` when it has them."""
    if "aa_seeds" in row:
        return list(row["aa_seeds"]), list(row["aa_chunk_sizes"]), True
    return (*derived_seeds(row, n_attacked), False)


def _config(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """What ran (``attacks_run``, ``n_target_classes``, ``version``): a written row's
    ``attack_config``, or the ``params`` of a row straight from ``benchmark``."""
    return row["attack_config"] if "attack_config" in row else row["params"]


def _version(row: Mapping[str, Any]) -> str:
    return str(row.get("attack_params", row.get("params", {})).get("version", "standard"))


def _autoattack(model: nn.Module, row: Mapping[str, Any], seed: int, attacks: list[str]) -> Any:
    """pyautoattack's AutoAttack as the row describes it (version, components, targets)."""
    from pyautoattack import AutoAttack

    version = _version(row)
    device = next(model.parameters()).device
    common = {"device": device, "eps": row["eps"], "norm": row["norm"], "seed": seed}
    if version == "custom":
        aa = AutoAttack(model, attacks=attacks, version="custom", **common)
    else:  # a screening row ran standard's components, as ``version="standard"`` sets them
        aa = AutoAttack(model, version="plus" if version == "plus" else "standard", **common)
        aa.attacks_to_run = attacks
    n_targets = _config(row)["n_target_classes"]
    aa.apgd_targeted.n_target_classes = n_targets
    aa.fab.n_target_classes = n_targets
    return aa


def _correct(aa: Any, x: Tensor, y: Tensor) -> Tensor:
    """Which of ``x`` AutoAttack leaves classified correctly (its own returned predictions)."""
    _, y_adv = aa.run_standard_evaluation(x, y, batch_size=max(1, len(x)))
    return y_adv == y


def replay_row(model: nn.Module, x: Tensor, y: Tensor, row: Mapping[str, Any]) -> dict[str, Any]:
    """Run the AutoAttack of ``row`` again with pyautoattack on ``model`` and the row's examples ``x``
    (in [0,1], the row's ``n_examples_evaluated``), ``y``; returns ``robust`` (the replayed per-example
    mask), ``matches`` (equal to the row's ``robust_bits``), the seeds and chunks used and whether
    the row recorded them."""
    n = int(row.get("n_examples_evaluated", row["n_examples"]))
    clean = torch.from_numpy(decode_bits(row["clean_bits"], n)).to(x.device)
    attacked = clean.nonzero().flatten()
    seeds, sizes, recorded = seeds_and_chunks(row, len(attacked))
    attacks = list(_config(row)["attacks_run"])
    screen = _version(row) == "screen"
    sampled = torch.from_numpy(decode_bits(row["aa_screen_sample_bits"], n)) if screen else None
    robust = torch.zeros(n, dtype=torch.bool, device=x.device)
    for seed, idx in zip(seeds, torch.split(attacked, sizes), strict=True):
        first = [a for a in attacks if a in ("apgd-ce", "apgd-t")] if screen else attacks
        ok = _correct(_autoattack(model, row, seed, first), x[idx], y[idx])
        robust[idx] = ok
        if sampled is not None:  # the sampled survivors meet FAB-T and Square, as recorded
            late = [a for a in attacks if a not in first]
            pick = idx[sampled[idx.cpu()].to(idx.device)]
            if len(pick) and late:
                robust[pick] = _correct(_autoattack(model, row, seed, late), x[pick], y[pick])
    want = torch.from_numpy(decode_bits(row["robust_bits"], n)).to(x.device)
    return {
        "robust": robust,
        "matches": bool(torch.equal(robust, want)),
        "n_differ": int((robust != want).sum()),
        "seeds": seeds,
        "chunk_sizes": sizes,
        "recorded": recorded,
    }
