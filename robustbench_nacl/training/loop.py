"""The resumable training loop: one process trains one encoder with one loss preset.

Data lives as one uint8 tensor on the device; each step draws its views with batched tensor
augmentation from a generator derived from (seed, epoch), so an epoch's randomness does not depend
on what happened before it and a run resumed at an epoch boundary replays exactly (bit for bit on
CPU). Every epoch end atomically saves weights, optimizer (and lr schedule) and RNG states to
``train_state.pt``; the manifest is written last and marks a finished run.

Under a process group (torchrun, ``--nproc``) every rank runs this same loop on the global batches
and only the model's forward is sharded (:mod:`.distributed`); rank 0 alone shows progress,
computes the monitor (kNN, and with ``monitor_probe`` a quick linear probe) and writes files.
Without one, nothing of that code runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import losses
from ..accel import CompilePlan, compile_plan, fused
from ..augment import views as augment
from ..data import ImageData, load_dataset
from ..errors import UserError
from ..io import atomic_open, check_writable_dir
from ..locks import exclusive_lock, remove_temporaries
from ..models.checkpoint import MANIFEST, WEIGHTS, save_weights, write_manifest
from ..models.features import extract_features, knn_accuracy, monitor_probe_accuracy
from ..models.heads import ContrastiveModel
from ..utils import device_name, resolve_device, seed_everything
from . import distributed, optim
from .config import TrainConfig, check_settings, check_train_size
from .distributed import World
from .epoch_log import LOG, write_log
from .manifest import RunOutcome, build_manifest, run_id
from .step import TrainStep, build_model, check_finite, epoch_values, exported

STATE = "train_state.pt"
STATE_KEYS = ("model", "optimizer", "torch_rng", "config", "epoch", "elapsed", "log")


@dataclass
class _Data:
    """The training set on the device, and both splits for the monitor."""

    train: ImageData
    test: ImageData
    x: torch.Tensor
    y: torch.Tensor


@dataclass
class _Run:
    """A run in progress: what the epochs need and what they accumulate."""

    cfg: TrainConfig
    out: Path
    dev: torch.device
    data: _Data
    model: ContrastiveModel
    optimizer: torch.optim.Optimizer
    start_epoch: int = 0
    elapsed: float = 0.0  # training seconds over all the processes of this run
    log: list[dict[str, Any]] = field(default_factory=list)
    world: World = field(default_factory=World)
    sync_bn: bool = False
    net: torch.nn.Module | None = None  # what the step calls: ``model``, or its DDP wrapper
    schedule: optim.LrSchedule | None = None  # sets the optimizer's lr before each step (None: constant)
    compile: CompilePlan = field(default_factory=CompilePlan)  # the step's path (eager: the default)

    def dist_state(self) -> dict[str, Any] | None:
        """What a resume must match besides the configuration: None for a single-process run."""
        if not self.world.distributed:
            return None
        return {"world_size": self.world.size, "sync_bn": self.sync_bn}

    def bn_shards(self) -> int:
        """Into how many shards BatchNorm splits each batch (1: the whole batch)."""
        return distributed.bn_shards(self.world, self.sync_bn) if self.world.distributed else 1

    def knn_acc(self) -> float | None:
        """The latest kNN accuracy the log holds."""
        return next((r["test_knn_acc"] for r in reversed(self.log) if "test_knn_acc" in r), None)

    def knn_init(self) -> float | None:
        """The kNN accuracy at random initialisation (epoch 0), when it was measured."""
        return self.log[0].get("test_knn_acc") if self.log and self.log[0]["epoch"] == 0 else None


def train(
    cfg: TrainConfig,
    out: str | Path,
    *,
    device: str | None = None,
    resume: bool = False,
    progress: bool = True,
    sync_bn: bool = False,
) -> Path:
    """Train one encoder; writes ``weights.safetensors`` + ``manifest.json`` into ``out``.

    Every epoch end atomically saves weights, optimizer and RNG states to ``train_state.pt``;
    ``resume=True`` continues from it. Returns the output directory. In an initialised process
    group every rank calls this: the global batch is split across them (``sync_bn``: BatchNorm
    statistics over the global batch; with one process they always are).
    """
    out = Path(out)
    check_settings(cfg)
    world = distributed.current_world()
    if world.distributed:
        distributed.check_batch(cfg.batch_size, world.size)
    dev = resolve_device(device)
    params = losses.resolve(cfg.loss, cfg.overrides)
    # looked up before anything is loaded or written: an unknown name fails first
    objective = losses.OBJECTIVES.get(params.objective)
    view_maker = augment.VIEW_MAKERS.get(params.views)
    finished = _check_out(out, cfg, resume)
    distributed.check_agree(world, int(finished), dev, f"states of {out} (finished or not)")
    if finished:
        return _finished(out, cfg)
    # one training per folder: a second `train` into a busy --out is refused in one line (rank 0
    # holds it for the group; the other ranks share its folder)
    busy = exclusive_lock(out, "train", "training") if world.main else contextlib.nullcontext()
    with busy:
        return _train_locked(cfg, out, params, objective, view_maker, dev, resume, world, sync_bn, progress)


def _train_locked(
    cfg: TrainConfig,
    out: Path,
    params: losses.LossParams,
    objective: Any,
    view_maker: Any,
    dev: torch.device,
    resume: bool,
    world: Any,
    sync_bn: bool,
    progress: bool,
) -> Path:
    """:func:`train` once it holds ``out``'s training lock."""
    if world.main and not world.distributed and _check_out(out, cfg, resume):
        return _finished(out, cfg)  # a run that ended while this one waited for the lock
    run = _start(cfg, params, out, dev, _load_data(cfg, dev), resume, world, sync_bn)
    step = TrainStep(
        cfg, params, run.net, run.optimizer, objective=objective, view_maker=view_maker, compile=run.compile
    )
    if not run.log and cfg.knn_every > 0 and world.main:
        # epoch 0: the same encoder at random initialisation, the baseline training must beat
        run.log.append(
            {"epoch": 0, **_monitor(exported(run.model, params), run.data.train, run.data.test, cfg)}
        )
    _train_epochs(run, step, progress and world.main)
    if world.main:
        _write_checkpoint(run, params)
        (out / STATE).unlink(missing_ok=True)
    distributed.barrier(world)  # every rank returns once the checkpoint exists
    return out


