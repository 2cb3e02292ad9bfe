"""Multi-process (DDP) training on CPU/gloo: the loss over all-gathered embeddings is the
single-process loss, synchronised BatchNorm is BatchNorm over the global batch, a 2-process
``--sync-bn`` run trains the single-process weights, a killed 2-process run resumes bit-identically,
and a process group of one changes nothing."""

from __future__ import annotations

import copy
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _models import one_thread
from _syncs import count_syncs
from conftest import run_cli
from safetensors.torch import load_file
from torch import nn

from robustbench_nacl import losses
from robustbench_nacl.cli import main
from robustbench_nacl.io import sha256_file
from robustbench_nacl.models.dual_bn import DualBatchNorm
from robustbench_nacl.training import TrainConfig, distributed, run_id, train

TINY: dict[str, Any] = {
    "dataset": "digits",
    "encoder": "convnet_small",
    "encoder_kwargs": {"width": 8},
    "max_train": 256,
    "batch_size": 64,
    "epochs": 1,
    "knn_every": 0,
}


def _cli_args(cfg: dict[str, Any], loss: str, out: Path) -> list[str]:
    return [
        "train",
        "--loss",
        loss,
        "--dataset",
        cfg["dataset"],
        "--encoder-arg",
        "width=8",
        "--max-train",
        str(cfg["max_train"]),
        "--batch-size",
        str(cfg["batch_size"]),
        "--epochs",
        str(cfg["epochs"]),
        "--knn-every",
        str(cfg["knn_every"]),
        "--out",
        str(out),
        "--no-progress",
    ]


# ============ two gloo processes inside the test ============


def _entry(rank: int, world: int, init: str, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)  # a mismatched collective fails the test, not hangs it
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
    try:
        fn(*args)
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, fn: Callable[..., None], *args: Any, world: int = 2) -> None:
    """``fn(*args)`` on every rank of a ``world``-process gloo group; a failed assert fails the test."""
    mp.spawn(_entry, args=(world, f"file://{tmp_path / 'store'}", fn, args), nprocs=world)


def _loss_and_grads(
    model: nn.Module, params: nn.Module, views: list[torch.Tensor], p: losses.LossParams
) -> tuple[float, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)  # the objective's batch-level draws (MIXNCA partners)
    loss, _ = losses.OBJECTIVES.get(p.objective).loss(model, views, None, p, gen, False)
    loss.backward()
    return loss.item(), [q.grad for q in params.parameters()]


#: SimCLR, a debiased hard-negative loss, MIXNCA (partners on the other rank) and IntCl (the
#: adversarial view's FGSM step differentiates the global loss through the gather)
GATHER_PRESETS = ("simclr", "debiased_hardneg", "mixnca", "intcl")


def _check_gathered_losses() -> None:
    world, batch = distributed.current_world(), 16
    for preset in GATHER_PRESETS:
        p = losses.resolve(preset, {})
        torch.manual_seed(0)  # the same views and weights on every rank
        views = [torch.rand(batch, 1, 8, 8) for _ in range(losses.needs(p).n_views)]
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
        ref_loss, ref_grads = _loss_and_grads(net, net, views, p)
        local = copy.deepcopy(net)
        local.zero_grad(set_to_none=True)
        sharded = distributed.wrap(local, batch, world, sync_bn=False)
        loss, grads = _loss_and_grads(sharded, local, views, p)
        assert abs(loss - ref_loss) <= 1e-6, (preset, loss, ref_loss)
        for g, r in zip(grads, ref_grads, strict=True):  # DDP's average is the single-process gradient
            torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5, msg=preset)


def _sync_bn_batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = (torch.randn(8, 3, 4, 4) * 2 + 1).contiguous(memory_format=torch.channels_last)
    return x, torch.randn_like(x)


