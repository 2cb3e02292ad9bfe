"""Figure ``autoattack_cost``: AutoAttack standard as the tool runs it, against the pure compute of its
model passes measured in the same run, per component; beside it, the corruption setting's cost.

Cases (``--quick``: the first one at 24 examples only):

- ``simclr`` and ``acl``: the published Fashion-MNIST encoders ``convnet_small.{simclr,acl}_fashion-
  mnist-0-4_s0`` (non-robust and robust) with their published SLF head, the encoder channels-last as
  ``eval`` composes it, on the first 500 in-domain test images at Linf 0.032: exactly the committed
  reference row's setting, attacked through ``attack.runner.robust_under_attack`` (chunks of 256,
  the seed ``benchmark`` derives), so the outcome of every example is also compared with the row's
  ``robust_bits``.
- after each standard run, the same examples under AutoAttack screening (``version = "screen"``,
  its own seed as ``benchmark`` derives it for that suite entry): its wall time, speed-up and how
  many examples' outcomes differ from standard's.
- ``resnet18_cifar``: a random-init resnet18_cifar (seed 0) with a random linear head, 10 classes,
  on ``n`` random uint8 images of CIFAR's shape labelled with its own clean predictions (every one
  attacked) at 8/255: timing only.

The attacked model is wrapped so that each forward is timed where AutoAttack makes it, and each
backward through it too (identity autograd functions at its input and output record when the
backward enters and leaves the model; they pass gradients unchanged). The pure compute is the sum
of those times: the passes as run, under the same load as the rest of the run, so the ratio wall /
pure does not depend on how busy the shared machine was. What it leaves out is AutoAttack's own
work between passes (step sizes, projections, Square's sampling) and ours around it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
ROOT = Path(__file__).resolve().parents[1]
KEYS = ("wall_s", "forward_calls", "forward_examples")  # per component, from the row fields
KEYS = ("wall_s", "forward_calls", "forward_examples")  # per component, from the row fields


class _Mark(torch.autograd.Function):
    """Identity whose backward records the time at which the gradient passes through it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, log: list, where: str) -> torch.Tensor:
        ctx.log, ctx.where = log, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.log.append((ctx.where, time.perf_counter()))
        return g, None, None


