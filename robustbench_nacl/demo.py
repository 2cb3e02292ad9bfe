"""The one-command demo: train the demo zoo, evaluate every entry, render the leaderboard.

Runs on the embedded default data (scikit-learn's 8x8 digits: pretrain on classes 0-4, transfer
to 5-9, the five ArCL shifts, the paper's attack suite) in a few minutes on 2 CPU cores.
``--dataset fashion-mnist`` runs the same code path on a harder real dataset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .errors import UserError
from .registry import Registry
from .zoo import ZooEntry, checkpoint_dir, demo_zoo, expected_id, is_trained

#: A folder of the user's: robustbench_out/ is ignored by the repository's .gitignore.
DEFAULT_OUT = Path("robustbench_out") / "demo"


@dataclass(frozen=True)
class DemoPlan:
    """The budget of one demo: data, recipe and evaluation sizes."""

    source: str  # pretraining dataset (class subset)
    target: str  # transfer dataset (the complementary classes)
    epochs: int
    batch_size: int
    probe_epochs: int
    n_examples: int | None  # first N test examples attacked per setting (None: all)
    max_train: int | None  # first N training images, for pretraining and the probe (None: all)
    shift: str | None = "all"


DEMOS: Registry[dict[str, DemoPlan]] = Registry("demo dataset")
DEMOS.add(
    "digits",
    {
        "full": DemoPlan(
            "digits:0-4",
            "digits:5-9",
            epochs=10,
            batch_size=128,
            probe_epochs=1000,
            n_examples=None,
            max_train=None,
        ),
        "quick": DemoPlan(
            "digits:0-4",
            "digits:5-9",
            epochs=2,
            batch_size=128,
            probe_epochs=100,
            n_examples=60,
            max_train=None,
            shift="grayscale,crop",
        ),
    },
)
DEMOS.add(
    "fashion-mnist",
    {
        # 28x28 images, 12x the pixels of digits: sized to ~10 minutes on 2 cores. Two shifts: on
        # 1-channel images "grayscale" is the identity and "grayscale+jitter" is "jitter"
        "full": DemoPlan(
            "fashion-mnist:0-4",
            "fashion-mnist:5-9",
            epochs=2,
            batch_size=128,
            probe_epochs=200,
            n_examples=200,
            max_train=2048,
            shift="crop,jitter",
        ),
        "quick": DemoPlan(
            "fashion-mnist:0-4",
            "fashion-mnist:5-9",
            epochs=1,
            batch_size=256,
            probe_epochs=50,
            n_examples=60,
            max_train=1024,
            shift="grayscale,crop",
        ),
    },
)


def demo_entries(plan: DemoPlan) -> list[ZooEntry]:
    """The demo zoo, re-targeted at the plan's dataset and recipe (same losses and encoders)."""
    out = []
    for e in demo_zoo():
        recipe = {**e.recipe, "epochs": plan.epochs, "batch_size": plan.batch_size}
        out.append(
            dataclasses.replace(
                e,
                id=expected_id(e.encoder, e.loss, plan.source, e.seed),
                dataset=plan.source,
                recipe=recipe,
                eval={**e.eval, "transfer": plan.target, "shift": plan.shift, "n_examples": plan.n_examples},
            )
        )
    return out


def _init_worker() -> None:
    # Tiny models: one thread per worker process beats two contended threads per process.
    import torch

    from . import plugins

    torch.set_num_threads(1)
    # the parent's plugins (ROBUSTBENCH_NACL_PLUGINS, and the installed entry points): a spawned
    # worker has not imported them, and a forked one finds them loaded (a no-op)
    plugins.load_plugins()


def _train_job(entry: ZooEntry, ckpts: str, plan: DemoPlan, device: str) -> str:
    from .training import train

    d = checkpoint_dir(entry, ckpts)
    cfg = entry.train_config(max_train=plan.max_train, knn_every=max(plan.epochs, 1))
    train(cfg, d, device=device, resume=(d / "train_state.pt").exists(), progress=False)
    return entry.id


