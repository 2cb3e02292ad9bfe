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

from torch import nn

from ..attack.suites import Suite
from ..data import DatasetSpec, parse_spec
from ..data.corruptions import parse_corruptions, parse_severities
from ..errors import UserError
from ..io import refuse_reference_dir
from ..models.dual_bn import has_dual_bn
from ..results.finetune import AffConfig, AlfConfig
from ..results.rows import ROWS_DIR, ResultRow
from ..utils import resolve_device
from .config import EvalConfig
from .finetune_recipes import check_recipe, recipe_plan
from .probe import ProbeConfig
from .recipe import checkpoint_fields
from .runner import Job, rewrite_vanished, run_protocol
from .settings import (
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
    computing the corruptions.
    """
    keywords = EvalConfig.from_keywords(
        dataset=dataset, transfer=transfer, shift=shift, corruptions=corruptions, severities=severities,
        suite=suite, out=out, n_examples=n_examples, seed=seed, device=device, probe=probe, arch=arch,
        fmt=fmt, normalize=normalize, control=control, force=force, batch_size=batch_size,
        data_root=data_root, progress=progress, name=name, heads=heads, save_heads=save_heads,
        protocol=protocol, alf=alf, aff=aff, setting_suites=setting_suites,
        finetune_settings=finetune_settings, finetune_recipe=finetune_recipe,
        corruptions_from=corruptions_from,
    )  # fmt: skip
    if config is not None and keywords != EvalConfig():
        raise UserError("evaluate(): pass either config= or keyword arguments, not both")
    return _run(checkpoint, keywords if config is None else config)


def _run(checkpoint: str | Path | nn.Module, cfg: EvalConfig) -> Evaluation:
    """:func:`evaluate` with its configuration in one object."""
    data, src, probing, output = cfg.data, cfg.source, cfg.probe, cfg.output
    cfg.check()
    finetune_configs(probing.protocol, probing.alf, probing.aff)  # checked before any loading
    check_recipe(probing.finetune_recipe, probing.alf, probing.aff)
    refuse_reference_dir(output.out)  # the repository's reference leaderboard is not a user's output folder
    dev = resolve_device(cfg.device)
    loaded_suite, suites = load_suites(cfg.attack.suite, cfg.attack.setting_suites)
    kinds = parse_setting_kinds(probing.finetune_settings, "finetune settings")
    if data.corruptions_from is None:  # names are checked before any loading (released ones: below)
        parse_corruptions(data.corruptions)  # type: ignore[arg-type]
    parse_severities(data.severities)  # type: ignore[arg-type]
    encoder, info = load_source(
        checkpoint, data.dataset, arch=src.arch, fmt=src.fmt, normalize=src.normalize, name=src.name
    )
    if src.control and info.format == IN_MEMORY:
        raise UserError("control=True needs a checkpoint: an in-memory module has no architecture to rebuild")
    dataset = data.dataset or info.dataset
    if not dataset:
        raise UserError("pass --dataset: a foreign checkpoint does not say what it was trained on")
    encoder, base = checkpoint_fields(
        encoder.to(dev).eval(), info, control=src.control, seed=cfg.seed, dataset=str(dataset)
    )
    fields = identity_fields(
        loaded_suite,
        sha=base["checkpoint_sha256"],
        seed=cfg.seed,
        n_examples=data.n_examples,
        probe=probing.probe,
    )
    settings = settings_for(
        parse_spec(dataset),
        data.transfer,
        data.shift,
        data.corruptions,
        data.severities,
        data.corruptions_from,
    )
    all_rows: list[ResultRow] = []
    computed = 0
    out = Path(output.out)
    plan = recipe_plan(
        probing.finetune_recipe, probing.protocol, settings, kinds, alf=probing.alf, aff=probing.aff,
        loss=base["loss"], dual_bn=has_dual_bn(encoder),
    )  # fmt: skip
    for finetune, run in plan:  # one pass per protocol and configuration (uniform SLF: no finetune field)
        job = Job(
            encoder, suites, base, fields.for_protocol(finetune), out, cfg.attack.batch_size, dev,
            output.progress, heads=Path(probing.heads) if probing.heads else None,
            save_heads=output.save_heads, finetune=finetune,
        )  # fmt: skip
        rows, n = run_protocol(job, run, force=output.force, data_root=data.data_root)
        all_rows += rows
        computed += n
    rewrite_vanished(out, all_rows)
    summary = _summary(out, base, info, src.control, computed=computed, reused=len(all_rows) - computed)
    return Evaluation(all_rows, summary, computed, len(all_rows) - computed)


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
    **_: Any,
) -> list[dict[str, Any]]:
    """Identities of every row ``evaluate(checkpoint, dataset=dataset, **kwargs)`` writes, computed
    without the checkpoint: ``checkpoint_sha256`` is None (the caller knows the checkpoint by id).

    Takes evaluate's own keyword arguments (those that do not enter a row's identity are ignored), so a
    caller that evaluates with a dict of arguments checks completeness with the very same dict. What
    the identities need of the checkpoint itself: ``loss`` (its family: a named recipe's settings
    depend on it) and ``dual_bn`` (whether it has dual BatchNorm: its AFF rows record dual-BN TRADES).
    """
    loaded, suites = load_suites(suite, setting_suites)
    kinds = parse_setting_kinds(finetune_settings, "finetune settings")
    fields = identity_fields(loaded, sha=None, seed=seed, n_examples=n_examples, probe=probe)
    settings = settings_for(dataset, transfer, shift, corruptions, severities, corruptions_from)
    check_recipe(finetune_recipe, alf, aff)
    plan = recipe_plan(
        finetune_recipe, protocol, settings, kinds, alf=alf, aff=aff, loss=loss, dual_bn=dual_bn
    )
    out = []
    for cfg, run in plan:  # as evaluate does
        pfields = fields.for_protocol(cfg)
        for s in run:
            out += expected_identities(s, suites[s.name], pfields.for_suite(suites[s.name]))
    return out


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
