"""The ``train`` command: one encoder with one loss preset, in this process or on ``--nproc`` local
processes (torch's elastic launcher)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import UserError
from .common import check_data_root, deterministic_flag, int_arg, json_kv, writable_out
from .flags import add_config_flags, config_values

_TRAIN_SPECIAL = ("loss", "overrides", "encoder_kwargs")
_TRAIN_HELP = {
    "dataset": "dataset spec, e.g. digits, cifar100, digits:0-4",
    "encoder": "encoder (see `robustbench-nacl encoders`; or timm:NAME)",
    "epochs": "training epochs",
    "batch_size": "images per batch (each gives its views)",
    "lr": "base learning rate of --optimizer (--schedule scales it per step)",
    "weight_decay": "weight decay of --optimizer",
    "optimizer": "optimizer: adam (default), sgd, lars (ACL/DynACL), torchlars (RoCL), lars_solo "
    "(solo-learn); settings with --optimizer-arg",
    "schedule": "learning-rate schedule: constant (default), cosine (ACL/DynACL), warmup_cosine "
    "(solo-learn), gradual_warmup_cosine (RoCL); settings with --schedule-arg, --warmup-epochs",
    "seed": "training seed (initialisation, augmentation, batch order)",
    "knn_k": "neighbours of the weighted-kNN monitor",
    "knn_t": "temperature of the weighted-kNN monitor",
    "knn_every": "kNN monitor every N epochs (0: only at the end)",
    "max_train": "use only the first N training images",
    "data_root": "dataset directory (default $ROBUSTBENCH_NACL_DATA or ~/.cache/robustbench_nacl)",
    "channels_last": "NHWC memory format for the convolutions (faster on CPU and GPU)",
    "fuse_views": "forward all views in one pass (changes BatchNorm statistics)",
}


def run_train(args: argparse.Namespace) -> int:
    """Train here, or start ``--nproc`` local processes that each run this command."""
    from ..losses import parse_overrides
    from ..training import TrainConfig, check_settings, distributed

    writable_out(args.out)
    values = {**config_values(TrainConfig, args, skip=_TRAIN_SPECIAL), **_optimizer_settings(args)}
    check_data_root(values.get("data_root"))
    encoder_kwargs = json_kv(args.encoder_arg)
    if args.like_zoo:
        values, encoder_kwargs = _like_zoo(args, values)
    cfg = TrainConfig(
        loss=args.loss, overrides=parse_overrides(args.set), encoder_kwargs=encoder_kwargs, **values
    )
    launched = distributed.launched_world_size()
    if args.nproc is not None and args.nproc < 1:
        raise UserError(f"--nproc {args.nproc}: must be >= 1")
    if args.nproc is not None and launched > 1 and args.nproc != launched:
        raise UserError(f"--nproc {args.nproc} under a launcher of {launched} processes; leave --nproc out")
    if (args.nproc or 1) > 1 and launched == 1:
        # the one-line errors before any process starts; the workers run without --nproc
        check_settings(cfg)
        distributed.check_batch(cfg.batch_size, args.nproc)
        if args.device.startswith("cuda"):
            distributed.check_gpus(args.nproc)
        return distributed.launch(args.nproc, distributed.strip_nproc(args._argv))
    return _train_here(args, cfg)


#: what ``train --like-zoo`` sets: flag -> TrainConfig field (``encoder_kwargs``: --encoder-arg)
_ZOO_SETS = {
    "--dataset": "dataset",
    "--encoder": "encoder",
    "--encoder-arg": "encoder_arg",
    "--epochs": "epochs",
    "--batch-size": "batch_size",
    "--lr": "lr",
    "--weight-decay": "weight_decay",
    "--max-train": "max_train",
    "--optimizer": "optimizer",
    "--optimizer-arg": "optimizer_arg",
    "--schedule": "schedule",
    "--schedule-arg": "schedule_arg",
    "--warmup-epochs": "warmup_epochs",
}


def _optimizer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``optimizer_kwargs`` and ``schedule_kwargs`` from their flags, only where given (an empty
    mapping is TrainConfig's default, which keeps every other run's configuration as it was)."""
    out: dict[str, Any] = {}
    if args.optimizer_arg:
        out["optimizer_kwargs"] = json_kv(args.optimizer_arg)
    schedule = json_kv(args.schedule_arg)
    if args.warmup_epochs is not None:
        schedule["warmup_epochs"] = args.warmup_epochs
    if schedule:
        out["schedule_kwargs"] = schedule
    return out


