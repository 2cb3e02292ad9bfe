"""One process trains one encoder with one loss preset; resumable bit-for-bit on CPU.

Data lives as one uint8 tensor on the device; each step draws its views with batched tensor
augmentation from a generator derived from (seed, epoch), so an epoch's randomness does not depend
on what happened before it and a run resumed at an epoch boundary replays exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import losses
from ..augment import views as augment
from ..data.datasets import load_dataset, normalization
from ..errors import NonFiniteLoss, UserError
from ..io import atomic_open, check_writable_dir, sha256_file
from ..losses.objectives import Objective
from ..models.checkpoint import MANIFEST, WEIGHTS, save_weights, write_manifest
from ..models.encoders import ContrastiveModel, create_encoder
from ..models.features import extract_features, knn_accuracy
from ..utils import device_name, resolve_device, seed_everything, versions

STATE = "train_state.pt"
LOG = "log.jsonl"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (hashed into the resume check and the manifest)."""

    loss: str = "simclr"  # a preset name (losses.PRESETS)
    overrides: dict[str, Any] = field(default_factory=dict)  # --set k=v on top of the preset
    dataset: str = "digits"
    encoder: str = "convnet_small"
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"width": 16}
    epochs: int = 10
    batch_size: int = 256
    lr: float = 3e-4  # Adam 3e-4, no schedule, no weight decay (CLAE/NaCl recipe)
    weight_decay: float = 0.0
    seed: int = 0
    fuse_views: bool = False  # one forward for all views (changes BatchNorm statistics)
    knn_every: int = 5  # kNN monitor every N epochs, at epoch 0 and after the last (0: only the last)
    knn_k: int = 200
    knn_t: float = 0.1
    precision: str = "fp32"  # "fp32" | "bf16" (autocast; the loss itself is always fp32)
    channels_last: bool = True  # NHWC convolutions: 1.2-1.6x faster training steps on CPU (bench/)
    data_root: str | None = None
    max_train: int | None = None  # use only the first N training images (documented demo budgets)
    id: str | None = None  # checkpoint id; default <encoder>.<preset>_<dataset>_s<seed>

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def run_id(cfg: TrainConfig) -> str:
    """Zoo id ``<encoder>.<preset>_<dataset>_s<seed>`` (dataset spec made filename-safe)."""
    if cfg.id:
        return cfg.id
    ds = cfg.dataset.replace(":", "-").replace("@", "+").replace(",", "_")
    return f"{cfg.encoder}.{cfg.loss}_{ds}_s{cfg.seed}"


def _epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    # A fresh stream per epoch: resuming needs no generator state from the killed process.
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + epoch * 7_919 + 17) % (2**63))
    return g


def build_model(
    cfg: TrainConfig, params: losses.LossParams, *, channels: int, size: tuple[int, int], num_classes: int
) -> ContrastiveModel:
    """Encoder (with its normalisation) + head, as the loss's declared needs ask, in ``cfg``'s memory format.

    The memory format is set here, not by each caller, so that everything that builds the trainer's
    model (``train``, the benchmarks) runs the kernels ``train`` runs: channels-last weights under the
    channels-last views ``TrainStep`` feeds when ``cfg.channels_last``.
    """
    need = losses.needs(params)
    mean, std = normalization(cfg.dataset)
    encoder = create_encoder(
        cfg.encoder,
        in_channels=channels,
        mean=mean,
        std=std,
        dual_bn=need.adversarial and params.dual_bn,
        input_shape=(channels, *size),
        **cfg.encoder_kwargs,
    )
    # dual BN in the head exactly when the encoder has it (ContrastiveModel's default)
    model = ContrastiveModel(encoder, params.head, out_dim=num_classes if need.labels else None)
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def _validate(cfg: TrainConfig, n_train: int) -> None:
    if cfg.epochs < 1:
        raise UserError(f"--epochs {cfg.epochs}: must be >= 1")
    if cfg.batch_size < 2:
        raise UserError(f"--batch-size {cfg.batch_size}: a contrastive batch needs at least 2 images")
    if cfg.batch_size > n_train:
        raise UserError(
            f"--batch-size {cfg.batch_size} exceeds the {n_train} training images of {cfg.dataset}"
        )


def _validate_settings(cfg: TrainConfig) -> None:
    # the checks that need no data, run before anything is loaded or written (torch's Adam would
    # raise a bare ValueError for a bad lr, and a NaN would pass it)
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UserError(f"--lr {cfg.lr}: must be a finite number > 0")
    if not (math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0):
        raise UserError(f"--weight-decay {cfg.weight_decay}: must be a finite number >= 0")
    if cfg.precision not in ("fp32", "bf16"):
        raise UserError(f"--precision {cfg.precision!r}; valid choices: fp32, bf16")


