"""Evaluate an encoder: probe it per setting, attack the probed classifier, write result rows.

Settings: in-domain (probe on the pretraining dataset), transfer (probe on another dataset) and
shift (probe on ArCL-modified versions). Rows are content-addressed: a setting whose rows all
exist (complete and valid) is skipped without loading data or probing, and a finished row is never
rewritten, so an interrupted evaluation resumes where it stopped and a repeated one is a no-op.
Every dataset a setting needs is loaded before the first row is written, so a missing one fails
the whole evaluation at once instead of after hours of work.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import importlib.metadata
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn
from tqdm.auto import tqdm

from .. import plugins
from ..attack.attacks import ATTACKS
from ..attack.suites import Suite, load_suite
from ..data.corruptions import corrupt, parse_corruptions, parse_severities
from ..data.datasets import DATASETS, ImageData, canonical_spec, load_dataset, parse_spec
from ..errors import UserError
from ..io import check_writable_dir, refuse_reference_dir, sha256_bytes
from ..locks import advisory_lock, remove_temporaries
from ..models.encoders import materialize_lazy
from ..models.factory import create_encoder
from ..models.foreign import NORMALIZATIONS, load_encoder
from ..registry import unknown_choice
from ..utils import device_name, resolve_device, versions
from . import rows as results
from .benchmark import WORST_CASE, benchmark, derive_seed
from .finetune import AffConfig, AlfConfig, FinetuneConfig, fit_protocol, parse_protocols, run_key
from .heads import HEADS_DIR, head_key, load_head, save_head
from .probe import ProbeConfig, ProbedClassifier, fit_linear_probe
from .rows import KEY_PARAMS, ROW_FORMAT, ResultRow

SHIFT_NAMES = ("grayscale", "crop", "flip", "jitter", "grayscale+jitter")
# Training-config fields that are not part of a recipe (for manifests without ``training_config``,
# which leaves out the same ones): the seed (seeds are what a recipe is averaged over), the run's
# name, where the data lives, the kNN monitor (it only reads features), and the preset overrides
# (the resolved loss_params, which they produce, are in the recipe).
NOT_RECIPE = ("seed", "id", "data_root", "knn_every", "knn_k", "knn_t", "overrides")
# Attacks implemented by another package: its version is part of the protocol.
ATTACK_PACKAGES = {"autoattack": "pyautoattack"}


@dataclass(frozen=True)
class Setting:
    """One probe-and-attack job: which dataset the probe is trained and tested on."""

    name: str  # "in-domain" | "transfer" | "shift" | "corruption"
    dataset: str  # canonical spec
    shift: str | None = None
    corruption: str | None = None  # the in-domain probe, tested on corrupted test images
    severity: int | None = None


class Evaluation(list[ResultRow]):
    """The rows of one ``evaluate`` call, plus a one-line ``summary`` of what was (re)computed."""

    def __init__(self, rows: Iterable[ResultRow], summary: str, computed: int, reused: int) -> None:
        super().__init__(rows)
        self.summary = summary
        self.computed = computed
        self.reused = reused


def key_params(loss_params: dict[str, Any] | None) -> str:
    """Compact description of a recipe's loss parameters (those differing from SimCLR's)."""
    if not loss_params:
        return ""
    from ..losses import LossParams

    default = LossParams().to_dict()
    parts = [
        f"{k}={loss_params[k]}" for k in KEY_PARAMS if k in loss_params and loss_params[k] != default.get(k)
    ]
    # a plugin loss's own parameters (SimCLR has none, so every one is shown)
    extra = loss_params.get("extra") or {}
    pairs = extra.items() if isinstance(extra, dict) else (tuple(kv) for kv in extra)
    parts += [f"{k}={v}" for k, v in pairs]
    return " ".join(parts)


def transfer_default(dataset: str) -> str | None:
    """The natural transfer target: the complementary class subset (digits:0-4 -> digits:5-9)."""
    spec = parse_spec(dataset)
    if spec.subset is None:
        return None
    from ..data.datasets import DATASETS

    n = DATASETS.info(spec.name)["num_classes"]
    rest = [c for c in range(n) if c not in spec.subset]
    return canonical_spec(f"{spec.name}:{','.join(map(str, rest))}") if rest else None


def settings_for(
    dataset: str,
    transfer: str | Iterable[str] | None,
    shift: str | Iterable[str] | None,
    corruptions: str | Iterable[str] | None = None,
    severities: str | Iterable[int] | None = None,
) -> list[Setting]:
    """The settings to run: in-domain always, plus transfer targets and shift variants.

    Datasets are canonical specs (``digits:5,6,7,8,9`` -> ``digits:5-9``); a target named twice
    in two spellings is one setting.
    """
    out = [Setting("in-domain", canonical_spec(dataset))]
    for t in [transfer] if isinstance(transfer, str) else list(transfer or []):
        out.append(Setting("transfer", canonical_spec(t)))
    if shift:
        names = SHIFT_NAMES if shift == "all" else ([shift] if isinstance(shift, str) else list(shift))
        for s in names:
            for part in s.split(","):
                if part not in SHIFT_NAMES:
                    raise UserError(f"unknown shift {part!r}; valid choices: all, {', '.join(SHIFT_NAMES)}")
                base = dataset.split("@", 1)[0]
                out.append(Setting("shift", canonical_spec(f"{base}@{part}"), part))
    out += corruption_settings(dataset, corruptions, severities)
    for s in out:
        spec = parse_spec(s.dataset)  # unknown names and bad class lists fail now, not after hours of work
        if spec.subset is not None and len(spec.subset) < 2:
            raise UserError(
                f"dataset {s.dataset!r} has one class: a probe needs at least 2 (e.g. digits:0-4)"
            )
    return list(dict.fromkeys(out))


def corruption_settings(
    dataset: str, corruptions: str | Iterable[str] | None, severities: str | Iterable[int] | None
) -> list[Setting]:
    """One ``corruption`` setting per (corruption, severity): the in-domain dataset's test images
    corrupted (docs/decisions.md, 'Corruptions'); ``all`` means those that suit its channels."""
    if not corruptions:
        if severities:
            raise UserError("--severities needs --corruptions (all or a comma list of names)")
        return []
    channels = int(DATASETS.info(parse_spec(dataset).name)["channels"])
    names = parse_corruptions(corruptions, channels)  # type: ignore[arg-type]
    levels = parse_severities(severities)  # type: ignore[arg-type]
    base = canonical_spec(dataset)
    return [Setting("corruption", base, corruption=c, severity=s) for c in names for s in levels]


def attack_versions(suite: Suite) -> dict[str, str]:
    """Versions of the code that implements the suite's attacks (part of every row's protocol)."""
    out = {"robustbench_nacl": str(versions()["robustbench_nacl"])}
    for spec in suite.attacks:
        pkg = "torchattacks" if spec.name.startswith("torchattacks.") else ATTACK_PACKAGES.get(spec.name)
        if pkg:
            try:
                out[pkg] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                out[pkg] = "not installed"
        plugin = (
            plugins.plugin_of(getattr(ATTACKS.get(spec.name), "__module__", None))
            if spec.name in ATTACKS
            else None
        )
        if plugin is not None:  # an attack from a plugin: its code is part of the protocol
            out[plugin.module] = f"{plugin.version or 'file'} sha256:{plugin.sha256}"
    return out


def recipe_of(info: dict[str, Any], *, encoder: nn.Module, control: bool) -> dict[str, Any]:
    """What ``recipe_id`` hashes (see docs/decisions.md, 'Result rows, recipes and protocols').

    A checkpoint written by ``train``: its training configuration without the seed (the manifest's
    ``training_config``; from its ``config`` for older manifests, minus NOT_RECIPE), with the dataset
    spec canonical. A random-init control: the architecture, normalisation and pretraining dataset.
    Anything else (a foreign file, a manifest without a configuration): the weights' sha256.
    """
    if control:
        pretrain = info.get("dataset")
        return {
            "kind": "random-init",
            "encoder": info["encoder"],
            "encoder_kwargs": dict(info.get("encoder_kwargs") or {}),
            "in_channels": int(encoder.mean.shape[1]),
            "input_shape": list(getattr(encoder, "input_shape", None) or []),
            "mean": encoder.mean.flatten().tolist(),
            "std": encoder.std.flatten().tolist(),
            "pretrain_dataset": canonical_spec(pretrain) if pretrain else None,
        }
    if info.get("format") == IN_MEMORY:
        return {
            "kind": "module",
            "class": info["module_class"],
            "state_dict_sha256": info["module_sha256"],
            "normalize": info["normalize"],
        }
    training, config = info.get("training_config"), info.get("config")
    if info.get("format", "ours") != "ours" or not isinstance(training or config, dict):
        return {"kind": "weights", "weights_sha256": info["sha256"]}
    if isinstance(training, dict):
        recipe = {k: v for k, v in training.items() if k != "seed"}
    else:  # a manifest written before training_config existed
        recipe = _training_config_of(config, info.get("loss_params"))
    if isinstance(recipe.get("dataset"), str):
        recipe["dataset"] = canonical_spec(recipe["dataset"])
    return {"kind": "trained", "config": recipe}


def _training_config_of(config: dict[str, Any], loss_params: Any) -> dict[str, Any]:
    """An older manifest's ``config`` minus NOT_RECIPE, with the resolved loss parameters."""
    drop = NOT_RECIPE if isinstance(loss_params, dict) else tuple(k for k in NOT_RECIPE if k != "overrides")
    out = {k: v for k, v in config.items() if k not in drop} | {"loss_params": loss_params}
    for k in ("lr", "weight_decay"):  # lr=1 and lr=1.0 are one setting
        if isinstance(out.get(k), int):
            out[k] = float(out[k])
    return out


