"""The GPU check of issue 46: one prepared script for a bare CUDA machine (torch, this checkout, no
network), printing one JSON line per figure on stdout (progress on stderr).

Figures, each eager (``--compile off``) beside compiled (``--compile auto``, which on CUDA is
inductor, fused optimizers, CUDA graphs where a site's shapes are fixed; robustbench_nacl/accel.py):

- ``gpu_epoch_simclr_bf16``, ``gpu_epoch_adv_bf16``: ``train()`` end to end for 2 epochs, extrapolated
  to 100 (bench/gpu_epoch.py's ``time_train``: resnet18_cifar, batch 256, CIFAR-100 from
  ``--data-root`` or 50,000 random uint8 tensors of its shape). Targets: <= 200 s and <= 400 s.
- ``views_ms``: one views call of the simclr preset on 2 x 256 CIFAR-shaped images, CUDA events,
  median of 50 after 5 warm-up calls. Target: <= 3 ms.
- ``eval_like_zoo_s``: wall seconds of ``eval --model NAME --like-zoo fashion-mnist`` of one published
  encoder (bench/README.md, 'eval --like-zoo fashion-mnist end to end'). Needs Fashion-MNIST under
  ``--data-root``; without it the line says so and its value is null. Target: <= 30 s.
- ``deterministic_reruns``: ``train --deterministic`` twice, each in its own process (cuBLAS reads its
  workspace setting at start-up), eager and compiled: the weights' sha256 must be equal.

``--only NAME`` (repeatable) runs some of them (a device's time is short: the whole check takes
several minutes). On a machine without CUDA it exits 2 with one line, unless ``--cpu-smoke``: then
every figure runs a tiny CPU version of the same code (compiled with ``aot_eager``: inductor's C++
build takes minutes on 2 cores) so that a test can check the script runs; its numbers say nothing
about a GPU and ``met`` is null.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODES = ("off", "auto")  # eager, compiled (on CUDA)
TARGETS = {
    "gpu_epoch_simclr_bf16": 200.0,
    "gpu_epoch_adv_bf16": 400.0,
    "views_ms": 3.0,
    "eval_like_zoo_s": 30.0,
}
EVAL_MODEL = "convnet_small.simclr_fashion-mnist-0-4_s0"  # the simclr s0 encoder of issue 46's timings
SMOKE_MODEL = "convnet_small.simclr_digits-0-4_s0"  # the demo's: digits ship with scikit-learn


def _emit(figure: str, value: Any, unit: str, *, smoke: bool, **fields: Any) -> None:
    """One JSON line: the figure, its value, target and whether it was met (null off a GPU)."""
    target = TARGETS.get(figure)
    met = None if smoke or value is None or target is None else value <= target
    line = {"figure": figure, "value": value, "unit": unit, "target": target, "met": met, **fields}
    print(json.dumps(line), flush=True)


def _log(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The library's own prints go to stderr: stdout carries only the JSON lines."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# ============ gpu_epoch ============


def gpu_epoch(args: argparse.Namespace, device: str) -> None:
    """``train()`` of simclr and adv in bf16, eager and compiled, extrapolated to 100 epochs."""
    import gpu_epoch as ge

    cuda = device == "cuda"
    dataset, note = ge._dataset(cuda, args.data_root)
    for loss in ("simclr", "adv"):
        cfg = ge._config(cuda, dataset, loss, "bf16", args.data_root)
        if not cuda:  # the smoke run: the smallest configuration that still runs train()
            cfg = dataclasses.replace(cfg, max_train=64, batch_size=32, encoder_kwargs={"width": 4})
        by_mode = {}
        for mode in MODES:
            _log(f"gpu_epoch {loss} bf16, compile {_mode(mode, cuda)}")
            with _quiet():
                by_mode[mode] = ge.time_train(dataclasses.replace(cfg, compile=_mode(mode, cuda)), device)
        compiled = by_mode["auto"]
        _emit(
            f"gpu_epoch_{loss}_bf16",
            compiled["train_s_per_100_epochs"],
            "s per 100 epochs of train() (compiled), extrapolated from 2 timed epochs",
            smoke=not cuda,
            eager_s_per_100_epochs=by_mode["off"]["train_s_per_100_epochs"],
            compile_warmup_s=round(compiled["epoch_s"][0] - compiled["epoch_s"][-1], 2),
            eager=by_mode["off"],
            compiled=compiled,
            data=note,
            device=_device_name(device),
        )


def _mode(mode: str, cuda: bool) -> str:
    # "auto" is eager off CUDA: the smoke run forces the compiled path with "on"
    return mode if cuda or mode == "off" else "on"


# ============ views ============


def views(args: argparse.Namespace, device: str) -> None:
    """Milliseconds of one simclr views call on 2 x 256 images of CIFAR's shape (CUDA events)."""
    import torch

    from robustbench_nacl import losses
    from robustbench_nacl.training import TrainConfig, TrainStep, build_model

    cuda = device == "cuda"
    n, size = (256, 32) if cuda else (16, 8)
    cfg = TrainConfig(loss="simclr", dataset="cifar10", encoder="convnet_small", batch_size=n)
    params = losses.resolve("simclr", {})
    model = build_model(cfg, params, channels=3, size=(size, size), num_classes=10).to(device)
    step = TrainStep(cfg, params, model, torch.optim.Adam(model.parameters()))
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, device=device)
    times = _timed_calls(lambda: step.views(x, g), device, warmup=5, reps=50 if cuda else 3)
    _emit(
        "views_ms",
        round(statistics.median(times), 3),
        f"ms per simclr views call of 2 x {n} images (median of {len(times)})",
        smoke=not cuda,
        spread_ms=[round(min(times), 3), round(max(times), 3)],
        device=_device_name(device),
    )


