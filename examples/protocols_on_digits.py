"""SLF, ALF and AFF on one digits encoder: the measurement behind docs/decisions.md ('Finetuning protocols').

    python examples/protocols_on_digits.py [OUT]     # about 20 CPU-minutes (AFF is most of it)

Trains a SimCLR convnet_small (width 16, 10 epochs, batch 128, Adam 3e-3) on digits, then evaluates
it on all 360 digits test images with PGD-20 (step eps / 4) at 8/255 and at 0.1 under four
protocols: SLF, ALF with the published defaults (25 epochs of CIFAR-10), ALF with CIFAR-10's *step*
budget (200 epochs at batch 128, milestones 80 and 160: about 2,300 SGD steps, as 25 CIFAR epochs
at batch 512) and AFF with the published defaults. Prints clean and robust accuracy per protocol.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from robustbench_nacl.report.stats import mcnemar
from robustbench_nacl.results.bits import decode_bits

SUITE = """name = "protocols-on-digits"
description = "PGD-20 (step eps / 4, 1 restart) at 8/255 and 0.1, Linf"

[[attack]]
name = "pgd"
norm = "Linf"
eps = [0.03137254901960784]
steps = 20
step_size = 0.00784313725490196
restarts = 1

[[attack]]
name = "pgd"
norm = "Linf"
eps = [0.1]
steps = 20
step_size = 0.025
restarts = 1
"""

PROTOCOLS = {  # label -> (output folder under OUT, eval arguments)
    "SLF": ("slf", ["--protocol", "slf"]),
    "ALF, published defaults": ("alf/default", ["--protocol", "alf"]),
    "ALF, CIFAR step budget": (
        "alf/steps",
        ["--protocol", "alf", "--alf-epochs", "200", "--alf-batch-size", "128", "--alf-milestones", "80,160"],
    ),
    "AFF, published defaults": ("aff/default", ["--protocol", "aff"]),
}


def main(argv: list[str]) -> int:
    """Train, evaluate under each protocol, print the table."""
    out = Path(argv[0] if argv else "robustbench_out/protocols_on_digits").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.toml").write_text(SUITE)
    cli = [sys.executable, "-m", "robustbench_nacl"]
    ckpt = out / "simclr"
    train = ["train", "--loss", "simclr", "--dataset", "digits", "--epochs", "10", "--batch-size", "128"]
    train += ["--lr", "0.003", "--encoder-arg", "width=16", "--out", str(ckpt), "--no-progress"]
    if not (ckpt / "weights.safetensors").exists():
        subprocess.run([*cli, *train], check=True)
    print("protocol                  clean    PGD-20@8/255  PGD-20@0.1   (360 digits test images)")
    pgd: dict[str, dict[float, dict]] = {}
    for label, (folder, args) in PROTOCOLS.items():
        rows_dir = out / folder
        cmd = [*cli, "eval", str(ckpt), "--suite", str(out / "suite.toml"), "--out", str(rows_dir)]
        subprocess.run([*cmd, *args, "--no-progress"], check=True, capture_output=True)
        rows = [json.loads(p.read_text()) for p in sorted((rows_dir / "rows").glob("*.json"))]
        pgd[label] = acc = {round(r["eps"], 4): r for r in rows if r["attack"] == "pgd"}
        clean = rows[0]["clean_acc"]
        print(
            f"{label:24} {clean * 100:6.1f} %  {acc[0.0314]['robust_acc'] * 100:9.1f} %  "
            f"{acc[0.1]['robust_acc'] * 100:9.1f} %"
        )
    # the same 360 examples under both protocols: McNemar's exact test on the robust outcomes
    for eps in (0.0314, 0.1):
        a, b = pgd["SLF"][eps], pgd["ALF, CIFAR step budget"][eps]
        n = a["n_examples_evaluated"]
        test = mcnemar(decode_bits(a["robust_bits"], n), decode_bits(b["robust_bits"], n))
        print(
            f"ALF (CIFAR step budget) vs SLF at eps {eps}: robust only under ALF {test.c}, "
            f"only under SLF {test.b}, McNemar p {test.p:.2g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
