"""What an evaluation will produce, computable without the checkpoint: its settings (which dataset
each probe is trained and tested on), its protocols, and the identity of every row it writes."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import plugins
from ..attack.base import ATTACKS
from ..attack.suites import Suite, load_suite
from ..data import DatasetSpec, parse_spec
from ..data.corruptions import parse_corruptions, parse_severities
from ..data.released import TRANSFER_AT_SIZE, parse_released, released_folder, released_set
from ..errors import UserError
from ..results import rows as results
from ..results.finetune import AffConfig, AlfConfig, FinetuneConfig
from ..utils import versions
from .benchmark import WORST_CASE
from .finetune import finetuning_protocols
from .probe import ProbeConfig

__all__ = [
    "SETTING_KINDS",
    "SHIFT_NAMES",
    "IdentityFields",
    "Setting",
    "attack_versions",
    "corruption_settings",
    "expected_identities",
    "finetune_configs",
    "identity_fields",
    "load_suites",
    "parse_setting_kinds",
    "protocol_settings",
    "settings_for",
    "transfer_default",
]

SHIFT_NAMES = ("grayscale", "crop", "flip", "jitter", "grayscale+jitter")
#: the kinds of setting an evaluation has (``Setting.name``)
SETTING_KINDS = ("in-domain", "transfer", "shift", "corruption")
# Attacks implemented by another package: its version is part of the protocol.
ATTACK_PACKAGES = {"autoattack": "pyautoattack"}


@dataclass(frozen=True)
class Setting:
    """One probe-and-attack job: which dataset the probe is trained and tested on."""

    name: str  # "in-domain" | "transfer" | "shift" | "corruption"
    spec: DatasetSpec  # canonical
    shift: str | None = None
    corruption: str | None = None  # the in-domain probe, tested on corrupted test images
    severity: int | None = None
    # the released set the corrupted images are read from ("CIFAR-10-C"); None: computed here
    corruption_source: str | None = None
    corruption_dir: str | None = field(default=None, compare=False)  # where its .npy files are

    @property
    def dataset(self) -> str:
        """The canonical spec string (what rows record)."""
        return str(self.spec)


def transfer_default(dataset: str | DatasetSpec) -> str | None:
    """The natural transfer target: the complementary class subset (digits:0-4 -> digits:5-9)."""
    spec = parse_spec(dataset)
    if spec.subset is None:
        return None
    n = spec.info["num_classes"]
    rest = tuple(c for c in range(n) if c not in spec.subset)
    return str(DatasetSpec(spec.name, rest).canonical()) if rest else None


def settings_for(
    dataset: str | DatasetSpec,
    transfer: str | DatasetSpec | Iterable[str | DatasetSpec] | None,
    shift: str | Iterable[str] | None,
    corruptions: str | Iterable[str] | None = None,
    severities: str | Iterable[int] | None = None,
    corruptions_from: str | None = None,
) -> list[Setting]:
    """The settings to run: in-domain always, plus transfer targets and shift variants.

    Datasets are canonical specs (``digits:5,6,7,8,9`` -> ``digits:5-9``); a target named twice
    in two spellings is one setting. A target the RobustSSL benchmark resizes to the in-domain size
    is that resized dataset (``stl10`` from a 32-pixel dataset: ``stl10-32``, :func:`at_size`).
    ``corruptions_from``: a folder of a released corruption set to read instead of computing them.
    """
    spec = parse_spec(dataset)
    out = [Setting("in-domain", spec.canonical())]
    targets = [transfer] if isinstance(transfer, str | DatasetSpec) else list(transfer or [])
    out += [Setting("transfer", at_size(parse_spec(t), spec).canonical()) for t in targets]
    if shift:
        names = SHIFT_NAMES if shift == "all" else ([shift] if isinstance(shift, str) else list(shift))
        for s in names:
            for part in s.split(","):
                if part not in SHIFT_NAMES:
                    raise UserError(f"unknown shift {part!r}; valid choices: all, {', '.join(SHIFT_NAMES)}")
                out.append(Setting("shift", spec.with_shift(part).canonical(), part))
    out += corruption_settings(spec, corruptions, severities, corruptions_from)
    for s in out:
        if s.spec.subset is not None and len(s.spec.subset) < 2:
            raise UserError(
                f"dataset {s.dataset!r} has one class: a probe needs at least 2 (e.g. digits:0-4)"
            )
    return list(dict.fromkeys(out))


def at_size(target: DatasetSpec, source: DatasetSpec) -> DatasetSpec:
    """The transfer target the RobustSSL benchmark evaluates from ``source``: ``stl10`` from a
    32-pixel dataset is ``stl10-32`` (its ``Resize(32)``); any other target is itself."""
    name = TRANSFER_AT_SIZE.get((target.name, int(source.info["size"])))
    return dataclasses.replace(target, name=name) if name else target


def corruption_settings(
    dataset: str | DatasetSpec,
    corruptions: str | Iterable[str] | None,
    severities: str | Iterable[int] | None,
    corruptions_from: str | None = None,
) -> list[Setting]:
    """One ``corruption`` setting per (corruption, severity): the in-domain dataset's test images
    corrupted (docs/decisions.md, 'Corruptions'); ``all`` means those that suit its channels. With
    ``corruptions_from`` (a folder of the released CIFAR-10-C / CIFAR-100-C files) they are read
    from there (``all``: the RobustSSL benchmark's 15), and their rows name the set."""
    if not corruptions:
        if severities or corruptions_from:
            what = "--severities" if severities else "--corruptions-from"
            raise UserError(f"{what} needs --corruptions (all or a comma list of names)")
        return []
    spec = parse_spec(dataset)
    source = folder = None
    if corruptions_from is None:
        names = parse_corruptions(corruptions, spec.channels)  # type: ignore[arg-type]
    else:
        if spec.subset is not None or spec.shift:
            raise UserError(f"--corruptions-from reads whole test sets; {spec} is a subset or shift of one")
        found = released_folder(corruptions_from, spec.name)
        text = corruptions if isinstance(corruptions, str) else ",".join(corruptions)
        names, source, folder = parse_released(text, found), released_set(spec.name).folder, str(found)
    levels = parse_severities(severities)  # type: ignore[arg-type]
    base = spec.canonical()
    return [
        Setting("corruption", base, corruption=c, severity=s, corruption_source=source, corruption_dir=folder)
        for c in names
        for s in levels
    ]


def parse_setting_kinds(text: str | Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    """``"in-domain,corruption"`` -> ``("in-domain", "corruption")``; None stays None (every kind);
    a kind that does not exist is a one-line UserError naming ``what`` was being read."""
    if text is None:
        return None
    names = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    bad = [n for n in names if n not in SETTING_KINDS]
    if bad or not names:
        raise UserError(
            f"{what} {','.join(bad) or text!r}: choose from {', '.join(SETTING_KINDS)}, comma-separated"
        )
    return tuple(dict.fromkeys(names))


def protocol_settings(
    settings: list[Setting], finetune: FinetuneConfig | None, kinds: tuple[str, ...] | None
) -> list[Setting]:
    """The settings a protocol runs: SLF every one; ALF and AFF those of ``kinds`` (None: every one).

    A finetuning protocol trains a classifier per dataset (ALF a head, AFF the whole encoder), so a
    budgeted evaluation may restrict it to the in-domain data, whose classifier the corruption
    settings reuse at no extra training cost."""
    if finetune is None or kinds is None:
        return settings
    return [s for s in settings if s.name in kinds]


def load_suites(suite: str | Any, setting_suites: dict[str, Any] | None) -> tuple[Suite, dict[str, Suite]]:
    """The evaluation's suite, and the suite of each setting kind: the one ``setting_suites`` names
    for it, else ``suite`` (an unknown kind or suite is a one-line UserError before any work)."""
    main = load_suite(suite)
    named = dict(setting_suites or {})
    if named:
        parse_setting_kinds(list(named), "setting suite for")
    return main, {k: load_suite(named[k]) if k in named else main for k in SETTING_KINDS}


def finetune_configs(
    protocol: str | Sequence[str], alf: AlfConfig | None, aff: AffConfig | None
) -> list[FinetuneConfig | None]:
    """The configuration of each requested finetuning protocol (None for SLF), checked before any
    work (label-free fits no classifier: it has none here)."""
    table: dict[str, FinetuneConfig | None] = {
        "slf": None,
        "alf": alf or AlfConfig(),
        "aff": aff or AffConfig(),
    }
    out = [table[p] for p in finetuning_protocols(protocol)]
    for cfg in out:
        if cfg is not None:
            cfg.check()
    return out


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


@dataclass(frozen=True)
class IdentityFields:
    """The identity fields every row of one evaluation (under one protocol) shares."""

    checkpoint_sha256: str | None  # None: planned without the checkpoint (the caller knows it by id)
    seed: int
    n_examples: int | None  # requested; None = every test example
    probe: ProbeConfig  # its seed resolved
    attack_versions: dict[str, str]
    finetune: dict[str, Any] | None = None  # ALF/AFF: the protocol's ``identity()``; SLF: None
    device_class: str | None = None  # utils.device_class: None on a CPU (the key is then absent)

    def for_protocol(self, cfg: FinetuneConfig | None) -> IdentityFields:
        """These fields under a protocol (SLF, None, has no finetune field)."""
        return dataclasses.replace(self, finetune=cfg.identity() if cfg is not None else None)

    def for_suite(self, suite: Suite) -> IdentityFields:
        """These fields for the rows of ``suite`` (a setting kind may run its own suite: the versions
        of the code behind its attacks are its rows', not the evaluation's other suites')."""
        return dataclasses.replace(self, attack_versions=attack_versions(suite))

    def row(
        self, setting: Setting, suite: Suite, *, attack: str, norm: str, params: dict[str, Any], eps: float
    ) -> dict[str, Any]:
        """The identity of one row of ``setting``."""
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "setting": setting.name,
            "dataset": setting.dataset,
            "attack": attack,
            "norm": norm,
            "attack_params": params,
            "eps": eps,
            "seed": self.seed,
            "n_examples": self.n_examples,
            "probe_config": self.probe.as_dict(),
            "suite_sha256": suite.sha256,
            "attack_versions": self.attack_versions,
            **corruption_fields(setting),
            # ALF/AFF settings; SLF identities have no such key, so their ids are what they always were
            **({results.FINETUNE: self.finetune} if self.finetune else {}),
            **device_fields(self.device_class),
        }


def device_fields(device_class: str | None) -> dict[str, Any]:
    """``device_class`` as an identity field: absent on a CPU, so CPU rows keep the ids they had."""
    return {results.DEVICE_CLASS: device_class} if device_class is not None else {}


def corruption_fields(setting: Setting) -> dict[str, Any]:
    """The corruption and severity of a corruption setting's rows; nothing for any other setting."""
    # only corruption rows carry these: every other row keeps its fields and its id
    if not setting.corruption:
        return {}
    released = {"corruption_source": setting.corruption_source} if setting.corruption_source else {}
    return {"corruption": setting.corruption, "severity": setting.severity, **released}


def expected_identities(setting: Setting, suite: Suite, fields: IdentityFields) -> list[dict[str, Any]]:
    """Identities of every row a setting produces: one per (attack, eps), one worst case per (norm, eps)."""
    ids = [
        fields.row(setting, suite, attack=s.name, norm=s.norm, params=dict(s.params), eps=e)
        for s in suite.attacks
        for e in s.eps
    ]
    worst = sorted({(s.norm, e) for s in suite.attacks for e in s.eps})
    ids += [fields.row(setting, suite, attack=WORST_CASE, norm=n, params={}, eps=e) for n, e in worst]
    return ids


def identity_fields(
    suite: Suite,
    *,
    sha: str | None,
    seed: int,
    n_examples: int | None,
    probe: ProbeConfig | None,
    device_class: str | None = None,
) -> IdentityFields:
    """The identity fields every row of one evaluation shares (SLF; see IdentityFields.for_protocol);
    ``device_class``: :func:`~..utils.device_class` of the device it runs on."""
    probe = probe or ProbeConfig()
    probe = dataclasses.replace(probe, seed=seed if probe.seed is None else probe.seed)
    return IdentityFields(sha, seed, n_examples, probe, attack_versions(suite), device_class=device_class)
