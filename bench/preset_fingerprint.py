"""Behaviour fingerprint: every preset's 2-epoch digits run, as sha256 of its weights and log.jsonl.

    python bench/preset_fingerprint.py OUT [--json FILE]

Trains every registered preset (deacl distils the simclr run made first) for 2 epochs on 256 digits
images (convnet_small width 8, batch 64, kNN monitor every epoch, 1 torch thread) and prints one line
per preset: name, weights sha256, log.jsonl sha256 without its wall-clock field (16 hex digits
each). Run it on two commits of the same machine: identical lines mean a change left training bit
for bit as it was (the claim made for refactors in CHANGELOG.md). Training is bit-identical only on
the same CPU and thread count, so compare runs of one machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import torch


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _log_sha(path: Path) -> str:
    """sha256 of log.jsonl without its wall-clock field (``wall_s`` differs run to run)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    text = "\n".join(json.dumps({k: v for k, v in r.items() if k != "wall_s"}, sort_keys=True) for r in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(out: Path) -> dict[str, list[str]]:
    """Train every preset under ``out`` and return name -> [weights sha, log sha]."""
    import robustbench_nacl as rbn
    from robustbench_nacl.losses import PRESETS

    torch.set_num_threads(1)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    common = {
        "dataset": "digits:0-4",
        "epochs": 2,
        "batch_size": 64,
        "max_train": 256,
        "encoder_kwargs": {"width": 8},
        "knn_every": 1,
    }
    result: dict[str, list[str]] = {}
    for name in ["simclr", *sorted(set(PRESETS) - {"simclr"})]:
        overrides = {"teacher": str((out / "simclr").resolve())} if name == "deacl" else {}
        rbn.train(rbn.TrainConfig(loss=name, overrides=overrides, **common), out / name)
        result[name] = [_sha(out / name / "weights.safetensors"), _log_sha(out / name / "log.jsonl")]
        print(name, *result[name], flush=True)
    return result


def main() -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="scratch folder for the runs (emptied first)")
    p.add_argument("--json", type=Path, help="also write the fingerprint as JSON here")
    args = p.parse_args()
    result = fingerprint(args.out)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