def _identity(
    setting: Setting, suite: Suite, *, attack: str, norm: str, params: dict, eps: float, **kw: Any
) -> dict[str, Any]:
    return {
        "checkpoint_sha256": kw["sha"],
        "setting": setting.name,
        "dataset": setting.dataset,
        "attack": attack,
        "norm": norm,
        "attack_params": params,
        "eps": eps,
        "seed": kw["seed"],
        "n_examples": kw["n_examples"],
        "probe_config": asdict(kw["probe"]),
        "suite_sha256": suite.sha256,
        "attack_versions": kw["attack_versions"],
        **_corruption_fields(setting),
        # ALF/AFF settings; SLF identities have no such key, so their ids are what they always were
        **({results.FINETUNE: kw["finetune"]} if kw.get("finetune") else {}),
    }


def _corruption_fields(setting: Setting) -> dict[str, Any]:
    # only corruption rows carry these: every other row keeps its fields and its id
    return {"corruption": setting.corruption, "severity": setting.severity} if setting.corruption else {}


def expected_identities(setting: Setting, suite: Suite, **kw: Any) -> list[dict[str, Any]]:
    """Identities of every row a setting produces: one per (attack, eps), one worst case per (norm, eps).

    ``kw``: sha, seed, n_examples, probe (a ProbeConfig with its seed resolved), attack_versions,
    and for ALF/AFF ``finetune`` (the protocol's ``identity()``; absent or None for SLF).
    """
    ids = [
        _identity(setting, suite, attack=s.name, norm=s.norm, params=dict(s.params), eps=e, **kw)
        for s in suite.attacks
        for e in s.eps
    ]
    worst = sorted({(s.norm, e) for s in suite.attacks for e in s.eps})
    ids += [_identity(setting, suite, attack=WORST_CASE, norm=n, params={}, eps=e, **kw) for n, e in worst]
    return ids