def _like_zoo(args: argparse.Namespace, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--like-zoo ZOO``: the encoder, dataset and recipe of that zoo's entries (its first entry's;
    a zoo trains every entry with one recipe), so the checkpoint is trained as the reference's were.
    The loss's own parameters stay yours (``--set``); the flags it sets must be left out."""
    from .. import zoo
    from ..zoo.entry import RECIPE_KEYS, RECIPE_OPTIMIZER_KEYS

    given = sorted(f for f, dest in _ZOO_SETS.items() if getattr(args, dest) != args.train_defaults[dest])
    if given:
        raise UserError(
            f"--like-zoo {args.like_zoo} sets {', '.join(given)} as the zoo trains its entries; drop "
            f"{'it' if len(given) == 1 else 'them'}, or drop --like-zoo and give every flag yourself"
        )
    entry = zoo.load_zoo(args.like_zoo)[0]
    recipe = {k: entry.recipe[k] for k in (*RECIPE_KEYS, *RECIPE_OPTIMIZER_KEYS) if k in entry.recipe}
    return {**values, "dataset": entry.dataset, "encoder": entry.encoder, **recipe}, dict(
        entry.encoder_kwargs
    )


def _settings_help(registry: Any) -> str:
    """``name (key=default, ...)`` for every registered optimizer or schedule that has settings (the
    defaults as JSON: what ``--optimizer-arg`` / ``--schedule-arg`` parse)."""
    parts = []
    for name in registry.names():
        defaults = registry.get(name).defaults
        if defaults:
            parts.append(f"{name} ({', '.join(f'{k}={json.dumps(v)}' for k, v in defaults.items())})")
    return "; ".join(parts).replace("%", "%%")


def _train_here(args: argparse.Namespace, cfg: Any) -> int:
    """Train in this process: alone, or as one rank of a torchrun / ``--nproc`` group."""
    from ..training import distributed, train

    try:
        device = distributed.init_from_env(args.device)
    except UserError as e:
        # every rank meets the same device error before the group exists: rank 0 (torchrun's RANK)
        # prints its one line, the others leave quietly
        if os.environ.get("RANK", "0") == "0":
            raise
        return e.exit_code
    world = distributed.current_world()
    try:
        out = train(
            cfg,
            args.out,
            device=device,
            resume=args.resume,
            progress=not args.no_progress,
            sync_bn=args.sync_bn,
        )
    except UserError as e:
        if world.main:
            raise
        return e.exit_code  # every rank meets the same error: rank 0 prints its one line
    finally:
        distributed.shutdown()
    if not world.main:
        return 0
    manifest = json.loads((out / "manifest.json").read_text())
    init = manifest.get("knn_acc_init")
    print(
        f"wrote {out / manifest['weights']} and {out / 'manifest.json'} "
        f"(test kNN accuracy {manifest['knn_acc']:.4f}"
        + (f", {init:.4f} at initialisation)" if init is not None else ")")
    )
    return 0


def train_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``train``, with one flag per scalar TrainConfig field."""
    deterministic_flag(p)
    from ..losses import PRESETS
    from ..training import TrainConfig
    from ..training.optim import OPTIMIZERS, SCHEDULES

    # built after the plugins are loaded: their presets are named here too
    names = ", ".join(PRESETS.names())
    p.add_argument("--loss", required=True, help=f"loss preset: {names} (see `robustbench-nacl losses`)")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a loss parameter, e.g. --set M=5"
    )
    p.add_argument("--encoder-arg", action="append", metavar="KEY=VALUE", help="encoder kwarg, e.g. width=16")
    p.add_argument("--out", required=True, help="output directory (a folder of your own, e.g. runs/NAME)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument(
        "--nproc",
        type=int_arg,
        default=None,
        metavar="N",
        help="train on N local processes (torch's elastic launcher; gloo on cpu, nccl on cuda, one GPU "
        "each), the global --batch-size split across them (as torchrun -m robustbench_nacl train)",
    )
    p.add_argument(
        "--sync-bn",
        action="store_true",
        help="multi-process runs: BatchNorm statistics over the global batch (default: per process)",
    )
    # every other TrainConfig field, with the dataclass's default: a new field needs no edit here
    from ..accel import COMPILE_CHOICES

    choices = {"precision": ["fp32", "bf16"], "compile": list(COMPILE_CHOICES)}
    add_config_flags(p, TrainConfig, skip=_TRAIN_SPECIAL, help=_TRAIN_HELP, choices=choices)
    p.add_argument(
        "--optimizer-arg",
        action="append",
        metavar="KEY=VALUE",
        help=f"an --optimizer setting, e.g. eta=0.02; their defaults: {_settings_help(OPTIMIZERS)}",
    )
    p.add_argument(
        "--schedule-arg",
        action="append",
        metavar="KEY=VALUE",
        help=f"a --schedule setting, e.g. min_lr=1e-6; their defaults: {_settings_help(SCHEDULES)}",
    )
    p.add_argument(
        "--warmup-epochs",
        type=int_arg,
        default=None,
        metavar="N",
        help="--schedule's warm-up epochs (its own default: 10)",
    )
    p.add_argument(
        "--like-zoo",
        default=None,
        metavar="ZOO",
        help="train with zoo ZOO's encoder, dataset and recipe (epochs, batch size, optimizer, lr, "
        "schedule, weight decay, training images), e.g. fashion-mnist for the reference of leaderboard/; "
        "your loss and --set stay",
    )
    # what every flag defaults to: --like-zoo refuses a flag it sets that was given too
    p.set_defaults(train_defaults={a.dest: a.default for a in p._actions if a.dest != "help"})
