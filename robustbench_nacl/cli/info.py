"""The commands that list what the package holds: ``losses`` (the paper's Table 1 from the presets),
``encoders``, ``datasets`` and ``models`` (the published reference models)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from .. import plugins
from ..errors import UserError


def _preset_entries(name: str | None, overrides: list[str] | None) -> list[dict[str, Any]]:
    """One JSON-ready entry per preset (or the one named, with ``--set`` overrides applied)."""
    from ..losses import PRESETS, needs, resolve

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
    """Print the loss presets as the paper's Table 1 (or JSON), then the adversarial ones."""
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
    """The adversarial-pretraining presets (losses/adversarial/): inner PGD, projection head, views
    and each method's own parameters (jitter strength, momentum, student initialisation...)."""
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
                e["params"]["head"],
                e["params"]["views"],
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in own.items()),
                e["description"],
                _loss_source(e),
            ]
        )
    headers = ["preset", "eps", "steps", "step", "BN", "head", "views", "parameters", "loss", "source"]
    print(
        ("\n" if blank else "")
        + "Adversarial contrastive pretraining: inner PGD (Linf, [0,1] pixel units, random start) on the\n"
        "method's loss, then its training loss (change any parameter with --set, e.g. --set attack_steps=3)\n"
    )
    print(tabulate(rows, headers=headers, tablefmt="github"))


def losses_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``losses``."""
    p.add_argument("name", nargs="?", help="one preset to show (with --set overrides applied)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a loss parameter")
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, params, ...}")


def run_encoders(args: argparse.Namespace) -> int:
    """Print the registered encoders and where each comes from."""
    from tabulate import tabulate

    from ..models.encoders import ENCODERS
    from ..models.timm_encoder import TIMM_PREFIX

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


def encoders_args(p: argparse.ArgumentParser) -> None:
    """``encoders`` takes only the common flags."""


def run_datasets(args: argparse.Namespace) -> int:
    """Print the registered datasets, their classes and how to get each."""
    from tabulate import tabulate

    from ..data import DATASETS

    rows = [
        [n, DATASETS.info(n).get("num_classes"), DATASETS.info(n).get("how_to_get", "")]
        for n in DATASETS.names()
    ]
    print(tabulate(rows, headers=["dataset", "classes", "how to get it"], tablefmt="github"))
    return 0


def datasets_args(p: argparse.ArgumentParser) -> None:
    """``datasets`` takes only the common flags."""


def run_models(args: argparse.Namespace) -> int:
    """Print the published reference models with their headline numbers (or their cards as JSON)."""
    from tabulate import tabulate

    from ..hub.catalog import published_models, published_sets
    from ..hub.load import not_covered

    models = published_models(args.dataset)
    if not models:
        known = sorted({m.card["dataset"] for m in published_models()}) or ["none in this installation"]
        raise UserError(f"no published model pretrained on {args.dataset}; published: {', '.join(known)}")
    if args.json:
        print(json.dumps([{**m.card, "set": m.set} for m in models], indent=2))
        return 0
    # ALF and AFF are the robust-SSL field's headline protocols: a column each where a card has them
    finetuned = [p for p in ("ALF", "AFF") if any(m.card["headline"].get(p) for m in models)]
    table = []
    for m in models:
        h = m.card["headline"]["SLF"]
        robust = f"{h['robust_acc']:.1%} ({h['metric']} {h['norm']} {h['eps_label']})"
        row = [m.name, m.card["dataset"], m.card["loss"]["family"], f"{h['clean_acc']:.1%}", robust]
        row.append(m.card.get("bn_branch") or "-")
        for p in finetuned:
            f = m.card["headline"].get(p)
            row.append(f"{f['robust_acc']:.1%} (clean {f['clean_acc']:.1%})" if f else "-")
        table.append(row)
    headers = [
        "name",
        "dataset",
        "loss",
        "clean (SLF)",
        "robust (SLF)",
        "BN branch",  # a dual-BN encoder's evaluated branch (ACL, DynACL: adv); - for one BN
        *(f"robust ({p})" for p in finetuned),
    ]
    print(tabulate(table, headers=headers, tablefmt="github"))
    print(f"{len(models)} published models; load one with load_model(NAME) or `eval --model NAME`")
    for s in published_sets():
        if missing := not_covered(s):  # a preset added since: listed, never an error
            print(f"set {s}: not in the published reference yet: {', '.join(missing)}")
    return 0


def models_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``models``."""
    p.add_argument(
        "--dataset", default=None, help="only models pretrained on this dataset (digits or digits:0-4)"
    )
    p.add_argument("--json", action="store_true", help="print every model's card as JSON")
