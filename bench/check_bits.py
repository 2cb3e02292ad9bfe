"""Check that the trainer's one-thread fast paths leave every weight bit unchanged.

``python bench/check_bits.py``: for every loss preset (and bf16 + channels_last, and fused views),
three ``TrainStep`` steps with the fast paths on and three with them off (``unfixed_trainer``) from
the same initial weights and generator seed, on 2 threads; the weights must be bit-identical. Prints
one JSON line; exit code 1 on any difference. Not a figure: a guard to run after touching the step.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import set_threads, unfixed_trainer

M_PRESETS = ("nca", "mixnca", "nca_mixnca", "var", "intnacl")


def _run(preset: str, batch: int, extra: dict[str, Any], fast: bool) -> list[torch.Tensor]:
    from robustbench_nacl import losses
    from robustbench_nacl.trainer import TrainConfig, TrainStep, build_model

    overrides = {"M": 3} if preset in M_PRESETS else {}
    cfg = TrainConfig(
        loss=preset,
        overrides=overrides,
        dataset="digits",
        encoder="convnet_small",
        encoder_kwargs={"width": 8},
        batch_size=batch,
        **extra,
    )
    params = losses.resolve(preset, overrides)
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=1, size=(8, 8), num_classes=10)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters(), lr=3e-3))
    data = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (batch, 1, 8, 8), dtype=torch.uint8, generator=data)
    y = torch.randint(0, 10, (batch,), generator=data)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        if fast:
            step(x, y, gen)
        else:
            with unfixed_trainer():
                step(x, y, gen)
    return [copy.deepcopy(p.detach()) for p in model.state_dict().values()]


def main() -> int:
    """Compare every configuration; print one JSON line."""
    from robustbench_nacl import losses

    set_threads(2)
    configs = [(p, b, {}) for p in losses.PRESETS.names() for b in (64, 256)]
    configs += [
        ("simclr", 64, {"precision": "bf16", "channels_last": True}),
        ("simclr", 64, {"fuse_views": True}),
        ("intnacl", 64, {"precision": "bf16"}),
    ]
    differ = []
    for preset, batch, extra in configs:
        a = _run(preset, batch, extra, fast=True)
        b = _run(preset, batch, extra, fast=False)
        if not all(torch.equal(u, v) for u, v in zip(a, b, strict=True)):
            differ.append(f"{preset} b{batch} {extra}")
    print(json.dumps({"check": "bit_identity", "configs": len(configs), "differ": differ, "ok": not differ}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
