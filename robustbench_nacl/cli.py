"""The ``robustbench-nacl`` command: one subcommand per workflow, registered in ``COMMANDS``.

User errors (bad flags, missing data, broken checkpoints) print one line and exit with code 2;
there is no traceback for them.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import io
import json
import os
import re
import shlex
import sys
import textwrap
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from . import plugins
from .errors import UserError
from .io import check_writable_dir, refuse_reference_dir
from .registry import Registry

#: Where every command writes by default: one folder of the user's, ignored by the repository's
#: .gitignore, never the repository's reference leaderboard/ (see docs/decisions.md, "Output folders").
DEFAULT_OUT = Path("robustbench_out")
DEFAULT_RESULTS = DEFAULT_OUT / "leaderboard"  # eval rows (OUT/rows) and the rendered leaderboard
DEFAULT_ZOO_OUT = DEFAULT_OUT / "zoo"
DEFAULT_ZOO_BOARD = DEFAULT_OUT / "zoo-leaderboard"
DEFAULT_DEMO_OUT = DEFAULT_OUT / "demo"

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: Registry[Command] = Registry("command")


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Any]:
    """Register ``add_arguments`` for a subcommand; its runner is the function named ``run_<name>``."""

    def deco(
        add_args: Callable[[argparse.ArgumentParser], None],
    ) -> Callable[[argparse.ArgumentParser], None]:
        COMMANDS.add(name, (add_args, globals()[f"run_{name.replace('-', '_')}"]), help=help)
        return add_args

    return deco


def _json_kv(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _writable_out(path: str | Path, option: str = "--out") -> None:
    """Refuse the repository's reference folders, then fail early if ``path`` cannot be written."""
    refuse_reference_dir(path, option)
    check_writable_dir(path)


def _command_line(args: argparse.Namespace) -> str:
    """The command as the user typed it, without the interpreter's or the script's absolute path."""
    return shlex.join(["robustbench-nacl", *getattr(args, "_argv", [])])


# ============ flags generated from config dataclasses ============


