"""Figure ``probe_speedup``: our cached-feature linear probe vs re-encoding the data every epoch.

Both train the same linear layer (Adam 3e-4, batch 256, the paper's 1000 epochs) on the frozen
encoder's features of real Fashion-MNIST images (``robustbench_nacl.data.load_dataset``), with the
test accuracy computed every epoch (our probe logs the best epoch):

- ``ours``: ``probe.fit_linear_probe`` (features once, then the fused-Adam loop on the cached tensor),
  measured in full for 1000 epochs, kNN metric included;
- ``re-encode``: every epoch encodes the training images batch by batch (eval mode, no grad), takes an
  autograd Adam step of the linear layer per batch, then encodes the test images for the accuracy:
  the pipeline without a feature cache. Measured for one epoch per repetition, extrapolated x1000.

The encoder is a random-initialisation ``convnet_small``: the cost of both does not depend on the
weights. The contenders alternate: re-encode epoch, ours, re-encode epoch, ours, ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from common import interleaved, log, median, rounded
from torch import nn

EPOCHS = 1000


def run(args: Any) -> dict[str, Any]:
    """Measure and extrapolate; the value is the speed-up factor."""
    from robustbench_nacl.data import load_dataset, normalization
    from robustbench_nacl.eval.probe import ProbeConfig, fit_linear_probe
    from robustbench_nacl.models.factory import create_encoder

    n_train, n_test = (2000, 500) if args.quick else (10_000, 2_000)
    reps = args.reps or (1 if args.quick else 2)
    train = load_dataset("fashion-mnist", "train")
    test = load_dataset("fashion-mnist", "test")
    train = dataclasses.replace(train, x=train.x[:n_train], y=train.y[:n_train])
    test = dataclasses.replace(test, x=test.x[:n_test], y=test.y[:n_test])
    torch.manual_seed(0)
    mean, std = normalization("fashion-mnist")
    encoder = create_encoder("convnet_small", in_channels=1, mean=mean, std=std)
    encoder.eval().requires_grad_(False)
    cfg = ProbeConfig(epochs=EPOCHS)
    result: dict[str, Any] = {}

    def ours() -> None:
        _, res = fit_linear_probe(encoder, train, test, cfg)
        result["ours_test_acc"] = res.test_acc

    head = nn.Linear(encoder.feature_dim, train.num_classes)
    opt = torch.optim.Adam(head.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(0)
    bs = cfg.batch_size

    def reencode_epoch() -> None:
        perm = torch.randperm(n_train, generator=gen)
        for i in range(0, n_train, bs):
            idx = perm[i : i + bs]
            with torch.no_grad():
                f = encoder(train.x[idx].float() / 255.0)
            loss = F.cross_entropy(head(f), train.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        correct = 0
        with torch.no_grad():
            for i in range(0, n_test, 512):
                f = encoder(test.x[i : i + 512].float() / 255.0)
                correct += int((head(f).argmax(1) == test.y[i : i + 512]).sum())
        result["reencode_test_acc_after_epochs"] = correct / n_test

    log(f"probe_speedup: {reps} interleaved repetitions (1 re-encode epoch, 1 full {EPOCHS}-epoch probe)")
    times = interleaved({"reencode_epoch": reencode_epoch, "ours_1000_epochs": ours}, reps=reps, warmup=0)
    ours_s = median(times["ours_1000_epochs"])
    reencode_s = median(times["reencode_epoch"]) * EPOCHS
    factor = reencode_s / ours_s
    return {
        "figure": "probe_speedup",
        "value": round(factor, 1),
        "unit": "x: re-encoding every epoch (extrapolated) / our cached-feature probe, 1000 epochs",
        "target": "report the factor (no threshold)",
        "seconds": {
            "ours_1000_epochs": round(ours_s, 2),
            "reencode_1000_epochs_extrapolated": round(reencode_s, 1),
        },
        "raw_s": {k: rounded(v) for k, v in times.items()},
        "config": {
            "dataset": f"fashion-mnist: first {n_train} train / first {n_test} test images (28x28)",
            "encoder": "convnet_small (width 32), random initialisation, eval mode",
            "probe": "linear, Adam lr 3e-4, batch 256, 1000 epochs, test accuracy every epoch",
            "extrapolation": f"re-encode: median of {reps} measured single epochs x {EPOCHS}",
            "ours_test_acc": result.get("ours_test_acc"),
        },
    }
