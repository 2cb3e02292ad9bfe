"""Figure ``channels_last``: NHWC over NCHW convolutions on CPU, the default of ``train`` and ``evaluate``.

For each encoder, the same weights in both memory formats, alternately in one process: an eval-mode
forward without gradients (what feature extraction and the attacks' clean passes run) and a
train-mode forward + backward (the trainer's model compute). The value is the smallest eval speed-up
over the encoders (the case ``evaluate`` relies on); every ratio is reported.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from common import interleaved, log, median

CASES = {  # encoder -> (input shape, encoder kwargs, batch)
    "convnet_small_w16_28px": ("convnet_small", (1, 28, 28), {"width": 16}, 512),
    "convnet_small_w32_28px": ("convnet_small", (1, 28, 28), {"width": 32}, 512),
    "resnet18_cifar_32px": ("resnet18_cifar", (3, 32, 32), {}, 128),
}


def _measure(name: str, shape: tuple[int, int, int], kwargs: dict[str, Any], batch: int, reps: int) -> dict:
    from robustbench_nacl.models.factory import create_encoder

    torch.manual_seed(0)
    nchw = create_encoder(name, in_channels=shape[0], input_shape=shape, **kwargs)
    nhwc = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    x = torch.rand(batch, *shape)

    def infer(m: torch.nn.Module) -> Any:
        def run() -> None:
            m.eval()
            with torch.no_grad():
                m(x)

        return run

    def train_step(m: torch.nn.Module) -> Any:
        def run() -> None:
            m.train()
            m(x).sum().backward()

        return run

    t = interleaved(
        {
            "eval_nchw": infer(nchw),
            "eval_nhwc": infer(nhwc),
            "train_nchw": train_step(nchw),
            "train_nhwc": train_step(nhwc),
        },
        reps=reps,
        warmup=1,
    )
    med = {k: median(v) for k, v in t.items()}
    nchw.eval(), nhwc.eval()
    with torch.no_grad():
        diff = float((nchw(x) - nhwc(x)).abs().max())
    return {
        "eval_speedup": round(med["eval_nchw"] / med["eval_nhwc"], 3),
        "train_speedup": round(med["train_nchw"] / med["train_nhwc"], 3),
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "max_abs_output_diff": diff,  # same weights, another kernel: float rounding only
        "batch": batch,
        "input": list(shape),
    }


def run(args: Any) -> dict[str, Any]:
    """All cases; the value is the smallest eval-mode speed-up."""
    reps = args.reps or (2 if args.quick else 5)
    cases = {}
    for case, (name, shape, kwargs, batch) in CASES.items():
        log(f"channels_last {case}: {reps} interleaved repetitions")
        cases[case] = _measure(name, shape, kwargs, batch, reps)
    return {
        "figure": "channels_last",
        "value": min(c["eval_speedup"] for c in cases.values()),
        "unit": "x: NCHW time / NHWC time, eval forward (min over the encoders)",
        "target": "report (the default memory format follows it)",
        "config": {"cases": cases, "threads": args.threads, "precision": "fp32"},
    }
