"""Figure ``gpu_epoch``: what ``train()`` costs end to end, extrapolated to the paper zoo's 100 epochs.

Each configuration (simclr and adv presets x fp32 and bf16) runs ``train()`` itself for 2 epochs: data
loading onto the device, the kNN monitor at initialisation and after the last epoch, ``train_state.pt``
saved after every epoch, the final checkpoint and manifest. The parts are timed where ``train`` calls
them, and the 100-epoch time is extrapolated from them (setup once, 100 x (epoch + state save), the
monitor at initialisation and every ``knn_every`` epochs, the checkpoint once). Beside it, the old
figure: one epoch of ``TrainStep`` alone x 100 (what it leaves out is the difference).

``cudnn.benchmark`` is decided from a measurement: the ``TrainStep`` epoch is timed with it off and on
(after a warm-up, which is where its autotuning happens), and the figure says which is faster.

On CUDA: resnet18_cifar, batch 256, on CIFAR-100 when ``--data-root`` holds it, else on 50,000 random
uint8 tensors of CIFAR's shape (labelled so in the output; the time does not depend on the pixel
values). Target: 100 epochs in at most 600 s on one H100 (the simclr bf16 row). On a CPU (or with
``--quick``) the same code runs on a small configuration (convnet_small on 256 digits images), so that
the script is tested to run; its times say nothing about a GPU and ``met`` is null.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from common import log

TARGET_S = 600.0
EPOCHS = 2  # timed per configuration; the figure extrapolates to PAPER_EPOCHS
PAPER_EPOCHS = 100
RANDOM_CIFAR = "bench_random_cifar"  # registered below only when CIFAR-100 is not on disk
GPU = {"encoder": "resnet18_cifar", "batch_size": 256, "n_train": 50_000, "n_test": 10_000}
SMALL = {"encoder": "convnet_small", "batch_size": 64, "n_train": 256, "encoder_kwargs": {"width": 8}}
CONFIGS = [(loss, precision) for loss in ("simclr", "adv") for precision in ("fp32", "bf16")]


def run(args: Any) -> dict[str, Any]:
    """Time ``train()`` for every configuration, the ``TrainStep``-only epoch and ``cudnn.benchmark``."""
    cuda = torch.cuda.is_available() and not getattr(args, "quick", False)
    device = "cuda" if cuda else "cpu"
    dataset, data_note = _dataset(cuda, getattr(args, "data_root", None))
    rows = []
    for loss, precision in CONFIGS:
        cfg = _config(cuda, dataset, loss, precision, getattr(args, "data_root", None))
        log(f"gpu_epoch: train() {loss} {precision}, {EPOCHS} epochs on {device}")
        row = {"loss": loss, "precision": precision, **time_train(cfg, device)}
        row["train_step_only_s_per_100_epochs"] = round(PAPER_EPOCHS * step_epoch_s(cfg, device, False), 2)
        rows.append(row)
    bench_cfg = _config(cuda, dataset, "simclr", "fp32", getattr(args, "data_root", None))
    cudnn = cudnn_benchmark_decision(bench_cfg, device) if cuda else None
    headline = next(r for r in rows if (r["loss"], r["precision"]) == ("simclr", "bf16"))
    value = headline["train_s_per_100_epochs"]
    return {
        "figure": "gpu_epoch",
        "unit": "s per 100 epochs of train() (simclr, bf16), extrapolated from 2 timed epochs",
        "target": f"<= {TARGET_S:.0f} s for 100 epochs on one H100",
        "value": value,
        "met": (value <= TARGET_S) if cuda else None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (small configuration: not a GPU figure)",
        "rows": rows,
        "cudnn_benchmark": cudnn or {"decision": None, "why": "no cuDNN on this device"},
        "config": {**(GPU if cuda else SMALL), "epochs_timed": EPOCHS, "data": data_note},
    }


def _dataset(cuda: bool, data_root: str | None) -> tuple[str, str]:
    """The training data of the figure and how to describe it."""
    if not cuda:
        return "digits:0-4", "digits classes 0-4 (the first 256 training images)"
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.errors import UserError

    try:
        load_dataset("cifar100", "train", root=data_root, download=False)
        return "cifar100", "CIFAR-100"
    except UserError:
        _register_random_cifar()
        return RANDOM_CIFAR, "50,000 + 10,000 random uint8 tensors of CIFAR-100's shape (not CIFAR)"


def _register_random_cifar() -> None:
    from robustbench_nacl.data import DATASETS

    if RANDOM_CIFAR in DATASETS:
        return

    def load(root: Path, split: str, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n = GPU["n_train"] if split == "train" else GPU["n_test"]
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
        return x, torch.randint(0, 100, (n,), generator=g)

    DATASETS.add(
        RANDOM_CIFAR,
        load,
        num_classes=100,
        channels=3,
        size=32,
        normalization="half",
        how_to_get="generated by bench/gpu_epoch.py (timing only)",
    )


def _config(cuda: bool, dataset: str, loss: str, precision: str, data_root: str | None) -> Any:
    from robustbench_nacl.training import TrainConfig

    size = GPU if cuda else SMALL
    return TrainConfig(
        loss=loss,
        dataset=dataset,
        encoder=size["encoder"],
        encoder_kwargs=dict(size.get("encoder_kwargs", {})),
        epochs=EPOCHS,
        batch_size=size["batch_size"],
        precision=precision,
        max_train=None if cuda else size["n_train"],
        data_root=data_root,
    )


@contextmanager
def _timed(module: Any, name: str, into: list[float], sync: Callable[[], None]) -> Iterator[None]:
    """Replace ``module.name`` by a wrapper that appends each call's seconds to ``into``."""
    real = getattr(module, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        sync()
        t = time.perf_counter()
        out = real(*a, **k)
        sync()
        into.append(time.perf_counter() - t)
        return out

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, real)