def identity_fields(
    suite: Suite, *, sha: str | None, seed: int, n_examples: int | None, probe: ProbeConfig | None
) -> dict[str, Any]:
    """The identity fields every row of one evaluation shares (the ``kw`` of expected_identities)."""
    probe = probe or ProbeConfig()
    probe = dataclasses.replace(probe, seed=seed if probe.seed is None else probe.seed)
    kw = {"sha": sha, "seed": seed, "n_examples": n_examples, "probe": probe}
    return kw | {"attack_versions": attack_versions(suite)}


def planned_identities(
    dataset: str,
    *,
    transfer: str | Iterable[str] | None = None,
    shift: str | Iterable[str] | None = None,
    corruptions: str | Iterable[str] | None = None,
    severities: str | Iterable[int] | None = None,
    suite: str | Path | dict[str, Any] | Suite = "paper",
    n_examples: int | None = None,
    seed: int = 0,
    probe: ProbeConfig | None = None,
    protocol: str | Sequence[str] = "slf",
    alf: AlfConfig | None = None,
    aff: AffConfig | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """Identities of every row ``evaluate(checkpoint, dataset=dataset, **kwargs)`` writes, computed
    without the checkpoint: ``checkpoint_sha256`` is None (the caller knows the checkpoint by id).

    Takes evaluate's own keyword arguments (those that do not enter a row's identity are ignored), so a
    caller that evaluates with a dict of arguments checks completeness with the very same dict.
    """
    loaded = load_suite(suite)
    kw = identity_fields(loaded, sha=None, seed=seed, n_examples=n_examples, probe=probe)
    settings = settings_for(dataset, transfer, shift, corruptions, severities)
    out = []
    for cfg in finetune_configs(protocol, alf, aff):  # as evaluate does: SLF has no finetune field
        pkw = {**kw, "finetune": cfg.identity()} if cfg is not None else kw
        out += [i for s in settings for i in expected_identities(s, loaded, **pkw)]
    return out


def random_init_like(encoder: nn.Module, info: dict[str, Any], seed: int) -> nn.Module:
    """An untrained encoder of the same architecture and normalisation (the random-init control).

    Its weights come from ``seed`` alone; the caller's global RNG is forked, not reseeded.
    """
    with torch.random.fork_rng(devices=[]):  # built on the CPU: only the CPU generator is used
        torch.manual_seed(seed)
        fresh = create_encoder(
            info["encoder"],
            in_channels=int(encoder.mean.shape[1]),
            mean=encoder.mean.flatten().tolist(),
            std=encoder.std.flatten().tolist(),
            input_shape=getattr(encoder, "input_shape", None),
            **info.get("encoder_kwargs", {}),
        )
    return fresh.to(next(encoder.parameters()).device).eval()


@dataclass
class _Job:
    """Everything the rows of one evaluation share."""

    encoder: nn.Module
    suite: Suite
    base: dict[str, Any]  # checkpoint and recipe fields of every row
    kw: dict[str, Any]  # identity fields shared by every row (see expected_identities)
    out: Path
    batch_size: int | None
    device: torch.device
    progress: bool
    probes: dict[str, Any]  # dataset -> (classifier, probe result, fields): corruption settings reuse it
    heads: Path | None = None  # a folder of fitted heads to reuse (published models ship theirs)
    save_heads: bool = False  # write each fitted head to out/heads/
    finetune: FinetuneConfig | None = None  # ALF/AFF; None: SLF


def evaluate(
    checkpoint: str | Path | nn.Module,
    *,
    dataset: str | None = None,
    transfer: str | Iterable[str] | None = None,
    shift: str | Iterable[str] | None = None,
    corruptions: str | Iterable[str] | None = None,
    severities: str | Iterable[int] | None = None,
    suite: str | Path | dict[str, Any] | Suite = "paper",
    out: str | Path = "robustbench_out/leaderboard",
    n_examples: int | None = None,
    seed: int = 0,
    device: str | None = None,
    probe: ProbeConfig | None = None,
    arch: str | None = None,
    fmt: str = "auto",
    normalize: str | tuple[Sequence[float], Sequence[float]] | None = None,
    control: bool = False,
    force: bool = False,
    batch_size: int | None = None,
    data_root: str | None = None,
    progress: bool = True,
    name: str | None = None,
    heads: str | Path | None = None,
    save_heads: bool = False,
    protocol: str | Sequence[str] = "slf",
    alf: AlfConfig | None = None,
    aff: AffConfig | None = None,
) -> Evaluation:
    """Probe and attack an encoder in every requested setting; returns the result rows.

    ``checkpoint`` is a directory written by ``train``, its manifest.json, a foreign weights file
    (with ``arch``), or an ``nn.Module`` mapping images in [0,1] to features (see
    :func:`in_memory_encoder`: ``dataset`` is then required, ``name`` labels its rows and
    ``normalize`` puts an input normalisation in front of it). ``control=True`` evaluates an
    untrained encoder of the same architecture instead (the random-initialisation control). Rows are
    written under ``out/rows/``; the returned list's ``summary`` says in one line how many were
    computed and how many already existed. ``probe.seed`` None (the default) means the evaluation
    ``seed``. ``corruptions`` (``"all"`` or names) adds a setting per corruption and severity
    (``severities``: ``"1-5"`` by default): the in-domain probe on corrupted test images. ``heads``
    is a folder of fitted linear heads (eval/heads.py): a setting whose head is there is attacked
    with it instead of refitting the probe; ``save_heads`` writes each fitted head to ``out/heads/``.
    ``protocol``: ``slf`` (the linear probe), ``alf``, ``aff`` or a comma list of them
    (eval/finetune.py; ``alf``/``aff`` hold their settings); rows of each protocol are separate.
    """
    _check_args(n_examples, batch_size, probe)
    configs = finetune_configs(protocol, alf, aff)
    refuse_reference_dir(out)  # the repository's reference leaderboard is not a user's output folder
    dev = resolve_device(device)
    loaded_suite = load_suite(suite)
    parse_corruptions(corruptions)  # type: ignore[arg-type]  # names are checked before any loading
    parse_severities(severities)  # type: ignore[arg-type]
    encoder, info = _load_source(checkpoint, dataset, arch=arch, fmt=fmt, normalize=normalize, name=name)
    if control and info["format"] == IN_MEMORY:
        raise UserError("control=True needs a checkpoint: an in-memory module has no architecture to rebuild")
    dataset = dataset or info.get("dataset")
    if not dataset:
        raise UserError("pass --dataset: a foreign checkpoint does not say what it was trained on")
    encoder, base = _checkpoint_fields(
        info["source"], encoder.to(dev).eval(), info, control=control, seed=seed, dataset=dataset
    )
    kw = identity_fields(
        loaded_suite, sha=base["checkpoint_sha256"], seed=seed, n_examples=n_examples, probe=probe
    )
    settings = settings_for(dataset, transfer, shift, corruptions, severities)
    all_rows: list[ResultRow] = []
    computed = 0
    for cfg in configs:  # one pass per protocol: SLF's identities carry no finetune field
        pkw = {**kw, "finetune": cfg.identity()} if cfg is not None else kw
        job = _Job(
            encoder, loaded_suite, base, pkw, Path(out), batch_size, dev, progress, probes={},
            heads=Path(heads) if heads else None, save_heads=save_heads, finetune=cfg,
        )  # fmt: skip
        rows, n = _evaluate_job(job, settings, force=force, data_root=data_root)
        all_rows += rows
        computed += n
    _rewrite_vanished(Path(out), all_rows)
    summary = _summary(job, info, control, computed=computed, reused=len(all_rows) - computed)
    return Evaluation(all_rows, summary, computed, len(all_rows) - computed)


def finetune_configs(
    protocol: str | Sequence[str], alf: AlfConfig | None, aff: AffConfig | None
) -> list[FinetuneConfig | None]:
    """The configuration of each requested protocol (None for SLF), checked before any work."""
    table: dict[str, FinetuneConfig | None] = {
        "slf": None,
        "alf": alf or AlfConfig(),
        "aff": aff or AffConfig(),
    }
    out = [table[p] for p in parse_protocols(protocol)]
    for cfg in out:
        if cfg is not None:
            cfg.check()
    return out


def _evaluate_job(
    job: _Job, settings: list[Setting], *, force: bool, data_root: str | None
) -> tuple[list[ResultRow], int]:
    """The rows of every setting under one protocol, and how many of them were computed."""
    plan = [(s, *_existing(job, s, force)) for s in settings]
    work = [s for s, ids, done in plan if len(done) < len(ids)]
    data = {s: _load(s, data_root) for s in work}  # a missing dataset fails before any row is written
    if work:
        check_writable_dir(job.out / results.ROWS_DIR)  # fail before probing and attacking
    rows: list[ResultRow] = []
    computed = 0
    desc = f"eval {job.base['checkpoint_id']}" + (f" {job.finetune.protocol}" if job.finetune else "")
    for setting, ids, done in tqdm(plan, desc=desc, disable=not job.progress or len(plan) < 2):
        if len(done) == len(ids):
            rows += [done[r] for r in ids]  # already computed: nothing to do
            continue
        done_rows, n = _compute_locked(job, setting, data[setting], force)
        rows += done_rows
        computed += n
    return rows, computed


def _load_source(
    checkpoint: str | Path | nn.Module,
    dataset: str | None,
    *,
    arch: str | None,
    fmt: str,
    normalize: Any,
    name: str | None,
) -> tuple[nn.Module, dict[str, Any]]:
    """(encoder, info) of a checkpoint on disk or an in-memory module; ``info["source"]`` names it."""
    if isinstance(checkpoint, nn.Module):
        if arch is not None or fmt != "auto":
            raise UserError("arch and fmt describe a checkpoint file; an in-memory module takes neither")
        return in_memory_encoder(checkpoint, dataset, name=name, normalize=normalize)
    if name is not None:
        raise UserError("name= labels an in-memory module; a checkpoint is named by its manifest or file")
    if normalize is not None and not isinstance(normalize, str):
        raise UserError("normalize= for a checkpoint file is a name: cifar10 | half | imagenet | none")
    encoder, info = load_encoder(checkpoint, arch=arch, fmt=fmt, normalize=normalize)
    return encoder, {**info, "source": str(checkpoint)}


# ============ in-memory modules ============

#: ``info["format"]`` (and the rows' ``checkpoint_format``) of an evaluated ``nn.Module``
IN_MEMORY = "module"


class NormalizedModule(nn.Module):
    """``module((x - mean) / std)``: an input normalisation in front of a user's module.

    ``mean``/``std`` are buffers, so the state dict (and its sha256) covers them.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, module: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.module = module
        self.register_buffer("mean", torch.tensor([float(v) for v in mean]).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor([float(v) for v in std]).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module((x - self.mean) / self.std)


def state_dict_sha256(module: nn.Module) -> str:
    """sha256 of a module's state dict serialised as safetensors (the format checkpoints use)."""
    # clones: safetensors refuses tensors that share storage (tied weights)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    return sha256_bytes(st_save(state))


def _normalization(normalize: Any, dataset: str) -> tuple[list[float], list[float]] | None:
    """The (mean, std) ``normalize=`` names or gives, checked against the dataset's channels."""
    if normalize is None:
        return None
    if isinstance(normalize, str):
        if normalize not in NORMALIZATIONS:
            raise unknown_choice("normalization", normalize, NORMALIZATIONS)
        normalize = NORMALIZATIONS[normalize]
    try:
        mean, std = ([float(v) for v in part] for part in normalize)
    except (TypeError, ValueError):
        raise UserError("normalize= must be a name or a pair (mean, std) of per-channel numbers") from None
    channels = int(DATASETS.info(parse_spec(dataset).name)["channels"])
    for what, values in (("mean", mean), ("std", std)):
        if len(values) not in (1, channels):
            raise UserError(f"normalize {what} has {len(values)} values; {dataset} has {channels} channel(s)")
    if min(std) <= 0:
        raise UserError(f"normalize std must be positive, got {std}")
    return mean, std


def in_memory_encoder(
    module: nn.Module, dataset: str | None, *, name: str | None = None, normalize: Any = None
) -> tuple[nn.Module, dict[str, Any]]:
    """(encoder, info) for evaluating ``module`` (images in [0,1] -> features) as it is in memory.

    The module is copied, so evaluation never moves, converts or re-modes the caller's (only its lazy
    layers, if any, are materialised first, in place, as its own first forward would). ``normalize``
    (a name such as ``"cifar10"``, or ``(mean, std)``) puts that normalisation in front of it.
    Its rows name it ``name`` (default: the class name), as checkpoint id and loss family, and
    record its class and the sha256 of its state dict; their recipe is (class, state dict sha256).
    """
    if not dataset:
        raise UserError("evaluate(module, dataset=...): an in-memory module needs the dataset to probe on")
    cls = type(module)
    label = str(name or cls.__name__).strip()
    if not label or any(c in label for c in "/\\:") or label.startswith("."):
        raise UserError(f"name {label!r}: give a short label without path separators or ':'")
    ds = DATASETS.info(parse_spec(dataset).name)
    # lazy layers get their shapes now, in the caller's module (as its own first forward would do):
    # a module without weights has no state dict to hash, copy or probe
    materialize_lazy(module, (int(ds["channels"]), int(ds["size"]), int(ds["size"])))
    module_sha = state_dict_sha256(module)
    encoder = copy.deepcopy(module)
    stats = _normalization(normalize, dataset)
    if stats is not None:
        encoder = NormalizedModule(encoder, *stats)
    info = {
        "source": f"in-memory:{label}",
        "format": IN_MEMORY,
        "checkpoint_id": label,
        "loss": label,
        "encoder": f"{cls.__module__}.{cls.__qualname__}",
        "module_class": f"{cls.__module__}.{cls.__qualname__}",
        "module_sha256": module_sha,  # the caller's state dict
        "sha256": state_dict_sha256(encoder),  # what is evaluated (the normalisation included)
        "normalize": None if stats is None else {"mean": stats[0], "std": stats[1]},
    }
    return encoder, info


def _check_args(n_examples: int | None, batch_size: int | None, probe: ProbeConfig | None) -> None:
    if n_examples is not None and n_examples < 1:
        raise UserError(f"--n-examples {n_examples}: must be >= 1")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: must be >= 1")
    if probe is not None:
        probe.check()


def _checkpoint_fields(
    source: str,
    encoder: nn.Module,
    info: dict[str, Any],
    *,
    control: bool,
    seed: int,
    dataset: str,
) -> tuple[nn.Module, dict[str, Any]]:
    """The encoder to evaluate (the checkpoint's, or its random-init control) and the checkpoint
    and recipe fields every row of it carries (a control is named after the pretraining dataset,
    else the evaluated one)."""
    sha = info["sha256"]
    ckpt_id = info.get("checkpoint_id") or f"{info['encoder']}.foreign-{Path(source).stem}"
    loss, loss_params = info.get("loss", "foreign"), info.get("loss_params")
    if control:
        encoder = random_init_like(encoder, info, seed)
        sha = sha256_bytes(st_save({k: v.contiguous().cpu() for k, v in encoder.state_dict().items()}))
        # <encoder>.random-init_<dataset>_s<seed>, named like a zoo id
        ckpt_id = f"{info['encoder']}.random-init_{_filename_safe(info.get('dataset') or dataset)}_s{seed}"
        loss, loss_params = "random-init", None
    pretrain = info.get("dataset")
    base = {
        "row_format": ROW_FORMAT,
        "checkpoint": source,
        "checkpoint_id": ckpt_id,
        "checkpoint_sha256": sha,
        "encoder": info["encoder"],
        "loss": loss,
        "loss_params": loss_params,
        "key_params": key_params(loss_params),
        "control": control,
        "pretrain_dataset": canonical_spec(pretrain) if pretrain else None,
        "recipe": recipe_of(info, encoder=encoder, control=control),
        "train_seed": info.get("seed"),
        "train_epochs": info.get("epochs"),
        "checkpoint_format": info.get("format", "ours"),
        "plugins": row_plugins(info),
        **{k: info[k] for k in ("module_class", "module_sha256") if k in info},
    }
    # NHWC convolutions: the same weights, 1.6-1.9x faster inference of convnet_small on CPU (and the
    # tensor-core layout on GPUs); NCHW inputs are accepted and the outputs follow the weights' format
    return encoder.to(memory_format=torch.channels_last), base


def row_plugins(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The plugins a row records: those its checkpoint's training process loaded (the manifest's
    ``plugins``), then those this evaluation loaded; one record per (module, sha256)."""
    recorded = info.get("plugins")
    records = [p for p in recorded if isinstance(p, dict)] if isinstance(recorded, list) else []
    records += plugins.loaded_plugins()
    seen: dict[tuple[Any, Any], dict[str, Any]] = {}
    for p in records:
        seen.setdefault((p.get("module"), p.get("sha256")), p)
    return list(seen.values())


def _filename_safe(spec: str) -> str:
    return str(spec).replace(":", "-").replace("@", "+").replace(",", "_")


def _existing(job: _Job, setting: Setting, force: bool) -> tuple[list[str], dict[str, ResultRow]]:
    """The row ids a setting produces, and those of them already on disk, complete and valid."""
    ids = [results.row_id(i) for i in expected_identities(setting, job.suite, **job.kw)]
    if force:
        return ids, {}
    done = {r: results.read_valid_row(results.row_path(job.out, r), r) for r in ids}
    return ids, {r: row for r, row in done.items() if row is not None}


def _load(setting: Setting, data_root: str | None) -> tuple[ImageData, ImageData]:
    """Both splits of a setting's dataset (DatasetNotFound, a one-line UserError, if it cannot be had)."""
    train = load_dataset(setting.dataset, "train", root=data_root)
    return train, load_dataset(setting.dataset, "test", root=data_root)


def _rewrite_vanished(out: Path, rows: list[ResultRow]) -> None:
    # The output directory may have been deleted while we ran: write the vanished rows again, so
    # that what is returned is what is on disk.
    vanished = [r for r in rows if not results.row_path(out, r.row_id).is_file()]
    for r in vanished:
        results.write_row(out, r)
    if vanished:
        print(
            f"{len(vanished)} result rows had vanished from {out} during the run; wrote them again",
            file=sys.stderr,
        )


def _summary(job: _Job, info: dict[str, Any], control: bool, *, computed: int, reused: int) -> str:
    """One line: what was evaluated, how many rows were computed, how many already existed."""
    rows_dir = job.out / results.ROWS_DIR
    what = job.base["checkpoint_id"]
    if control:
        source = info.get("checkpoint_id") or info["encoder"]
        what = f"random-init control ({what}: an untrained {info['encoder']} shaped like {source})"
    total = computed + reused
    if computed == 0:
        done = f"all {total} result rows already exist in {rows_dir}"
        return f"{what}: {done}; nothing recomputed (--force to recompute)"
    if reused == 0:
        return f"{what}: {total} result rows computed into {rows_dir}"
    return f"{what}: {total} result rows in {rows_dir}: {computed} computed, {reused} already existed"


def _compute_locked(
    job: _Job, setting: Setting, data: tuple[ImageData, ImageData], force: bool
) -> tuple[list[ResultRow], int]:
    """(rows, how many were computed) of one setting, under the advisory lock of its rows: a second
    process evaluating the same checkpoint and protocol into ``out`` waits, then reuses what the first
    one wrote (and computes only what is still missing)."""
    ids, _ = _existing(job, setting, force)
    key = sha256_bytes(" ".join(sorted(ids)).encode())[:24]
    with advisory_lock(job.out, key, f"{job.base['checkpoint_id']} {setting.name} {setting.dataset}"):
        ids, done = _existing(job, setting, force)  # what another process finished meanwhile counts
        remove_temporaries(job.out / results.ROWS_DIR, [f"{r}.json" for r in ids])  # of a killed writer
        if len(done) == len(ids):
            return [done[r] for r in ids], 0
        return _run_setting(job, setting, data, ids, keep=done), len(ids) - len(done)


def _run_setting(
    job: _Job,
    setting: Setting,
    data: tuple[ImageData, ImageData],
    ids: list[str],
    keep: dict[str, ResultRow],
) -> list[ResultRow]:
    """Probe, attack and write the rows of one setting (rows in ``keep`` are returned, not rewritten)."""
    train, test = data
    t0 = time.perf_counter()
    n = job.kw["n_examples"]
    x_test, y_test = test.x[:n], test.y[:n]  # the first n test examples: fixed and documented
    if setting.corruption:
        seed = derive_seed(job.kw["seed"], "corruption", setting.corruption, setting.severity)
        x_test = corrupt(x_test, setting.corruption, int(setting.severity or 1), seed)
    classifier, probe_result, finetuned = _fit(job, setting, train, test)
    probe_s = time.perf_counter() - t0
    measured = benchmark(
        classifier,
        x_test.float().div(255),
        y_test,
        job.suite,
        seed=job.kw["seed"],
        batch_size=job.batch_size,
        num_classes=train.num_classes,
        progress=job.progress,
    )
    shared = {
        "probe_test_acc": probe_result.test_acc,
        "probe_best_test_acc": probe_result.best_test_acc,  # selected on test: for comparison only
        "probe_best_epoch": probe_result.best_epoch,
        "probe_train_acc": probe_result.train_acc,
        "knn_acc": probe_result.knn_acc,
        "n_train": probe_result.n_train,
        "num_classes": train.num_classes,
        "versions": versions(),
        "device": device_name(job.device),
        "probe_wall_s": round(probe_s, 3),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **finetuned,  # ALF/AFF: the protocol's settings (and AFF's weights sha256); SLF: nothing
    }
    written = []
    for r in measured:
        row = _make_row(job, setting, r, shared)
        if row.row_id not in ids:  # the identity computed up front must be the one written
            raise RuntimeError(f"row {row.row_id} of {r['attack']} eps {r['eps']} is not an expected row")
        if row.row_id in keep:  # finished before (an interrupted run): never rewritten
            written.append(keep[row.row_id])
            continue
        results.write_row(job.out, row)
        written.append(row)
    return written


def _fit(
    job: _Job, setting: Setting, train: ImageData, test: ImageData
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The attacked classifier of a setting under the job's protocol, its clean metrics, row fields.

    Fitted once per dataset in this evaluation: a corruption setting attacks the in-domain classifier
    on corrupted test images (every fit is deterministic, so this changes no number, only the time).
    """
    shared = setting.name in ("in-domain", "corruption")  # only these share a classifier: hold no other
    if shared and setting.dataset in job.probes:
        return job.probes[setting.dataset]
    if job.finetune is None:
        fitted = (*_probe(job, setting, train, test), {})
    else:
        encoder = copy.deepcopy(job.encoder)
        before = {k: v.clone() for k, v in encoder.state_dict().items()}
        key = run_key(
            job.finetune.identity(), sha=job.kw["sha"], dataset=setting.dataset, probe=asdict(job.kw["probe"])
        )
        fitted = fit_protocol(
            job.finetune, encoder, train, test, job.kw["probe"], out=job.out, key=key, progress=job.progress
        )
        if not isinstance(job.finetune, AffConfig):  # ALF trains the head only: the encoder stays as it was
            _check_unchanged(before, fitted[0].encoder)
    if shared:
        job.probes[setting.dataset] = fitted
    return fitted


def _check_unchanged(before: dict[str, torch.Tensor], encoder: nn.Module) -> None:
    """Probing must never change the encoder (BatchNorm statistics included)."""
    after = encoder.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise RuntimeError("the encoder changed during probing (BatchNorm statistics?)")


def _probe(job: _Job, setting: Setting, train: ImageData, test: ImageData) -> tuple[nn.Module, Any]:
    """The linear probe of a setting (SLF): a stored head when ``job.heads`` has one, else fitted (on a
    copy of the encoder, so the caller's module is untouched too)."""
    name = "in-domain" if setting.name == "corruption" else setting.name  # the same probe, the same head
    key = head_key(job.kw["sha"], name, setting.dataset, asdict(job.kw["probe"]))
    stored = load_head(job.heads, key) if job.heads else None
    if stored is not None:
        head, probe_result = stored
        return ProbedClassifier(copy.deepcopy(job.encoder), head.to(job.device)), probe_result
    before = {k: v.clone() for k, v in job.encoder.state_dict().items()}
    classifier, probe_result = fit_linear_probe(copy.deepcopy(job.encoder), train, test, job.kw["probe"])
    _check_unchanged(before, classifier.encoder)
    if job.save_heads:
        save_head(job.out / HEADS_DIR, key, classifier.head, probe_result)
    return classifier, probe_result


def _make_row(job: _Job, setting: Setting, r: dict[str, Any], shared: dict[str, Any]) -> ResultRow:
    """One benchmark row plus the checkpoint, setting, probe and protocol fields, with its ids."""
    params = {} if r["attack"] == WORST_CASE else _spec_params(job.suite, r)
    row = {
        **job.base,
        "setting": setting.name,
        "dataset": setting.dataset,
        "shift": setting.shift,
        **_corruption_fields(setting),
        "split": "test",
        **{k: v for k, v in r.items() if k != "params"},  # robust_bits/clean_bits come along when present
        "attack_params": params,
        "attack_config": r.get("params", {}),
        "seed": job.kw["seed"],
        "suite_sha256": job.suite.sha256,
        "n_examples": job.kw["n_examples"],  # requested; None = every test example
        "n_examples_evaluated": r["n_examples"],
        "n_examples_requested": job.kw["n_examples"],
        "probe_config": asdict(job.kw["probe"]),
        "attack_versions": job.kw["attack_versions"],
        **shared,
    }
    return ResultRow.from_json(results.stamp_ids(row))


def _spec_params(suite: Suite, row: dict[str, Any]) -> dict[str, Any]:
    # the spec whose raw parameters the row's (possibly expanded) parameters contain
    for s in suite.attacks:
        same = s.name == row["attack"] and s.norm == row["norm"] and row["eps"] in s.eps
        if same and all(row.get("params", {}).get(k) == v for k, v in s.params.items()):
            return dict(s.params)
    raise RuntimeError(f"benchmark returned a row for an attack not in the suite: {row['attack']}")