def _optional_scalar(tp: Any) -> type | None:
    """``int``/``float``/``str``/``bool`` for a field of that type (or that type ``| None``), else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            return None
        tp = args[0]
    return tp if tp in (int, float, str, bool) else None


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the dataclass's source (trailing, or on the line above): its help text."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = re.search(r"#\s*(.+)$", lines[node.end_lineno - 1])  # type: ignore[operator]
        above = re.match(r"\s*#\s*(.+)$", lines[node.lineno - 2]) if node.lineno > 1 else None
        if m := trailing or above:
            out[node.target.id] = m.group(1).strip()
    return out


def config_fields(cls: type, skip: Iterable[str] = ()) -> list[dataclasses.Field[Any]]:
    """The fields of a config dataclass that become flags: every scalar one not in ``skip``."""
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if f.name not in skip and _optional_scalar(hints[f.name])]


def flag_name(field_name: str, prefix: str = "") -> str:
    """``batch_size`` -> ``--batch-size`` (``--probe-batch-size`` with prefix ``probe-``)."""
    return f"--{prefix}{field_name.replace('_', '-')}"


def add_config_flags(
    p: argparse.ArgumentParser,
    cls: type,
    *,
    prefix: str = "",
    skip: Iterable[str] = (),
    help: dict[str, str] | None = None,
    choices: dict[str, list[str]] | None = None,
) -> None:
    """One flag per scalar field of dataclass ``cls``, its default the field's default.

    A field added to the dataclass appears as a flag with no edit here; its help is ``help[name]``,
    else the field's comment in the source.
    """
    hints, comments = typing.get_type_hints(cls), _field_comments(cls)
    for f in config_fields(cls, skip):
        tp = _optional_scalar(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = (help or {}).get(f.name) or comments.get(f.name) or f"{cls.__name__}.{f.name}"
        text = text.replace("%", "%%")  # argparse formats help with %
        kw: dict[str, Any] = {"default": default, "dest": (prefix + f.name).replace("-", "_")}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction  # it appends the default itself
        else:
            kw.update(type=tp, metavar={int: "N", float: "X"}.get(tp, f.name.split("_")[-1].upper()))
            text += " (default: %(default)s)"
        if choices and f.name in choices:
            kw["choices"] = choices[f.name]
        p.add_argument(flag_name(f.name, prefix), help=text, **kw)


def config_values(
    cls: type, args: argparse.Namespace, *, prefix: str = "", skip: Iterable[str] = ()
) -> dict[str, Any]:
    """The values of the flags :func:`add_config_flags` made, as keyword arguments of ``cls``."""
    return {f.name: getattr(args, (prefix + f.name).replace("-", "_")) for f in config_fields(cls, skip)}


# ============ losses ============


def _preset_entries(name: str | None, overrides: list[str] | None) -> list[dict[str, Any]]:
    """One JSON-ready entry per preset (or the one named, with ``--set`` overrides applied)."""
    from .losses import PRESETS, needs, resolve

    entries = []
    for n in [name] if name else PRESETS.names():
        preset = PRESETS.get(n)
        p = resolve(n, overrides) if name else preset.params
        plugin = plugins.plugin_of(preset.module)
        entries.append(
            {
                "name": n,
                "params": p.to_dict(),
                "needs": dataclasses.asdict(needs(p)),
                "paper": preset.paper,
                "description": preset.description,
                "grid": preset.grid,
                "module": preset.module,  # None: built in
                "plugin": plugin.record() if plugin is not None else None,
            }
        )
    return entries


def _loss_source(entry: dict[str, Any]) -> str:
    """The "source" column: the paper, and for a plugin its module, version and sha256 prefix."""
    plugin = entry.get("plugin")
    if not plugin:
        return entry["paper"] if not entry.get("module") else f"{entry['paper']} ({entry['module']})".strip()
    where = plugin["module"] + (f" {plugin['version']}" if plugin.get("version") else "")
    sha = f" sha256 {plugin['sha256'][:12]}" if plugin.get("sha256") else ""
    return f"{entry['paper']} (plugin {where}{sha})".strip()


def _nacl_term(p: dict[str, Any]) -> str:
    """The L_NaCl column: the aggregator of the positives, as the paper names it."""
    if p["objective"] == "supervised":
        return "CE"
    if p["objective"] != "contrastive":  # a plugin's objective: its own loss
        return p["objective"]
    if p["positives"] != "nca":
        return {"worst_pair": "ArCL"}.get(p["positives"], p["positives"].upper())
    return "NCA+MIXNCA" if p["combine"] else ("MIXNCA" if p["lam"] is not None else "NCA")


# (header, how to read the cell from the params); "views" is the positive generator (augmentation,
# mixup, noise), "positives" the aggregator over them (nca, var, worst_pair)
_LOSS_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("G1", lambda p: p["G1"]),
    ("M", lambda p: p["M"]),
    ("lambda", lambda p: "-" if p["lam"] is None else p["lam"]),
    ("alpha", lambda p: p["alpha"]),
    ("G2", lambda p: p["G2"] if p["alpha"] else "-"),
    ("w", lambda p: p["w"] if p["alpha"] else "-"),
    ("tau+", lambda p: p["tau_plus"]),
    ("beta", lambda p: p["beta"]),
    ("t", lambda p: p["t"]),
    ("views", lambda p: p["views"]),
    ("positives", lambda p: p["positives"]),
]


_NACL_LEGEND = (
    "L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)   (NaCl Table 1, generated from the presets;\n"
    "views: how the positives are made; positives: how they are aggregated)\n"
)


def run_losses(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    entries = _preset_entries(args.name, args.set)
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    adversarial = [e for e in entries if "attack_eps" in e["params"].get("extra", {})]
    entries = [e for e in entries if e not in adversarial]
    rows = [
        [
            e["name"],
            _nacl_term(e["params"]),
            *(cell(e["params"]) for _, cell in _LOSS_COLUMNS),
            _loss_source(e),
        ]
        for e in entries
    ]
    headers = ["preset", "L_NaCl", *(h for h, _ in _LOSS_COLUMNS), "source"]
    if entries:
        print(_NACL_LEGEND)
        print(tabulate(rows, headers=headers, tablefmt="github"))
    if adversarial:
        _print_adversarial(adversarial, tabulate, blank=bool(entries))
    return 0


#: the inner attack's parameters and each method's own, as the adversarial table shows them
_ATTACK_SHORT = {"attack_eps": "eps", "attack_steps": "steps", "attack_step_size": "step"}


def _print_adversarial(entries: list[dict[str, Any]], tabulate: Callable[..., str], blank: bool) -> None:
    """The adversarial-pretraining presets (losses/adversarial.py): inner PGD and method parameters."""
    rows = []
    for e in entries:
        extra = e["params"]["extra"]
        own = {
            k: v
            for k, v in extra.items()
            if k not in (*_ATTACK_SHORT, "attack_random_start", "attack_bn_eval")
        }
        rows.append(
            [
                e["name"],
                *(f"{extra[k]:.4g}" if isinstance(extra[k], float) else extra[k] for k in _ATTACK_SHORT),
                "dual" if e["needs"]["adversarial"] and e["params"]["dual_bn"] else "single",
                e["params"]["views"],
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in own.items()),
                e["description"],
                _loss_source(e),
            ]
        )
    headers = ["preset", "eps", "steps", "step", "BN", "views", "parameters", "loss", "source"]
    print(
        ("\n" if blank else "")
        + "Adversarial contrastive pretraining: inner PGD (Linf, [0,1] pixel units, random start) on the\n"
        "method's loss, then its training loss (change any parameter with --set, e.g. --set attack_steps=3)\n"
    )
    print(tabulate(rows, headers=headers, tablefmt="github"))


@command("losses", "list the loss presets (the paper's Table 1) or show one with overrides")
def _losses_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="one preset to show (with --set overrides applied)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a loss parameter")
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, params, ...}")


# ============ encoders / datasets ============


def run_encoders(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .models.encoders import ENCODERS
    from .models.timm_encoder import TIMM_PREFIX

    rows = []
    for n in ENCODERS.names():
        info = ENCODERS.info(n)
        plugin = plugins.plugin_of(info.get("module"))
        source = f"plugin {plugin.module}" if plugin is not None else "built in"
        rows.append([n, info.get("description", ""), source])
    print(tabulate(rows, headers=["encoder", "description", "source"], tablefmt="github"))
    print(
        f"\n{TIMM_PREFIX}NAME: any timm.list_models() network (timm.create_model(NAME, num_classes=0)), "
        "after pip install 'robustbench-nacl[timm]'"
    )
    return 0


@command("encoders", "list the encoder architectures")
def _encoders_args(p: argparse.ArgumentParser) -> None:
    pass


def run_datasets(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .data import DATASETS

    rows = [
        [n, DATASETS.info(n).get("num_classes"), DATASETS.info(n).get("how_to_get", "")]
        for n in DATASETS.names()
    ]
    print(tabulate(rows, headers=["dataset", "classes", "how to get it"], tablefmt="github"))
    return 0


@command("datasets", "list the datasets and how to get each")
def _datasets_args(p: argparse.ArgumentParser) -> None:
    pass


# ============ train ============


# Train flags that are not one scalar TrainConfig field each, or need more than the field's comment.
_TRAIN_SPECIAL = ("loss", "overrides", "encoder_kwargs")
_TRAIN_HELP = {
    "dataset": "dataset spec, e.g. digits, cifar100, digits:0-4",
    "encoder": "encoder (see `robustbench-nacl encoders`; or timm:NAME)",
    "epochs": "training epochs",
    "batch_size": "images per batch (each gives its views)",
    "lr": "Adam learning rate (constant: no schedule)",
    "weight_decay": "Adam weight decay",
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
    from .losses import parse_overrides
    from .training import TrainConfig, check_settings, distributed

    _writable_out(args.out)
    cfg = TrainConfig(
        loss=args.loss,
        overrides=parse_overrides(args.set),
        encoder_kwargs=_json_kv(args.encoder_arg),
        **config_values(TrainConfig, args, skip=_TRAIN_SPECIAL),
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


def _train_here(args: argparse.Namespace, cfg: Any) -> int:
    """Train in this process: alone, or as one rank of a torchrun / ``--nproc`` group."""
    from .training import distributed, train

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


@command("train", "train one encoder with one loss preset")
def _train_args(p: argparse.ArgumentParser) -> None:
    _deterministic_flag(p)
    from .losses import PRESETS
    from .training import TrainConfig

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
        type=int,
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
    add_config_flags(
        p, TrainConfig, skip=_TRAIN_SPECIAL, help=_TRAIN_HELP, choices={"precision": ["fp32", "bf16"]}
    )


# ============ eval ============


def _resolve_transfer(args: argparse.Namespace) -> str | None:
    """``--transfer auto``: the complementary classes of the in-domain class subset."""
    from .eval.settings import transfer_default
    from .models.foreign import load_encoder

    if args.transfer != "auto":
        return args.transfer
    _, info = load_encoder(args.checkpoint, arch=args.arch, fmt=args.format, normalize=args.normalize)
    transfer = transfer_default(args.dataset or info.get("dataset") or "")
    if transfer is None:
        raise UserError(
            "--transfer auto needs a class-subset dataset (e.g. digits:0-4); name the target instead"
        )
    return transfer


def run_eval(args: argparse.Namespace) -> int:
    from .eval.evaluate import evaluate
    from .eval.probe import ProbeConfig
    from .results.finetune import AffConfig, AlfConfig

    refuse_reference_dir(args.out)
    checkpoint, heads = _eval_source(args)
    rows = evaluate(
        checkpoint,
        heads=heads,
        save_heads=args.save_heads,
        dataset=args.dataset,
        transfer=_resolve_transfer(args),
        shift=args.shift,
        corruptions=args.corruptions,
        severities=args.severities,
        suite=args.suite,
        out=args.out,
        n_examples=args.n_examples,
        seed=args.seed,
        device=args.device,
        probe=ProbeConfig(**config_values(ProbeConfig, args, prefix="probe-")),
        arch=args.arch,
        fmt=args.format,
        normalize=args.normalize,
        control=args.control,
        force=args.force,
        batch_size=args.batch_size,
        data_root=args.data_root,
        progress=not args.no_progress,
        protocol=args.protocol,
        alf=AlfConfig(**config_values(AlfConfig, args, prefix="alf-")),
        aff=AffConfig(**config_values(AffConfig, args, prefix="aff-")),
    )
    _print_rows(rows)
    # evaluate() says in one line what it computed and what it reused (a re-run: nothing computed)
    summary = getattr(rows, "summary", None)
    print(summary or f"{len(rows)} result rows under {Path(args.out) / 'rows'}")
    if args.card and rows:
        from .eval.cards import card_of_rows, write_card

        path = Path(args.out) / "cards" / f"{rows[0]['checkpoint_id']}.json"
        print(f"model card: {write_card(path, card_of_rows(rows))}")
    return 0


def _eval_source(args: argparse.Namespace) -> tuple[str, str | None]:
    """(checkpoint, heads folder) of ``eval``: a path, or a published model's (``--model NAME``)."""
    if (args.checkpoint is None) == (args.model is None):
        raise UserError("pass a checkpoint path or --model NAME (one of `robustbench-nacl models`), not both")
    if args.model is None:
        if args.weights_from:
            raise UserError("--weights-from goes with --model NAME; a checkpoint path names its own weights")
        return args.checkpoint, None
    from .published import HEADS_DIR, checkpoint_dir, find_model

    model = find_model(args.model)
    return str(checkpoint_dir(model, args.weights_from)), str(model.set_folder / HEADS_DIR)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    from tabulate import tabulate

    table = [
        [
            r["setting"],
            r["dataset"],
            r["attack"],
            r["norm"],
            r["eps_label"],
            f"{r['clean_acc']:.2%}",
            f"{r['robust_acc']:.2%}",
            "ok" if r.get("sanity_ok") else "FLAGGED",
        ]
        for r in rows
    ]
    print(
        tabulate(table, headers=["setting", "dataset", "attack", "norm", "eps", "clean", "robust", "sanity"])
    )


