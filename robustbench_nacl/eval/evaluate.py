"""Evaluate an encoder: probe it per setting, attack the probed classifier, write result rows.

Settings: in-domain (probe on the pretraining dataset), transfer (probe on another dataset) and
shift (probe on ArCL-modified versions). Rows are content-addressed: a setting whose rows all
exist (complete and valid) is skipped without loading data or probing, and a finished row is never
rewritten, so an interrupted evaluation resumes where it stopped and a repeated one is a no-op.
Every dataset a setting needs is loaded before the first row is written, so a missing one fails
the whole evaluation at once instead of after hours of work.

This module is the entry (:func:`evaluate`, :func:`planned_identities`); the parts live beside it:
config.py (:class:`EvalConfig`), source.py (loading what is evaluated), recipe.py (the checkpoint
fields of rows), settings.py (settings and row identities) and runner.py (the per-setting jobs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attack.suites import Suite
from ..data import DatasetSpec, parse_spec
from ..data.corruptions import parse_corruptions, parse_severities
from ..errors import UserError
from ..io import refuse_reference_dir
from ..models.dual_bn import has_dual_bn
from ..results.finetune import AffConfig, AlfConfig
from ..results.label_free import LABEL_FREE, LabelFreeConfig
from ..results.label_free import identities as label_free_identities
from ..results.rows import ROWS_DIR, ResultRow
from ..utils import device_class, resolve_device
from .config import EvalConfig
from .finetune import finetuning_protocols, parse_protocols
from .finetune_recipes import check_recipe, recipe_plan
from .label_free import attack_versions as label_free_versions
from .label_free import data_for, image_folder, run_label_free
from .probe import ProbeConfig
from .recipe import checkpoint_fields
from .runner import Job, rewrite_vanished, run_protocol
from .settings import (
    IdentityFields,
    expected_identities,
    finetune_configs,
    identity_fields,
    load_suites,
    parse_setting_kinds,
    settings_for,
)
from .source import IN_MEMORY, CheckpointInfo, load_source

__all__ = ["Evaluation", "evaluate", "planned_identities"]


class Evaluation(list[ResultRow]):
    """The rows of one ``evaluate`` call, plus a one-line ``summary`` of what was (re)computed."""

    def __init__(self, rows: Iterable[ResultRow], summary: str, computed: int, reused: int) -> None:
        super().__init__(rows)
        self.summary = summary
        self.computed = computed
        self.reused = reused


def evaluate(
    checkpoint: str | Path | nn.Module,
    config: EvalConfig | None = None,
    *,
    dataset: str | DatasetSpec | None = None,
    transfer: str | DatasetSpec | Iterable[str | DatasetSpec] | None = None,
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
    setting_suites: Mapping[str, str | Path | dict[str, Any] | Suite] | None = None,
    finetune_settings: str | Sequence[str] | None = None,
    finetune_recipe: str = "uniform",
    corruptions_from: str | None = None,
    label_free: LabelFreeConfig | None = None,
    compile: str = "auto",
) -> Evaluation:
    """Probe and attack an encoder in every requested setting; returns the result rows.

    ``checkpoint`` is a directory written by ``train``, its manifest.json, a foreign weights file
    (with ``arch``), or an ``nn.Module`` mapping images in [0,1] to features (see
    :func:`~robustbench_nacl.eval.source.in_memory_encoder`: ``dataset`` is then required, ``name``
    labels its rows and ``normalize`` puts an input normalisation in front of it). What to do is
    ``config`` (an :class:`EvalConfig`) or, equivalently, the keyword arguments, one per field of
    its groups (not both). ``control=True`` evaluates an untrained encoder of the same architecture
    instead (the random-initialisation control). Rows are written under ``out/rows/``; the returned
    list's ``summary`` says in one line how many were computed and how many already existed.
    ``probe.seed`` None (the default) means the evaluation ``seed``. ``corruptions`` (``"all"`` or
    names) adds a setting per corruption and severity (``severities``: ``"1-5"`` by default): the
    in-domain probe on corrupted test images. ``heads`` is a folder of fitted linear heads
    (eval/heads.py): a setting whose head is there is attacked with it instead of refitting the
    probe; ``save_heads`` writes each fitted head to ``out/heads/``. ``protocol``: ``slf`` (the
    linear probe), ``alf``, ``aff`` or a comma list of them (eval/finetune.py; ``alf``/``aff`` hold
    their settings); rows of each protocol are separate. ``setting_suites`` gives a setting kind
    (``transfer``, ``shift``, ``corruption``, ``in-domain``) its own suite, e.g. a short one for the
    many corruption settings; ``finetune_settings`` restricts ALF/AFF to some kinds (e.g.
    ``"in-domain,corruption"``: one finetuning per encoder). ``finetune_recipe`` names the recipe
    (eval/finetune_recipes.py): ``uniform``, one protocol for every family, or ``robustssl``, the
    RobustSSL benchmark's per-method settings; it is part of every finetuned row's identity.
    ``corruptions_from``: a folder of the released CIFAR-10-C / CIFAR-100-C files, read instead of
    computing the corruptions. ``protocol="label-free"`` (alone or in the list) attacks the encoder's
    representation itself, without a head (eval/label_free.py; ``label_free`` holds its settings):
    in-domain only, and on an unlabeled image folder too (``dataset`` an existing directory, which
    the labelled protocols refuse). ``compile`` (``off``, ``auto``: on CUDA only, ``on``) runs the
    probe, the finetuning epochs and the attacks under ``torch.compile`` (robustbench_nacl/accel.py):
    how the numbers are computed, recorded beside the device, never part of a row's identity.
    """
    keywords = EvalConfig.from_keywords(
        dataset=dataset, transfer=transfer, shift=shift, corruptions=corruptions, severities=severities,
        suite=suite, out=out, n_examples=n_examples, seed=seed, device=device, probe=probe, arch=arch,
        fmt=fmt, normalize=normalize, control=control, force=force, batch_size=batch_size,
        data_root=data_root, progress=progress, name=name, heads=heads, save_heads=save_heads,
        protocol=protocol, alf=alf, aff=aff, setting_suites=setting_suites,
        finetune_settings=finetune_settings, finetune_recipe=finetune_recipe,
        corruptions_from=corruptions_from, label_free=label_free, compile=compile,
    )  # fmt: skip
    if config is not None and keywords != EvalConfig():
        raise UserError("evaluate(): pass either config= or keyword arguments, not both")
    return _run(checkpoint, keywords if config is None else config)


def _run(checkpoint: str | Path | nn.Module, cfg: EvalConfig) -> Evaluation:
    """:func:`evaluate` with its configuration in one object."""
    data, src, probing, output = cfg.data, cfg.source, cfg.probe, cfg.output
    labelled, label_free, folder = _check_before_loading(checkpoint, cfg)
    dev = resolve_device(cfg.device)
    loaded_suite, suites = load_suites(cfg.attack.suite, cfg.attack.setting_suites)
    kinds = parse_setting_kinds(probing.finetune_settings, "finetune settings")
    encoder, info, dataset = _load(checkpoint, cfg, folder)
    encoder, base = checkpoint_fields(
        encoder.to(dev).eval(), info, control=src.control, seed=cfg.seed, dataset=str(dataset)
    )
    fields = identity_fields(
        loaded_suite,
        sha=base["checkpoint_sha256"],
        seed=cfg.seed,
        n_examples=data.n_examples,
        probe=probing.probe,
        device_class=device_class(dev),
    )
    settings = (
        []
        if folder is not None
        else settings_for(
            parse_spec(dataset),
            data.transfer,
            data.shift,
            data.corruptions,
            data.severities,
            data.corruptions_from,
        )
    )
    all_rows: list[ResultRow] = []
    computed = 0
    out = Path(output.out)
    plan = (
        recipe_plan(
            probing.finetune_recipe, labelled, settings, kinds, alf=probing.alf, aff=probing.aff,
            loss=base["loss"], dual_bn=has_dual_bn(encoder),
        )
        if labelled
        else []
    )  # fmt: skip
    for finetune, run in plan:  # one pass per protocol and configuration (uniform SLF: no finetune field)
        job = Job(
            encoder, suites, base, fields.for_protocol(finetune), out, cfg.attack.batch_size, dev,
            output.progress, heads=Path(probing.heads) if probing.heads else None,
            save_heads=output.save_heads, finetune=finetune, compile=cfg.compile,
        )  # fmt: skip
        rows, n = run_protocol(job, run, force=output.force, data_root=data.data_root)
        all_rows += rows
        computed += n
    if label_free is not None:  # the representation itself, in-domain (or the folder): no head
        rows, n = _label_free_rows(encoder, cfg, label_free, (info, dataset, folder), base, fields, dev)
        all_rows += rows
        computed += n
    rewrite_vanished(out, all_rows)
    summary = _summary(out, base, info, src.control, computed=computed, reused=len(all_rows) - computed)
    return Evaluation(all_rows, summary, computed, len(all_rows) - computed)


def _check_before_loading(
    checkpoint: str | Path | nn.Module, cfg: EvalConfig
) -> tuple[list[str], LabelFreeConfig | None, Path | None]:
    """Every check that needs no checkpoint, each a one-line UserError, before anything is loaded;
    returns the labelled protocols, the label-free settings (None: not asked) and the image folder."""
    data, probing = cfg.data, cfg.probe
    cfg.check()
    labelled = finetuning_protocols(probing.protocol)  # one-line UserError for an unknown protocol
    label_free = _label_free_config(probing.protocol, probing.label_free)
    folder = image_folder(data.dataset)
    if folder is not None and labelled:
        raise UserError(
            f"--dataset {data.dataset} is an unlabeled image folder: only --protocol label-free reads one "
            f"({', '.join(labelled)} train{'s' if len(labelled) == 1 else ''} a head on labels)"
        )
    finetune_configs(probing.protocol, probing.alf, probing.aff)  # checked before any loading
    check_recipe(probing.finetune_recipe, probing.alf, probing.aff)
    refuse_reference_dir(cfg.output.out)  # the repository's reference leaderboard is not a user's output
    if data.corruptions_from is None:  # names are checked before any loading (released ones: below)
        parse_corruptions(data.corruptions)  # type: ignore[arg-type]
    parse_severities(data.severities)  # type: ignore[arg-type]
    if folder is not None and isinstance(checkpoint, nn.Module):
        raise UserError("an image folder needs a checkpoint (its dataset sets the image size), not a module")
    return labelled, label_free, folder


def _load(
    checkpoint: str | Path | nn.Module, cfg: EvalConfig, folder: Path | None
) -> tuple[nn.Module, CheckpointInfo, str]:
    """The encoder, what it is (CheckpointInfo) and the dataset its rows are measured on."""
    src = cfg.source
    encoder, info = load_source(
        checkpoint,
        None if folder is not None else cfg.data.dataset,
        arch=src.arch,
        fmt=src.fmt,
        normalize=src.normalize,
        name=src.name,
    )
    if src.control and info.format == IN_MEMORY:
        raise UserError("control=True needs a checkpoint: an in-memory module has no architecture to rebuild")
    dataset = folder.name if folder is not None else cfg.data.dataset or info.dataset
    if not dataset:
        raise UserError("pass --dataset: a foreign checkpoint does not say what it was trained on")
    return encoder, info, str(dataset)


def _label_free_rows(
    encoder: nn.Module,
    cfg: EvalConfig,
    label_free: LabelFreeConfig,
    source: tuple[CheckpointInfo, str, Path | None],
    base: dict[str, Any],
    fields: IdentityFields,
    dev: torch.device,
) -> tuple[list[ResultRow], int]:
    """The label-free protocol's rows: the in-domain test split, or the image folder (``source``:
    the checkpoint's info, the dataset and the folder)."""
    info, dataset, folder = source
    data = cfg.data
    spec = parse_spec(info.dataset).info if folder is not None and info.dataset else {}
    lf_data = data_for(
        str(parse_spec(dataset).canonical()) if folder is None else str(folder),
        folder,
        int(spec["channels"]) if spec else None,
        int(spec["size"]) if spec else None,
        data.data_root,
    )
    return run_label_free(
        encoder, lf_data, label_free, base=base, seed=cfg.seed, n_examples=data.n_examples,
        probe=cfg.probe.probe or ProbeConfig(), out=Path(cfg.output.out), force=cfg.output.force,
        device=dev, batch_size=cfg.attack.batch_size, device_class=fields.device_class,
    )  # fmt: skip