def _torch_sync_bn_reference() -> dict[str, torch.Tensor]:
    """``torch.nn.SyncBatchNorm`` on the global batch, outside a process group (what nccl's computes
    over all ranks; in a gloo group torch's refuses CPU tensors, so it runs here, in the parent)."""
    x, gy = _sync_bn_batch()
    bn = nn.SyncBatchNorm(3)
    xr = x.clone().requires_grad_(True)
    y = bn(xr)
    (y * gy).sum().backward()
    return {"y": y.detach(), "x_grad": xr.grad, "weight_grad": bn.weight.grad, "bias_grad": bn.bias.grad,
            "running_mean": bn.running_mean, "running_var": bn.running_var}  # fmt: skip


def _check_sync_bn(torch_ref: dict[str, torch.Tensor]) -> None:
    world = distributed.current_world()
    x, gy = _sync_bn_batch()
    bn = nn.BatchNorm2d(3)
    sync = distributed.convert_sync_bn(copy.deepcopy(bn), world.backend)
    assert type(sync) is distributed.SyncBatchNorm  # gloo: the own one
    xr = x.clone().requires_grad_(True)
    y_ref = bn(xr)
    (y_ref * gy).sum().backward()
    rows = slice(world.rank * 4, (world.rank + 1) * 4)
    shard = x[rows].clone().requires_grad_(True)
    with count_syncs() as syncs:  # the shard sizes are combined on the device, never read back
        y = sync(shard)
    assert syncs.total == 0, syncs.counts
    (y * gy[rows]).sum().backward()  # this rank's part of the global sum
    # the own SyncBatchNorm (gloo) gives torch's numbers (what nccl runs), to float32 rounding
    torch.testing.assert_close(y, torch_ref["y"][rows], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(shard.grad, torch_ref["x_grad"][rows], atol=1e-6, rtol=1e-5)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(sync, name), torch_ref[name], atol=1e-6, rtol=1e-5)
    # and in eval mode, inside the group, both run: the same output from the same statistics
    theirs = nn.SyncBatchNorm(3).eval()
    theirs.load_state_dict(sync.state_dict())
    torch.testing.assert_close(sync.eval()(shard.detach()), theirs(shard.detach()), atol=0, rtol=0)
    sync.train()
    torch.testing.assert_close(y, y_ref.detach()[rows], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(shard.grad, xr.grad[rows], atol=1e-6, rtol=1e-5)
    for got, ref, theirs_ref in (
        (sync.weight.grad, bn.weight.grad, torch_ref["weight_grad"]),
        (sync.bias.grad, bn.bias.grad, torch_ref["bias_grad"]),
    ):
        dist.all_reduce(got)  # what DDP does (then divides by W, as the step's loss is W times larger)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, theirs_ref, atol=1e-5, rtol=1e-5)
    for got, ref in ((sync.running_mean, bn.running_mean), (sync.running_var, bn.running_var)):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_gathered_loss_and_sync_bn_equal_the_single_process_ones(tmp_path: Path) -> None:
    _spawn(tmp_path, _check_all_collectives, _torch_sync_bn_reference())


def _check_all_collectives(torch_ref: dict[str, torch.Tensor]) -> None:
    _check_gathered_losses()
    _check_sync_bn(torch_ref)
    _check_each_rank_forwards_its_shard()


class _Seen(nn.Module):
    """The identity, recording the rows it is given (each row's first value is its global index)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))  # DDP needs a parameter
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x[:, 0].detach().clone())
        return x * self.w


def _check_each_rank_forwards_its_shard() -> None:
    """Rank r forwards rows [r*b, (r+1)*b) of every global-batch block, and only those: a rank that
    forwarded the whole batch (or another rank's shard) gives the same loss under sync BN, so only
    the rows themselves tell."""
    world, batch = distributed.current_world(), 8
    x = torch.arange(2 * batch, dtype=torch.float32).view(-1, 1).repeat(1, 3)  # two blocks (fused views)
    seen = _Seen()
    out = distributed.wrap(seen, batch, world, sync_bn=True)(x)
    b = batch // world.size
    mine = [k * batch + world.rank * b + i for k in range(2) for i in range(b)]
    assert len(seen.seen) == 1 and seen.seen[0].tolist() == mine, (world.rank, seen.seen)
    torch.testing.assert_close(out, x)  # and the gathered output is the global batch in order
    everyone = distributed.all_gather(seen.seen[0])
    assert sorted(torch.cat(everyone).tolist()) == list(range(2 * batch))  # no row twice, none missing


def test_sync_bn_conversion_keeps_dual_bn_parameters_and_state_dict() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3), DualBatchNorm(4), nn.Flatten(), nn.BatchNorm1d(144))
    keys, weight = list(model.state_dict()), model[1].main.weight
    distributed.convert_sync_bn(model)
    assert isinstance(model[1], DualBatchNorm)  # routes still work: only its branches changed
    assert isinstance(model[1].main, distributed.SyncBatchNorm)
    assert isinstance(model[1].aux, distributed.SyncBatchNorm)
    assert isinstance(model[3], distributed.SyncBatchNorm)
    assert model[1].main.weight is weight  # the optimizer's parameters are the model's
    assert list(model.state_dict()) == keys  # checkpoints load into plain BatchNorm


# ============ training ============


def _disagreeing(a: Path, b: Path, atol: float = 1e-5) -> tuple[int, int]:
    """(elements of the two checkpoints' weights further apart than ``atol``, all elements)."""
    wa, wb = load_file(a / "weights.safetensors"), load_file(b / "weights.safetensors")
    assert list(wa) == list(wb)
    diffs = torch.cat([(wa[k].double() - wb[k].double()).abs().flatten() for k in wa])
    return int((diffs > atol).sum()), diffs.numel()


@pytest.mark.slow
def test_two_process_sync_bn_run_trains_the_single_process_weights(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # intcl: adversarial positives, whose FGSM step differentiates the gathered global loss,
    # through dual BatchNorm, both branches synchronised
    cfg = {**TINY, "loss": "intcl"}
    with one_thread():  # the ranks' thread count (OMP_NUM_THREADS=1): the same float32 kernels
        single = train(TrainConfig(**cfg), tmp_path / "single", progress=False)
    res = run_cli([*_cli_args(cfg, "intcl", tmp_path / "ddp"), "--nproc", "2", "--sync-bn"], cli_env)
    assert res.returncode == 0, res.stderr
    bad, total = _disagreeing(single, tmp_path / "ddp")
    # Rounding (a sum split over two ranks) can reach a weight whose gradient is ~0, which Adam's
    # normalisation amplifies: single-process runs with channels-last and channels-first kernels
    # differ by up to 3.5e-5 in 1-2 such weights. Allow 1 in 10,000; per-rank BatchNorm (no
    # --sync-bn) moves more than half of them.
    assert bad <= total // 10_000, (bad, total)
    ddp, ref = (json.loads((d / "manifest.json").read_text()) for d in (tmp_path / "ddp", single))
    assert ddp["distributed"] == {"world_size": 2, "backend": "gloo", "rank_batch_size": 32, "sync_bn": True}
    assert "distributed" not in ref
    # global BatchNorm statistics: the single-process recipe, id and configuration
    identity = ("id", "config", "training_config")
    assert [ddp[k] for k in identity] == [ref[k] for k in identity]


def _worker_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the processes the ``--nproc`` launcher started (their RANK variable)."""
    pids: dict[int, int] = {}
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for pid in (task / "children").read_text().split():
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            rank = next((int(v[5:]) for v in env if v.startswith(b"RANK=")), None)
            if rank is not None:
                pids[rank] = int(pid)
    return pids


def _epochs_logged(out: Path) -> int:
    log = out / "log.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/task").exists(), reason="finds the ranks' processes in /proc (Linux)"
)
def test_killing_one_rank_then_resume_is_bit_identical(
    tmp_path: Path, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {**TINY, "epochs": 3, "max_train": 128, "batch_size": 32, "knn_every": 100}
    ref = run_cli([*_cli_args(cfg, "simclr", tmp_path / "ref"), "--nproc", "2"], cli_env)
    assert ref.returncode == 0, ref.stderr
    manifest = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    ref_sha = manifest["weights_sha256"]
    # per-rank BatchNorm (the default) is another recipe than the single-process one: another id
    assert manifest["training_config"]["per_rank_batchnorm"] == 2
    assert manifest["id"] != run_id(TrainConfig(loss="simclr", **cfg))

    out = tmp_path / "killed"
    args = [*_cli_args(cfg, "simclr", out), "--nproc", "2"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "robustbench_nacl", *args],
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while _epochs_logged(out) < 1 and time.time() < deadline and launcher.poll() is None:
        time.sleep(0.005)
    workers = _worker_pids(launcher.pid)
    os.kill(workers[1], signal.SIGKILL)  # rank 1, mid-epoch 2: rank 0 and the launcher must follow
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1 and "SIGKILL" in err.splitlines()[-1], err[-2000:]
    assert not Path(f"/proc/{workers[0]}").exists()  # rank 0 did not outlive its group
    assert not (out / "manifest.json").exists()
    assert 1 <= torch.load(out / "train_state.pt", weights_only=True)["epoch"] < 3

    with one_thread():  # resuming on another number of processes: one line, exit 2
        assert main([*_cli_args(cfg, "simclr", out), "--resume"]) == 2
    # rank 0 holds the run's lock; whether it released it depends on which came first, its own error
    # at rank 1's death or the launcher's teardown of the group. Where it did not, the next run says
    # on a line of its own that it took the lock over (locks.py), before the one-line refusal.
    lines = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("took over the lock of")]
    assert len(lines) == 1 and "started with 2 processes" in lines[0], lines
    res = run_cli([*args, "--resume"], cli_env)
    assert res.returncode == 0, res.stderr
    assert sha256_file(out / "weights.safetensors") == ref_sha


# ============ world size 1 and one-line errors ============


def test_a_group_of_one_trains_the_single_process_bits(tmp_path: Path) -> None:
    # MIXNCA: its mixed positives are a two-block input of the sharded forward
    cfg = TrainConfig(loss="mixnca", overrides={"M": 2}, **{**TINY, "max_train": 128, "batch_size": 32})
    with one_thread():
        plain = train(cfg, tmp_path / "plain", progress=False)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            grouped = train(cfg, tmp_path / "grouped", progress=False)
        finally:
            dist.destroy_process_group()
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (plain, grouped))
    assert b["distributed"]["world_size"] == 1  # the DDP path ran: wrapper, all_gather, DDP
    assert a["weights_sha256"] == b["weights_sha256"]
    assert (a["id"], a["config"], a["training_config"]) == (b["id"], b["config"], b["training_config"])
    assert a["id"] == run_id(cfg) and "distributed" not in a


def test_a_batch_the_processes_do_not_divide_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["train", "--loss", "simclr", "--batch-size", "64", "--out", str(tmp_path / "run")]
    assert main([*args, "--nproc", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch-size 64 is not divisible by the 3 processes" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA (2 GPUs for nccl)")
def test_two_gpus_nccl_sync_bn_run_trains_the_single_process_weights(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cfg = {**TINY, "loss": "intcl"}
    single = train(TrainConfig(**cfg), tmp_path / "single", device="cuda", progress=False)
    args = [*_cli_args(cfg, "intcl", tmp_path / "ddp"), "--nproc", "2", "--sync-bn", "--device", "cuda"]
    res = run_cli(args, cli_env)
    assert res.returncode == 0, res.stderr
    bad, total = _disagreeing(single, tmp_path / "ddp", atol=1e-4)  # GPU kernels: looser rounding
    assert bad <= total // 1000, (bad, total)
    assert json.loads((tmp_path / "ddp" / "manifest.json").read_text())["distributed"]["backend"] == "nccl"
