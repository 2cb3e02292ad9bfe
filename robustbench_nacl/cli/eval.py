"""The ``eval`` command: probe and attack one encoder checkpoint (or a published model) and print
the result rows it wrote."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..io import refuse_reference_dir
from ..untrusted import safe_name
from .common import (
    DEFAULT_RESULTS,
    check_data_root,
    deterministic_flag,
    int_arg,
    protocol_arg,
    seed_arg,
)
from .flags import add_config_flags, add_recipe_flag, config_values, robustssl_args

if TYPE_CHECKING:
    from ..eval.config import EvalConfig


def _resolve_transfer(args: argparse.Namespace) -> str | None:
    """``--transfer auto``: the complementary classes of the in-domain class subset."""
    from ..eval.settings import transfer_default
    from ..models.foreign import load_encoder

    if args.transfer != "auto":
        return args.transfer
    _, info = load_encoder(args.checkpoint, arch=args.arch, fmt=args.format, normalize=args.normalize)
    transfer = transfer_default(args.dataset or info.get("dataset") or "")
    if transfer is None:
        raise UserError(
            "--transfer auto needs a class-subset dataset (e.g. digits:0-4); name the target instead"
        )
    return transfer


#: the eval flags that are evaluate()'s keyword arguments of the same name, passed on as given
_AS_GIVEN = (
    "save_heads",
    "dataset",
    "shift",
    "corruptions",
    "severities",
    "suite",
    "out",
    "n_examples",
    "seed",
    "device",
    "arch",
    "normalize",
    "control",
    "force",
    "batch_size",
    "data_root",
    "protocol",
    "finetune_settings",
    "finetune_recipe",
    "corruptions_from",
    "compile",
)


#: what ``--like-zoo`` sets: flag -> (argparse dest, or a prefix of a config's flags)
_ZOO_SETS = {
    "--transfer": "transfer",
    "--shift": "shift",
    "--corruptions": "corruptions",
    "--severities": "severities",
    "--suite": "suite",
    "--finetune-settings": "finetune_settings",
    "--finetune-recipe": "finetune_recipe",
    "--n-examples": "n_examples",
    "--probe-*": "probe_",
    "--alf-*": "alf_",
    "--aff-*": "aff_",
}


def _manifest(args: argparse.Namespace) -> dict[str, Any]:
    """The manifest of what ``eval`` evaluates (a published model's, or a checkpoint folder's; {}
    where there is none or it cannot be read: the checks come later)."""
    if args.model is not None:
        from ..hub.catalog import find_model

        folder = find_model(args.model).folder
    else:
        folder = Path(args.checkpoint or "")
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _manifest_field(args: argparse.Namespace, key: str) -> str | None:
    """One field of :func:`_manifest`, as a string (None where it is absent)."""
    value = _manifest(args).get(key)
    return None if value is None else str(value)


def _checkpoint_id(args: argparse.Namespace) -> str | None:
    """The zoo entry id of what ``eval`` evaluates: a published model's name, or the id in a
    checkpoint folder's manifest."""
    return args.model if args.model is not None else _manifest_field(args, "id")


def _same_data(args: argparse.Namespace, zoo_dataset: str) -> None:
    """``--like-zoo`` evaluates on the zoo's dataset: refuse an encoder pretrained on another one (its
    rows would not rank beside the zoo's), unless ``--dataset`` says to evaluate it there anyway."""
    mine = _manifest_field(args, "dataset")
    if args.dataset or mine is None:
        return
    base = {d.split("@")[0].split(":")[0] for d in (mine, zoo_dataset)}
    if len(base) > 1:
        raise UserError(
            f"--like-zoo {args.like_zoo} evaluates on {zoo_dataset}, but this encoder was pretrained on "
            f"{mine}: pass --dataset {zoo_dataset} to evaluate it there all the same, or a zoo of {mine}"
        )


