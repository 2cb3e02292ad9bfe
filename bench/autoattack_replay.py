"""Replay the reference board's AutoAttack rows with pyautoattack called directly, example by example.

``python bench/autoattack_replay.py [NAME ...] [--control-of NAME] [--out FILE]``

For each published Fashion-MNIST encoder NAME (default: simclr, intcl, acl and dynacl, seed 0): the
classifier the tool attacked (``load_model(NAME, head=True)``, the encoder in channels-last as
``eval`` composes it), the first ``n_examples`` in-domain test images, and its committed SLF in-domain
AutoAttack row (``leaderboard/rows``). ``attack.autoattack_replay.replay_row`` then runs
``pyautoattack.AutoAttack`` itself, chunk by chunk with the seed each chunk received (recorded in
rows written since issue 36; derived for the reference rows, which predate the fields), and
compares every example's outcome with the row's ``robust_bits``. ``--control-of NAME``: the
random-init control of NAME's seed (weights from ``random_init_like``, checked against the row's
sha256; its linear probe fitted again with the row's probe settings, checked by the clean bits).
One JSON line per encoder on stdout, and appended to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [f"convnet_small.{f}_fashion-mnist-0-4_s0" for f in ("simclr", "intcl", "acl", "dynacl")]


def _row(checkpoint_sha256: str) -> dict[str, Any]:
    """The committed SLF in-domain AutoAttack row of a checkpoint."""
    from robustbench_nacl.results.rows import load_rows

    rows = [
        dict(r)
        for r in load_rows(ROOT / "leaderboard")
        if r["checkpoint_sha256"] == checkpoint_sha256
        and r["attack"] == "autoattack"
        and r["setting"] == "in-domain"
        and not r.get("finetune")
    ]
    if len(rows) != 1:
        raise SystemExit(f"expected one SLF in-domain AutoAttack row of {checkpoint_sha256}, got {len(rows)}")
    return rows[0]


def _control_sha(seed: int) -> str:
    """The checkpoint sha256 of the reference's random-init control of ``seed``."""
    from robustbench_nacl.results.rows import load_rows

    ids = {r["checkpoint_id"]: r["checkpoint_sha256"] for r in load_rows(ROOT / "leaderboard")}
    return ids[f"convnet_small.random-init_fashion-mnist-0-4_s{seed}"]


def _published(name: str) -> tuple[nn.Module, dict[str, Any]]:
    from robustbench_nacl.hub.catalog import find_model
    from robustbench_nacl.hub.load import load_model

    model = load_model(name, head=True)
    model.encoder.to(memory_format=torch.channels_last)  # as eval composes it (eval/recipe.py)
    return model, _row(find_model(name).card["weights_sha256"])


def _control(name: str, data: Any) -> tuple[nn.Module, dict[str, Any]]:
    from robustbench_nacl.eval.probe import ProbeConfig, fit_linear_probe
    from robustbench_nacl.eval.source import random_init_like, weights_sha256
    from robustbench_nacl.hub.catalog import find_model
    from robustbench_nacl.hub.load import checkpoint_dir
    from robustbench_nacl.models.foreign import load_encoder

    encoder, info = load_encoder(checkpoint_dir(find_model(name)))
    seed = int(name.rsplit("_s", 1)[1])
    fresh = random_init_like(encoder, info, seed)
    row = _row(_control_sha(seed))
    if weights_sha256(fresh) != row["checkpoint_sha256"]:
        raise SystemExit(f"the control of {name} does not hash like the row's checkpoint")
    probe = ProbeConfig(**row["probe_config"])
    classifier, _ = fit_linear_probe(fresh.to(memory_format=torch.channels_last), *data, probe)
    return classifier, row


def replay_one(model: nn.Module, row: dict[str, Any], test: Any) -> dict[str, Any]:
    """Replay one row; the JSON-able result."""
    from robustbench_nacl.attack.autoattack_replay import replay_row
    from robustbench_nacl.results.bits import decode_bits

    n = int(row["n_examples_evaluated"])
    x, y = test.x[:n].float().div(255), test.y[:n].long()
    with torch.no_grad():
        clean = (model(x).argmax(1) == y).numpy()
    t = time.perf_counter()
    got = replay_row(model, x, y, row)
    return {
        "checkpoint_id": row["checkpoint_id"],
        "n_examples": n,
        "clean_bits_match": bool((clean == decode_bits(row["clean_bits"], n)).all()),
        "n_attacked": int(row["n_clean_correct"]),
        "robust_row": int(row["n_robust"]),
        "robust_replayed": int(got["robust"].sum()),
        "bits_match": got["matches"],
        "n_differ": got["n_differ"],
        "seeds": got["seeds"],
        "chunk_sizes": got["chunk_sizes"],
        "seeds_recorded_in_row": got["recorded"],
        "replay_wall_s": round(time.perf_counter() - t, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Replay each encoder's row; exit 1 if any example differs."""
    from robustbench_nacl.data import load_dataset

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", default=None)
    p.add_argument("--control-of", default=None, help="also replay the random-init control of this seed")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    test = load_dataset("fashion-mnist:0-4", "test")
    jobs = [(name, lambda name=name: _published(name)) for name in args.names or DEFAULT]
    if args.control_of:
        train = load_dataset("fashion-mnist:0-4", "train")
        jobs.append((f"control of {args.control_of}", lambda: _control(args.control_of, (train, test))))
    ok = True
    for _, build in jobs:
        model, row = build()
        result = replay_one(model.eval(), row, test)
        ok &= result["bits_match"]
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