def _check_out(out: Path, cfg: TrainConfig, resume: bool) -> bool:
    """Check ``out`` before any work; True when it holds a finished run (``--resume``: nothing to do)."""
    if not resume and ((out / STATE).exists() or (out / MANIFEST).exists()):
        raise UserError(
            f"{out} already holds a training run; pass --resume to continue it or choose another --out"
        )
    if (out / MANIFEST).exists():
        return True
    check_writable_dir(out)  # before loading data and training, not at the first checkpoint
    # leftovers of a write that was killed mid-way (atomic_open's temporaries, never read), also when a
    # run killed while writing its first state starts again without --resume (no state to resume)
    remove_temporaries(out, (STATE, LOG, WEIGHTS, MANIFEST))
    return False


def _load_data(cfg: TrainConfig, dev: torch.device) -> _Data:
    """Both splits (the training split cut to ``cfg.max_train``), the training images on ``dev``."""
    train_set = load_dataset(cfg.spec, "train", root=cfg.data_root)
    if cfg.max_train is not None:
        train_set = dataclasses.replace(
            train_set, x=train_set.x[: cfg.max_train], y=train_set.y[: cfg.max_train]
        )
    test_set = load_dataset(cfg.spec, "test", root=cfg.data_root)
    check_train_size(cfg, len(train_set))
    return _Data(train_set, test_set, train_set.x.to(dev), train_set.y.to(dev))


