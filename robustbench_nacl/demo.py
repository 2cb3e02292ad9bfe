"""The one-command demo: train the demo zoo, evaluate every entry, render the leaderboard.

Runs on the embedded default data (scikit-learn's 8x8 digits: pretrain on classes 0-4, transfer
to 5-9, the five ArCL shifts, the paper's attack suite) in a few minutes on 2 CPU cores.
``--dataset fashion-mnist`` runs the same code path on a harder real dataset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError
from .pipeline import run_entries, with_protocol
from .registry import Registry
from .zoo import ZooEntry, demo_zoo, expected_id, teacher_of

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
    # standardised probe features: a 100-epoch probe on raw features underfits some encoders
    # (9 of the 40 quick digits probes raised probe_underfit; none with standardised features)
    probe_standardize: bool = False


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
            probe_standardize=True,
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
            probe_standardize=True,
        ),
    },
)


def demo_entries(plan: DemoPlan) -> list[ZooEntry]:
    """The demo zoo, re-targeted at the plan's dataset and recipe (same losses and encoders)."""
    out = []
    for e in demo_zoo():
        recipe = {**e.recipe, "epochs": plan.epochs, "batch_size": plan.batch_size}
        if plan.max_train is not None:
            recipe["max_train"] = plan.max_train
        ev = {**e.eval, "transfer": plan.target, "shift": plan.shift, "n_examples": plan.n_examples}
        ev.update(probe_epochs=plan.probe_epochs, probe_max_train=plan.max_train)
        if plan.probe_standardize:  # only when on: the full demo's manifests stay the shipped ones
            ev["probe_standardize"] = True
        out.append(
            dataclasses.replace(
                e,
                id=expected_id(e.encoder, e.loss, plan.source, e.seed),
                dataset=plan.source,
                recipe=recipe,
                eval=ev,
                teacher=teacher_of(e.loss, e.encoder, plan.source, e.seed),  # DeACL's, re-targeted too
            )
        )
    return out


def run_demo(
    out: str | Path = DEFAULT_OUT,
    *,
    dataset: str = "digits",
    quick: bool = False,
    device: str = "cpu",
    workers: int | None = None,
    progress: bool = True,
    command: str | None = None,
    protocol: str = "slf",
) -> dict[str, Path]:
    """Train the demo zoo, evaluate every entry plus a random-init control, render the leaderboard.

    ``command`` is the command line recorded in the leaderboard (default: ``robustbench-nacl demo``);
    ``protocol``: the finetuning protocol(s), e.g. ``slf,alf,aff`` (eval/finetune.py).
    """
    from .report.leaderboard import render_leaderboard
    from .results.rows import load_rows

    plan = DEMOS.get(dataset)["quick" if quick else "full"]
    base = Path(out) / ("quick" if quick else "full")
    ckpts = base / "checkpoints"
    workers = workers or min(2, os.cpu_count() or 1)
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    t0 = time.perf_counter()
    run = run_entries(
        with_protocol(demo_entries(plan), protocol),
        ckpts,
        base,
        workers=workers,
        device=device,
        progress=progress,
    )
    t_train, t_eval = run.train_s, run.eval_s

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