@command("eval", "probe and attack an encoder checkpoint; writes content-addressed result rows")
def _eval_args(p: argparse.ArgumentParser) -> None:
    _deterministic_flag(p)
    from .eval.probe import ProbeConfig

    p.add_argument(
        "checkpoint",
        nargs="?",
        help="a directory written by `train`, its manifest.json, or a foreign weights file",
    )
    p.add_argument("--model", default=None, help="a published model instead (`robustbench-nacl models`)")
    p.add_argument(
        "--weights-from",
        default=None,
        metavar="DIR|URL",
        help="--model: its weights from this folder or URL (downloads are cached; sha256 checked)",
    )
    p.add_argument(
        "--card", action="store_true", help="also write OUT/cards/<checkpoint id>.json, its model card"
    )
    p.add_argument(
        "--save-heads", action="store_true", help="also write the fitted linear heads to OUT/heads/"
    )
    p.add_argument(
        "--dataset", default=None, help="in-domain dataset (default: the checkpoint's pretraining dataset)"
    )
    p.add_argument(
        "--transfer", default=None, help="transfer target dataset, or 'auto' for the complementary classes"
    )
    p.add_argument(
        "--shift",
        default=None,
        help="'all' or a comma list of: grayscale, crop, flip, jitter, grayscale+jitter",
    )
    p.add_argument(
        "--corruptions",
        default=None,
        help="common corruptions of the test images (the in-domain probe): 'all' or a comma list of: "
        "gaussian_noise, shot_noise, impulse_noise, speckle_noise, gaussian_blur, defocus_blur, "
        "contrast, brightness, saturate (colour only), pixelate",
    )
    p.add_argument("--severities", default=None, help="corruption severities: 1-5 (default), 3 or 1,3,5")
    p.add_argument(
        "--suite", default="paper", help="attack suite name (attacks/*.toml) or a path to a TOML file"
    )
    p.add_argument(
        "--out",
        default=str(DEFAULT_RESULTS),
        help="output directory (rows land in OUT/rows; default: %(default)s)",
    )
    p.add_argument(
        "--n-examples", type=int, default=None, help="evaluate the first N test examples (default: all)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--batch-size", type=int, default=None, help="attack batch size")
    p.add_argument("--arch", default=None, help="architecture of a foreign checkpoint, e.g. resnet18_cifar")
    from .models.foreign import FORMATS  # lazy, like every command's heavy imports

    p.add_argument("--format", default="auto", help="foreign layout: auto | " + " | ".join(FORMATS.names()))
    p.add_argument(
        "--normalize",
        default=None,
        help="input normalisation of a foreign checkpoint: cifar10 | half | imagenet | none",
    )
    p.add_argument(
        "--control", action="store_true", help="evaluate a random-init encoder of the same architecture"
    )
    p.add_argument("--force", action="store_true", help="recompute rows that already exist")
    p.add_argument("--data-root", default=None)
    # the probe and kNN recipe: one --probe-FIELD flag per ProbeConfig field, with its default
    add_config_flags(p, ProbeConfig, prefix="probe-")
    _protocol_arg(p)
    from .results.finetune import AffConfig, AlfConfig

    add_config_flags(p.add_argument_group("ALF settings (--protocol alf)"), AlfConfig, prefix="alf-")
    add_config_flags(p.add_argument_group("AFF settings (--protocol aff)"), AffConfig, prefix="aff-")