def _like_zoo(args: argparse.Namespace) -> dict[str, Any]:
    """``--like-zoo ZOO``: evaluate()'s keyword arguments as that zoo's manifests evaluate their
    entries, so that the rows share the zoo's protocols and rank beside its board. The entry is the
    checkpoint's own where it is one of the zoo's (a published model, or a checkpoint the zoo trained),
    else the entry of ``--seed``, else the first; the evaluation seed is ``--seed``, by default the
    entry's own (so the zoo's own checkpoint gets its rows again). The flags it sets must be left out."""
    from dataclasses import replace

    from .. import zoo
    from ..pipeline import eval_arguments

    defaults = args.eval_defaults
    given = sorted(
        flag
        for flag, dest in _ZOO_SETS.items()
        if any(
            getattr(args, d) != v
            for d, v in defaults.items()
            if d == dest or (dest.endswith("_") and d.startswith(dest))
        )
    )
    if given:
        raise UserError(
            f"--like-zoo {args.like_zoo} sets {', '.join(given)} as the zoo evaluates its entries; drop "
            f"{'it' if len(given) == 1 else 'them'}, or drop --like-zoo and give every flag yourself"
        )
    entries = zoo.load_zoo(args.like_zoo)
    own = _checkpoint_id(args)
    entry = next((e for e in entries if e.id == own), None) or next(
        (e for e in entries if e.seed == (args.seed or 0)), entries[0]
    )
    _same_data(args, entry.dataset)
    kw = eval_arguments(entry if args.seed is None else replace(entry, seed=args.seed))  # its "seed" too
    kw["dataset"] = args.dataset or entry.dataset
    kw["protocol"] = args.protocol or kw["protocol"]
    # --setting-suite KIND=SUITE re-attacks one kind of setting with another suite, the rest as the zoo
    # does (those rows are then another protocol's: they rank in tables of their own)
    kw["setting_suites"] = {
        **(kw.get("setting_suites") or {}),
        **(_setting_suites(args.setting_suite) or {}),
    } or None
    del kw["control"]
    return kw


def _from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """evaluate()'s keyword arguments from the flags themselves."""
    from ..eval.probe import ProbeConfig
    from ..results.finetune import AffConfig, AlfConfig

    kw = {name: getattr(args, name) for name in _AS_GIVEN}
    protocol = args.protocol or "slf"
    finetune = {}
    for name, cls in (("alf", AlfConfig), ("aff", AffConfig)):
        finetune[name] = cls(**config_values(cls, args, prefix=f"{name}-"))
        finetune[name].check()  # a bad value is refused even where the protocol is not run
        given = finetune[name] != cls() and name not in protocol.split(",")
        if given and not args.like_zoo:  # with --like-zoo, _like_zoo has refused the flag already
            raise UserError(
                f"--{name}-* flags set {name.upper()} settings: add --protocol {name}, or drop them"
            )
    from ..results.label_free import LabelFreeConfig

    # label-free settings given without --protocol label-free: evaluate() refuses them in one line
    label_free = LabelFreeConfig(**config_values(LabelFreeConfig, args, prefix="label-free-"))
    return {
        **kw,
        "label_free": label_free if label_free != LabelFreeConfig() else None,
        "protocol": protocol,
        "transfer": _resolve_transfer(args),
        "probe": ProbeConfig(**config_values(ProbeConfig, args, prefix="probe-")),
        **finetune,
        "setting_suites": _setting_suites(args.setting_suite),
    }


