"""The shipped zoos (demo, fashion-mnist, paper, robust-ssl-cifar10), generated from the package's
loss presets, and ``zoo regenerate``, which rewrites their manifests."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..registry import unknown_choice
from .entry import ZooEntry, expected_id
from .manifests import parse_entry, write_entry, zoo_root

PAPER_RECIPE = {"epochs": 100, "batch_size": 256, "optimizer": "adam", "lr": 3e-4, "weight_decay": 0.0}
PAPER_EVAL = {"transfer": "cifar10", "shift": None, "suite": "paper", "n_examples": None}
DEMO_RECIPE = {"epochs": 10, "batch_size": 128, "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0}
DEMO_EVAL = {"transfer": "digits:5-9", "shift": "all", "suite": "paper", "n_examples": None}
DEMO_M = 3  # demo: 3 positives instead of 5, so that every family fits the 5-minute CPU budget


def package_presets() -> list[str]:
    """The presets the package ships (a plugin's presets belong to the plugin, not to the shipped zoos)."""
    from ..losses import PRESETS

    return [n for n in PRESETS.names() if is_package_preset(PRESETS.get(n).module)]


def is_package_preset(module: str | None) -> bool:
    """True for a preset registered by robustbench_nacl itself (built-in: module None or ours)."""
    return module is None or module == "robustbench_nacl" or module.startswith("robustbench_nacl.")


def zoo_presets() -> list[str]:
    """The presets a generated zoo trains: the package's own (DeACL's with its stage-1 teacher, the
    zoo's :data:`TEACHER_PRESET` entry of the same seed: :func:`teacher_of`)."""
    return package_presets()


#: the preset whose entry a generated zoo's DeACL entry distils (same encoder, dataset and seed)
TEACHER_PRESET = "simclr"


def teacher_of(loss: str, encoder: str, dataset: str, seed: int) -> str | None:
    """The id of the teacher entry of a generated entry of ``loss`` (None: the loss distils nothing)."""
    from ..losses import PRESETS

    if "teacher" not in PRESETS.get(loss).params.extra_params():
        return None
    return expected_id(encoder, TEACHER_PRESET, dataset, seed)


#: preset of a generated entry -> the ++ post-processing recipe (post/recipes.py) its authors run
#: on it: the zoos that hold the robust-SSL leaderboard (fashion-mnist, robust-ssl-cifar10) get one
#: post entry per such entry (:func:`post_entries`); demo and paper do not
#: (docs/decisions.md, 'The ++ post-processing')
POST_OF = {"dynacl": "dynacl++", "dynacl_air": "air++"}


def post_entries(entries: list[ZooEntry]) -> list[ZooEntry]:
    """One post entry per entry of a :data:`POST_OF` preset (without a tag of its own): the parent's
    encoder, dataset, seed, recipe and evaluation, loss ``<preset>++`` (what the post-processed
    checkpoint records), the recipe at its authors' settings (no overrides)."""
    from ..post import POST_RECIPES

    out = []
    for p in entries:
        recipe = POST_OF.get(p.loss)
        if recipe is None or p.id != expected_id(p.encoder, p.loss, p.dataset, p.seed):
            continue
        loss = f"{p.loss}++"
        out.append(
            replace(
                p,
                id=expected_id(p.encoder, loss, p.dataset, p.seed),
                loss=loss,
                overrides={},
                recipe=json.loads(json.dumps(p.recipe)),  # a deep copy: entries share no dicts
                eval=json.loads(json.dumps(p.eval)),
                description=f"{POST_RECIPES.get(recipe).description} [of {p.id}]",
                weights_sha256=None,
                teacher=None,
                post={"parent": p.id, "recipe": recipe},
            )
        )
    return out


def paper_zoo(seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> list[ZooEntry]:
    """CIFAR-100, resnet18_cifar, NaCl recipe: every preset at paper settings plus the grids of Tables 2-5."""
    from ..losses import PRESETS

    variants: list[tuple[str, dict[str, Any], str]] = [(n, {}, "") for n in zoo_presets()]
    for g in ("g0", "g2"):
        for m in (2, 3, 4, 5):
            variants.append(
                (
                    "nca",
                    {"G1": g, "M": m, **({"tau_plus": 0.0, "beta": 0.0} if g == "g0" else {})},
                    f"{g}-M{m}",
                )
            )
            for lam in (0.5, 0.6, 0.7, 0.8, 0.9):
                extra = {"tau_plus": 0.0, "beta": 0.0} if g == "g0" else {}
                variants.append(("mixnca", {"G1": g, "M": m, "lam": lam, **extra}, f"{g}-M{m}-lam{lam}"))
    for m in (2, 5):  # Table 3 (IntNaCl on IntCl) and Table 4's w = 1 variant
        for lam in (0.5, 0.7, 0.9):
            variants.append(("intnacl", {"M": m, "lam": lam}, f"M{m}-lam{lam}"))
        variants.append(("intnacl", {"M": m, "w": "1"}, f"M{m}-w1"))
    for m in (2, 3, 4):  # ICLR VAR grid
        variants.append(("var", {"M": m}, f"M{m}"))
    seen: set[tuple[str, str]] = set()
    out = []
    for loss, overrides, tag in variants:
        if (loss, json.dumps(overrides, sort_keys=True)) in seen:
            continue
        seen.add((loss, json.dumps(overrides, sort_keys=True)))
        for s in seeds:
            out.append(
                ZooEntry(
                    id=expected_id("resnet18_cifar", loss, "cifar100", s, tag),
                    zoo="paper",
                    encoder="resnet18_cifar",
                    loss=loss,
                    dataset="cifar100",
                    seed=s,
                    recipe=dict(PAPER_RECIPE),
                    overrides=overrides,
                    eval=dict(PAPER_EVAL),
                    description=PRESETS.get(loss).description + (f" [{tag}]" if tag else ""),
                    teacher=teacher_of(loss, "resnet18_cifar", "cifar100", s),
                )
            )
    return out


#: The reference zoo (leaderboard/README.md; docs/decisions.md, "Reference leaderboard"). Its training
#: budget was chosen by measurement for the second edition: SimCLR's learning curve on all 30,000
#: training images flattens after about 7 epochs (1,600 steps), but that regeneration (60 encoders,
#: 3 controls, SLF + ALF for every one, AFF for seed 0, AutoAttack) had to fit about 10 hours of a
#: 2-core CPU, which left training 480 steps: 6 epochs of the first 10,240 images. The third edition
#: keeps it (the families whose recipes did not change keep their checkpoints) and spends the rest
#: on evaluation: fitted ALF heads and AFF for every seed; its README's cost section measures it.
FMNIST_RECIPE = {
    "epochs": 6,
    "batch_size": 128,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 10240,
    "monitor_every": 1,  # the learning curves (kNN and quick probe per epoch; Fig. S3)
    "monitor_probe": True,
}
FMNIST_EVAL = {
    "transfer": "fashion-mnist:5-9",
    "shift": "crop,flip,jitter",  # on 1-channel images grayscale is the identity, grayscale+jitter is jitter
    "corruptions": "all",  # the 9 that suit grey images
    "severities": "1,3,5",
    "suite": "fashion-mnist-aa",  # in-domain: FGSM and PGD sweeps, AutoAttack standard at 0.032
    "setting_suites": {
        "transfer": "fashion-mnist-apgd",
        "shift": "fashion-mnist-light",
        "corruption": "fashion-mnist-corruption",
    },
    "n_examples": 500,
    "probe_epochs": 200,
    "probe_lr": 0.01,
    "probe_max_train": 4096,
    "probe_standardize": True,
    "finetune_settings": "in-domain",
    # standardised features at the recipe's 25 epochs: converged on this board, where keeping the
    # recipe's steps (``fit fitted``) would cost 49x for the same head (the board's reading in
    # docs/decisions.md, 'Fitted ALF heads')
    "alf": {"max_train": 1024, "batch_size": 128, "fit": "standardized"},
    "aff": {"max_train": 1024, "batch_size": 128},
}
#: the seeds whose entries are also evaluated under AFF (the most expensive protocol): all three,
#: so that AFF differences get seed intervals and paired tests like SLF's and ALF's
FMNIST_AFF_SEEDS = (0, 1, 2)


def _one_per_family(
    zoo: str,
    dataset: str,
    recipe: dict[str, Any],
    ev: dict[str, Any],
    seeds: tuple[int, ...],
    *,
    tag_m: bool,
    presets: list[str] | None = None,
    protocols: Callable[[int], str] | None = None,
) -> list[ZooEntry]:
    """convnet_small (width 16) on ``dataset``: ``presets`` (default: :func:`zoo_presets`; at most
    DEMO_M positives) x ``seeds``; ``protocols(seed)``: the seed's ``eval.protocol`` (default: none)."""
    from ..losses import PRESETS

    out = []
    for name in presets if presets is not None else zoo_presets():
        overrides = {"M": DEMO_M} if PRESETS.get(name).params.M > DEMO_M else {}
        tag = f" [M={DEMO_M}]" if tag_m and overrides else ""
        for s in seeds:
            out.append(
                ZooEntry(
                    id=expected_id("convnet_small", name, dataset, s),
                    zoo=zoo,
                    encoder="convnet_small",
                    loss=name,
                    dataset=dataset,
                    seed=s,
                    recipe=dict(recipe),
                    encoder_kwargs={"width": 16},
                    overrides=overrides,
                    eval={**ev, **({"protocol": protocols(s)} if protocols else {})},
                    description=PRESETS.get(name).description + tag,
                    teacher=teacher_of(name, "convnet_small", dataset, s),
                )
            )
    return out


def fashion_mnist_zoo(seeds: tuple[int, ...] = (0, 1, 2)) -> list[ZooEntry]:
    """Fashion-MNIST classes 0-4, convnet_small (width 16): every preset x 3 seeds (the reference zoo),
    SLF, ALF and label-free for every seed, AFF too for :data:`FMNIST_AFF_SEEDS`; and the ++
    post-processing of the dynacl and dynacl_air entries (:func:`post_entries`), evaluated as their
    parents."""
    presets = _one_per_family(
        "fashion-mnist",
        "fashion-mnist:0-4",
        FMNIST_RECIPE,
        FMNIST_EVAL,
        seeds,
        tag_m=True,
        # label-free last: no head, the frozen encoder's representation attacked (issue 48's rows)
        protocols=lambda s: "slf,alf,aff,label-free" if s in FMNIST_AFF_SEEDS else "slf,alf,label-free",
    )
    return presets + post_entries(presets)


def demo_zoo() -> list[ZooEntry]:
    """digits classes 0-4, convnet_small (width 16): one entry per loss family, seed 0."""
    return _one_per_family("demo", "digits:0-4", DEMO_RECIPE, DEMO_EVAL, (0,), tag_m=False)


#: The robust-SSL methods' pretraining as their authors run it on CIFAR-10 (ResNet-18): epochs, batch,
#: optimizer, lr, weight decay and lr schedule of each one's public code (files, commits and what
#: differs: the zoo's README and docs/decisions.md, 'Optimizers and learning-rate schedules'). For GPUs.
ACL_RECIPE: dict[str, Any] = {
    "epochs": 1000,
    "batch_size": 512,
    "optimizer": "lars",  # VITA-Group optimizer/lars.py: LARS(model.parameters(), lr=5.0, weight_decay=1e-6)
    "optimizer_kwargs": {"momentum": 0.9, "eta": 0.001},
    "lr": 5.0,
    "weight_decay": 1e-6,
    "schedule": "cosine",  # LambdaLR(cosine_annealing), 10 warm-up epochs, to 1e-6, per iteration
    "schedule_kwargs": {"warmup_epochs": 10, "min_lr": 1e-6, "interval": "step", "variant": "acl"},
}
#: DynACL (train_DynACL.py): ACL's optimizer; its scheduler steps once per epoch
DYNACL_RECIPE: dict[str, Any] = {
    **ACL_RECIPE,
    "schedule_kwargs": {"warmup_epochs": 10, "min_lr": 1e-6, "interval": "epoch", "variant": "dynacl"},
}
#: RoCL (README command, src/argument.py, src/rocl_train.py): 2 GPUs x 256 with SyncBatchNorm, torchlars
#: over SGD(lr 0.1, momentum 0.9, weight decay 1e-6), GradualWarmupScheduler(x15, 10 epochs) + cosine
ROCL_RECIPE: dict[str, Any] = {
    "epochs": 1000,
    "batch_size": 512,
    "optimizer": "torchlars",
    "optimizer_kwargs": {"momentum": 0.9, "eta": 0.001, "eps": 1e-8},
    "lr": 0.1,
    "weight_decay": 1e-6,
    "schedule": "gradual_warmup_cosine",
    "schedule_kwargs": {"warmup_epochs": 10, "multiplier": 15.0},
}
#: solo-learn's CIFAR SimCLR (bash_files/pretrain/cifar/simclr.sh), whose published checkpoint DeACL
#: distils: LARS (eta 0.02, clipped, biases and norms excluded), lr 0.4 x 256/256, temperature 0.2
SIMCLR_SOLO_RECIPE: dict[str, Any] = {
    "epochs": 1000,
    "batch_size": 256,
    "optimizer": "lars_solo",
    "optimizer_kwargs": {
        "momentum": 0.9,
        "eta": 0.02,
        "eps": 1e-8,
        "clip": True,
        "exclude_bias_n_norm": True,
    },
    "lr": 0.4,
    "weight_decay": 1e-5,
    "schedule": "warmup_cosine",
    "schedule_kwargs": {"warmup_epochs": 10, "warmup_start_lr": 0.003, "min_lr": 0.0},
}
#: DeACL stage 2 (bash_files/DeACL_cifar10_resnet18.sh on solo-learn): SGD lr 0.5 x 256/256, weight
#: decay 5e-4, warmup_cosine with solo-learn's defaults, 100 epochs
DEACL_RECIPE: dict[str, Any] = {
    "epochs": 100,
    "batch_size": 256,
    "optimizer": "sgd",
    "optimizer_kwargs": {"momentum": 0.9, "nesterov": False},
    "lr": 0.5,
    "weight_decay": 5e-4,
    "schedule": "warmup_cosine",
    "schedule_kwargs": {"warmup_epochs": 10, "warmup_start_lr": 0.003, "min_lr": 0.0},
}
#: preset -> (recipe, loss overrides, what the description adds)
ROBUST_SSL_RECIPES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "simclr": (SIMCLR_SOLO_RECIPE, {"t": 0.2}, "DeACL's teacher: solo-learn's CIFAR SimCLR recipe"),
    "acl": (ACL_RECIPE, {}, "ACL's recipe: LARS lr 5, cosine per iteration"),
    "rocl": (ROCL_RECIPE, {}, "RoCL's recipe: torchlars lr 0.1 x 15, gradual warm-up + cosine"),
    "dynacl": (DYNACL_RECIPE, {}, "DynACL's recipe: LARS lr 5, cosine per epoch"),
    "deacl": (DEACL_RECIPE, {}, "DeACL's recipe: SGD lr 0.5, warm-up cosine, 100 epochs"),
    # AIR's pretraining.py: ACL's LARS(lr 5, weight decay 1e-6), batch 512, 1000 epochs, its cosine
    # LambdaLR stepped at the start of every iteration with warm-up lr_max * step / warmup_steps
    "acl_air": (ACL_RECIPE, {}, "AIR's recipe: LARS lr 5, cosine per iteration"),
    "dynacl_air": (ACL_RECIPE, {}, "AIR's recipe: LARS lr 5, cosine per iteration"),
}
ROBUST_SSL_EVAL = {"transfer": None, "shift": None, "suite": "robust-ssl", "n_examples": None}


def robust_ssl_cifar10_zoo(seeds: tuple[int, ...] = (0,)) -> list[ZooEntry]:
    """CIFAR-10, resnet18_cifar: ACL, RoCL, DynACL, DeACL (with its SimCLR teacher), ACL-AIR and
    DynACL-AIR at their authors' pretraining recipes (:data:`ROBUST_SSL_RECIPES`), and DynACL++ and
    DynACL-AIR++ (:func:`post_entries`), seed 0; meant for GPUs."""
    from ..losses import PRESETS

    out = []
    for loss, (recipe, overrides, note) in ROBUST_SSL_RECIPES.items():
        for s in seeds:
            out.append(
                ZooEntry(
                    id=expected_id("resnet18_cifar", loss, "cifar10", s),
                    zoo="robust-ssl-cifar10",
                    encoder="resnet18_cifar",
                    loss=loss,
                    dataset="cifar10",
                    seed=s,
                    recipe=json.loads(json.dumps(recipe)),  # a deep copy: entries share no dicts
                    overrides=dict(overrides),
                    eval=dict(ROBUST_SSL_EVAL),
                    description=f"{PRESETS.get(loss).description} [{note}]",
                    teacher=teacher_of(loss, "resnet18_cifar", "cifar10", s),
                )
            )
    return out + post_entries(out)  # DynACL++ and DynACL-AIR++ at their authors' settings


def training_fields(entry: ZooEntry) -> dict[str, Any]:
    """What decides an entry's weights: its manifest without the evaluation, description and pin."""
    return {k: v for k, v in entry.to_dict().items() if k not in ("eval", "description", "weights_sha256")}


def keep_pin(entry: ZooEntry, manifest: Path) -> ZooEntry:
    """``entry`` with the weights pin of its current manifest file when that file trains the same
    weights (a regenerated evaluation or description keeps the published weights; a changed recipe,
    loss or seed drops the pin, since the published weights no longer follow from it)."""
    if entry.weights_sha256 is not None or not manifest.is_file():
        return entry
    try:
        old = parse_entry(json.loads(manifest.read_text()), str(manifest))
    except (ValueError, UserError):  # a damaged manifest is rewritten, unpinned
        return entry
    if old.weights_sha256 is None or training_fields(old) != training_fields(entry):
        return entry
    return replace(entry, weights_sha256=old.weights_sha256)


#: The zoos whose manifests are generated from the package's presets (``zoo regenerate`` writes them).
GENERATED_ZOOS = {
    "demo": demo_zoo,
    "fashion-mnist": fashion_mnist_zoo,
    "paper": paper_zoo,
    "robust-ssl-cifar10": robust_ssl_cifar10_zoo,
}


def regenerate(name: str | None = None, root: str | Path | None = None) -> dict[str, tuple[int, int]]:
    """Rewrite the manifests of the generated zoos (or of ``name``): {zoo: (written, stale removed)}.

    After a preset is added to the package, this is the one command that brings the shipped zoos up
    to date; manifests whose entry the generator no longer makes are removed.
    """
    if name is not None and name not in GENERATED_ZOOS:
        raise unknown_choice("generated zoo", name, GENERATED_ZOOS)
    done = {}
    for zoo_name in [name] if name else list(GENERATED_ZOOS):
        entries = GENERATED_ZOOS[zoo_name]()
        folder = zoo_root(root) / zoo_name
        stale = {p for p in folder.glob("*.json")} - {folder / f"{e.id}.json" for e in entries}
        for e in entries:
            write_entry(keep_pin(e, folder / f"{e.id}.json"), root)
        for p in stale:
            p.unlink()
        done[zoo_name] = (len(entries), len(stale))
    return done