def _protocol_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--protocol",
        default="slf",
        type=_protocols,
        help="finetuning protocol(s): slf (linear probe on clean features), alf (adversarial linear), "
        "aff (adversarial full, TRADES), or a comma list, e.g. slf,alf,aff (default: %(default)s)",
    )


def _protocols(text: str) -> str:
    from .eval.finetune import parse_protocols

    try:
        return ",".join(parse_protocols(text))
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ============ leaderboard / zoo / demo ============


@contextlib.contextmanager
def _rendering(folder: str | Path) -> Iterator[None]:
    """One render of a leaderboard folder at a time; what a render killed mid-write left is removed
    first (only renders write files at the folder's top level: rows live in its rows/)."""
    from .locks import advisory_lock, remove_temporaries, sweep

    with advisory_lock(folder, "leaderboard", f"the leaderboard in {folder}"):
        remove_temporaries(folder)
        yield
    sweep(folder)  # locks of killed evaluations whose rows another run then completed


def run_leaderboard(args: argparse.Namespace) -> int:
    from .report.leaderboard import main_leaderboard

    refuse_reference_dir(args.out)
    with _rendering(args.out):
        files = main_leaderboard(
            args.rows,
            args.out,
            headline_eps=args.headline_eps,
            command=_command_line(args),
            rank_by=args.rank_by,
            baseline=args.baseline,
            baseline_recipe=args.baseline_recipe,
            notify=lambda notice: print(notice, file=sys.stderr),
        )
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


class _AppendOrDefault(argparse.Action):
    """``action="append"`` whose default list is replaced, not extended, by the first value given."""

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any, opt: Any = None
    ) -> None:
        current = getattr(ns, self.dest)
        setattr(ns, self.dest, [*(current if current is not self.default else []), value])


def _baseline_flags(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "--baseline",
        default=default,
        help="loss family every recipe is compared with"
        + (" (default: %(default)s)" if default else " (default: simclr where present; none: no column)"),
    )
    p.add_argument(
        "--baseline-recipe",
        default=None,
        metavar="RECIPE_ID",
        help="which recipe of the baseline family, when it has several (a recipe id prefix)",
    )


@command("leaderboard", "render LEADERBOARD.md, CSV/JSON, the paper's plots and index.html from result rows")
def _leaderboard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rows",
        action=_AppendOrDefault,
        default=[str(DEFAULT_RESULTS)],
        metavar="DIR",
        help="directory of result rows: the --out of `eval`; repeat it to rank your rows (the first) "
        f"beside reference rows (default: {DEFAULT_RESULTS})",
    )
    p.add_argument(
        "--out", default=str(DEFAULT_RESULTS), help="where to write the leaderboard (default: %(default)s)"
    )
    p.add_argument("--headline-eps", type=float, default=0.002, help="epsilon of the headline robust columns")
    p.add_argument(
        "--rank-by",
        default=None,
        metavar="METRIC",
        help="clean or ATTACK@EPS, e.g. worst_case@max, fgsm@0.002, pgd@8/255 "
        "(default: the worst case at the suite's largest epsilon)",
    )
    _baseline_flags(p, None)


