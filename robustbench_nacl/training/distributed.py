"""Multi-process (DDP) training: the process group, the sharded forward, synchronised BatchNorm and
the ``--nproc`` launcher (see docs/decisions.md, 'Distributed training').

Every rank runs the single-process trainer on the *global* batch: the same permutation, the same
augmentation and the same batch-level draws of the objective, from the same (seed, epoch) stream.
Only the model is sharded: :class:`ShardedForward` runs the DDP-wrapped model on this rank's slice
of each global-batch block of its input and all-gathers the outputs, with gradient, into global
order. Every rank then computes the loss of the whole global batch (identical on all ranks), so the
gradient reaching rank r's embeddings after the gather's backward (a sum over ranks) is W times the
single-process one, and DDP's average over the W ranks gives the single-process gradient.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import sys
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.nn import functional as dist_fn

from ..errors import UserError
from ..utils import resolve_device

#: the process-group backend of each device type: the same code runs on both
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
#: how long a collective waits for a rank that is alive but not taking part (rank 0 writing the
#: epoch's state or computing the kNN monitor, which for a ResNet on CIFAR on a CPU takes minutes)
#: before the group fails; a rank that dies makes its peers fail at once (closed connections) and
#: the elastic agent then ends the whole group, so this only bounds a hung rank
TIMEOUT = datetime.timedelta(minutes=60)


@dataclass(frozen=True)
class World:
    """This process's place in the process group (rank 0 of 1 without one)."""

    rank: int = 0
    size: int = 1
    backend: str | None = None  # None: no process group, the single-process trainer

    @property
    def main(self) -> bool:
        """Whether this rank prints progress and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether a process group drives this run (DDP, also with a world of 1)."""
        return self.backend is not None


def current_world() -> World:
    """The initialised process group's rank, size and backend, else the single-process world."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
    return World()


def launched_world_size() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 outside a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(device: str | None) -> str | None:
    """Under torchrun with more than one process: join the process group; returns this rank's device.

    gloo for ``cpu``, nccl for ``cuda`` (each rank on ``cuda:LOCAL_RANK``). Outside a launcher, or
    with a world of 1, nothing is initialised and ``device`` is returned as given.
    """
    if launched_world_size() <= 1 or (dist.is_available() and dist.is_initialized()):
        return device
    dev = resolve_device(device)
    backend = BACKENDS.get(dev.type)
    if backend is None:
        raise UserError(f"--device {dev.type}: multi-process training runs on cpu (gloo) or cuda (nccl)")
    if dev.type == "cuda":
        if dev.index is not None:
            raise UserError("under torchrun each process uses cuda:LOCAL_RANK; pass --device cuda")
        check_gpus(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, timeout=TIMEOUT)
    return str(dev)


def check_gpus(nproc: int) -> None:
    """One-line :class:`UserError` when one node's processes outnumber its GPUs."""
    if torch.cuda.device_count() < nproc:
        raise UserError(f"{nproc} processes on cuda need {nproc} GPUs; {torch.cuda.device_count()} visible")


def shutdown() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def check_batch(batch_size: int, world_size: int) -> None:
    """One-line :class:`UserError` unless the global batch splits into equal shards of >= 2 images."""
    if batch_size % world_size:
        raise UserError(
            f"--batch-size {batch_size} is not divisible by the {world_size} processes; "
            f"choose a multiple of {world_size}"
        )
    if batch_size // world_size < 2:
        raise UserError(f"--batch-size {batch_size} gives each of {world_size} processes fewer than 2 images")


