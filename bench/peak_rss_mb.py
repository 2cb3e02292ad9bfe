"""Figure ``peak_rss_mb``: peak resident memory of the demo and of a resnet18 evaluation on 10,000 images.

Each case runs in a child process. Two numbers per case:

- ``max_process_mb``: ``ru_maxrss`` of ``os.wait4`` on the child, i.e. the largest peak of any single
  process of its tree (the kernel's high-water mark, exact);
- ``tree_sampled_mb``: the largest sum of VmRSS over the child's process tree, sampled every 0.1 s
  from /proc (the demo runs worker processes side by side; their sum is what the machine must hold).

Cases:

- ``demo``: ``robustbench-nacl demo --quick`` (``--full-demo``: the full demo);
- ``resnet18_eval``: ``benchmark()`` of a random-initialisation ``resnet18_cifar`` + linear head on
  ``--eval-n`` (10,000) **random uint8 tensors of CIFAR's shape** (3x32x32) and random labels, turned into
  float [0, 1] as ``evaluate`` does. There is no CIFAR on this machine and synthetic data is not a
  dataset: the number measures memory and time, not accuracy. To finish on 2 CPU cores the suite is
  FGSM at one eps (8/255) only; the clean pass, the sanity checks and the noise pass run on all images
  as in any evaluation.

The figure's value is the larger ``tree_sampled_mb`` of the two cases.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import log

FGSM_ONLY = {"name": "fgsm_8", "attack": [{"name": "fgsm", "norm": "Linf", "eps": [8 / 255]}]}


def _tree_rss_kb(pid: int) -> int:
    """Sum of VmRSS (kB) of ``pid`` and all its descendants (0 for vanished processes)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` as a child; its wall time, exit code, peak RSS (wait4) and sampled tree peak."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    peak = {"kb": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["kb"] = max(peak["kb"], _tree_rss_kb(proc.pid))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    stdout = proc.stdout.read()  # until the child closes it (it exits)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    sampler.join()
    return {
        "returncode": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "max_process_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kB
        "tree_sampled_mb": round(peak["kb"] / 1024, 1),
        "stdout_tail": stdout.strip().splitlines()[-1:] if stdout.strip() else [],
    }


def child_eval(n: int, threads: int) -> None:
    """The resnet18 evaluation (run in the child): prints its timings as one JSON line."""
    import torch
    from torch import nn

    import robustbench_nacl as rbn
    from robustbench_nacl.data import normalization
    from robustbench_nacl.eval.probe import ProbedClassifier
    from robustbench_nacl.models.factory import create_encoder

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x_u8 = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    torch.manual_seed(0)
    mean, std = normalization("cifar10")
    encoder = create_encoder("resnet18_cifar", in_channels=3, mean=mean, std=std)
    model = ProbedClassifier(encoder, nn.Linear(encoder.feature_dim, 10))
    x = x_u8.float().div_(255.0)
    del x_u8
    t0 = time.perf_counter()
    rows = rbn.benchmark(model, x, y, FGSM_ONLY, seed=0, progress=False)
    wall = time.perf_counter() - t0
    r = rows[0]
    print(
        json.dumps(
            {
                "benchmark_wall_s": round(wall, 1),
                "clean_acc": r["clean_acc"],
                "n_attacked": r["n_attacked"],
                "rss_self_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        ),
        flush=True,
    )


def run(args: Any) -> dict[str, Any]:
    """Both cases, each in a child process."""
    cases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        demo_cmd = [sys.executable, "-m", "robustbench_nacl", "demo", "--out", str(Path(tmp) / "demo")]
        if not args.full_demo:
            demo_cmd.append("--quick")
        log(f"peak_rss_mb: {' '.join(demo_cmd[1:])}")
        cases["demo"] = {"command": "robustbench-nacl " + " ".join(demo_cmd[3:]), **measure(demo_cmd)}
    eval_cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child-eval",
        str(args.eval_n),
        str(args.threads),
    ]
    log(f"peak_rss_mb: resnet18_cifar benchmark() on {args.eval_n} random CIFAR-shaped images")
    res = measure(eval_cmd)
    detail = json.loads(res.pop("stdout_tail")[0]) if res["returncode"] == 0 else {}
    cases["resnet18_eval"] = {
        **res,
        **detail,
        "model": "resnet18_cifar (random init) + Linear(512, 10) as ProbedClassifier",
        "data": f"{args.eval_n} random uint8 tensors of CIFAR's shape (3x32x32), random labels: not CIFAR",
        "suite": "FGSM Linf at 8/255 only (kept small to finish on 2 CPU cores)",
    }
    cases["demo"].pop("stdout_tail", None)
    ok = all(c["returncode"] == 0 for c in cases.values())
    return {
        "figure": "peak_rss_mb",
        "value": max(c["tree_sampled_mb"] for c in cases.values()) if ok else None,
        "unit": "MB (max over the cases of the sampled peak RSS summed over the process tree)",
        "target": "report (no threshold)",
        "cases": cases,
        "config": {"threads": args.threads, "sampling_s": 0.1},
    }


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child-eval":
        child_eval(int(sys.argv[2]), int(sys.argv[3]))