def run_eval(args: argparse.Namespace) -> int:
    """Evaluate the checkpoint (or ``--model``), print its rows and the one-line summary."""
    from ..eval.evaluate import evaluate
    from ..models.foreign.robustssl import pretraining_format
    from ..results.reported import placement_for_card

    refuse_reference_dir(args.out)
    args.format = pretraining_format(args.format, args.pretraining)  # --pretraining NAME: robustssl:NAME
    check_data_root(args.data_root)
    zoo_kw = _like_zoo(args) if args.like_zoo else {}  # its flag conflicts first: a usage error
    args.seed = 0 if args.seed is None else args.seed  # without --like-zoo; with it, zoo_kw's seed wins
    checkpoint, heads = _eval_source(args)
    config = _eval_config(args, _from_flags(args) | zoo_kw, heads)
    rows = evaluate(checkpoint, config)
    _print_rows(rows)
    # evaluate() says in one line what it computed and what it reused (a re-run: nothing computed)
    summary = getattr(rows, "summary", None)
    print(summary or f"{len(rows)} result rows under {Path(args.out) / 'rows'}")
    for line in placement_for_card(rows):  # CIFAR/STL-10 AutoAttack at 8/255 beside the field's numbers
        print(f"beside the RobustSSL benchmark's reported entries: {line}")
    if args.card and rows:
        from ..hub.cards import bn_branch, card_of_rows, write_card

        # the id comes from a manifest (checked when it was read) or a file's name: one plain name
        name = safe_name(rows[0]["checkpoint_id"], "checkpoint id")
        path = Path(args.out) / "cards" / f"{name}.json"
        card = card_of_rows(rows, bn_branch=bn_branch(_manifest(args)))
        print(f"model card: {write_card(path, card)}")
    return 0


def _eval_config(args: argparse.Namespace, kw: dict[str, Any], heads: str | None) -> EvalConfig:
    """The typed :class:`EvalConfig` of ``eval``: the flags' values (``kw``: evaluate()'s names, with
    ``--like-zoo``'s in place of the flags it sets), group by group."""
    from ..eval.config import (
        AttackOptions,
        DataOptions,
        EvalConfig,
        OutputOptions,
        ProbeOptions,
        SourceOptions,
    )

    return EvalConfig(
        data=DataOptions(
            dataset=kw["dataset"],
            transfer=kw["transfer"],
            shift=kw["shift"],
            corruptions=kw["corruptions"],
            severities=kw["severities"],
            n_examples=kw["n_examples"],
            data_root=kw["data_root"],
            corruptions_from=kw["corruptions_from"],
        ),
        source=SourceOptions(
            arch=kw["arch"], fmt=args.format, normalize=kw["normalize"], control=kw["control"]
        ),
        probe=ProbeOptions(
            probe=kw["probe"],
            protocol=kw["protocol"],
            alf=kw["alf"],
            aff=kw["aff"],
            heads=heads,
            finetune_settings=kw["finetune_settings"],
            finetune_recipe=kw["finetune_recipe"],
            label_free=kw.get("label_free"),
        ),
        attack=AttackOptions(
            suite=kw["suite"], batch_size=kw["batch_size"], setting_suites=kw["setting_suites"]
        ),
        output=OutputOptions(
            out=kw["out"], force=kw["force"], save_heads=kw["save_heads"], progress=not args.no_progress
        ),
        seed=kw["seed"],
        device=kw["device"],
        compile=kw["compile"],
    )


def _setting_suites(pairs: list[str] | None) -> dict[str, str] | None:
    """``--setting-suite corruption=quick`` (repeatable) -> ``{"corruption": "quick"}``."""
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        kind, sep, suite = pair.partition("=")
        if not sep or not kind.strip() or not suite.strip():
            raise UserError(f"--setting-suite {pair!r}: write KIND=SUITE, e.g. corruption=quick")
        out[kind.strip()] = suite.strip()
    return out


def _eval_source(args: argparse.Namespace) -> tuple[str, str | None]:
    """(checkpoint, heads folder) of ``eval``: a path, or a published model's (``--model NAME``)."""
    if (args.checkpoint is None) == (args.model is None):
        raise UserError("pass a checkpoint path or --model NAME (one of `robustbench-nacl models`), not both")
    if args.model is None:
        if args.weights_from:
            raise UserError("--weights-from goes with --model NAME; a checkpoint path names its own weights")
        return args.checkpoint, None
    from ..hub.catalog import find_model
    from ..hub.load import checkpoint_dir, heads_dir

    model = find_model(args.model)
    return str(checkpoint_dir(model, args.weights_from)), str(heads_dir(model))