def run_compare(args: argparse.Namespace) -> int:
    from .report.compare import main_compare

    text = main_compare(args.rows, args.baseline, baseline_recipe=args.baseline_recipe, as_json=args.json)
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


@command("compare", "every recipe against a baseline on the same test examples: difference, interval, p")
def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rows",
        nargs="+",
        default=[str(DEFAULT_RESULTS)],
        metavar="DIR",
        help="directories of result rows (default: %(default)s)",
    )
    _baseline_flags(p, "simclr")
    p.add_argument("--json", action="store_true", help="print the comparisons as JSON")


def _zoo_list(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from . import zoo

    rows = [
        [e.id, e.loss, e.dataset, e.seed, "yes" if zoo.is_trained(e, args.out) else "no"]
        for e in zoo.load_zoo(args.zoo)
    ]
    print(tabulate(rows, headers=["id", "loss", "dataset", "seed", "trained"], tablefmt="github"))
    return 0


def _zoo_show(args: argparse.Namespace) -> int:
    from . import zoo

    if not args.ids:
        raise UserError("zoo show needs an entry id, e.g. `zoo show convnet_small.simclr_digits-0-4_s0`")
    for i in args.ids:
        print(json.dumps(zoo.find_entry(i).to_dict(), indent=2))
    return 0


def _zoo_train(args: argparse.Namespace) -> int:
    """Train the entries asked for that are not trained (or have a live job), with --launcher."""
    from .launch import make_tasks

    _writable_out(args.out)
    options = _launch_options(args)
    return _zoo_launch(
        args, make_tasks(_zoo_entries(args), "train", args.out, args.leaderboard, args.device), options
    )


def _zoo_eval(args: argparse.Namespace) -> int:
    """Evaluate every trained entry asked for (and one random-init control per seed) into --leaderboard."""
    from . import zoo
    from .launch import make_tasks
    from .pipeline import is_complete, rows_done

    refuse_reference_dir(args.leaderboard, "--leaderboard")
    options = _launch_options(args)
    entries = _zoo_entries(args)
    trained = [e for e in entries if zoo.is_trained(e, args.out)]
    complete = rows_done(args.leaderboard)  # rows committed without their checkpoints count as done
    missing = [e for e in entries if e not in trained and not is_complete(e, complete)]
    if not trained and missing:
        raise UserError(
            f"none of the {len(entries)} entries is trained under {args.out}; run `zoo train` first"
        )
    tasks = make_tasks(trained, "eval", args.out, args.leaderboard, args.device)
    if not args.no_controls:
        tasks += make_tasks(trained, "control", args.out, args.leaderboard, args.device)
    code = _zoo_launch(args, tasks, options)
    if missing:
        print(f"{len(missing)} entries are not trained under {args.out}: not evaluated")
    if not trained:
        print(f"the rows of all {len(entries)} entries are complete under {args.leaderboard}")
    return code


def _launch_options(args: argparse.Namespace) -> Any:
    """--launcher and the --slurm-* flags as LaunchOptions; a missing submitit is one line, here."""
    from .launch import LAUNCHERS, LaunchOptions, require_submitit

    LAUNCHERS.get(args.launcher)
    slurm = {k: v for k, v in vars(args).items() if k.startswith("slurm_") and v not in (None, [])}
    if args.launcher == "local" and slurm:
        flags = ", ".join(flag_name(k) for k in slurm)
        raise UserError(f"{flags}: for --launcher slurm or submitit-local, not for the local pool")
    if args.launcher != "local":
        require_submitit(args.launcher)
    if args.launcher == "slurm" and args.slurm_time is None:
        raise UserError(
            "--launcher slurm needs --slurm-time MIN, each job's time limit (it is requeued at it)"
        )
    for name in ("slurm_gpus_per_job", "slurm_time", "slurm_array_parallelism", "slurm_cpus_per_task"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "slurm_gpus_per_job" else 1):
            raise UserError(
                f"{flag_name(name)} {value}: must be a whole number >= {int(name != 'slurm_gpus_per_job')}"
            )
    gpus = args.slurm_gpus_per_job
    return LaunchOptions(
        workers=args.workers,
        partition=args.slurm_partition,
        gpus_per_job=(1 if args.device.startswith("cuda") else 0) if gpus is None else gpus,
        time_min=args.slurm_time,
        array_parallelism=args.slurm_array_parallelism,
        cpus_per_task=args.slurm_cpus_per_task,
        slurm_args={str(k): str(v) for k, v in _json_kv(args.slurm_arg).items()},
        progress=not args.no_progress,
    )


def _task_label(task: Any) -> str:
    return f"random-init control of {task.entry.id}" if task.action == "control" else task.entry.id


def _task_done_line(task: Any, result: Any = None) -> str:
    """What `zoo train|eval` prints for a finished task (``result``: what a local run returned)."""
    from . import zoo
    from .pipeline import expected_rows

    if task.action == "train":
        d = zoo.checkpoint_dir(task.entry, task.ckpts)
        return f"{task.entry.id}: " + (f"trained -> {d}" if result is not None else f"already trained ({d})")
    n = expected_rows(task.entry) if result is None else result
    where = f" in {Path(task.board) / 'rows'}" if task.action == "eval" else ""
    return f"{_task_label(task)}: {n} rows{where}" + (
        " (complete: not evaluated again)" if result is None else ""
    )


def _zoo_launch(args: argparse.Namespace, tasks: list[Any], options: Any) -> int:
    """Skip finished tasks and live jobs, hand the rest to --launcher; with --wait (or local) report
    each outcome. Exit 1 if a waited-for job failed."""
    from . import launch

    plan = launch.plan(tasks)
    for st in plan.done:
        print(_task_done_line(st.task))
    for st in plan.live:
        print(f"{_task_label(st.task)}: {st.detail}; not submitted again")
    submitted = launch.launch(args.launcher, plan.todo, options)
    if launch.LAUNCHERS.get(args.launcher).waits:
        for sub in submitted:
            print(_task_done_line(sub.task, sub.result))
        return 0
    if submitted:
        ids = ", ".join(s.job_id for s in submitted[:4]) + (", ..." if len(submitted) > 4 else "")
        print(
            f"submitted {len(submitted)} {args.launcher} job(s) ({ids}); job records and logs under "
            f"{launch.jobs_folder(args.out)}; `robustbench-nacl zoo status` shows where they stand"
        )
    if not args.wait or not submitted:
        return 0
    states = launch.wait(submitted)
    for st in states:
        print(f"{_task_label(st.task)}: {st.state}" + (f" ({st.detail})" if st.state != "done" else ""))
    return 1 if any(st.state != "done" for st in states) else 0


def _zoo_run(args: argparse.Namespace) -> int:
    """Train, evaluate and render a whole zoo; resumable (finished entries and rows are skipped)."""
    from .locks import sweep
    from .pipeline import run_entries
    from .report.leaderboard import render_leaderboard
    from .results.rows import load_rows

    if args.launcher != "local":
        raise UserError(
            f"zoo run works in this process; with --launcher {args.launcher} run `zoo train`, then "
            "`zoo eval` (each with --wait, or when `zoo status` says done), then `leaderboard`"
        )
    refuse_reference_dir(args.leaderboard, "--leaderboard")
    _writable_out(args.out)
    t0 = time.perf_counter()
    entries = _zoo_entries(args)
    run = run_entries(
        entries,
        args.out,
        args.leaderboard,
        workers=args.workers,
        device=args.device,
        controls=not args.no_controls,
        progress=not args.no_progress,
    )
    sweep(args.out)  # locks of killed trainings finished by a later run
    with _rendering(args.leaderboard):
        files = render_leaderboard(
            load_rows(args.leaderboard), args.leaderboard, command=_command_line(args), rank_by=args.rank_by
        )
    print(
        f"{len(entries)} entries: {run.trained} trained ({run.train_s:.0f} s), {run.evaluated} evaluations "
        f"({run.eval_s:.0f} s), {run.skipped} already complete; {time.perf_counter() - t0:.0f} s in all\n"
        f"  leaderboard: {files['LEADERBOARD.md']}"
    )
    return 0


def _zoo_verify(args: argparse.Namespace) -> int:
    """One line per entry asked for (missing ones too), then a count; exit 1 if a checkpoint changed,
    2 if none of the entries asked for has a checkpoint under --out (nothing was verified)."""
    from . import zoo

    report = zoo.verify_entries(_zoo_entries(args), args.out)
    for entry, status, detail in report.results:
        print(f"{status:<18} {entry.id}  {detail}")
    for entry in report.missing:
        print(f"{'missing':<18} {entry.id}  no checkpoint at {zoo.checkpoint_dir(entry, args.out)}")
    print(report.summary())
    if not report.results:
        which = f"zoo {args.zoo!r}" if args.zoo and not args.ids else "the entries asked for"
        raise UserError(
            f"verified none of the {len(report.missing)} entries of {which}: none has a checkpoint "
            f"under {args.out}; train them with `zoo train` or pass the --out they were trained into"
        )
    if report.bad:
        print(f"{len(report.bad)} checkpoint(s) do not match their recorded sha256", file=sys.stderr)
        return 1
    return 0


def _zoo_status(args: argparse.Namespace) -> int:
    """One line per entry: where its training, evaluation and control stand, then a count per state."""
    from tabulate import tabulate

    from .launch import ACTIONS, zoo_status

    entries = _zoo_entries(args)
    states: dict[str, dict[str, Any]] = {}
    for st in zoo_status(entries, args.out, args.leaderboard):
        states.setdefault(st.task.entry.id, {})[st.task.action] = st
    table = []
    for e in entries:
        mine = states.get(e.id, {})
        cells = [
            "-" if a not in mine else mine[a].state + (f" ({mine[a].job_id})" if mine[a].live else "")
            for a in ACTIONS.names()
        ]
        why = [f"{a}: {st.detail}" for a, st in mine.items() if st.state not in ("done", "not started")]
        table.append([e.id, *cells, "; ".join(why)])
    print(tabulate(table, headers=["id", *ACTIONS.names(), "detail"], tablefmt="github"))
    counts = []
    for a in ACTIONS.names():
        found = [mine[a].state for mine in states.values() if a in mine]
        order = dict.fromkeys(
            ["done", "running", "pending", "failed", "interrupted", "unknown", "not started"]
        )
        parts = [f"{found.count(s)} {s}" for s in order if found.count(s)]
        counts.append(f"{a} {', '.join(parts) or 'none'}")
    print(f"{len(entries)} entries (checkpoints {args.out}, rows {args.leaderboard}): " + "; ".join(counts))
    return 0


def _zoo_publish(args: argparse.Namespace) -> int:
    """Copy the trained, evaluated entries of --zoo into the package's published set (maintainers)."""
    from .publish import publish_zoo

    if not args.zoo:
        raise UserError("zoo publish needs --zoo NAME: a published set is one zoo")
    publish_zoo(_zoo_entries(args), args.out, args.leaderboard, args.zoo)
    return 0


def _zoo_regenerate(args: argparse.Namespace) -> int:
    """Rewrite the generated zoos' manifests from the presets (after adding a preset to the package)."""
    from . import zoo

    for name, (written, removed) in zoo.regenerate(args.zoo).items():
        print(f"zoo {name}: {written} manifests written, {removed} stale ones removed")
    return 0


def _zoo_verify_submission(args: argparse.Namespace) -> int:
    """Recompute a sample of a submission's rows from its weights; exit 1 naming a row that disagrees."""
    from .submission import verify_submission

    if len(args.ids) != 1:
        raise UserError(
            "zoo verify-submission needs one folder: `zoo verify-submission DIR` (CONTRIBUTING.md)"
        )
    report = verify_submission(
        args.ids[0], settings=args.sample_settings, tolerance=args.tolerance, device=args.device
    )
    for line in report.lines:
        print(line)
    if report.failures:
        print(f"rejected: {report.failures[0]}", file=sys.stderr)
        return 1
    print(f"accepted: {report.summary}")
    return 0


def _zoo_entries(args: argparse.Namespace) -> list[Any]:
    from . import zoo
    from .pipeline import with_protocol

    entries = [zoo.find_entry(i) for i in args.ids] if args.ids else zoo.load_zoo(args.zoo)
    return with_protocol(entries, getattr(args, "protocol", "slf"))


_ZOO_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _zoo_list,
    "show": _zoo_show,
    "train": _zoo_train,
    "eval": _zoo_eval,
    "run": _zoo_run,
    "verify": _zoo_verify,
    "status": _zoo_status,
    "publish": _zoo_publish,
    "regenerate": _zoo_regenerate,
    "verify-submission": _zoo_verify_submission,
}


