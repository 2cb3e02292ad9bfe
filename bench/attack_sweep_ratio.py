"""Figure ``attack_sweep_ratio``: our paper-suite evaluation vs torchattacks called once per epsilon.

The classifier has the shape of what ``evaluate`` attacks (``probe.ProbedClassifier``: normalisation
-> encoder -> linear, frozen, eval mode): a ``convnet_small`` with a linear head trained by our
trainer's step code (supervised preset, a short Fashion-MNIST budget), so that clean accuracy is
realistic (a few SimCLR steps + a probe gave ~30-55 %, which would let us skip most examples). The
examples are the first ``n`` Fashion-MNIST test images. Alternately, in one process:

- ``ours``: ``robustbench_nacl.eval.benchmark(model, x, y, "paper")``: FGSM at 0.002..0.032 and PGD at
  0.002 (10 steps of 0.01, 2 restarts), including everything it does besides attacking (clean
  predictions, the per-model sanity checks, the eps-0 check, random-noise accuracy per eps, the
  threat-model check of every batch, the worst-case rows);
- ``torchattacks``: ``torchattacks.FGSM(model, eps)`` once per eps on all examples and
  ``torchattacks.PGD(model, eps=0.002, alpha=0.01, steps=10)`` twice (the two restarts), each
  followed by a forward pass to count the robust examples; clean accuracy once.

Both report robust accuracies; they are printed side by side so a speed-up bought by doing less
shows up as a difference in accuracy.
"""

from __future__ import annotations

from typing import Any

import torch
from common import interleaved, log, median, rounded

TARGET = 1.0
FGSM_EPS = (0.002, 0.004, 0.008, 0.016, 0.032)
PGD = {"eps": 0.002, "alpha": 0.01, "steps": 10, "restarts": 2}


def _classifier(quick: bool) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train a classifier with our trainer's step code, return it frozen as the attacked model."""
    from robustbench_nacl import losses
    from robustbench_nacl.data.datasets import load_dataset
    from robustbench_nacl.eval.probe import ProbedClassifier
    from robustbench_nacl.train.trainer import TrainConfig, TrainStep, build_model

    n_train, epochs = (1024, 1) if quick else (4096, 3)
    cfg = TrainConfig(
        loss="supervised",
        overrides={"views": "identity"},
        dataset="fashion-mnist",
        encoder="convnet_small",
        batch_size=256,
        lr=3e-3,
    )
    params = losses.resolve(cfg.loss, cfg.overrides)
    data = load_dataset("fashion-mnist", "train")
    x, y = data.x[:n_train], data.y[:n_train]
    torch.manual_seed(0)
    model = build_model(cfg, params, channels=1, size=(28, 28), num_classes=10)
    step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters(), lr=cfg.lr))
    gen = torch.Generator().manual_seed(0)
    log(f"attack_sweep_ratio: training the classifier ({epochs} epochs on {n_train} images)")
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(n_train, generator=gen)
        for i in range(n_train // cfg.batch_size):
            idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            step(x[idx], y[idx], gen)
    # BatchNorm recalibration: after 48 fast Adam steps the running averages lag the weights
    # (eval-mode accuracy ~23 % against ~73 % with batch statistics); a cumulative average over the
    # training images fixes the statistics without touching a weight.
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        for i in range(0, n_train, cfg.batch_size):
            model(x[i : i + cfg.batch_size].float() / 255.0)
    classifier = ProbedClassifier(model.encoder, model.head)  # frozen, eval mode
    recipe = {
        "model": "convnet_small (width 32) + linear head: normalisation -> encoder -> linear, frozen",
        "training": (
            "our TrainStep, supervised preset without augmentation (views=identity), cross-entropy, "
            f"fashion-mnist first {n_train} "
            f"train images, {epochs} epochs, batch 256, Adam 3e-3, BatchNorm statistics recalibrated"
        ),
    }
    return classifier, recipe


def run(args: Any) -> dict[str, Any]:
    """Measure both contenders alternately; the value is ours / torchattacks (wall time)."""
    import torchattacks

    import robustbench_nacl as rbn
    from robustbench_nacl.data.datasets import load_dataset

    n = 200 if args.quick else 500
    reps = args.reps or (1 if args.quick else 3)
    model, recipe = _classifier(args.quick)
    test = load_dataset("fashion-mnist", "test")
    x, y = test.x[:n].float() / 255.0, test.y[:n].long()
    acc: dict[str, dict[str, float]] = {}

    def ours() -> None:
        rows = rbn.benchmark(model, x, y, "paper", seed=0, progress=False)
        acc["ours"] = {"clean": rows[0]["clean_acc"]}
        for r in rows:
            if r["attack"] != "worst_case":
                acc["ours"][f"{r['attack']}@{r['eps']}"] = r["robust_acc"]

    def reference() -> None:
        torch.manual_seed(0)
        out = {"clean": float((model(x).argmax(1) == y).float().mean())}
        for eps in FGSM_EPS:
            x_adv = torchattacks.FGSM(model, eps=eps)(x, y)
            with torch.no_grad():
                out[f"fgsm@{eps}"] = float((model(x_adv).argmax(1) == y).float().mean())
        robust = torch.ones(len(x), dtype=torch.bool)
        for _ in range(PGD["restarts"]):
            atk = torchattacks.PGD(model, eps=PGD["eps"], alpha=PGD["alpha"], steps=PGD["steps"])
            x_adv = atk(x, y)
            with torch.no_grad():
                robust &= model(x_adv).argmax(1) == y
        out[f"pgd@{PGD['eps']}"] = float(robust.float().mean())
        acc["torchattacks"] = out

    log(f"attack_sweep_ratio: {reps} interleaved repetitions on {n} examples")
    full_x, full_y = x, y
    x, y = full_x[:32], full_y[:32]
    ours(), reference()  # warm-up on 32 examples (allocator, lazy imports), not timed
    x, y = full_x, full_y
    times = interleaved({"ours": ours, "torchattacks": reference}, reps=reps, warmup=0)
    med = {k: median(v) for k, v in times.items()}
    ratio = med["ours"] / med["torchattacks"]
    return {
        "figure": "attack_sweep_ratio",
        "value": round(ratio, 4),
        "unit": "ratio: our benchmark() wall time / torchattacks once per eps on all examples",
        "target": f"<= {TARGET}",
        "met": ratio <= TARGET,
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "raw_s": {k: rounded(v) for k, v in times.items()},
        "accuracy": acc,
        "config": {
            "suite": "paper: FGSM Linf 0.002-0.032 (5 eps); PGD Linf 0.002, 10 x 0.01, 2 restarts",
            "examples": f"fashion-mnist test images 0-{n - 1}",
            "classifier": recipe,
            "torchattacks_batch": n,
            "ours_batch": "benchmark default (256 on CPU)",
        },
    }