def _start(
    cfg: TrainConfig,
    params: losses.LossParams,
    out: Path,
    dev: torch.device,
    data: _Data,
    resume: bool,
    world: World,
    sync_bn: bool,
) -> _Run:
    """The seeded model, optimizer and lr schedule, continued from ``train_state.pt`` when resuming
    (every rank reads it), wrapped for DDP under a process group."""
    _, channels, h, w = data.train.x.shape
    seed_everything(cfg.seed)
    model = build_model(cfg, params, channels=channels, size=(h, w), num_classes=data.train.num_classes)
    model = model.to(dev)
    optimizer = optim.build_optimizer(
        cfg.optimizer,
        model.parameters(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        kwargs=cfg.optimizer_kwargs,
    )
    plan = compile_plan(cfg.compile, dev, "train")
    optimizer = fused(optimizer, plan)  # CUDA only, before any state is loaded or schedule attached
    steps = len(data.train) // cfg.batch_size  # as _train_epoch draws them (drop_last)
    schedule = optim.build_schedule(
        cfg.schedule, cfg.schedule_kwargs, optimizer, base_lr=cfg.lr, epochs=cfg.epochs, steps_per_epoch=steps
    )
    run = _Run(cfg, out, dev, data, model, optimizer, world=world, sync_bn=sync_bn, net=model, compile=plan)
    run.schedule = schedule
    if resume and (out / STATE).exists():
        state = _load_state(out / STATE)
        if state["config"] != _json_config(cfg):
            raise UserError(f"{out} was started with a different configuration; resume with the same flags")
        _check_same_run(out, state.get("distributed"), run.dist_state())
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if schedule is not None:
            schedule.load_state_dict(state.get("schedule", {}), expected_steps=state["epoch"] * steps)
        torch.set_rng_state(state["torch_rng"])
        run.start_epoch, run.elapsed, run.log = state["epoch"], state["elapsed"], state["log"]
    distributed.check_agree(world, run.start_epoch, dev, f"epochs to resume from in {out / STATE}")
    if world.distributed:
        run.net = distributed.wrap(model, cfg.batch_size, world, sync_bn)
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
    return run


def _shards(dist_state: dict[str, Any] | None) -> int:
    """Into how many shards BatchNorm split each global batch in a saved or current world."""
    return 1 if dist_state is None or dist_state["sync_bn"] else int(dist_state["world_size"])


def _check_same_run(out: Path, saved: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
    """Resuming on another number of processes is the same run when BatchNorm sees the same batches:
    every rank computes the loss of the global batch, so only per-rank BatchNorm (W shards) tells
    world sizes apart; with --sync-bn (or one process) the statistics are the global batch's."""
    if _shards(saved) == _shards(now):
        return
    if saved is not None and not saved["sync_bn"]:
        how = f"resume on {saved['world_size']} processes without --sync-bn"
    else:
        how = "resume on one process, or on any number with --sync-bn"
    raise UserError(
        f"{out} was started with {_processes(saved)}, this run has {_processes(now)}: BatchNorm would see "
        f"each batch in {_shards(now)} shard(s) instead of {_shards(saved)}, which is another run; {how}"
    )


def _processes(dist_state: dict[str, Any] | None) -> str:
    """A saved or current world, in words."""
    if dist_state is None:
        return "one process (no process group)"
    sync = ", --sync-bn" if dist_state["sync_bn"] else ""
    return f"{dist_state['world_size']} processes{sync}"


def _train_epochs(run: _Run, step: TrainStep, progress: bool) -> None:
    """The remaining epochs; after each, the state is saved (atomically) and the log appended."""
    cfg = run.cfg
    epochs = tqdm(
        range(run.start_epoch, cfg.epochs),
        desc=f"train {run_id(cfg, bn_shards=run.bn_shards())}",
        disable=not progress,
        initial=run.start_epoch,
        total=cfg.epochs,
    )
    # the rows log.jsonl already holds: those of the state resumed from (none on a fresh run)
    logged = len(run.log) if run.start_epoch > 0 else 0
    for epoch in epochs:
        row = _train_epoch(run, step, epoch, progress)
        if not run.world.main:
            continue  # the other ranks go on to the next epoch's first collective and wait there
        if (cfg.knn_every > 0 and (epoch + 1) % cfg.knn_every == 0) or epoch + 1 == cfg.epochs:
            row.update(_monitor(exported(run.model, step.params), run.data.train, run.data.test, cfg))
        run.log.append(row)
        knn_acc = run.knn_acc()
        epochs.set_postfix(
            loss=f"{row['train_loss']:.4f}", knn=f"{knn_acc:.3f}" if knn_acc is not None else "-"
        )
        _save_state(run, epoch + 1)
        write_log(run.out / LOG, run.log, logged)  # after the state, which then always covers it
        logged = len(run.log)


def _train_epoch(run: _Run, step_fn: TrainStep, epoch: int, progress: bool) -> dict[str, Any]:
    """One pass over a fresh permutation of the training set; returns the epoch's log row."""
    cfg, batch = run.cfg, run.cfg.batch_size
    steps = len(run.data.train) // batch  # drop the last incomplete batch: N = 2B - 2 stays fixed
    t0 = time.perf_counter()
    gen = _epoch_generator(cfg.seed, epoch, run.dev)
    perm = torch.randperm(len(run.data.train), generator=gen, device=run.dev)
    step_fn.model.train()  # run.model itself, or the DDP wrapper around it
    step_fn.set_epoch(epoch)  # an adversarial/scheduled objective's per-epoch state (else nothing)
    step_losses: list[torch.Tensor] = []
    step_stats: dict[str, list[torch.Tensor | float]] = {}
    for step in tqdm(range(steps), desc=f"epoch {epoch + 1}", leave=False, disable=not progress):
        idx = perm[step * batch : (step + 1) * batch]
        loss, stats = step_fn(run.data.x[idx], run.data.y[idx], gen)
        step_losses.append(loss)
        for k, v in stats.items():
            step_stats.setdefault(k, []).append(v)
    # the epoch's one read-out: the steps above never wait for the device
    values = epoch_values(step_losses)
    check_finite(values, epoch + 1)
    total = sum(values)
    stats_sum = {k: sum(epoch_values(v)) for k, v in step_stats.items()}
    run.elapsed += time.perf_counter() - t0
    row: dict[str, Any] = {"epoch": epoch + 1, "train_loss": total / steps, "wall_s": round(run.elapsed, 3)}
    row.update({f"train_{k}": v / steps for k, v in stats_sum.items()})
    return row


def _write_checkpoint(run: _Run, params: losses.LossParams) -> None:
    """The weights, then the manifest (last: its presence marks a complete checkpoint)."""
    _, channels, h, w = run.data.train.x.shape
    outcome = RunOutcome(
        in_channels=channels,
        input_size=(h, w),
        num_classes=run.data.train.num_classes,
        weights_sha256=save_weights(run.out / WEIGHTS, exported(run.model, params)),
        device=device_name(run.dev),
        wall_s=run.elapsed,
        knn_acc=run.knn_acc(),
        knn_acc_init=run.knn_init(),
        compile=run.compile.label(),
    )
    block = None
    if run.world.distributed:
        block = distributed.manifest_block(run.world, run.cfg.batch_size, run.sync_bn)
    manifest = build_manifest(run.cfg, params, outcome, distributed=block, bn_shards=run.bn_shards())
    write_manifest(run.out, manifest)


def _epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    # A fresh stream per epoch: resuming needs no generator state from the killed process.
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + epoch * 7_919 + 17) % (2**63))
    return g


