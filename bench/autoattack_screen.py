"""AutoAttack screening against the reference board's committed AutoAttack standard rows.

``python bench/autoattack_screen.py [--all] [--out FILE] [NAME ...]``

Per encoder: the classifier of its SLF in-domain row (published encoder and head, channels-last as
``eval`` composes it; ``control-sN``: the random-init control of seed N, its probe fitted again as
in ``autoattack_replay.py``), the same 500 Fashion-MNIST test images, AutoAttack screening at Linf
0.032 through the tool (``autoattack_cost.attack``: the seed ``benchmark`` derives for the
``fashion-mnist-aa-screen`` suite entry). Compared with the committed standard row: robust counts
(and accuracy difference), examples whose outcome differs, whether the flag fired, and the time
(this machine's screening wall beside the row's standard ``wall_s``, measured on the reference
machine: a different machine and load, so read that ratio as rough). One JSON line per encoder on
stdout and appended to ``--out`` as it lands. Without names: seed 0 of every family and the control
(``--all``: all 63 reference encoders). ``--table FILE`` prints the markdown table and the summary
figures of bench/README.md's screening section from such a file instead (no attack runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILIES = (
    *("simclr", "nca", "intcl", "intnacl", "mixnca", "nca_mixnca", "var", "gaussian", "hardneg"),
    *("debiased", "debiased_hardneg", "dacl", "dacl_plus", "arcl", "adv", "acl", "dynacl", "rocl"),
    *("deacl", "supervised"),
)


def _names(all_seeds: bool) -> list[str]:
    seeds = (0, 1, 2) if all_seeds else (0,)
    return [f"convnet_small.{f}_fashion-mnist-0-4_s{s}" for s in seeds for f in FAMILIES] + [
        f"control-s{s}" for s in seeds
    ]


def _build(name: str, data: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any]]:
    from autoattack_replay import _control, _published

    from robustbench_nacl.data import load_dataset

    if not name.startswith("control-s"):
        return _published(name)
    if "train" not in data:
        data["train"] = load_dataset("fashion-mnist:0-4", "train")
    acl = f"convnet_small.acl_fashion-mnist-0-4_s{name.removeprefix('control-s')}"
    return _control(acl, (data["train"], data["test"]))


def screen_one(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Screen one encoder; the comparison with its committed standard row."""
    from autoattack_cost import attack

    from robustbench_nacl.results.bits import decode_bits

    model, row = _build(name, data)
    n = int(row["n_examples_evaluated"])
    x, y = data["test"].x[:n].float().div(255), data["test"].y[:n].long()
    got = attack(model.eval(), x, y, "screen", int(row["seed"]), float(row["eps"]))
    standard = decode_bits(row["robust_bits"], n)
    robust = got["robust"].numpy()
    f = got["fields"]
    return {
        "encoder": row["checkpoint_id"],
        "n_examples": n,
        "standard_robust": int(row["n_robust"]),
        "screen_robust": int(robust.sum()),
        "robust_acc_diff_points": round(100 * (robust.sum() - row["n_robust"]) / n, 2),
        "examples_differ": int((robust != standard).sum()),
        "standard_after_apgd_t": int(row["aa_n_robust_after_apgd_t"]),
        "screen_after_apgd_t": int(f["aa_n_robust_after_apgd_t"]),
        "standard_late_finds": int(row["aa_n_robust_after_apgd_t"] - row["n_robust"]),
        "screen_survivors": f["aa_screen_survivors"],
        "screen_sample_size": f["aa_screen_sample_size"],
        "screen_found": f["aa_screen_found"],
        "flag_fired": f["aa_screen_found"] > 0,
        "screen_wall_s": round(got["wall"], 1),
        "screen_per_component": {
            c: [f[f"aa_{k}_{c.replace('-', '_')}"] for k in ("wall_s", "forward_examples")]
            for c in f["aa_components"].split(",")
        },
        "standard_row_wall_s_reference_machine": round(float(row["wall_s"]), 1),
    }


def _short(encoder: str) -> str:
    return encoder.removeprefix("convnet_small.").replace("_fashion-mnist-0-4", "")


def table(lines: list[dict[str, Any]]) -> str:
    """bench/README.md's screening table and its summary figures, from the JSON lines."""
    out = [
        "| encoder | standard robust (row) | screening robust | difference (points) | examples that differ "
        "| APGD survivors (standard / screening) | late finds in standard | sample | screening found | flag "
        "| screening wall | standard row wall (reference machine) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in lines:
        out.append(
            f"| {_short(d['encoder'])} | {d['standard_robust']} | {d['screen_robust']} | "
            f"{d['robust_acc_diff_points']:+.1f} | {d['examples_differ']} | "
            f"{d['standard_after_apgd_t']} / {d['screen_after_apgd_t']} | {d['standard_late_finds']} | "
            f"{d['screen_sample_size']} of {d['screen_survivors']} | {d['screen_found']} | "
            f"{'**fired**' if d['flag_fired'] else '–'} | {d['screen_wall_s']:.0f} s | "
            f"{d['standard_row_wall_s_reference_machine']:.0f} s |"
        )
    diffs = [abs(d["robust_acc_diff_points"]) for d in lines]
    sampled = sum(d["screen_sample_size"] < d["screen_survivors"] for d in lines)
    late = [d for d in lines if d["standard_late_finds"] > 0]
    mine = sum(d["screen_wall_s"] for d in lines)
    theirs = sum(d["standard_row_wall_s_reference_machine"] for d in lines)
    out += [
        "",
        f"- encoders: {len(lines)}; largest robust-accuracy difference {max(diffs):.1f} points, "
        f"mean absolute "
        f"{sum(diffs) / len(diffs):.2f}; examples that differ per encoder: "
        f"{min(d['examples_differ'] for d in lines)}-{max(d['examples_differ'] for d in lines)} of "
        f"{lines[0]['n_examples']}",
        f"- flags fired: {sum(d['flag_fired'] for d in lines)} of {len(lines)}; encoders where standard's "
        f"FAB-T or Square found an example APGD missed: {len(late)} "
        f"({', '.join(_short(d['encoder']) for d in late) or 'none'})",
        f"- sample smaller than the survivors: {sampled} of {len(lines)} encoders; screening wall here "
        f"{mine:,.0f} s against the rows' standard wall {theirs:,.0f} s on the reference machine "
        f"({theirs / mine:.1f}x, different machine and load)",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Screen the encoders one after the other, writing each line as it lands."""
    from robustbench_nacl.data import load_dataset

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true", help="all 63 reference encoders (3 seeds)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--table", type=Path, default=None, help="print the README table of this file")
    args = p.parse_args(argv)
    if args.table:
        print(table([json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]))
        return 0
    torch.set_num_threads(1)
    data: dict[str, Any] = {"test": load_dataset("fashion-mnist:0-4", "test")}
    for name in args.names or _names(args.all):
        line = json.dumps(screen_one(name, data))
        print(line, flush=True)
        if args.out:
            with args.out.open("a") as fh:
                fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
