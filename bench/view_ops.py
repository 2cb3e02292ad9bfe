"""CPU proxy ``view_ops``: the ATen ops one views call of each preset dispatches, and its CPU time.

    python bench/view_ops.py [--batches 16,64,256] [--shape 3,32,32] [--time] [--baseline DIR]

For every registered preset, its view maker is called as ``TrainStep`` calls it (the preset's
``n_views`` and parameters) on random uint8 images (CIFAR's shape by default), once to warm up, then
once under a ``TorchDispatchMode`` that counts every ATen op it dispatches, at each batch size. On a
GPU each of these ops is at least one kernel launch, so the count is what bounds a views call there
(the issue 46 measurement: about 1,400 launches for 2.1 ms of kernel time), and it is a CPU cost too
(dispatch overhead per op). The count should not grow with the batch size. One JSON line per preset:
``ops`` per batch size, ``per_view``, ``constant`` (the same count at every batch size) and the most
frequent ops.

``--time`` adds the wall time of one call at the largest batch (median of ``--reps`` calls, 1 torch
thread). ``--baseline DIR`` does everything for a second copy of the package as well, e.g. an older
commit unpacked with ``git archive COMMIT | tar -x -C DIR``, interleaving the timed calls with this
checkout's (``baseline_ops``, ``baseline_ms``, ``paired_ratio``: per round this / baseline).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from common import emit, interleaved, log, median, paired_ratios
from torch.utils._python_dispatch import TorchDispatchMode

ViewCall = Callable[[torch.Tensor, torch.Generator], Any]


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched while active, by name (``aten.add``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def load_package(root: Path | None) -> ModuleType:
    """``robustbench_nacl`` of this checkout (None), or the one under ``root`` as a separate module."""
    if root is None:
        return importlib.import_module("robustbench_nacl")
    name = "robustbench_nacl_baseline"
    if name in sys.modules:
        return sys.modules[name]
    init = root / "robustbench_nacl" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--baseline: no robustbench_nacl package under {root}")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def view_call(package: ModuleType, preset: str) -> tuple[ViewCall, str, int]:
    """The preset's views call as ``TrainStep`` makes it: ``(call(x, gen), view maker, n_views)``."""
    losses = importlib.import_module(f"{package.__name__}.losses")
    views = importlib.import_module(f"{package.__name__}.augment.views")
    params = losses.resolve(preset)
    n_views = losses.needs(params).n_views
    maker = views.VIEW_MAKERS.get(params.views)
    kwargs = {**params.to_dict(), **params.extra_params()}
    return (lambda x, gen: maker(x, n_views, gen, **kwargs)), params.views, n_views


def images(batch: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """Random uint8 images (the op count does not depend on the pixel values)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (batch, *shape), dtype=torch.uint8, generator=gen)


def count_ops(call: ViewCall, batch: int, shape: tuple[int, int, int] = (3, 32, 32)) -> Counter[str]:
    """The ops one call dispatches, after a warm-up call (which builds the cached constants)."""
    x = images(batch, shape)
    call(x, torch.Generator().manual_seed(1))
    with OpCounter() as counter:
        call(x, torch.Generator().manual_seed(2))
    return counter.ops


def measure(preset: str, args: argparse.Namespace, baseline: ModuleType | None) -> dict[str, Any]:
    """One preset's JSON line."""
    call, maker, n_views = view_call(load_package(None), preset)
    counts = {b: count_ops(call, b, args.shape) for b in args.batches}
    totals = {str(b): sum(c.values()) for b, c in counts.items()}
    largest = counts[max(args.batches)]
    out: dict[str, Any] = {
        "figure": "view_ops",
        "preset": preset,
        "views": maker,
        "n_views": n_views,
        "input": list(args.shape),
        "ops": totals,
        "per_view": round(sum(largest.values()) / n_views, 1),
        "constant": len(set(totals.values())) == 1,
        "top_ops": dict(largest.most_common(8)),
    }
    calls = {"this": call}
    if baseline is not None:
        base_call, _, _ = view_call(baseline, preset)
        base_counts = {b: count_ops(base_call, b, args.shape) for b in args.batches}
        out["baseline_ops"] = {str(b): sum(c.values()) for b, c in base_counts.items()}
        calls["baseline"] = base_call
    if args.time:
        x = images(max(args.batches), args.shape)
        gen = torch.Generator().manual_seed(3)  # one stream, drawn from by the contenders in turn
        times = interleaved({k: (lambda c=c: c(x, gen)) for k, c in calls.items()}, reps=args.reps)
        out["cpu_ms"] = round(median(times["this"]) * 1000, 2)
        if baseline is not None:
            out["baseline_ms"] = round(median(times["baseline"]) * 1000, 2)
            out["paired_ratio"] = round(median(paired_ratios(times, "this", "baseline")), 3)
        out["timing"] = f"median of {args.reps} interleaved calls, batch {max(args.batches)}, 1 torch thread"
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _shape(text: str) -> tuple[int, int, int]:
    values = _ints(text)
    if len(values) != 3 or values[0] not in (1, 3):
        raise argparse.ArgumentTypeError(f"expected C,H,W with C in (1, 3), got {text!r}")
    return values  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=_ints, default=(16, 64, 256), help="batch sizes (default 16,64,256)")
    p.add_argument("--shape", type=_shape, default=(3, 32, 32), help="C,H,W of the images (default 3,32,32)")
    p.add_argument("--presets", help="comma-separated presets (default: every registered one)")
    p.add_argument("--time", action="store_true", help="also time one call at the largest batch")
    p.add_argument("--reps", type=int, default=30, help="timed calls per contender (default 30)")
    p.add_argument("--baseline", type=Path, help="a directory holding another robustbench_nacl to compare")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from robustbench_nacl.losses import PRESETS

    presets = sorted(PRESETS) if args.presets is None else args.presets.split(",")
    unknown = sorted(set(presets) - set(PRESETS))
    if unknown:
        p.error(f"unknown presets: {', '.join(unknown)}")
    baseline = load_package(args.baseline) if args.baseline is not None else None
    for preset in presets:
        log(f"view_ops {preset}")
        emit(measure(preset, args, baseline))


if __name__ == "__main__":
    main()