def _json_config(cfg: TrainConfig) -> dict[str, Any]:
    # the config as it reads back from JSON or train_state.pt (tuples become lists, ...)
    return json.loads(json.dumps(cfg.to_dict()))


def _finished(out: Path, cfg: TrainConfig) -> Path:
    """``--resume`` of a run whose manifest was written: nothing to train.

    A kill between writing the manifest and removing ``train_state.pt`` leaves both; the manifest is
    the last thing training writes, so the run is complete and the state file is only removed.
    """
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{out / MANIFEST} is unreadable ({e}); delete {out} to train again") from None
    if not isinstance(manifest, dict) or manifest.get("config") != _json_config(cfg):
        raise UserError(f"{out} holds a finished run of a different configuration; choose another --out")
    (out / STATE).unlink(missing_ok=True)
    return out


def _load_state(path: Path) -> dict[str, Any]:
    """``train_state.pt`` (tensors and plain containers only: ``weights_only``), checked for its keys."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or holding objects weights_only refuses
        reason = " ".join(str(e).split())[:200]
        raise UserError(f"{path} is unreadable ({reason}); delete it to restart the run") from None
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        raise UserError(f"{path} is not a training state of this tool; delete it to restart the run")
    return state


def _monitor(
    model: ContrastiveModel, train_set: ImageData, test_set: ImageData, cfg: TrainConfig
) -> dict[str, float]:
    """The monitor's log fields: ``test_knn_acc``, and with ``monitor_probe`` the quick linear probe's
    ``train_probe_acc`` and ``test_probe_acc`` on the same features (it draws from no RNG)."""
    # on the model's device: a GPU run's monitor does not move the features to the CPU
    bank = extract_features(model.encoder, train_set.x, keep_device=True)
    query = extract_features(model.encoder, test_set.x, keep_device=True)
    classes = train_set.num_classes
    out = {
        "test_knn_acc": knn_accuracy(
            bank, train_set.y, query, test_set.y, num_classes=classes, k=cfg.knn_k, t=cfg.knn_t
        )
    }
    if cfg.monitor_probe:
        fit, test = monitor_probe_accuracy(bank, train_set.y, query, test_set.y, num_classes=classes)
        out.update(train_probe_acc=fit, test_probe_acc=test)
    return out


def _save_state(run: _Run, epoch: int) -> None:
    state = {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "config": _json_config(run.cfg),
        "epoch": epoch,
        "elapsed": run.elapsed,
        "log": run.log,
    }
    if run.world.distributed:  # only then: a single-process state holds what it always did
        state["distributed"] = run.dist_state()
    if run.schedule is not None:  # likewise: only a scheduled run has a schedule to continue
        state["schedule"] = run.schedule.state_dict()
    with atomic_open(run.out / STATE, "wb") as f:
        torch.save(state, f)
