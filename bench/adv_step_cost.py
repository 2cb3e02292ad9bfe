"""Figure ``adv_step_cost``: each adversarial-pretraining method's training step / SimCLR's, on a CPU.

Every contender is ``robustbench_nacl.training.TrainStep`` (the code ``train()`` runs per batch: views,
the objective, backward, Adam) of its preset with the preset's defaults, the same encoder, batch and
images, run alternately in one process. Expected: about ``attack_steps + 1`` forward/backward passes
per attacked view against SimCLR's one (the inner PGD is ``attack_steps`` forward+input-backward
passes of the attacked batch, then the training forward/backward over clean and adversarial views).
DeACL's teacher is a 1-epoch ``simclr`` checkpoint of the same encoder, trained first (its time is
not counted).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from common import interleaved, log, median, rounded

PRESETS = ("simclr", "adv", "acl", "rocl", "dynacl", "deacl", "acl_air", "dynacl_air")


def _step(preset: str, pool: torch.Tensor, batch: int, overrides: dict[str, Any]) -> Any:
    from robustbench_nacl import losses
    from robustbench_nacl.training import TrainConfig, TrainStep, build_model

    cfg = TrainConfig(
        loss=preset,
        overrides=overrides,
        dataset="digits",
        encoder="convnet_small",
        encoder_kwargs={"width": 16},
        batch_size=batch,
    )
    params = losses.resolve(preset, overrides)
    _, c, h, w = pool.shape
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=c, size=(h, w), num_classes=10)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return TrainStep(cfg, params, model, optimizer)


def run(args: Any) -> dict[str, Any]:
    """Median step time of every preset and its ratio to SimCLR's."""
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.training import TrainConfig, train

    batch = 128 if args.quick else 256
    reps = args.reps or (2 if args.quick else 5)
    pool = load_dataset("digits", "train").x
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Path(tmp) / "teacher"
        train(
            TrainConfig(
                loss="simclr",
                dataset="digits",
                encoder_kwargs={"width": 16},
                epochs=1,
                batch_size=batch,
                knn_every=0,
            ),
            teacher,
            progress=False,
        )
        steps = {p: _step(p, pool, batch, {"teacher": str(teacher)} if p == "deacl" else {}) for p in PRESETS}
        gen = torch.Generator().manual_seed(1)
        y = torch.zeros(batch, dtype=torch.long)
        perm = torch.randperm(len(pool), generator=gen)
        idx = perm[:batch]
        contenders = {p: (lambda s=s: s(pool[idx], y, gen)) for p, s in steps.items()}
        log(f"adv_step_cost: {reps} interleaved repetitions of {list(contenders)}")
        times = interleaved(contenders, reps=reps, warmup=1)
    med = {k: median(v) for k, v in times.items()}
    ratios = {k: round(v / med["simclr"], 2) for k, v in med.items()}
    return {
        "figure": "adv_step_cost",
        "value": ratios,
        "unit": "training step time / SimCLR's step time (median of interleaved repetitions)",
        "target": "report (expected about attack_steps + 1 for ACL/DynACL/RoCL/DeACL)",
        "met": None,
        "config": {
            "encoder": "convnet_small width 16",
            "data": f"digits train images (1x8x8 uint8), batch {batch}",
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "raw_s": {k: rounded(v) for k, v in times.items()},
            "attack_steps": {
                "acl": 5,
                "dynacl": 5,
                "rocl": 7,
                "deacl": 5,
                "acl_air": 5,
                "dynacl_air": 5,
                "adv": "1 (FGSM)",
            },
            "precision": "fp32",
            "method": "TrainStep of each preset, same process and images, contenders alternated",
        },
    }