def run_zoo(args: argparse.Namespace) -> int:
    return _ZOO_ACTIONS[args.action](args)


@command(
    "zoo",
    "list, show, train, eval, run (train + eval + render), verify or status of zoo entries (zoo/*/*.json); "
    "publish, regenerate, verify-submission DIR",
)
def _zoo_args(p: argparse.ArgumentParser) -> None:
    _deterministic_flag(p)
    p.add_argument("action", choices=list(_ZOO_ACTIONS))
    p.add_argument("ids", nargs="*", help="entry ids (default: every entry of --zoo)")
    p.add_argument("--zoo", default=None, help="which zoo: demo | fashion-mnist | paper (default: all)")
    p.add_argument(
        "--out",
        default=str(DEFAULT_ZOO_OUT),
        help="checkpoints directory, one folder per entry id (default: %(default)s)",
    )
    p.add_argument(
        "--leaderboard",
        default=str(DEFAULT_ZOO_BOARD),
        help="eval/run: where result rows (LEADERBOARD/rows) and the rendered leaderboard go "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="train/eval/run on the local pool: worker processes (default: 1)",
    )
    p.add_argument("--no-controls", action="store_true", help="eval/run: no random-init controls")
    _protocol_arg(p)
    p.add_argument(
        "--rank-by",
        default=None,
        metavar="METRIC",
        help="run: the leaderboard's ranking metric, as `leaderboard --rank-by` (default: the worst case "
        "at the suite's largest epsilon)",
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto (in a job: cuda, never cuda:N)")
    p.add_argument(
        "--sample-settings",
        type=int,
        default=2,
        help="verify-submission: settings whose rows are recomputed (in-domain first; default: %(default)s)",
    )
    p.add_argument(
        "--tolerance",
        type=int,
        default=0,
        help="verify-submission: attacked outcomes allowed to differ per 200 examples (another CPU's "
        "rounding; default: %(default)s, exact)",
    )
    _launcher_args(p)


def _launcher_args(p: argparse.ArgumentParser) -> None:
    from .launch import LAUNCHERS

    g = p.add_argument_group("where train/eval run (one job per entry; see README, 'Running on a cluster')")
    g.add_argument(
        "--launcher",
        default="local",
        choices=LAUNCHERS.names(),
        help="local: this machine's process pool, done when the command returns (default); "
        "submitit-local: background jobs on this machine through submitit; slurm: one Slurm job array "
        "through submitit (pip install 'robustbench-nacl[cluster]'). Finished entries and entries "
        "with a live job are not submitted again",
    )
    g.add_argument(
        "--wait", action="store_true", help="submitit launchers: wait for the jobs; exit 1 if one failed"
    )
    g.add_argument("--slurm-partition", metavar="P", help="Slurm partition (default: the cluster's)")
    g.add_argument(
        "--slurm-gpus-per-job",
        type=int,
        metavar="G",
        help="GPUs per job (default: 1 with --device cuda, else 0); a training job with G > 1 runs one "
        "DDP process per GPU, an evaluation job uses one",
    )
    g.add_argument(
        "--slurm-time",
        type=int,
        metavar="MIN",
        help="each job's time limit in minutes (required by slurm); a job that reaches it, or is "
        "preempted, is requeued and resumes from its last epoch",
    )
    g.add_argument(
        "--slurm-array-parallelism", type=int, metavar="K", help="at most K jobs of the array at once"
    )
    g.add_argument("--slurm-cpus-per-task", type=int, metavar="N", help="CPUs per process")
    g.add_argument(
        "--slurm-arg",
        action="append",
        metavar="KEY=VALUE",
        help="any other sbatch option, e.g. account=ABC, qos=high, constraint=a100 (repeatable)",
    )


def run_models(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .published import not_covered, published_models, published_sets

    models = published_models(args.dataset)
    if not models:
        known = sorted({m.card["dataset"] for m in published_models()}) or ["none in this installation"]
        raise UserError(f"no published model pretrained on {args.dataset}; published: {', '.join(known)}")
    if args.json:
        print(json.dumps([{**m.card, "set": m.set} for m in models], indent=2))
        return 0
    table = []
    for m in models:
        h = m.card["headline"]["SLF"]
        robust = f"{h['robust_acc']:.1%} ({h['metric']} {h['norm']} {h['eps_label']})"
        table.append([m.name, m.card["dataset"], m.card["loss"]["family"], f"{h['clean_acc']:.1%}", robust])
    print(tabulate(table, headers=["name", "dataset", "loss", "clean", "robust (SLF)"], tablefmt="github"))
    print(f"{len(models)} published models; load one with load_model(NAME) or `eval --model NAME`")
    for s in published_sets():
        if missing := not_covered(s):  # a preset added since: listed, never an error
            print(f"set {s}: not in the published reference yet: {', '.join(missing)}")
    return 0


@command(
    "models", "list the published reference models (load_model / eval --model NAME) with headline numbers"
)
def _models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dataset", default=None, help="only models pretrained on this dataset (digits or digits:0-4)"
    )
    p.add_argument("--json", action="store_true", help="print every model's card as JSON")


def run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo as demo

    _writable_out(args.out)
    demo(
        args.out,
        dataset=args.dataset,
        quick=args.quick,
        device=args.device,
        workers=args.workers,
        command=_command_line(args),
        protocol=args.protocol,
    )
    return 0


@command("demo", "the main job: train the demo zoo on digits, evaluate it, render the leaderboard")
def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=str(DEFAULT_DEMO_OUT), help="output directory (default: %(default)s)")
    p.add_argument(
        "--quick", action="store_true", help="fewer epochs and examples, same code path (~1 minute)"
    )
    p.add_argument("--dataset", default="digits", help="digits (embedded, default) | fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--workers", type=int, default=None, help="parallel worker processes (default: min(2, cores))"
    )
    _protocol_arg(p)


