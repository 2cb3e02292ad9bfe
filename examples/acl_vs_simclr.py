"""ACL against SimCLR on digits, 3 seeds each: the measurement behind docs/decisions.md ('ACL').

    python examples/acl_vs_simclr.py [OUT]      # about 1 minute on 2 CPU cores

Writes six zoo manifests (the demo zoo's acl and simclr recipe: convnet_small width 16, 10 epochs,
batch 128, Adam 3e-3, digits:0-4; seeds 0, 1, 2) and an attack suite (the fashion-mnist suite plus
PGD-10 at 0.064 and 0.1) under OUT, runs `robustbench-nacl zoo run` on them, then
`robustbench-nacl compare --json` and prints acl minus simclr for clean accuracy and every PGD
setting: the seed-paired difference with its t interval and the Holm-adjusted McNemar p.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import robustbench_nacl
from robustbench_nacl.packaged import attacks_dir, zoo_dir

SEEDS = (0, 1, 2)
EXTRA_PGD = ((0.064, 0.016), (0.1, 0.025))  # (eps, step size): 10 steps of 2.5 eps / 10


def write_inputs(out: Path) -> Path:
    """The six manifests under OUT/zoo/aclexp and the suite OUT/suite.toml; returns the suite."""
    suite = out / "suite.toml"
    text = (attacks_dir() / "fashion-mnist.toml").read_text()
    text = text.replace('name = "fashion-mnist"', 'name = "acl-vs-simclr"', 1)
    for eps, step in EXTRA_PGD:
        text += f'\n[[attack]]\nname = "pgd"\nnorm = "Linf"\neps = [{eps}]\nsteps = 10\n'
        text += f"step_size = {step}\nrestarts = 1\n"
    suite.write_text(text)
    folder = out / "zoo" / "aclexp"
    folder.mkdir(parents=True, exist_ok=True)
    for loss in ("simclr", "acl"):
        base = json.loads((zoo_dir() / "demo" / f"convnet_small.{loss}_digits-0-4_s0.json").read_text())
        for seed in SEEDS:
            entry = dict(base, seed=seed, id=f"convnet_small.{loss}_digits-0-4_s{seed}", zoo="aclexp")
            entry["eval"] = {"transfer": None, "shift": None, "suite": str(suite), "n_examples": None}
            (folder / f"{entry['id']}.json").write_text(json.dumps(entry, indent=2) + "\n")
    return suite


def main(argv: list[str]) -> int:
    """Run the zoo and print the comparison."""
    out = Path(argv[0] if argv else "robustbench_out/acl_vs_simclr").resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_inputs(out)
    cli = [sys.executable, "-m", "robustbench_nacl"]
    env = dict(os.environ, ROBUSTBENCH_NACL_ZOO=str(out / "zoo"))
    board = out / "board"
    run = ["zoo", "run", "--zoo", "aclexp", "--out", str(out / "checkpoints"), "--leaderboard", str(board)]
    subprocess.run(
        [*cli, *run, "--no-controls", "--no-progress", "--rank-by", "worst_case@0.1"],
        env=env,
        check=True,
    )
    done = subprocess.run(
        [*cli, "compare", "--rows", str(board), "--baseline", "simclr", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    print(f"robustbench_nacl {robustbench_nacl.__version__}: acl minus simclr, {len(SEEDS)} seed pairs")
    for c in json.loads(done.stdout)["comparisons"]:
        if c["metric"] == "clean" or c["metric"].startswith("pgd_"):
            interval = f"[{c['lo'] * 100:+.1f}, {c['hi'] * 100:+.1f}]"
            print(f"  {c['metric_label']:24} {c['diff'] * 100:+6.1f} {interval}  p (Holm) {c['p_holm']:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