def _eval_job(ckpt: str, out: str, plan: DemoPlan, device: str, control: bool) -> int:
    from .eval.evaluate import evaluate
    from .eval.probe import ProbeConfig

    rows = evaluate(
        ckpt,
        transfer=plan.target,
        shift=plan.shift,
        suite="paper",
        out=out,
        n_examples=plan.n_examples,
        probe=ProbeConfig(epochs=plan.probe_epochs, seed=0, max_train=plan.max_train),
        device=device,
        control=control,
        progress=False,
    )
    return len(rows)


def _run_jobs(
    pool: Executor | None, jobs: list[tuple[Any, ...]], fn: Any, desc: str, progress: bool
) -> list[Any]:
    """Run independent jobs in the worker pool (or inline without one); errors propagate."""
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress, unit="job")
    results = []
    try:
        if pool is None:
            for args in jobs:
                results.append(fn(*args))
                bar.update()
        else:
            for f in as_completed([pool.submit(fn, *args) for args in jobs]):
                results.append(f.result())
                bar.update()
    finally:
        bar.close()
    return results


def _make_pool(workers: int) -> Executor | None:
    if workers <= 1:
        return None
    import multiprocessing as mp

    # fork (where available) reuses the parent's imports: spawning re-imports torch and
    # scikit-learn in every worker (~10 s each on 2 loaded cores). The parent has run no torch
    # op yet, so no OpenMP pool exists to be forked.
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_init_worker)


def run_demo(
    out: str | Path = DEFAULT_OUT,
    *,
    dataset: str = "digits",
    quick: bool = False,
    device: str = "cpu",
    workers: int | None = None,
    progress: bool = True,
    command: str | None = None,
) -> dict[str, Path]:
    """Train the demo zoo, evaluate every entry plus a random-init control, render the leaderboard.

    ``command`` is the command line recorded in the leaderboard (default: ``robustbench-nacl demo``).
    """
    from .eval.rows import load_rows
    from .report.leaderboard import render_leaderboard

    plan = DEMOS.get(dataset)["quick" if quick else "full"]
    base = Path(out) / ("quick" if quick else "full")
    ckpts = base / "checkpoints"
    workers = workers or min(2, os.cpu_count() or 1)
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    t0 = time.perf_counter()
    entries = demo_entries(plan)

    # ============ training the demo zoo (already-trained entries are skipped) ============
    pool = _make_pool(workers)
    try:
        todo = [(e, str(ckpts), plan, device) for e in entries if not is_trained(e, ckpts)]
        _run_jobs(pool, todo, _train_job, f"train demo zoo ({len(todo)} of {len(entries)})", progress)
        t_train = time.perf_counter() - t0

        # ============ evaluating every entry, and one random-init control per encoder ============
        jobs = [(str(checkpoint_dir(e, ckpts)), str(base), plan, device, False) for e in entries]
        first_per_encoder = {e.encoder: e for e in reversed(entries)}
        jobs += [
            (str(checkpoint_dir(e, ckpts)), str(base), plan, device, True) for e in first_per_encoder.values()
        ]
        _run_jobs(pool, jobs, _eval_job, "evaluate", progress)
        t_eval = time.perf_counter() - t0 - t_train
    finally:
        if pool is not None:
            pool.shutdown()

    # ============ rendering the leaderboard ============
    files = render_leaderboard(
        load_rows(base), base / "leaderboard", command=command or "robustbench-nacl demo"
    )
    total = time.perf_counter() - t0
    if progress:
        print(
            f"demo ({dataset}, {'quick' if quick else 'full'}) done in {total:.0f} s "
            f"(train {t_train:.0f} s, evaluate {t_eval:.0f} s, {workers} worker(s))\n"
            f"  checkpoints: {ckpts}\n  result rows: {base / 'rows'}\n"
            f"  leaderboard: {files['LEADERBOARD.md']}\n  web page:    {files['index.html']}"
        )
    return files