class TrainStep:
    """The trainer's optimisation step: draw the views, forward them, the loss, backward, optimizer step.

    ``step(x, y, gen)`` takes one batch of raw training images (uint8 or float in [0, 1]) and labels
    and returns ``(loss value, stats)``; it raises :class:`NonFiniteLoss` before touching the weights
    when the loss is not finite. ``train`` runs exactly this code, and so does ``bench/``.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        params: losses.LossParams,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        objective: Objective | None = None,
        view_maker: augment.ViewMaker | None = None,
    ) -> None:
        self.cfg, self.params, self.model, self.optimizer = cfg, params, model, optimizer
        self.need = losses.needs(params)
        self.objective = objective or losses.OBJECTIVES.get(params.objective)
        self.view_maker = view_maker or augment.VIEW_MAKERS.get(params.views)
        self.view_kwargs = params.to_dict()
        self.device = next(model.parameters()).device
        self.autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"
        )

    def views(self, x: torch.Tensor, gen: torch.Generator) -> list[torch.Tensor]:
        """The batch's views, as the loss sees them (channels_last when configured)."""
        views = self.view_maker(x, self.need.n_views, gen, **self.view_kwargs)
        if self.cfg.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> tuple[float, dict[str, float]]:
        views = self.views(x, gen)
        with self.autocast:
            loss, stats = self.objective.loss(self.model, views, y, self.params, gen, self.cfg.fuse_views)
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(f"non-finite loss ({value})")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return value, stats


def train(
    cfg: TrainConfig,
    out: str | Path,
    *,
    device: str | None = None,
    resume: bool = False,
    progress: bool = True,
) -> Path:
    """Train one encoder; writes ``weights.safetensors`` + ``manifest.json`` into ``out``.

    Every epoch end atomically saves weights, optimizer and RNG states to ``train_state.pt``;
    ``resume=True`` continues from it. Returns the output directory.
    """
    out = Path(out)
    _validate_settings(cfg)
    dev = resolve_device(device)
    params = losses.resolve(cfg.loss, cfg.overrides)
    need = losses.needs(params)
    objective = losses.OBJECTIVES.get(params.objective)
    view_maker = augment.VIEW_MAKERS.get(params.views)

    # ============ checking the output directory ============
    state_path, manifest_path = out / STATE, out / MANIFEST
    if not resume and (state_path.exists() or manifest_path.exists()):
        raise UserError(
            f"{out} already holds a training run; pass --resume to continue it or choose another --out"
        )
    if manifest_path.exists():
        return _finished(out, cfg)
    check_writable_dir(out)  # before loading data and training, not at the first checkpoint
    if resume:
        # leftovers of a write that was killed mid-way (atomic_open's temporaries), never read
        for tmp in out.glob(f".{STATE}.*.tmp"):
            tmp.unlink(missing_ok=True)

    # ============ preparing data ============
    train_set = load_dataset(cfg.dataset, "train", root=cfg.data_root)
    if cfg.max_train is not None:
        if cfg.max_train < 2:
            raise UserError(f"--max-train {cfg.max_train}: must be >= 2")
        train_set = dataclasses.replace(
            train_set, x=train_set.x[: cfg.max_train], y=train_set.y[: cfg.max_train]
        )
    test_set = load_dataset(cfg.dataset, "test", root=cfg.data_root)
    _validate(cfg, len(train_set))
    x_train = train_set.x.to(dev)
    y_train = train_set.y.to(dev)
    _, channels, h, w = train_set.x.shape

    # ============ building the model ============
    seed_everything(cfg.seed)
    model = build_model(cfg, params, channels=channels, size=(h, w), num_classes=train_set.num_classes).to(
        dev
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_epoch, elapsed, log_rows = 0, 0.0, []
    if resume and state_path.exists():
        state = _load_state(state_path)
        if state["config"] != json.loads(json.dumps(cfg.to_dict())):
            raise UserError(f"{out} was started with a different configuration; resume with the same flags")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        start_epoch, elapsed = state["epoch"], state["elapsed"]
        log_rows = state["log"]
    out.mkdir(parents=True, exist_ok=True)
    step_fn = TrainStep(cfg, params, model, optimizer, objective=objective, view_maker=view_maker)
    steps = len(train_set) // cfg.batch_size  # drop the last incomplete batch: N = 2B - 2 stays fixed
    knn_acc = log_rows[-1].get("test_knn_acc") if log_rows else None
    if not log_rows and cfg.knn_every > 0:
        # epoch 0: the same encoder at random initialisation, the baseline training must beat
        log_rows.append({"epoch": 0, "test_knn_acc": _knn(model, train_set, test_set, cfg)})
    knn_init = log_rows[0].get("test_knn_acc") if log_rows and log_rows[0]["epoch"] == 0 else None

    # ============ training ============
    epochs = tqdm(
        range(start_epoch, cfg.epochs),
        desc=f"train {run_id(cfg)}",
        disable=not progress,
        initial=start_epoch,
        total=cfg.epochs,
    )
    for epoch in epochs:
        t0 = time.perf_counter()
        gen = _epoch_generator(cfg.seed, epoch, dev)
        perm = torch.randperm(len(train_set), generator=gen, device=dev)
        model.train()
        total, stats_sum = 0.0, {}
        for step in tqdm(range(steps), desc=f"epoch {epoch + 1}", leave=False, disable=not progress):
            idx = perm[step * cfg.batch_size : (step + 1) * cfg.batch_size]
            try:
                loss_value, stats = step_fn(x_train[idx], y_train[idx], gen)
            except NonFiniteLoss as e:
                raise NonFiniteLoss(
                    f"{e} at epoch {epoch + 1} step {step + 1}; "
                    "lower --lr or raise the temperature (--set t=...)"
                ) from None
            total += loss_value
            for k, v in stats.items():
                stats_sum[k] = stats_sum.get(k, 0.0) + v
        elapsed += time.perf_counter() - t0
        row: dict[str, Any] = {"epoch": epoch + 1, "train_loss": total / steps, "wall_s": round(elapsed, 3)}
        row.update({f"train_{k}": v / steps for k, v in stats_sum.items()})
        if (cfg.knn_every > 0 and (epoch + 1) % cfg.knn_every == 0) or epoch + 1 == cfg.epochs:
            knn_acc = _knn(model, train_set, test_set, cfg)
            row["test_knn_acc"] = knn_acc
        log_rows.append(row)
        epochs.set_postfix(
            loss=f"{row['train_loss']:.4f}", knn=f"{knn_acc:.3f}" if knn_acc is not None else "-"
        )
        _save_state(state_path, model, optimizer, cfg, epoch + 1, elapsed, log_rows)
        with atomic_open(out / LOG, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in log_rows))

    # ============ writing the checkpoint ============
    weights_sha = save_weights(out / WEIGHTS, model)
    manifest = {
        "id": run_id(cfg),
        "encoder": cfg.encoder,
        "encoder_kwargs": cfg.encoder_kwargs,
        "in_channels": channels,
        "input_size": [h, w],
        "num_classes": train_set.num_classes,
        "dual_bn": need.adversarial and params.dual_bn,
        "head": params.head,
        "loss": cfg.loss,
        "loss_params": params.to_dict(),
        "needs": dataclasses.asdict(need),
        "dataset": cfg.dataset,
        "recipe": {
            "epochs": cfg.epochs,
            "batch_size": cfg.batch_size,
            "optimizer": "adam",
            "lr": cfg.lr,
            "weight_decay": cfg.weight_decay,
            "augmentation": params.views,
            "fuse_views": cfg.fuse_views,
            "precision": cfg.precision,
            "channels_last": cfg.channels_last,
            "drop_last": True,
        },
        "seed": cfg.seed,
        "epochs": cfg.epochs,
        "normalization": dict(zip(("mean", "std"), normalization(cfg.dataset), strict=True)),
        "weights": WEIGHTS,
        "weights_sha256": weights_sha,
        "versions": versions(),
        "device": device_name(dev),
        "wall_s": round(elapsed, 3),
        "knn_acc": knn_acc,
        "knn_acc_init": knn_init,  # the same encoder before training (epoch 0)
        "knn": {"k": cfg.knn_k, "t": cfg.knn_t, "split": "test"},
        "config": cfg.to_dict(),
    }
    write_manifest(out, manifest)
    state_path.unlink(missing_ok=True)
    return out