def time_train(cfg: Any, device: str) -> dict[str, Any]:
    """``train(cfg)`` end to end, its parts, and the extrapolation to 100 epochs."""
    from robustbench_nacl.training import loop

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    parts: dict[str, list[float]] = {"epoch": [], "knn": [], "save_state": [], "checkpoint": []}
    names = {
        "epoch": "_train_epoch",
        "knn": "_monitor",
        "save_state": "_save_state",
        "checkpoint": "_write_checkpoint",
    }
    with (
        tempfile.TemporaryDirectory() as out,
        _timed(loop, names["epoch"], parts["epoch"], sync),
        _timed(loop, names["knn"], parts["knn"], sync),
        _timed(loop, names["save_state"], parts["save_state"], sync),
        _timed(loop, names["checkpoint"], parts["checkpoint"], sync),
    ):
        sync()
        t0 = time.perf_counter()
        loop.train(cfg, Path(out) / "run", device=device, progress=False)
        sync()
        total = time.perf_counter() - t0
    setup = total - sum(sum(v) for v in parts.values())
    epoch = parts["epoch"][-1]  # the second epoch: the first one pays the warm-up
    # at initialisation and every knn_every epochs (the last is one of them); 0: after the last only
    knn_calls = 1 + PAPER_EPOCHS // cfg.knn_every if cfg.knn_every > 0 else 1
    knn = max(parts["knn"])
    save = parts["save_state"][-1]
    extrapolated = setup + PAPER_EPOCHS * (epoch + save) + knn_calls * knn + parts["checkpoint"][-1]
    return {
        "train_s_2_epochs": round(total, 2),
        "train_s_per_100_epochs": round(extrapolated, 2),
        "setup_s": round(setup, 2),
        "epoch_s": [round(e, 3) for e in parts["epoch"]],
        "knn_monitor_s": round(knn, 3),
        "knn_monitor_calls_per_100_epochs": knn_calls,
        "save_state_s": round(save, 3),
        "checkpoint_s": round(parts["checkpoint"][-1], 3),
    }


def step_epoch_s(cfg: Any, device: str, cudnn_benchmark: bool) -> float:
    """One epoch of ``TrainStep`` alone, after a warm-up of 3 steps (the old figure's measurement)."""
    from robustbench_nacl import losses
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.training import TrainStep, build_model

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = cudnn_benchmark
    try:
        data = load_dataset(cfg.dataset, "train", root=cfg.data_root)
        n = min(len(data), cfg.max_train or len(data))
        x, y = data.x[:n].to(device), data.y[:n].to(device)
        params = losses.resolve(cfg.loss, cfg.overrides)
        torch.manual_seed(0)
        size = tuple(x.shape[2:])
        model = build_model(cfg, params, channels=x.shape[1], size=size, num_classes=data.num_classes)
        model = model.to(device).train()
        step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters(), lr=cfg.lr))
        g = torch.Generator(device=device).manual_seed(0)
        b, steps = cfg.batch_size, n // cfg.batch_size
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        for i in range(min(3, steps)):  # warm-up: allocator, cuDNN autotuning when enabled
            step(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b], g)
        sync()
        t0 = time.perf_counter()
        perm = torch.randperm(n, generator=g, device=device)
        for i in range(steps):
            idx = perm[i * b : (i + 1) * b]
            step(x[idx], y[idx], g)
        sync()
        return time.perf_counter() - t0
    finally:
        torch.backends.cudnn.benchmark = before


def cudnn_benchmark_decision(cfg: Any, device: str) -> dict[str, Any]:
    """``TrainStep`` epochs with ``cudnn.benchmark`` off and on (interleaved, 2 each) and the choice."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for on in (False, True, True, False):
        times[on].append(step_epoch_s(cfg, device, on))
    off_s, on_s = min(times[False]), min(times[True])
    return {
        "off_s_per_epoch": round(off_s, 3),
        "on_s_per_epoch": round(on_s, 3),
        "decision": on_s < 0.95 * off_s,  # enable only for a clear (>= 5 %) gain
        "why": "enable cudnn.benchmark if its epoch is at least 5 % faster (best of 2 each)",
    }


if __name__ == "__main__":  # python bench/gpu_epoch.py [--quick] [--data-root DIR]
    import json

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="the small CPU configuration even on a GPU")
    p.add_argument("--data-root", default=None, help="where CIFAR-100 is (else random tensors)")
    print(json.dumps(run(p.parse_args())))
