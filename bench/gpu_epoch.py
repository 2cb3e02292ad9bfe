"""Figure ``gpu_epoch``: one SimCLR epoch of resnet18_cifar on a GPU, extrapolated to 100 epochs.

Our ``TrainStep`` (simclr preset, batch 256, bf16 autocast, channels_last, no ``torch.compile``: whether
it helps was never measured, no GPU was lent to this task) on CIFAR-100-sized data held on the GPU:
50,000 **random uint8 tensors of CIFAR's shape** (CIFAR cannot be downloaded on these machines; the time
does not depend on the pixel values). Target: 100 epochs in at most 600 s on one H100.

Without CUDA the figure prints ``"value": null`` with ``"skipped"``: it is never estimated from a CPU.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from common import log

TARGET_S = 600.0
N_IMAGES = 50_000


def run(args: Any) -> dict[str, Any]:
    """Time one epoch (after a short warm-up) and extrapolate to 100 epochs."""
    base = {
        "figure": "gpu_epoch",
        "unit": "s per 100 epochs (one measured epoch x 100)",
        "target": f"<= {TARGET_S:.0f} s for 100 epochs on one H100",
    }
    if not torch.cuda.is_available():
        return {
            **base,
            "value": None,
            "skipped": "no GPU in this environment",
            "met": None,
            "config": {"encoder": "resnet18_cifar", "batch": 256, "precision": "bf16", "channels_last": True},
        }
    from robustbench_nacl import losses
    from robustbench_nacl.training import TrainConfig, TrainStep, build_model

    dev = torch.device("cuda")
    cfg = TrainConfig(
        loss="simclr",
        dataset="cifar100",  # normalisation constants only: the data below is random
        encoder="resnet18_cifar",
        batch_size=256,
        precision="bf16",
        channels_last=True,
    )
    params = losses.resolve(cfg.loss)
    torch.manual_seed(0)
    # NHWC: build_model applies cfg.channels_last
    model = build_model(cfg, params, channels=3, size=(32, 32), num_classes=100).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step = TrainStep(cfg, params, model, optimizer)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randint(0, 256, (N_IMAGES, 3, 32, 32), dtype=torch.uint8, device=dev, generator=g)
    y = torch.randint(0, 100, (N_IMAGES,), device=dev, generator=g)
    steps = N_IMAGES // cfg.batch_size
    model.train()
    for i in range(10):  # warm-up: cuDNN autotuning, allocator
        step(x[i * 256 : (i + 1) * 256], y[i * 256 : (i + 1) * 256], g)
    torch.cuda.synchronize()
    log(f"gpu_epoch: timing one epoch of {steps} steps on {torch.cuda.get_device_name(0)}")
    t0 = time.perf_counter()
    perm = torch.randperm(N_IMAGES, generator=g, device=dev)
    for i in range(steps):
        idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        step(x[idx], y[idx], g)
    torch.cuda.synchronize()
    epoch_s = time.perf_counter() - t0
    value = epoch_s * 100
    return {
        **base,
        "value": round(value, 1),
        "met": value <= TARGET_S,
        "epoch_s": round(epoch_s, 2),
        "config": {
            "encoder": "resnet18_cifar + clae head, simclr preset",
            "batch": cfg.batch_size,
            "precision": "bf16 autocast",
            "channels_last": True,
            "torch_compile": False,
            "data": f"{N_IMAGES} random uint8 tensors of CIFAR's shape on the GPU (not CIFAR)",
            "steps_per_epoch": steps,
        },
    }