class Timed(nn.Module):
    """The model, timing each forward and each backward through it (seconds summed in ``spent``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.spent = 0.0
        self.calls = 0
        self.log: list[tuple[str, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        grad = torch.is_grad_enabled() and x.requires_grad
        t = time.perf_counter()
        out = self.model(_Mark.apply(x, self.log, "in") if grad else x)
        self.spent += time.perf_counter() - t
        return _Mark.apply(out, self.log, "out") if grad else out

    def backward_seconds(self) -> float:
        """Time between the gradient entering the model (at its output) and leaving it (its input)."""
        total, entered = 0.0, None
        for where, t in self.log:
            if where == "out":
                entered = t
            elif entered is not None:
                total, entered = total + t - entered, None
        return total


def _published(family: str, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, dict[str, Any]]:
    from autoattack_replay import _published as published

    from robustbench_nacl.data import load_dataset

    test = load_dataset("fashion-mnist:0-4", "test")
    if family == "control":  # the random-init control of seed 0, its probe fitted again
        from autoattack_replay import _control

        train = load_dataset("fashion-mnist:0-4", "train")
        model, row = _control("convnet_small.acl_fashion-mnist-0-4_s0", (train, test))
    else:
        model, row = published(f"convnet_small.{family}_fashion-mnist-0-4_s0")
    return model.eval(), test.x[:n].float().div(255), test.y[:n].long(), row


def _resnet(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, None]:
    from robustbench_nacl.eval.probe import ProbedClassifier
    from robustbench_nacl.models.factory import create_encoder

    torch.manual_seed(0)
    enc = create_encoder("resnet18_cifar", in_channels=3, mean=(0.5,) * 3, std=(0.25,) * 3)
    model = ProbedClassifier(enc.to(memory_format=torch.channels_last), nn.Linear(enc.feature_dim, 10))
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(0)).float() / 255
    with torch.no_grad():
        y = model(x).argmax(1)
    return model, x, y, None


def attack(model: nn.Module, x: torch.Tensor, y: torch.Tensor, version: str, seed: int, eps: float) -> dict:
    """AutoAttack ``version`` through the tool (``robust_under_attack``, chunks of 256, the seed
    ``benchmark`` derives from ``seed``) on the clean-correct examples of ``x``: the row fields,
    the per-example robust mask, wall and pure compute."""
    from robustbench_nacl.attack import autoattack as aa_trace
    from robustbench_nacl.attack.rng import derive_seed
    from robustbench_nacl.attack.runner import robust_under_attack

    params = {"version": version}
    gen = torch.Generator().manual_seed(derive_seed(seed, "autoattack", "Linf", params, eps))
    with torch.no_grad():
        todo = (model(x).argmax(1) == y).nonzero().flatten()
    timed = Timed(model).eval()
    with aa_trace.recording() as rec:
        t = time.perf_counter()
        correct, _ = robust_under_attack(
            "autoattack", timed, x[todo], y[todo], [eps], norm="Linf", gens=[gen], batch_size=256,
            params={**params, "num_classes": int(model(x[:1]).shape[1])},
        )  # fmt: skip
        wall = time.perf_counter() - t
    robust = torch.zeros(len(x), dtype=torch.bool)
    robust[todo] = correct[0]
    pure = timed.spent + timed.backward_seconds()
    fields = aa_trace.component_fields(rec[eps], todo, len(x), lambda m: m)
    return {"fields": fields, "robust": robust, "wall": wall, "pure": pure, "timed": timed, "todo": todo}


def _case(model: nn.Module, x: torch.Tensor, y: torch.Tensor, row: dict[str, Any] | None, eps: float) -> dict:
    """AutoAttack standard, then screening, through the tool; wall, pure, per component, and the
    outcomes against the committed row where it measured the same examples."""
    from robustbench_nacl.results.bits import decode_bits

    seed = row["seed"] if row else 0
    std = attack(model, x, y, "standard", seed, eps)
    fields = std["fields"]
    out = {
        "n_examples": len(x),
        "attacked": len(std["todo"]),
        "robust": int(std["robust"].sum()),
        "wall_s": round(std["wall"], 2),
        "pure_compute_s": round(std["pure"], 2),
        "forward_s": round(std["timed"].spent, 2),
        "model_calls": std["timed"].calls,
        "wall_over_pure": round(std["wall"] / std["pure"], 3),
        "per_component": {
            c: {k: fields[f"aa_{k}_{c.replace('-', '_')}"] for k in KEYS}
            for c in fields["aa_components"].split(",")
        },
        "seeds": fields["aa_seeds"],
        "chunk_sizes": fields["aa_chunk_sizes"],
    }
    if row is not None and len(x) == row["n_examples_evaluated"]:  # --quick runs fewer: no comparison
        committed = decode_bits(row["robust_bits"], len(x))
        out["bits_equal_committed_row"] = bool((std["robust"].numpy() == committed).all())
        out["row_robust"] = int(row["n_robust"])
    scr = attack(model, x, y, "screen", seed, eps)
    out["screen"] = {
        "robust": int(scr["robust"].sum()),
        "wall_s": round(scr["wall"], 2),
        "speedup_vs_standard": round(std["wall"] / scr["wall"], 2),
        "examples_differ_from_standard": int((scr["robust"] != std["robust"]).sum()),
        **{k: scr["fields"][f"aa_screen_{k}"] for k in ("survivors", "sample_size", "found")},
    }
    return out


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


PARTIAL = ROOT / "bench" / "autoattack_cost.partial.jsonl"  # each case as it lands (a long run)


def _land(name: str, case: dict[str, Any]) -> dict[str, Any]:
    with PARTIAL.open("a") as fh:
        fh.write(json.dumps({"case": name, **case}) + "\n")
    return case


def run(args: Any) -> dict[str, Any]:
    """Every case; the value is the largest wall / pure ratio of AutoAttack standard."""
    quick = getattr(args, "quick", False)
    n_fm, n_resnet = (24, 4) if quick else (500, 8)
    cases: dict[str, Any] = {}
    families = getattr(args, "aa_encoders", "simclr,acl").split(",")
    for family in families[:1] if quick else families:
        print(f"autoattack_cost: {family}", file=sys.stderr, flush=True)
        cases[family] = _land(family, _case(*_published(family, n_fm), eps=0.032))
    if not quick:
        print("autoattack_cost: resnet18_cifar", file=sys.stderr, flush=True)
        cases["resnet18_cifar"] = _land("resnet18_cifar", _case(*_resnet(n_resnet), eps=8 / 255))
    worst = max(c["wall_over_pure"] for c in cases.values())
    return {
        "figure": "autoattack_cost",
        "value": worst,
        "unit": "AutoAttack wall / pure compute of its model passes, timed in the same run (max over cases)",
        "target": "<= 1.2",
        "met": worst <= 1.2,
        "config": {"cases": cases, "corruptions": _corruption_times()},
    }
