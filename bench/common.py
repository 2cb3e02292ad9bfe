"""Shared helpers of the benchmark figures: environment block, interleaved timing, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def set_threads(n: int) -> int:
    """Set torch's intra-op threads explicitly (recorded in every figure); returns the value in effect."""
    torch.set_num_threads(n)
    return torch.get_num_threads()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git() -> dict[str, Any]:
    def out(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {"commit": out("rev-parse", "--short", "HEAD"), "dirty": bool(out("status", "--porcelain"))}


def environment() -> dict[str, Any]:
    """The machine, versions, threads and current load, for the ``env`` field of every figure."""
    import torchvision

    return {
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git": _git(),
    }


def interleaved(
    contenders: dict[str, Callable[[], Any]], reps: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Wall seconds of each contender, run alternately ``reps`` times after ``warmup`` untimed rounds.

    The order alternates between rounds (A B, B A, ...) so that a slow drift of the machine's load
    falls on both contenders alike.
    """
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    """Median of a non-empty list."""
    return float(statistics.median(xs))


def rounded(xs: list[float], digits: int = 4) -> list[float]:
    """The raw timings, rounded for the JSON line."""
    return [round(x, digits) for x in xs]


def emit(figure: dict[str, Any]) -> None:
    """Print one figure as one JSON line on stdout (``env`` appended)."""
    figure = {**figure, "env": environment()}
    print(json.dumps(figure), flush=True)


def log(msg: str) -> None:
    """Progress on stderr (stdout carries only the JSON lines)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def paired_ratios(times: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Per-round ratios ``num / den`` (the two ran back to back in each round, so load drift cancels)."""
    return [round(a / b, 4) for a, b in zip(times[num], times[den], strict=True)]
