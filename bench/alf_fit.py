"""Measurement ``alf_fit`` (issue 37): the ALF head's clean accuracy under each fit and schedule length,
against SLF's, on the same encoder.

Not a speed figure (``run.py`` does not run it): one JSON line per (encoder, fit, epochs) with the
clean test accuracy and train accuracy of SLF (the board's probe: standardised features, 200 epochs
at lr 0.01) and of the ALF head, its FGSM accuracy at 8/255, the SLF reference of the
``alf_underfit`` check, the two sanity flags and the wall time. Everything goes through
``evaluate``, as the board's rows.

Two sources of encoders:

- ``--board`` (the reference board's check): the package's published ``simclr`` seed-0 encoder of
  the Fashion-MNIST zoo and its random-init control, evaluated on Fashion-MNIST classes 0-4 (500 test
  examples, 1,024 ALF training images at batch 128, as the zoo's manifests). The board's reading,
  ``fit standardized`` at the recipe's 25 epochs, is converged when 4x the epochs (milestones at
  the same fractions) moves clean accuracy by about a point (docs/decisions.md, 'Fitted ALF heads'):
  ``--fits standardized --epochs 25,100``.
- default: convnet_small (width 16) trained ``--simclr-epochs`` epochs of SimCLR on digits, and its
  untrained copy.

    python bench/alf_fit.py --board --fits standardized --epochs 25,100
    python bench/alf_fit.py [--simclr-epochs 5] [--fits off,fitted] [--batch-size 128]

A ``fit fitted`` head at batch 128 on 1,024 images is 9,776 PGD-10 steps, 49x the recipe's 200:
about 2-3 hours per board encoder, from the 136-210 s its 25-epoch heads took (docs/decisions.md,
'Fitted ALF heads').
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import emit, log, set_threads

SUITE = {"name": "alf-fit", "attack": [{"name": "fgsm", "eps": [8 / 255]}]}
BOARD_ENTRY = "convnet_small.simclr_fashion-mnist-0-4_s0"


def _milestones(epochs: int) -> str:
    """The recipe's milestones (10, 20 of 25 epochs) at the same fractions of ``epochs``."""
    return f"{round(epochs * 10 / 25)},{round(epochs * 20 / 25)}"


def main() -> None:
    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.eval.probe import ProbeConfig
    from robustbench_nacl.packaged import published_dir
    from robustbench_nacl.results.finetune import AlfConfig, fitted_schedule
    from robustbench_nacl.results.rows import protocol_name
    from robustbench_nacl.training import TrainConfig, train

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--board", action="store_true", help="the board's published simclr s0 and its control")
    p.add_argument("--simclr-epochs", type=int, default=5, help="digits: SimCLR epochs of the encoder")
    p.add_argument("--fits", default="off,fitted", help="ALF fits to compare (comma list)")
    p.add_argument("--epochs", default="25", help="ALF recipe epochs to compare (comma list)")
    p.add_argument("--max-train", type=int, default=1024, help="ALF training images (the board's 1,024)")
    p.add_argument("--batch-size", type=int, default=128, help="ALF batch (board: 128, recipe: 512)")
    p.add_argument("--encoders", default="trained,control", help="trained and/or control (comma list)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    threads = set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.board:
            ckpt = published_dir() / "fashion-mnist" / "models" / BOARD_ENTRY
            dataset, n_examples = "fashion-mnist:0-4", 500
            probe = ProbeConfig(epochs=200, lr=0.01, standardize=True, max_train=4096)
            name = BOARD_ENTRY
        else:
            cfg = TrainConfig(
                loss="simclr", dataset="digits", encoder="convnet_small", epochs=args.simclr_epochs
            )
            ckpt = train(cfg, Path(tmp) / "run", progress=False)
            dataset, n_examples = "digits", None
            probe = ProbeConfig(epochs=200, lr=0.01, standardize=True)
            name = f"simclr digits, {args.simclr_epochs} epochs"
        for control in [{"trained": False, "control": True}[e] for e in args.encoders.split(",")]:
            for fit in args.fits.split(","):
                for epochs in (int(e) for e in args.epochs.split(",")):
                    alf = AlfConfig(
                        max_train=args.max_train,
                        batch_size=args.batch_size,
                        fit=fit,
                        epochs=epochs,
                        milestones=_milestones(epochs),
                    )
                    log(f"control={control} fit={fit}: {fitted_schedule(alf, args.max_train).epochs} epochs")
                    start = time.perf_counter()
                    rows = evaluate(
                        Path(ckpt),
                        dataset=dataset,
                        suite=SUITE,
                        probe=probe,
                        protocol="slf,alf",
                        alf=alf,
                        control=control,
                        n_examples=n_examples,
                        out=Path(tmp) / f"rows-{control}-{fit}-{epochs}",
                        progress=False,
                    )
                    slf = next(r for r in rows if protocol_name(r) == "slf")
                    row = next(r for r in rows if protocol_name(r) == "alf")
                    emit(
                        {
                            "figure": "alf_fit",
                            "value": {
                                "slf_clean": slf["clean_acc"],
                                "slf_train": slf["probe_train_acc"],
                                "alf_clean": row["clean_acc"],
                                "alf_train": row["probe_train_acc"],
                                "alf_fgsm": row["robust_acc"],
                                "slf_train_acc": row["slf_train_acc"],
                                "alf_underfit": row["sanity_alf_underfit"],
                                "finetune_above_chance": row["sanity_finetune_above_chance"],
                                "epochs_run": row["finetune_epochs"],
                                "wall_s": round(time.perf_counter() - start, 1),
                            },
                            "unit": "accuracy",
                            "config": {
                                "encoder": "random-init" if control else name,
                                "dataset": dataset,
                                "n_examples": n_examples,
                                "fit": fit,
                                "alf_epochs": epochs,
                                "alf_milestones": _milestones(epochs),
                                "alf_max_train": args.max_train,
                                "alf_batch_size": args.batch_size,
                                "threads": threads,
                            },
                        }
                    )


if __name__ == "__main__":
    main()
