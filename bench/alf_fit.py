"""Measurement ``alf_fit`` (issue 37): the ALF head's clean accuracy, unfitted and fitted, against SLF's.

Not a speed figure (``run.py`` does not run it): one JSON line per encoder with the clean test
accuracy of SLF (the board's probe: standardised features, 200 epochs at lr 0.01), of ALF as the
recipe is configured (``fit off``: 25 epochs of the literature's recipe at batch 128, on 1,024
training images: 200 SGD steps) and of the fitted ALF head (``fit fitted``: the recipe's 9,775 steps,
standardised features), with each head's train accuracy, the SLF reference and the two sanity
flags. Encoders: convnet_small (width 16) trained ``--epochs`` epochs of SimCLR on digits, and its
untrained copy (the random-init control). Everything goes through ``evaluate``, as the board's rows.

    python bench/alf_fit.py [--epochs 5] [--max-train 1024] [--batch-size 128] [--encoders trained,control]

At batch 128 a fitted head is 9,775 PGD-10 steps (about an hour per encoder on one contended CPU
core); ``--batch-size 512`` (the recipe's: 2,450 steps) is a quarter of that.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import emit, log, set_threads

SUITE = {"name": "alf-fit", "attack": [{"name": "fgsm", "eps": [8 / 255]}]}


def main() -> None:
    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.eval.probe import ProbeConfig
    from robustbench_nacl.results.finetune import AlfConfig, fitted_schedule
    from robustbench_nacl.results.rows import protocol_name
    from robustbench_nacl.training import TrainConfig, train

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--epochs", type=int, default=5, help="SimCLR epochs of the trained encoder")
    p.add_argument("--max-train", type=int, default=1024, help="ALF training images (the board's 1,024)")
    p.add_argument("--batch-size", type=int, default=128, help="ALF batch (board: 128, recipe: 512)")
    p.add_argument("--encoders", default="trained,control", help="trained and/or control (comma list)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    threads = set_threads(args.threads)
    cfg = TrainConfig(loss="simclr", dataset="digits", encoder="convnet_small", epochs=args.epochs)
    probe = ProbeConfig(epochs=200, lr=0.01, standardize=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = train(cfg, Path(tmp) / "run", progress=False)
        for control in [{"trained": False, "control": True}[e] for e in args.encoders.split(",")]:
            out: dict[str, object] = {}
            for fit in ("off", "fitted"):
                alf = AlfConfig(max_train=args.max_train, batch_size=args.batch_size, fit=fit)
                log(f"control={control} fit={fit}: {fitted_schedule(alf, args.max_train).epochs} epochs")
                rows = evaluate(
                    ckpt,
                    dataset="digits",
                    suite=SUITE,
                    probe=probe,
                    protocol="slf,alf",
                    alf=alf,
                    control=control,
                    out=Path(tmp) / f"rows-{control}-{fit}",
                    progress=False,
                )
                slf = next(r for r in rows if protocol_name(r) == "slf")
                row = next(r for r in rows if protocol_name(r) == "alf")
                out["slf_clean"], out["slf_train"] = slf["clean_acc"], slf["probe_train_acc"]
                out[f"alf_{fit}"] = {
                    "clean": row["clean_acc"],
                    "train": row["probe_train_acc"],
                    "slf_train_acc": row["slf_train_acc"],
                    "epochs": row["finetune_epochs"],
                    "alf_underfit": row["sanity_alf_underfit"],
                    "finetune_above_chance": row["sanity_finetune_above_chance"],
                }
            emit(
                {
                    "figure": "alf_fit",
                    "value": out,
                    "unit": "accuracy",
                    "config": {
                        "encoder": "random-init" if control else f"simclr digits, {args.epochs} epochs",
                        "dataset": "digits (test split, all of it)",
                        "alf_max_train": args.max_train,
                        "alf_batch_size": args.batch_size,
                        "threads": threads,
                    },
                }
            )


if __name__ == "__main__":
    main()
