"""Figure ``train_vs_reference``: images/s of our trainer over a reference-style (HCL/DCL) pipeline.

Both train the same model (``convnet_small`` + CLAE head, built by ``train.build_model`` from the same
seed) on the same Fashion-MNIST images (28x28) with the same batch size, precision (fp32), optimizer
(Adam 3e-4) and torch threads, in one process, alternately. Ours is in ``train``'s default
channels-last memory format, the reference in NCHW, as the public HCL/DCL code runs it:

- ``ours``: ``train.TrainStep`` (what ``train()`` runs per batch) over a fresh permutation of a
  pool of ``steps * batch`` images held as one uint8 tensor;
- ``reference``: ``bench/reference.py``: PIL images, per-sample torchvision transforms in a
  ``DataLoader`` with 2 workers, two forward passes, HCL's NT-Xent; a fresh loader epoch over the same
  pool each repetition (worker start-up included, as in every real epoch).

- ``pure_compute``: the ceiling, our model's forward/backward/Adam step on pre-made views (the
  trainer's own views of one batch, made once).

Images/s counts source images (each gives two views on both sides). The GPU target (>= 3 for
resnet18_cifar) cannot be measured on this machine; the figure says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import reference
import torch
from common import interleaved, log, median, paired_ratios, rounded

TARGET_CPU = 1.2
TARGET_GPU = 3.0


def run(args: Any) -> dict[str, Any]:
    """Measure both pipelines alternately and report the images/s ratio."""
    from robustbench_nacl import losses
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.training import TrainConfig, TrainStep, build_model

    batch, steps, workers = 256, (3 if args.quick else 6), 2
    reps = args.reps or (2 if args.quick else 3)
    data = load_dataset("fashion-mnist", "train")
    pool_x, pool_y = data.x[: steps * batch], data.y[: steps * batch]
    cfg = TrainConfig(loss="simclr", dataset="fashion-mnist", encoder="convnet_small", batch_size=batch)
    params = losses.resolve(cfg.loss)
    device = torch.device("cpu")

    def model_and_opt(c: TrainConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = build_model(c, params, channels=1, size=(28, 28), num_classes=10).to(device)
        return m, torch.optim.Adam(m.parameters(), lr=c.lr)

    ours_model, ours_opt = model_and_opt(cfg)  # as train() builds it: channels-last by default
    # the same weights in NCHW, the only layout the public HCL/DCL code uses
    ref_model, ref_opt = model_and_opt(dataclasses.replace(cfg, channels_last=False))
    step = TrainStep(cfg, params, ours_model, ours_opt)
    gen = torch.Generator().manual_seed(0)
    dataset = reference.PairDataset(pool_x, pool_y, reference.simclr_transform(28))
    epoch = {"n": 0}

    def ours() -> None:
        ours_model.train()
        perm = torch.randperm(len(pool_x), generator=gen)
        for i in range(steps):
            idx = perm[i * batch : (i + 1) * batch]
            step(pool_x[idx], pool_y[idx], gen)

    def ref() -> None:
        epoch["n"] += 1
        loader = reference.make_loader(dataset, batch, workers, seed=epoch["n"])
        seen = reference.train_steps(ref_model, loader, ref_opt, temperature=params.t, device=device)
        assert seen == steps * batch

    premade = step.views(pool_x[:batch], torch.Generator().manual_seed(1))  # made once, as the trainer feeds

    def pure_compute() -> None:
        # the ceiling: the same model's forward/backward/step on pre-made views, no data pipeline at all
        ours_model.train()
        for _ in range(steps):
            z = [ours_model(v) for v in premade]
            loss = (z[0] * z[1]).sum()
            ours_opt.zero_grad(set_to_none=True)
            loss.backward()
            ours_opt.step()

    contenders = {"ours": ours, "reference": ref, "pure_compute": pure_compute}
    log(f"train_vs_reference: {reps} interleaved repetitions of {steps} steps x batch {batch}")
    times = interleaved(contenders, reps=reps, warmup=1)
    ips = {k: steps * batch / median(v) for k, v in times.items()}
    ratio = ips["ours"] / ips["reference"]
    return {
        "figure": "train_vs_reference",
        "value": round(ratio, 4),
        "unit": "ratio: our trainer's images/s / reference pipeline's images/s (convnet_small, CPU)",
        "target": f">= {TARGET_CPU} (convnet_small, 28x28, 2 CPU cores)",
        "met": ratio >= TARGET_CPU,
        "gpu_target": f">= {TARGET_GPU} for resnet18_cifar on a GPU: not measured, no GPU here",
        "images_per_s": {k: round(v, 2) for k, v in ips.items()},
        "paired_ratios": paired_ratios(times, "reference", "ours"),
        "ceiling": {
            "pure_compute_over_reference": round(ips["pure_compute"] / ips["reference"], 4),
            "ours_over_pure_compute": round(ips["ours"] / ips["pure_compute"], 4),
        },
        "raw_s": {k: rounded(v) for k, v in times.items()},
        "config": {
            "encoder": "convnet_small (width 32) + clae head",
            "dataset": f"fashion-mnist train images 0-{len(pool_x) - 1} (1x28x28)",
            "batch": batch,
            "steps_per_repetition": steps,
            "repetitions": reps,
            "precision": "fp32",
            "memory_format": {"ours": "channels_last (train's default)", "reference": "NCHW"},
            "optimizer": "Adam lr 3e-4",
            "ours": "TrainStep, simclr preset: batched views of the uint8 tensor, ColorJitter(.8,.8,.8,.2)",
            "reference": (
                "PIL + per-sample torchvision transforms (RandomResizedCrop, flip, "
                "ColorJitter(0.4,0.4,0.4,0.1) p=0.8, RandomGrayscale 0.2), "
                f"DataLoader num_workers={workers}, two forwards, HCL NT-Xent"
            ),
            "temperature": params.t,
        },
    }