# ============ entry point ============


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, and where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


PLUGIN_HELP = (
    "load a plugin before the command runs: a dotted module name or the path of a .py file "
    "(repeatable; see examples/README.md)"
)


def _deterministic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="CUDA: deterministic algorithms and cuDNN kernels, CUBLAS_WORKSPACE_CONFIG (slower; "
        "docs/decisions.md, 'Determinism on CUDA'); no effect on CPU results",
    )


def _add_plugin_flag(p: argparse.ArgumentParser, dest: str = "plugin") -> None:
    p.add_argument("--plugin", action="append", default=[], dest=dest, metavar="MODULE", help=PLUGIN_HELP)


def _add_common_flags(p: argparse.ArgumentParser) -> None:
    """The flags every command takes, whether or not it has anything to show or load for them."""
    _add_plugin_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def plugin_specs(argv: list[str]) -> list[str]:
    """The ``--plugin`` values of a command line, wherever they stand (read before the parsers are
    built, so that plugin losses and encoders are registered when their help and checks are made)."""
    pre = _Parser(prog="robustbench-nacl", add_help=False, allow_abbrev=False)
    _add_plugin_flag(pre)
    known, _ = pre.parse_known_args(argv)
    return list(known.plugin)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per registered command, each taking ``--plugin``."""
    parser = _Parser(
        prog="robustbench-nacl",
        description="Adversarial-robustness benchmark and model zoo for contrastive encoders.",
    )
    _add_plugin_flag(parser, dest="plugin_top")  # `robustbench-nacl --plugin X COMMAND` works too
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS.names():
        add_args, _ = COMMANDS.get(name)
        p = sub.add_parser(name, help=COMMANDS.info(name)["help"], description=COMMANDS.info(name)["help"])
        add_args(p)
        _add_common_flags(p)
    return parser


def _command_of(argv: list[str]) -> str:
    """The command named on a command line (for error messages before it is parsed), or ''."""
    return next((a for a in argv if a in COMMANDS), "")


def _fail(command: str, message: str, code: int = 2) -> int:
    where = f"robustbench-nacl {command}" if command else "robustbench-nacl"
    print(f"{where}: error: {' '.join(message.split())}", file=sys.stderr)
    return code


#: the exit code after the reader of stdout went away (`| head`): a shell's code for death by SIGPIPE
CLOSED_PIPE = 128 + 13


def _closed_pipe() -> int:
    """Stop quietly, as Unix tools do when their reader closes the pipe: no message, and no second
    error when Python flushes stdout at exit (it now points at /dev/null)."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 user error, 3 non-finite loss, 130 interrupted).

    Plugins (``--plugin``, ``$ROBUSTBENCH_NACL_PLUGINS``, installed entry points) load first; one
    that fails to import or registers a name that exists is one line and exit code 2.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plugins.load_plugins(plugin_specs(argv))
    except UserError as e:
        return _fail(_command_of(argv), str(e), e.exit_code)
    parser = build_parser()
    args = parser.parse_args(argv)
    args._argv = argv  # for the provenance line of what a command writes (no absolute paths)
    _, runner = COMMANDS.get(args.command)
    if getattr(args, "deterministic", False):
        from .utils import set_deterministic

        set_deterministic()
    try:
        # the parsed values again (a no-op for those loaded above): an abbreviated --plug also counts
        plugins.load_plugins([*args.plugin_top, *args.plugin], entry_points=False)
        code = runner(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is a closed pipe, not a traceback
        return code
    except UserError as e:
        return _fail(args.command, str(e), e.exit_code)
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as e:
        # the environment failed us (disk full, read-only or vanished directory): one line, not a traceback
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _fail(args.command, f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        print(f"robustbench-nacl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
