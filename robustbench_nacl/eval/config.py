"""What an evaluation is asked to do, in named groups: :class:`EvalConfig` (data, source, probe,
attack, output, plus the seed and device), and its construction from ``evaluate``'s keyword form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..accel import check_compile
from ..attack.suites import Suite
from ..data import DatasetSpec
from ..errors import UserError
from ..results.finetune import AffConfig, AlfConfig
from ..results.label_free import LabelFreeConfig
from .probe import ProbeConfig

__all__ = ["AttackOptions", "DataOptions", "EvalConfig", "OutputOptions", "ProbeOptions", "SourceOptions"]


@dataclass(frozen=True)
class DataOptions:
    """Which data each setting probes and attacks."""

    dataset: str | DatasetSpec | None = None  # in-domain; None: the checkpoint's pretraining dataset
    transfer: str | DatasetSpec | Iterable[str | DatasetSpec] | None = None  # transfer targets
    shift: str | Iterable[str] | None = None  # "all", a name, a comma list or a list of names
    # "all" or names: the in-domain probe, on corrupted test images
    corruptions: str | Iterable[str] | None = None
    severities: str | Iterable[int] | None = None  # with corruptions; "1-5" by default
    n_examples: int | None = None  # the first n test examples are attacked; None = all
    data_root: str | None = None
    # a folder of the released CIFAR-10-C / CIFAR-100-C .npy files: corruptions read, not computed
    corruptions_from: str | None = None


@dataclass(frozen=True)
class SourceOptions:
    """How the thing evaluated is read (a checkpoint file) or labelled (an in-memory module)."""

    arch: str | None = None  # a foreign file's architecture
    fmt: str = "auto"  # a foreign file's layout
    normalize: str | tuple[Sequence[float], Sequence[float]] | None = None
    name: str | None = None  # an in-memory module's label
    control: bool = False  # evaluate an untrained encoder of the same architecture instead


@dataclass(frozen=True)
class ProbeOptions:
    """How the attacked classifier is made: the protocol(s) and their settings."""

    probe: ProbeConfig | None = None  # seed None: the evaluation seed
    protocol: str | Sequence[str] = "slf"  # slf | alf | aff | label-free or a comma list
    alf: AlfConfig | None = None
    aff: AffConfig | None = None
    heads: str | Path | None = None  # a folder of fitted linear heads to reuse (SLF)
    # the setting kinds ALF/AFF run on ("in-domain,corruption"); None: every setting, as SLF
    finetune_settings: str | Sequence[str] | None = None
    # the named finetuning recipe (eval/finetune_recipes.py): uniform | robustssl[:METHOD]
    finetune_recipe: str = "uniform"
    label_free: LabelFreeConfig | None = None  # --protocol label-free: its settings (None: defaults)


@dataclass(frozen=True)
class AttackOptions:
    """The attacks run on each classifier."""

    suite: str | Path | dict[str, Any] | Suite = "paper"
    batch_size: int | None = None
    # a suite per setting kind ({"corruption": "fgsm-headline"}); a kind not named runs ``suite``
    setting_suites: Mapping[str, str | Path | dict[str, Any] | Suite] | None = None


@dataclass(frozen=True)
class OutputOptions:
    """Where rows go and what is written or shown on the way."""

    out: str | Path = "robustbench_out/leaderboard"
    force: bool = False  # recompute rows that already exist
    save_heads: bool = False  # write each fitted head to out/heads/
    progress: bool = True


@dataclass(frozen=True)
class EvalConfig:
    """Everything ``evaluate`` needs besides the thing it evaluates."""

    data: DataOptions = field(default_factory=DataOptions)
    source: SourceOptions = field(default_factory=SourceOptions)
    probe: ProbeOptions = field(default_factory=ProbeOptions)
    attack: AttackOptions = field(default_factory=AttackOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    seed: int = 0
    device: str | None = None
    # torch.compile the probe, finetuning and attacks: off | auto (on CUDA only) | on (accel.py);
    # how the numbers are computed, never part of a row's identity (rows record it beside the device)
    compile: str = "auto"

    def check(self) -> None:
        """One-line UserErrors for numbers that cannot be run (before anything is loaded)."""
        n_examples, batch_size = self.data.n_examples, self.attack.batch_size
        if n_examples is not None and n_examples < 1:
            raise UserError(f"--n-examples {n_examples}: must be >= 1")
        if batch_size is not None and batch_size < 1:
            raise UserError(f"--batch-size {batch_size}: must be >= 1")
        if self.probe.probe is not None:
            self.probe.probe.check()
        check_compile(self.compile)

    @classmethod
    def from_keywords(
        cls,
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
    ) -> EvalConfig:
        """The configuration ``evaluate``'s keyword form describes (one keyword per field)."""
        return cls(
            data=DataOptions(
                dataset, transfer, shift, corruptions, severities, n_examples, data_root, corruptions_from
            ),
            source=SourceOptions(arch, fmt, normalize, name, control),
            probe=ProbeOptions(
                probe, protocol, alf, aff, heads, finetune_settings, finetune_recipe, label_free
            ),
            attack=AttackOptions(suite, batch_size, setting_suites),
            output=OutputOptions(out, force, save_heads, progress),
            seed=seed,
            device=device,
            compile=compile,
        )