def _print_rows(rows: list[dict[str, Any]]) -> None:
    """One table line per result row: setting, attack, accuracies, sanity."""
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


def _budget_args(p: argparse.ArgumentParser) -> None:
    """The flags that spend a budgeted evaluation's attacks and finetuning where they matter."""
    p.add_argument(
        "--setting-suite",
        action="append",
        default=None,
        metavar="KIND=SUITE",
        help="run SUITE in the settings of one kind (in-domain, transfer, shift, corruption) instead of "
        "--suite, e.g. corruption=quick (repeatable)",
    )
    p.add_argument(
        "--finetune-settings",
        default=None,
        metavar="KINDS",
        help="the setting kinds ALF and AFF run on, e.g. in-domain,corruption (default: every setting; "
        "each finetunes once per dataset)",
    )


def _source_args(p: argparse.ArgumentParser) -> None:
    """What ``eval`` evaluates (a checkpoint or a published model) and what it writes beside the rows."""
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


def eval_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``eval``, with one flag per ProbeConfig, AlfConfig and AffConfig field."""
    deterministic_flag(p)
    from ..eval.probe import ProbeConfig

    _source_args(p)
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
        "--n-examples", type=int_arg, default=None, help="evaluate the first N test examples (default: all)"
    )
    p.add_argument(
        "--seed",
        type=seed_arg,
        default=None,
        help="evaluation seed: attack starts, probe initialisation (default 0; with --like-zoo, the "
        "zoo entry's own seed)",
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    _compile_arg(p)
    p.add_argument("--batch-size", type=int_arg, default=None, help="attack batch size")
    p.add_argument("--arch", default=None, help="architecture of a foreign checkpoint, e.g. resnet18_cifar")
    from ..models.foreign import FORMATS  # lazy, like every command's heavy imports

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
    robustssl_args(p)
    # the probe and kNN recipe: one --probe-FIELD flag per ProbeConfig field, with its default
    add_config_flags(p, ProbeConfig, prefix="probe-")
    protocol_arg(p, default=None, default_text="slf; with --like-zoo, the zoo's")
    _budget_args(p)
    from ..results.finetune import AffConfig, AlfConfig

    add_config_flags(p.add_argument_group("ALF settings (--protocol alf)"), AlfConfig, prefix="alf-")
    add_config_flags(p.add_argument_group("AFF settings (--protocol aff)"), AffConfig, prefix="aff-")
    from ..results.label_free import LabelFreeConfig

    group = p.add_argument_group("label-free settings (--protocol label-free: the representation attacked)")
    add_config_flags(group, LabelFreeConfig, prefix="label-free-")
    add_recipe_flag(p)
    _like_zoo_arg(p)


def _compile_arg(p: argparse.ArgumentParser) -> None:
    """``--compile``: where torch.compile runs (robustbench_nacl/accel.py)."""
    from ..accel import COMPILE_CHOICES

    p.add_argument(
        "--compile",
        default="auto",
        choices=COMPILE_CHOICES,
        help="torch.compile the probe, finetuning and attacks: off | auto (on CUDA only) | on; recorded "
        "in the rows beside the device, not part of their identity (default: %(default)s)",
    )


def _like_zoo_arg(p: argparse.ArgumentParser) -> None:
    """``--like-zoo``, and every flag's default, by which it tells a flag given too."""
    p.add_argument(
        "--like-zoo",
        default=None,
        metavar="ZOO",
        help="evaluate as zoo ZOO's manifests evaluate their entries (its settings, suites, probe, "
        "finetuning and number of examples), so the rows rank beside its board, e.g. fashion-mnist for "
        "leaderboard/; --protocol and --seed still apply",
    )
    p.set_defaults(eval_defaults={a.dest: a.default for a in p._actions if a.dest != "help"})