def _finished(out: Path, cfg: TrainConfig) -> Path:
    """``--resume`` of a run whose manifest was written: nothing to train.

    A kill between writing the manifest and removing ``train_state.pt`` leaves both; the manifest is
    the last thing training writes, so the run is complete and the state file is only removed.
    """
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{out / MANIFEST} is unreadable ({e}); delete {out} to train again") from None
    if not isinstance(manifest, dict) or manifest.get("config") != json.loads(json.dumps(cfg.to_dict())):
        raise UserError(f"{out} holds a finished run of a different configuration; choose another --out")
    (out / STATE).unlink(missing_ok=True)
    return out


def _load_state(path: Path) -> dict[str, Any]:
    """``train_state.pt`` (tensors and plain containers only: ``weights_only``), checked for its keys."""
    keys = ("model", "optimizer", "torch_rng", "config", "epoch", "elapsed", "log")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or holding objects weights_only refuses
        reason = " ".join(str(e).split())[:200]
        raise UserError(f"{path} is unreadable ({reason}); delete it to restart the run") from None
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise UserError(f"{path} is not a training state of this tool; delete it to restart the run")
    return state


def _knn(model: ContrastiveModel, train_set: Any, test_set: Any, cfg: TrainConfig) -> float:
    bank = extract_features(model.encoder, train_set.x)
    query = extract_features(model.encoder, test_set.x)
    return knn_accuracy(
        bank, train_set.y, query, test_set.y, num_classes=train_set.num_classes, k=cfg.knn_k, t=cfg.knn_t
    )


def _save_state(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    epoch: int,
    elapsed: float,
    log: list,
) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "config": json.loads(json.dumps(cfg.to_dict())),
        "epoch": epoch,
        "elapsed": elapsed,
        "log": log,
    }
    with atomic_open(path, "wb") as f:
        torch.save(state, f)


def verify_weights(directory: str | Path) -> bool:
    """True when ``weights.safetensors`` still has the sha256 its manifest records."""
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    return sha256_file(directory / manifest["weights"]) == manifest["weights_sha256"]
