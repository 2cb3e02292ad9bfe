"""Figure ``autoattack_cost``: AutoAttack (standard, Linf 8/255) as the tool runs it, against the
pure compute of its passes, and its absolute cost per 100 examples; beside it, the corruption
setting's cost per severity.

The classifier is what ``evaluate`` attacks on digits: a ``convnet_small`` (width 16, the test
recipe: SimCLR, digits:0-4) with a linear probe, frozen, in eval mode, channels_last. ``n``
clean-correct test examples (``--quick``: 8, else 24: this CPU runs FAB-T and Square slowly) go
through ``attack.autoattack_adapter.autoattack`` (pyautoattack 0.2.0 via the adapter, with the per-component
trace). Every call of the model is counted with its batch size and whether it needs an input
gradient; afterwards each distinct (batch size, gradient) pass is timed alone (median of 5) and
the counts x those times give the pure compute. The value is wall / pure compute. The cost per
100 examples is wall * 100 / n: an extrapolation, linear in the number of examples, which
overstates it a little (AutoAttack batches survivors, so larger n amortises per-call overhead).

Corruptions: ``data.corruptions.corrupt`` on the 360 digits test images and on 1,000 random
32x32 RGB images (CIFAR's shape), every corruption, per severity (median of 3).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


class Counting(nn.Module):
    """The model, counting (batch size, grad enabled) of every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: Counter[tuple[int, bool]] = Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[(len(x), torch.is_grad_enabled() and x.requires_grad)] += 1
        return self.model(x)


def _pass_time(model: nn.Module, x: torch.Tensor, grad: bool) -> float:
    times = []
    for _ in range(5):
        xi = x.clone().requires_grad_(grad)
        t = time.perf_counter()
        if grad:
            model(xi).sum().backward()
        else:
            with torch.no_grad():
                model(xi)
        times.append(time.perf_counter() - t)
    return sorted(times)[2]


def _classifier() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from _reliability import TINY

    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.eval.probe import ProbeConfig, fit_linear_probe
    from robustbench_nacl.models.foreign import load_encoder
    from robustbench_nacl.training import train

    out = Path(__file__).resolve().parents[1] / "robustbench_out" / "bench" / "aa_ckpt"  # git-ignored
    ckpt = out if (out / "manifest.json").is_file() else train(TINY, out, progress=False)
    encoder, _ = load_encoder(ckpt)
    tr, te = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    clf, _ = fit_linear_probe(encoder.eval(), tr, te, ProbeConfig(epochs=100, lr=1e-2, seed=0))
    return clf.eval().to(memory_format=torch.channels_last), te.x.float() / 255, te.y


def _corruption_times() -> dict[str, Any]:
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.data.corruptions import corrupt, corruption_names

    sets = {
        "digits_360x1x8x8": load_dataset("digits", "test").x,
        "rgb_1000x3x32x32": torch.randint(0, 256, (1000, 3, 32, 32), dtype=torch.uint8),
    }
    out: dict[str, Any] = {}
    for label, x in sets.items():
        names = corruption_names(x.shape[1])
        per = {}
        for s in range(1, 6):
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                for name in names:
                    corrupt(x, name, s, seed=0)
                ts.append(time.perf_counter() - t)
            per[f"s{s}"] = round(sorted(ts)[1], 3)
        out[label] = {"corruptions": len(names), "seconds_all_corruptions_per_severity": per}
    return out


def run(args: Any) -> dict[str, Any]:
    from robustbench_nacl.attack.autoattack_adapter import autoattack

    n = 8 if getattr(args, "quick", False) else 24
    model, x, y = _classifier()
    with torch.no_grad():
        ok = model(x).argmax(1) == y
    xs, ys = x[ok][:n], y[ok][:n]
    counting = Counting(model).eval()
    t = time.perf_counter()
    x_adv = autoattack(counting, xs, ys, eps=8 / 255, gen=torch.Generator().manual_seed(0), num_classes=5)
    wall = time.perf_counter() - t
    with torch.no_grad():
        robust = int((model(x_adv).argmax(1) == ys).sum())
    pure = sum(c * _pass_time(model, xs[:b] if b <= n else xs.repeat(b // n + 1, 1, 1, 1)[:b], g)
               for (b, g), c in counting.calls.items())  # fmt: skip
    return {
        "figure": "autoattack_cost",
        "value": round(wall / pure, 3),
        "unit": "AutoAttack wall / pure compute of its passes",
        "target": None,
        "met": None,
        "config": {
            "model": "convnet_small width 16 + linear probe, digits:0-4 (5 classes: 4 targets)",
            "n_examples": n,
            "robust": robust,
            "wall_s": round(wall, 2),
            "pure_compute_s": round(pure, 2),
            "calls": sum(counting.calls.values()),
            "seconds_per_100_examples_extrapolated": round(wall * 100 / n, 1),
            "corruptions": _corruption_times(),
        },
    }
