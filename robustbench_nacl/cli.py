"""The ``robustbench-nacl`` command: one subcommand per workflow, registered in ``COMMANDS``.

User errors (bad flags, missing data, broken checkpoints) print one line and exit with code 2;
there is no traceback for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .errors import UserError
from .io import check_writable_dir
from .registry import Registry

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


# ============ losses ============


def run_losses(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .losses import PRESETS, needs, resolve

    names = [args.name] if args.name else PRESETS.names()
    entries = []
    for n in names:
        preset = PRESETS.get(n)
        p = resolve(n, args.set) if args.name else preset.params
        entries.append(
            {
                "name": n,
                "params": p.to_dict(),
                "needs": needs(p).__dict__,
                "paper": preset.paper,
                "description": preset.description,
                "grid": preset.grid,
            }
        )
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    rows = []
    for e in entries:
        p = e["params"]
        if p["objective"] != "contrastive":
            nacl = "CE"
        elif p["positives"] != "nca":
            nacl = p["positives"].upper().replace("WORST_PAIR", "ArCL")
        else:
            nacl = "NCA+MIXNCA" if p["combine"] else ("MIXNCA" if p["lam"] is not None else "NCA")
        rows.append(
            [
                e["name"],
                nacl,
                p["G1"],
                p["M"],
                "-" if p["lam"] is None else p["lam"],
                p["alpha"],
                p["G2"] if p["alpha"] else "-",
                p["w"] if p["alpha"] else "-",
                p["tau_plus"],
                p["beta"],
                p["t"],
                p["views"],
                e["paper"],
            ]
        )
    headers = [
        "preset",
        "L_NaCl",
        "G1",
        "M",
        "lambda",
        "alpha",
        "G2",
        "w",
        "tau+",
        "beta",
        "t",
        "positives",
        "source",
    ]
    print(
        "L = L_NaCl(G1, M, lambda) + alpha * L_Robust(G2, w)   (NaCl Table 1, generated from the presets)\n"
    )
    print(tabulate(rows, headers=headers, tablefmt="github"))
    return 0


@command("losses", "list the loss presets (the paper's Table 1) or show one with overrides")
def _losses_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="one preset to show (with --set overrides applied)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a loss parameter")
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, params, ...}")


# ============ encoders / datasets ============


def run_encoders(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .models.encoders import ENCODERS

    rows = [[n, ENCODERS.info(n).get("description", "")] for n in ENCODERS.names()]
    print(tabulate(rows, headers=["encoder", "description"], tablefmt="github"))
    return 0


@command("encoders", "list the encoder architectures")
def _encoders_args(p: argparse.ArgumentParser) -> None:
    pass


def run_datasets(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .data.datasets import DATASETS

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


def run_train(args: argparse.Namespace) -> int:
    from .losses import parse_overrides
    from .train.trainer import TrainConfig, train

    cfg = TrainConfig(
        loss=args.loss,
        overrides=parse_overrides(args.set),
        dataset=args.dataset,
        encoder=args.encoder,
        encoder_kwargs=_json_kv(args.encoder_arg),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        seed=args.seed,
        fuse_views=args.fuse_views,
        knn_every=args.knn_every,
        precision=args.precision,
        channels_last=args.channels_last,
        data_root=args.data_root,
        max_train=args.max_train,
    )
    out = train(cfg, args.out, device=args.device, resume=args.resume, progress=not args.no_progress)
    manifest = json.loads((out / "manifest.json").read_text())
    print(
        f"wrote {out / manifest['weights']} and {out / 'manifest.json'} "
        f"(test kNN accuracy {manifest['knn_acc']:.4f}"
        + (
            f", {manifest['knn_acc_init']:.4f} at initialisation)"
            if manifest.get("knn_acc_init") is not None
            else ")"
        )
    )
    return 0


@command("train", "train one encoder with one loss preset")
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loss", required=True, help="loss preset (see `robustbench-nacl losses`)")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a loss parameter, e.g. --set M=5"
    )
    p.add_argument("--dataset", default="digits", help="dataset spec, e.g. digits, cifar100, digits:0-4")
    p.add_argument("--encoder", default="convnet_small", help="encoder (see `robustbench-nacl encoders`)")
    p.add_argument("--encoder-arg", action="append", metavar="KEY=VALUE", help="encoder kwarg, e.g. width=16")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument(
        "--fuse-views", action="store_true", help="forward all views in one pass (changes BN statistics)"
    )
    p.add_argument("--knn-every", type=int, default=5, help="kNN monitor every N epochs (0: only at the end)")
    p.add_argument("--max-train", type=int, default=None, help="use only the first N training images")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="NHWC memory format for the convolutions (default; faster on CPU and GPU)",
    )
    p.add_argument(
        "--data-root",
        default=None,
        help="dataset directory (default $ROBUSTBENCH_NACL_DATA or ~/.cache/robustbench_nacl)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


# ============ eval ============


def run_eval(args: argparse.Namespace) -> int:
    from .eval.evaluate import evaluate, transfer_default
    from .eval.probe import ProbeConfig

    transfer = args.transfer
    if transfer == "auto":
        from .models.foreign import load_encoder

        _, info = load_encoder(args.checkpoint, arch=args.arch, fmt=args.format, normalize=args.normalize)
        transfer = transfer_default(args.dataset or info.get("dataset") or "")
        if transfer is None:
            raise UserError(
                "--transfer auto needs a class-subset dataset (e.g. digits:0-4); name the target instead"
            )
    rows = evaluate(
        args.checkpoint,
        dataset=args.dataset,
        transfer=transfer,
        shift=args.shift,
        suite=args.suite,
        out=args.out,
        n_examples=args.n_examples,
        seed=args.seed,
        device=args.device,
        probe=ProbeConfig(epochs=args.probe_epochs, seed=args.seed),
        arch=args.arch,
        fmt=args.format,
        normalize=args.normalize,
        control=args.control,
        force=args.force,
        batch_size=args.batch_size,
        data_root=args.data_root,
        progress=not args.no_progress,
    )
    _print_rows(rows)
    print(f"{len(rows)} result rows under {args.out}/rows")
    return 0


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
    p.add_argument(
        "checkpoint", help="a directory written by `train`, its manifest.json, or a foreign weights file"
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
        "--suite", default="paper", help="attack suite name (attacks/*.toml) or a path to a TOML file"
    )
    p.add_argument("--out", default="leaderboard", help="output directory (rows land in OUT/rows)")
    p.add_argument(
        "--n-examples", type=int, default=None, help="evaluate the first N test examples (default: all)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--probe-epochs", type=int, default=1000, help="linear-probe epochs on cached features")
    p.add_argument("--batch-size", type=int, default=None, help="attack batch size")
    p.add_argument("--arch", default=None, help="architecture of a foreign checkpoint, e.g. resnet18_cifar")
    p.add_argument(
        "--format", default="auto", help="foreign layout: auto | torchvision | solo-learn | hcl | ours"
    )
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
    p.add_argument("--no-progress", action="store_true")


# ============ leaderboard / zoo / demo ============


def run_leaderboard(args: argparse.Namespace) -> int:
    from .report.leaderboard import main_leaderboard

    files = main_leaderboard(args.rows, args.out, headline_eps=args.headline_eps, command=" ".join(sys.argv))
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


@command("leaderboard", "render LEADERBOARD.md, CSV/JSON, the paper's plots and index.html from result rows")
def _leaderboard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", required=True, help="directory of result rows (the --out of `eval`)")
    p.add_argument("--out", required=True, help="where to write the leaderboard")
    p.add_argument("--headline-eps", type=float, default=0.002, help="epsilon of the headline robust columns")


def run_zoo(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from . import zoo

    if args.action == "list":
        entries = zoo.load_zoo(args.zoo)
        rows = [
            [e.id, e.loss, e.dataset, e.seed, "yes" if zoo.is_trained(e, args.out) else "no"] for e in entries
        ]
        print(tabulate(rows, headers=["id", "loss", "dataset", "seed", "trained"], tablefmt="github"))
        return 0
    if args.action == "show":
        if not args.ids:
            raise UserError("zoo show needs an entry id, e.g. `zoo show convnet_small.simclr_digits-0-4_s0`")
        for i in args.ids:
            print(json.dumps(zoo.find_entry(i).to_dict(), indent=2))
        return 0
    entries = [zoo.find_entry(i) for i in args.ids] if args.ids else zoo.load_zoo(args.zoo)
    if args.action == "train":
        from .train.trainer import train

        check_writable_dir(args.out)

        for e in entries:
            d = zoo.checkpoint_dir(e, args.out)
            if zoo.is_trained(e, args.out):
                print(f"{e.id}: already trained ({d})")
                continue
            train(e.train_config(), d, device=args.device, resume=(d / "train_state.pt").exists())
            print(f"{e.id}: trained -> {d}")
        return 0
    bad = 0
    for e in entries:
        status, detail = zoo.verify_entry(e, args.out)
        if status in ("changed", "unpinned-mismatch"):
            bad += 1
        if status != "untrained" or args.ids:
            print(f"{status:<18} {e.id}  {detail}")
    if bad:
        print(f"{bad} checkpoint(s) do not match their recorded sha256", file=sys.stderr)
        return 1
    return 0


@command("zoo", "list, show, train or verify model-zoo entries (zoo/*/*.json)")
def _zoo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show", "train", "verify"])
    p.add_argument("ids", nargs="*", help="entry ids (default: every entry of --zoo)")
    p.add_argument("--zoo", default=None, help="which zoo: demo | paper (default: all)")
    p.add_argument("--out", default="runs/zoo", help="checkpoints directory (one folder per entry id)")
    p.add_argument("--device", default="cpu")


def run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo as demo

    demo(args.out, dataset=args.dataset, quick=args.quick, device=args.device, workers=args.workers)
    return 0


@command("demo", "the main job: train the demo zoo on digits, evaluate it, render the leaderboard")
def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo_out", help="output directory")
    p.add_argument(
        "--quick", action="store_true", help="fewer epochs and examples, same code path (~1 minute)"
    )
    p.add_argument("--dataset", default="digits", help="digits (embedded, default) | fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--workers", type=int, default=None, help="parallel worker processes (default: min(2, cores))"
    )


# ============ entry point ============


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, and where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per registered command."""
    parser = _Parser(
        prog="robustbench-nacl",
        description="Adversarial-robustness benchmark and model zoo for contrastive encoders.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS.names():
        add_args, _ = COMMANDS.get(name)
        add_args(
            sub.add_parser(name, help=COMMANDS.info(name)["help"], description=COMMANDS.info(name)["help"])
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 user error, 3 non-finite loss, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _, runner = COMMANDS.get(args.command)
    try:
        return runner(args)
    except UserError as e:
        print(f"robustbench-nacl {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        # the environment failed us (disk full, read-only or vanished directory): one line, not a traceback
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        reason = " ".join(str(e.strerror or e).split())
        print(f"robustbench-nacl {args.command}: error: {where}{reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"robustbench-nacl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