def check_agree(world: World, value: int, device: torch.device, what: str) -> None:
    """One-line :class:`UserError` on every rank unless all ranks hold the same ``value``.

    What each rank reads from ``--out`` must be the same (on several nodes: a filesystem every node
    sees); ranks that went different ways would wait for each other's collectives until the timeout.
    """
    if not world.distributed:
        return
    t = torch.tensor([value, -value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if int(t[0]) != -int(t[1]):
        raise UserError(
            f"the {world.size} processes read different {what} ({-int(t[1])} to {int(t[0])}); "
            "on several nodes --out must be on a filesystem every node sees"
        )


def barrier(world: World) -> None:
    """Wait for every rank (no-op without a process group)."""
    if world.distributed:
        dist.barrier()


# ============ the sharded forward ============


def all_gather(x: Tensor) -> tuple[Tensor, ...]:
    """Every rank's ``x``, in rank order, with gradient (the backward sums over ranks).

    ``torch.distributed.nn.functional.all_gather``, the public autograd-aware gather; torch 2.14
    marks it deprecated in favour of a private module, so its warning is silenced here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return dist_fn.all_gather(x)


class ShardedForward(nn.Module):
    """``module`` (DDP-wrapped) on this rank's shard of a global batch; the output in global order.

    An input of ``k * batch_size`` rows is ``k`` blocks of one global batch each (the views fused
    into one forward, MIXNCA's two halves); rank r takes rows ``[r*b, (r+1)*b)`` of every block
    (``b = batch_size / W``) and forwards them together, so BatchNorm sees what one process would
    see of them. The outputs are all-gathered with gradient
    (``torch.distributed.nn.functional.all_gather``) and put back in block order.
    """

    def __init__(self, module: nn.Module, batch_size: int, world: World) -> None:
        super().__init__()
        self.module, self.batch_size, self.world = module, batch_size, world
        self.shard = batch_size // world.size

    def forward(self, x: Tensor) -> Tensor:
        blocks, rest = divmod(x.shape[0], self.batch_size)
        if rest or not blocks:
            raise ValueError(f"a batch of {x.shape[0]} rows is not whole global batches of {self.batch_size}")
        b, lo = self.shard, self.world.rank * self.shard
        starts = [k * self.batch_size + lo for k in range(blocks)]
        local = x[lo : lo + b] if blocks == 1 else torch.cat([x[s : s + b] for s in starts])
        parts = all_gather(self.module(local))
        return torch.cat([p[k * b : (k + 1) * b] for k in range(blocks) for p in parts])


# ============ synchronised BatchNorm ============


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of the global batch (every rank's shard): the
    gloo (CPU) one; under nccl :func:`convert_sync_bn` uses ``torch.nn.SyncBatchNorm``.

    ``torch.nn.SyncBatchNorm`` refuses CPU tensors (torch 2.14), so this one exists for gloo: each
    rank's biased mean and variance (two-pass, float32) and row count are all-gathered with
    gradient and combined exactly (Chan et al.); the running statistics update as ``BatchNorm``
    does (unbiased variance, ``momentum`` or the cumulative average), from the gathered counts
    without reading them back to the host. Outside training, or without a process group, it is
    plain BatchNorm. Parameter and buffer names are BatchNorm's, so state dicts load either way.
    """

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected an input of 2 or more dimensions, got {x.dim()}")

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        self._check_input_dim(x)
        c, dims = x.shape[1], [0, *range(2, x.dim())]
        xf = x.float()
        var, mean = torch.var_mean(xf, dim=dims, correction=0)
        count = torch.full((1,), xf.numel() // c, dtype=xf.dtype, device=x.device)
        stats = torch.stack(all_gather(torch.cat([mean, var, count])))  # (W, 2C + 1)
        means, variances, counts = stats[:, :c], stats[:, c : 2 * c], stats[:, 2 * c :]
        n = counts.sum()
        g_mean = (counts * means).sum(0) / n
        g_var = (counts * (variances + (means - g_mean) ** 2)).sum(0) / n
        if self.track_running_stats:
            self._update_running(g_mean.detach(), g_var.detach(), n.detach())
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (xf - g_mean.view(shape)) * torch.rsqrt(g_var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    def _update_running(self, mean: Tensor, var: Tensor, n: Tensor) -> None:
        assert self.num_batches_tracked is not None
        assert self.running_mean is not None and self.running_var is not None
        self.num_batches_tracked.add_(1)
        m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        with torch.no_grad():
            # n / (n - 1) as a device tensor: a float() of the count would wait for the device
            unbias = n / (n - 1.0).clamp_min(1.0)
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(var * unbias, alpha=m)


#: the synchronised BatchNorm of each process-group backend: torch's (cuDNN kernels, one fused
#: collective per layer) where it runs, the own one on gloo, where torch's refuses CPU tensors
SYNC_BN = {"nccl": "torch", "gloo": "own"}


def convert_sync_bn(module: nn.Module, backend: str | None = "gloo") -> nn.Module:
    """Replace every BatchNorm in ``module`` (in place; dual BatchNorm's branches too) by the
    synchronised BatchNorm of ``backend`` (:data:`SYNC_BN`: ``torch.nn.SyncBatchNorm`` under nccl,
    :class:`SyncBatchNorm` under gloo), sharing its parameters and buffers. Returns ``module`` (or
    the replacement when ``module`` is itself a BatchNorm)."""
    if SYNC_BN.get(str(backend), "own") == "torch":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert_own(module)


def _convert_own(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        new = SyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            new.weight, new.bias = module.weight, module.bias
        if module.track_running_stats:
            new.running_mean, new.running_var = module.running_mean, module.running_var
            new.num_batches_tracked = module.num_batches_tracked
        return new.train(module.training)
    for name, child in module.named_children():
        new_child = _convert_own(child)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def wrap(model: nn.Module, batch_size: int, world: World, sync_bn: bool) -> ShardedForward:
    """The module the training step calls under DDP: ``model`` (BatchNorm synchronised when
    ``sync_bn``) in DistributedDataParallel, behind :class:`ShardedForward`.

    ``model`` keeps its parameter objects (the optimizer's). Buffers are not broadcast: rank 0's
    BatchNorm statistics, the ones it saves, come from its own shards (or the global batch with
    ``sync_bn``) either way, and the other ranks' never reach a file.
    """
    if sync_bn:
        convert_sync_bn(model, world.backend)
    dev = next(model.parameters()).device
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index] if dev.type == "cuda" else None, **_no_buffer_sync()
    )
    return ShardedForward(ddp, batch_size, world)


def _no_buffer_sync() -> dict[str, bool]:
    # torch 2.14 renames broadcast_buffers (deprecated) to forward_sync_buffers; both keep the
    # buffer broadcast of DDP's construction (every rank holds the same state then anyway)
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}


def manifest_block(world: World, batch_size: int, sync_bn: bool) -> dict[str, Any]:
    """The manifest's ``distributed`` block."""
    return {
        "world_size": world.size,
        "backend": world.backend,
        "rank_batch_size": batch_size // world.size,
        "sync_bn": sync_bn,
    }


def bn_shards(world: World, sync_bn: bool) -> int:
    """Into how many shards BatchNorm splits each batch: W with per-rank BatchNorm, else 1."""
    return 1 if sync_bn else world.size


# ============ the --nproc launcher ============


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``python -m robustbench_nacl ARGV`` in ``nproc`` local processes through torch's elastic
    launcher (as ``torchrun --standalone --nproc_per_node NPROC``); returns the exit code.

    A process that fails ends the group (the agent stops the others). The exit code is the
    failed ranks' own (2: a user error, printed by rank 0; 3: a non-finite loss), else 1.
    """
    import tempfile

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_elastic()
    # torchrun's default: N processes on the same cores must not each start one thread per core
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # the agent's per-run log folder would otherwise stay behind in /tmp after every run
    logs = tempfile.TemporaryDirectory(prefix="robustbench-nacl-elastic-")
    config = LaunchConfig(
        logs_specs=DefaultLogsSpecs(log_dir=logs.name),
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"robustbench-nacl-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "robustbench_nacl", *argv)
    except SignalException:  # Ctrl-C / SIGTERM reached the agent: it has stopped the workers
        raise KeyboardInterrupt from None
    except ChildFailedError as e:
        codes = sorted(f.exitcode for f in e.failures.values())
        own = [c for c in codes if c > 1]
        if own:
            return own[0]
        rank, failure = e.get_first_failure()
        message = failure.message if "traceback see" not in str(failure.message) else ""
        print(
            f"robustbench-nacl train: error: process {rank} failed (exit code {failure.exitcode})"
            + (f": {message}" if message else "; its own error is printed above"),
            file=sys.stderr,
        )
        return 1
    finally:
        logs.cleanup()
    return 0


def _quiet_elastic() -> None:
    # the agent logs every worker's failure with its own traceback-like lines; the workers' one-line
    # errors (rank 0's) and launch()'s own line say what failed
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def strip_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N`` (what the launched processes run)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out
