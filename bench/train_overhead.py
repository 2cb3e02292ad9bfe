"""Figure ``train_overhead``: the trainer's full step divided by the pure model compute of the same shapes.

Contenders, same process, same model and optimizer, same precision, run alternately:

- ``trainer_step``: ``robustbench_nacl.training.TrainStep``, the code ``train()`` runs for every batch:
  gather the batch from the uint8 training tensor, batched SimCLR views (``augment.VIEW_MAKERS``), one
  forward per view, the loss from ``losses.OBJECTIVES``, backward, Adam step;
- ``pure_compute``: the same model on pre-made views (``TrainStep.views`` of one batch, made once, so of
  the same shape, dtype and memory format): forward of each, a trivial loss (sum of the products of the
  two outputs), backward, Adam step.
"""

from __future__ import annotations

from typing import Any

import torch
from common import interleaved, log, median, paired_ratios, rounded

TARGET = 1.15


def _setup(encoder: str, batch: int) -> tuple[Any, Any, torch.Tensor, dict[str, Any]]:
    """Model, TrainStep, the uint8 training pool and a description of the data."""
    from robustbench_nacl import losses
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.training import TrainConfig, TrainStep, build_model

    if encoder == "convnet_small":
        dataset = "fashion-mnist"
        pool = load_dataset(dataset, "train").x[: 8 * batch]
        data = f"fashion-mnist train images 0-{len(pool) - 1} (1x28x28 uint8)"
    else:
        dataset = "cifar10"  # only for the normalisation constants: no CIFAR data is read
        g = torch.Generator().manual_seed(0)
        pool = torch.randint(0, 256, (4 * batch, 3, 32, 32), dtype=torch.uint8, generator=g)
        data = "random uint8 tensors of CIFAR's shape (3x32x32); no CIFAR on this machine"
    cfg = TrainConfig(loss="simclr", dataset=dataset, encoder=encoder, batch_size=batch)
    params = losses.resolve(cfg.loss)
    _, c, h, w = pool.shape
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=c, size=(h, w), num_classes=10)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step = TrainStep(cfg, params, model, optimizer)
    return model, step, pool, {"dataset": data, "loss": cfg.loss, "views": params.views}


def measure(encoder: str, *, batch: int, reps: int) -> dict[str, Any]:
    """Interleaved medians and the ratio for one encoder."""
    model, step, pool, data = _setup(encoder, batch)
    optimizer = step.optimizer
    n_views = step.need.n_views
    gen = torch.Generator().manual_seed(1)
    y = torch.zeros(batch, dtype=torch.long)
    _, c, h, w = pool.shape
    # the trainer's own views of one batch, made once: same shapes, dtype and memory format
    premade = step.views(pool[:batch], torch.Generator().manual_seed(2))
    perm = torch.randperm(len(pool), generator=gen)  # the trainer draws one permutation per epoch
    slot = {"i": 0}

    def batch_idx() -> torch.Tensor:
        i = slot["i"] = (slot["i"] + 1) % (len(pool) // batch)
        return perm[i * batch : (i + 1) * batch]

    def trainer_step() -> None:
        step(pool[batch_idx()], y, gen)

    def pure_compute() -> None:
        z = [model(v) for v in premade]
        loss = (z[0] * z[1]).sum() if len(z) > 1 else z[0].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    contenders = {"trainer_step": trainer_step, "pure_compute": pure_compute}
    log(f"train_overhead {encoder}: {reps} interleaved repetitions of {list(contenders)}")
    times = interleaved(contenders, reps=reps, warmup=1)
    med = {k: median(v) for k, v in times.items()}
    ratio = med["trainer_step"] / med["pure_compute"]
    out: dict[str, Any] = {
        "ratio": round(ratio, 4),
        "met": ratio <= TARGET,
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "raw_s": {k: rounded(v) for k, v in times.items()},
        "images_per_step": batch * n_views,
        "batch": batch,
        "input": [c, h, w],
        **data,
    }
    out["paired_ratios"] = paired_ratios(times, "trainer_step", "pure_compute")
    return out


def run(args: Any) -> dict[str, Any]:
    """Both encoders; the figure's value is the larger of the two ratios (the target applies to each)."""
    encoders = {"convnet_small": args.reps or 7, "resnet18_cifar": args.reps_resnet or 3}
    results = {enc: measure(enc, batch=256, reps=reps) for enc, reps in encoders.items()}
    value = max(r["ratio"] for r in results.values())
    return {
        "figure": "train_overhead",
        "value": value,
        "unit": "ratio: trainer step time / pure model compute time (max over the encoders)",
        "target": f"<= {TARGET} for each encoder",
        "met": all(r["met"] for r in results.values()),
        "config": {
            "encoders": results,
            "precision": "fp32",
            "memory_format": "channels_last (train's default), model and views",
            "optimizer": "Adam lr 3e-4",
            "pure_compute": "forward of each pre-made view tensor, sum(z1*z2), backward, Adam step",
            "method": "same process and model, contenders alternated, median of the repetitions",
        },
    }