def planned_identities(
    dataset: str | DatasetSpec,
    *,
    transfer: str | DatasetSpec | Iterable[str | DatasetSpec] | None = None,
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
    setting_suites: Mapping[str, str | Path | dict[str, Any] | Suite] | None = None,
    finetune_settings: str | Sequence[str] | None = None,
    finetune_recipe: str = "uniform",
    loss: str | None = None,
    dual_bn: bool = False,
    corruptions_from: str | None = None,
    label_free: LabelFreeConfig | None = None,
    device: str | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """Identities of every row ``evaluate(checkpoint, dataset=dataset, **kwargs)`` writes, computed
    without the checkpoint: ``checkpoint_sha256`` is None (the caller knows the checkpoint by id).

    Takes evaluate's own keyword arguments (those that do not enter a row's identity are ignored), so a
    caller that evaluates with a dict of arguments checks completeness with the very same dict. What
    the identities need of the checkpoint itself: ``loss`` (its family: a named recipe's settings
    depend on it) and ``dual_bn`` (whether it has dual BatchNorm: its AFF rows record dual-BN TRADES).
    ``device``: where the rows would be computed (their device class; None: a CPU).
    """
    loaded, suites = load_suites(suite, setting_suites)
    kinds = parse_setting_kinds(finetune_settings, "finetune settings")
    fields = identity_fields(
        loaded, sha=None, seed=seed, n_examples=n_examples, probe=probe, device_class=_planned_class(device)
    )
    settings = settings_for(dataset, transfer, shift, corruptions, severities, corruptions_from)
    check_recipe(finetune_recipe, alf, aff)
    labelled = finetuning_protocols(protocol)
    plan = (
        recipe_plan(finetune_recipe, labelled, settings, kinds, alf=alf, aff=aff, loss=loss, dual_bn=dual_bn)
        if labelled
        else []
    )
    out = []
    for cfg, run in plan:  # as evaluate does
        pfields = fields.for_protocol(cfg)
        for s in run:
            out += expected_identities(s, suites[s.name], pfields.for_suite(suites[s.name]))
    lf = _label_free_config(protocol, label_free)
    if lf is not None:  # as run_label_free plans them (the in-domain test split is labelled)
        out += label_free_identities(
            lf, dataset=settings[0].dataset, checkpoint_sha256=None, seed=seed, n_examples=n_examples,
            probe_config=fields.probe.as_dict(), attack_versions=label_free_versions(), labelled=True,
            device_class=fields.device_class,
        )  # fmt: skip
    return out


def _planned_class(device: str | None) -> str | None:
    """The device class rows planned for ``device`` record (None: a CPU, or no device given). The
    name of a GPU is read from the GPU itself, so planning for one needs one."""
    return None if device is None else device_class(resolve_device(device))


def _label_free_config(
    protocol: str | Sequence[str], given: LabelFreeConfig | None
) -> LabelFreeConfig | None:
    """The label-free protocol's settings when it is asked for (checked), else None; its settings
    given without it are a one-line UserError (they would be silently ignored)."""
    if LABEL_FREE not in parse_protocols(protocol):
        if given is not None and given != LabelFreeConfig():
            raise UserError("label-free settings given: add label-free to the protocol, or drop them")
        return None
    cfg = given or LabelFreeConfig()
    cfg.check()
    return cfg


def _summary(
    out: Path, base: dict[str, Any], info: CheckpointInfo, control: bool, *, computed: int, reused: int
) -> str:
    """One line: what was evaluated, how many rows were computed, how many already existed."""
    rows_dir = out / ROWS_DIR
    what = base["checkpoint_id"]
    if control:
        source = info.checkpoint_id or info.encoder
        what = f"random-init control ({what}: an untrained {info.encoder} shaped like {source})"
    total = computed + reused
    if computed == 0:
        done = f"all {total} result rows already exist in {rows_dir}"
        return f"{what}: {done}; nothing recomputed (--force to recompute)"
    if reused == 0:
        return f"{what}: {total} result rows computed into {rows_dir}"
    return f"{what}: {total} result rows in {rows_dir}: {computed} computed, {reused} already existed"