def _timed_calls(fn: Callable[[], Any], device: str, *, warmup: int, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls after ``warmup`` (CUDA events on a GPU)."""
    import torch

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append(1000 * (time.perf_counter() - t))
    return out


# ============ eval --like-zoo ============


def eval_like_zoo(args: argparse.Namespace, device: str) -> None:
    """Wall seconds of one published encoder's ``eval --like-zoo fashion-mnist``, eager and compiled."""
    cuda = device == "cuda"
    model = args.model if cuda else SMOKE_MODEL
    if cuda:
        missing = _missing_fashion_mnist(args.data_root)
        if missing:
            _emit("eval_like_zoo_s", None, "s", smoke=False, not_measured=missing, model=model)
            return
        flags = ["--model", model, "--like-zoo", "fashion-mnist", "--device", "cuda"]
        flags += ["--data-root", args.data_root]
    else:  # the smoke run: the same command on digits (bundled with scikit-learn), a quick suite
        flags = ["--model", model, "--suite", "quick", "--n-examples", "16", "--probe-epochs", "2"]
        flags += ["--device", "cpu"]
    walls, rows = {}, {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as out:
            argv = ["eval", *flags, "--out", out, "--no-progress", "--compile", _mode(mode, cuda)]
            _log("robustbench-nacl " + " ".join(argv))
            walls[mode], rows[mode] = _run_cli(argv, Path(out))
    same = rows["off"] == rows["auto"]
    _emit(
        "eval_like_zoo_s",
        walls["auto"],
        "s wall of eval --like-zoo fashion-mnist of one encoder (compiled)",
        smoke=not cuda,
        eager_s=walls["off"],
        rows=len(rows["auto"]),
        rows_with_eager_outcomes=sum(rows["auto"].get(k) == v for k, v in rows["off"].items()),
        same_outcomes_as_eager=same,
        model=model,
        device=_device_name(device),
    )


def _missing_fashion_mnist(data_root: str | None) -> str | None:
    from robustbench_nacl.data import load_dataset
    from robustbench_nacl.errors import UserError

    try:
        load_dataset("fashion-mnist", "test", root=data_root, download=False)
    except UserError as e:
        return f"Fashion-MNIST is not under --data-root ({e}); carry it to measure this figure"
    return None


def _run_cli(argv: list[str], out: Path) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one in-process command, and its rows' per-example outcomes by row id."""
    from robustbench_nacl.cli import main
    from robustbench_nacl.results.rows import load_rows

    t = time.perf_counter()
    with _quiet():
        code = main(argv)
    wall = round(time.perf_counter() - t, 2)
    if code != 0:
        raise SystemExit(f"gpu_check: {' '.join(argv[:3])} ... exited {code}")
    return wall, {r.row_id: (r.get("clean_bits"), r.get("robust_bits")) for r in load_rows(out)}


# ============ --deterministic ============


def deterministic(args: argparse.Namespace, device: str) -> None:
    """``train --deterministic`` twice per mode, each in a fresh process: equal weights' sha256?"""
    cuda = device == "cuda"
    base = ["train", "--loss", "simclr", "--dataset", "digits", "--encoder", "convnet_small"]
    base += ["--epochs", "2", "--batch-size", "128", "--device", device, "--deterministic", "--no-progress"]
    if not cuda:
        base += ["--max-train", "64", "--batch-size", "32", "--encoder-arg", "width=4", "--knn-every", "0"]
    result = {}
    for mode in MODES:
        shas = []
        for rerun in range(2):
            with tempfile.TemporaryDirectory() as tmp:
                argv = [*base, "--out", str(Path(tmp) / "run"), "--compile", _mode(mode, cuda)]
                _log(f"deterministic rerun {rerun + 1}/2, compile {_mode(mode, cuda)}")
                shas.append(_train_process(argv, Path(tmp) / "run", smoke=not cuda))
        result[mode] = {"weights_sha256": shas, "bit_identical": shas[0] == shas[1]}
    value = all(r["bit_identical"] for r in result.values())
    _emit(
        "deterministic_reruns",
        value,
        "train --deterministic twice per mode: equal weights (true/false)",
        smoke=not cuda,
        eager=result["off"],
        compiled=result["auto"],
        device=_device_name(device),
    )


def _train_process(argv: list[str], out: Path, *, smoke: bool) -> str:
    """Run ``robustbench-nacl ARGV`` in a new process; the sha256 of the weights it wrote."""
    prelude = "import sys; from robustbench_nacl.cli import main; "
    if smoke:  # the compiled path on a CPU: aot_eager (see the module docstring)
        prelude += "import robustbench_nacl.accel as a; a.DEFAULT_BACKEND = 'aot_eager'; "
    code = prelude + f"sys.exit(main({argv!r}))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"gpu_check: train exited {res.returncode}: {tail}")
    return hashlib.sha256((out / "weights.safetensors").read_bytes()).hexdigest()


# ============ the command ============


FIGURES: dict[str, Callable[[argparse.Namespace, str], None]] = {
    "gpu_epoch": gpu_epoch,
    "views": views,
    "eval_like_zoo": eval_like_zoo,
    "deterministic": deterministic,
}


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu (--cpu-smoke: not a GPU figure)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny CPU versions (checks that the script runs)")
    p.add_argument("--only", action="append", choices=list(FIGURES), help="run only this figure (repeatable)")
    p.add_argument("--data-root", default=None, help="datasets (CIFAR-100, Fashion-MNIST) if carried")
    p.add_argument("--model", default=EVAL_MODEL, help="the published encoder of eval_like_zoo")
    args = p.parse_args(argv)
    for path in (str(BENCH), str(ROOT)):  # gpu_epoch and common; this checkout's package
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        import torch

        import robustbench_nacl  # noqa: F401  (its dependencies: safetensors, tqdm, ...)
    except ImportError as e:
        print(
            f"gpu_check: cannot import {e.name}: install torch and this package's dependencies",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check: no CUDA device here; run it on a GPU machine (or --cpu-smoke to check it runs)",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if args.cpu_smoke else "cuda"
    if args.cpu_smoke:
        import robustbench_nacl.accel as accel

        accel.DEFAULT_BACKEND = "aot_eager"
    for name in args.only or list(FIGURES):
        t = time.perf_counter()
        FIGURES[name](args, device)
        _log(f"{name}: {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
