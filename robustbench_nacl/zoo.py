"""The model zoo: one JSON manifest per entry under ``zoo/`` (data shipped in the package, not code).

An entry names an encoder, a loss preset with its overrides, a dataset, a recipe and a seed; once
trained, its checkpoint directory holds ``weights.safetensors`` whose sha256 ``zoo verify``
re-checks. Two zoos ship: ``paper`` (CIFAR-100, resnet18_cifar, the NaCl recipe, every preset and
the ablation grids, 5 seeds; for GPUs) and ``demo`` (digits, a small convnet, one entry per family).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError, one_line
from .io import sha256_file, write_json_atomic
from .models.checkpoint import read_manifest
from .packaged import zoo_dir
from .registry import unknown_choice

ZOO_ENV = "ROBUSTBENCH_NACL_ZOO"
REPO_ZOO = zoo_dir()  # the package's files/zoo (the repository's top-level zoo/ links to it)
# ids and zoo names are used as file names: no separators, no leading dot (so never "." or "..")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=,-]{0,199}")
RECIPE_KEYS = {"epochs": int, "batch_size": int, "lr": float, "weight_decay": float, "max_train": int}
EVAL_KEYS = {
    "transfer": (str, type(None)),
    "shift": (str, type(None)),
    "corruptions": (str, type(None)),  # all | a comma list (docs/decisions.md, 'Corruptions')
    "severities": (str, type(None)),  # 1-5 by default
    "suite": str,
    "n_examples": (int, type(None)),
    "probe_epochs": (int, type(None)),
    "probe_max_train": (int, type(None)),
}


@dataclass(frozen=True)
class ZooEntry:
    """One zoo manifest (schema: zoo/README.md)."""

    id: str
    zoo: str
    encoder: str
    loss: str
    dataset: str
    seed: int
    recipe: dict[str, Any]
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    weights_sha256: str | None = None  # pinned once trained and published
    # DeACL: the id of the entry of the same zoo whose checkpoint is the stage-1 teacher
    teacher: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the manifest file's content); ``teacher`` only where an entry has one, so every
        other manifest is what it was."""
        out = asdict(self)
        if out["teacher"] is None:
            del out["teacher"]
        return out

    def train_config(
        self, data_root: str | None = None, *, ckpts: str | Path | None = None, **extra: Any
    ) -> Any:
        """The TrainConfig this entry describes; an entry with a ``teacher`` needs ``ckpts``, the
        checkpoints folder where that entry is trained (:func:`teacher_dir`)."""
        from .training import TrainConfig

        overrides = dict(self.overrides)
        if self.teacher is not None:
            if ckpts is None:
                raise UserError(f"zoo entry {self.id} distils {self.teacher}: train it with `zoo train`")
            overrides["teacher"] = str(teacher_dir(self, ckpts))
        return TrainConfig(
            loss=self.loss,
            overrides=overrides,
            dataset=self.dataset,
            encoder=self.encoder,
            encoder_kwargs=dict(self.encoder_kwargs),
            seed=self.seed,
            data_root=data_root,
            id=self.id,
            **{k: self.recipe[k] for k in RECIPE_KEYS if k in self.recipe},
            **extra,
        )


def teacher_dir(entry: ZooEntry, ckpts: str | Path) -> Path:
    """The trained checkpoint of an entry's ``teacher`` entry under ``ckpts`` (absolute); a one-line
    error when it is not trained there yet."""
    d = (Path(ckpts) / str(entry.teacher)).resolve()
    if not (d / "manifest.json").is_file():
        raise UserError(
            f"zoo entry {entry.id} distils the checkpoint of entry {entry.teacher}, which is not trained "
            f"under {ckpts} yet: train {entry.teacher} first (`zoo train` orders them)"
        )
    return d


def zoo_root(root: str | Path | None = None) -> Path:
    """The zoo folder: argument > $ROBUSTBENCH_NACL_ZOO > the shipped zoo/ (in the package)."""
    return Path(root or os.environ.get(ZOO_ENV) or REPO_ZOO)


def expected_id(encoder: str, loss: str, dataset: str, seed: int, tag: str = "") -> str:
    """``<encoder>.<preset>[-tag]_<dataset>_s<seed>`` (dataset made filename-safe, as the trainer does)."""
    ds = dataset.replace(":", "-").replace("@", "+").replace(",", "_")
    return f"{encoder}.{loss}{'-' + tag if tag else ''}_{ds}_s{seed}"


def parse_entry(data: Any, source: str) -> ZooEntry:
    """Validate one manifest; every problem is a one-line UserError naming the file and the field."""
    from .data import parse_spec
    from .losses import resolve
    from .models.factory import check_encoder

    def bad(msg: str) -> UserError:  # values from the file may hold newlines: the error stays one line
        return UserError(" ".join(f"zoo manifest {source}: {msg}".split()))

    if not isinstance(data, dict):
        raise bad("must be a JSON object")
    required = {
        "id": str,
        "zoo": str,
        "encoder": str,
        "loss": str,
        "dataset": str,
        "seed": int,
        "recipe": dict,
    }
    for k, t in required.items():
        if k not in data:
            raise bad(f"missing field {k!r}")
        if not isinstance(data[k], t) or isinstance(data[k], bool):
            raise bad(f"field {k!r} must be a {t.__name__}")
    optional = {
        "encoder_kwargs": dict,
        "overrides": dict,
        "eval": dict,
        "description": str,
        "weights_sha256": (str, type(None)),
        "teacher": (str, type(None)),
    }
    for k, v in data.items():
        if k not in required and k not in optional:
            raise bad(f"unknown field {k!r}; valid fields: {', '.join([*required, *optional])}")
        if k in optional and not isinstance(v, optional[k]):
            raise bad(f"field {k!r} has the wrong type")
    for k, v in data["recipe"].items():
        if k in RECIPE_KEYS and (not isinstance(v, int | float) or isinstance(v, bool)):
            raise bad(f"recipe.{k} must be a number")
    for k, v in data.get("eval", {}).items():
        if k not in EVAL_KEYS:
            raise bad(f"unknown eval field {k!r}; valid: {', '.join(EVAL_KEYS)}")
        if not isinstance(v, EVAL_KEYS[k]):
            raise bad(f"eval.{k} has the wrong type")
    if data["recipe"].get("epochs", 1) < 1 or data["recipe"].get("batch_size", 2) < 2:
        raise bad("recipe.epochs must be >= 1 and recipe.batch_size >= 2")
    for where, key in (("recipe", "max_train"), ("eval", "probe_epochs"), ("eval", "probe_max_train")):
        value = data.get(where, {}).get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad(f"{where}.{key} must be a whole number >= 1")
    for k in ("id", "zoo"):
        if not _SAFE_NAME.fullmatch(data[k]):
            # ids and zoo names become file and directory names: nothing may point outside --out
            shown = data[k] if len(data[k]) <= 60 else data[k][:57] + "..."
            raise bad(f"field {k!r} must be a file-name-safe name (letters, digits, ._+=,-), not {shown!r}")
    sha = data.get("weights_sha256")
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise bad("weights_sha256 must be 64 lowercase hex digits")
    for k, v in data.get("overrides", {}).items():
        if v is not None and not isinstance(v, str | int | float | bool):
            raise bad(f"overrides.{k} must be a number, string, boolean or null, not {type(v).__name__}")
    try:
        check_encoder(data["encoder"])  # a registered (or plugin) encoder, or timm:NAME
        params = resolve(data["loss"], dict(data.get("overrides", {})))
        parse_spec(data["dataset"])
    except UserError as e:
        raise bad(str(e)) from None
    except (TypeError, ValueError) as e:
        # a JSON value of the wrong type for its loss parameter (e.g. "t": null) reaches the range checks
        raise bad(f"overrides hold a value of the wrong type for its parameter ({one_line(e)})") from None
    _check_teacher_field(data, "teacher" in params.extra_params(), bad)
    return ZooEntry(**data)


def _check_teacher_field(data: dict[str, Any], distils: bool, bad: Any) -> None:
    """``teacher``: for a loss that distils a stage-1 checkpoint (DeACL) only, named once, by the id
    of another entry (a path in ``overrides.teacher`` stays possible outside the generated zoos)."""
    teacher, by_path = data.get("teacher"), data.get("overrides", {}).get("teacher")
    if teacher is not None and not distils:
        raise bad(
            f"field 'teacher' is only for a loss that distils a stage-1 checkpoint, not {data['loss']!r}"
        )
    if teacher is not None and by_path:
        raise bad("name the teacher once: field 'teacher' (a zoo entry) or overrides.teacher (a path)")
    if distils and teacher is None and not by_path:
        raise bad(
            f"loss {data['loss']!r} needs a stage-1 teacher: set field 'teacher' to the id of another "
            "entry of this zoo (e.g. its simclr entry of the same seed)"
        )
    if teacher is not None and (not _SAFE_NAME.fullmatch(teacher) or teacher == data["id"]):
        raise bad(f"field 'teacher' must be the id of another entry of this zoo, not {teacher!r}")


def check_teachers(entries: list[ZooEntry], source: str) -> None:
    """Each ``teacher`` names an entry of the same zoo, with the student's encoder, that has no
    teacher itself (one stage of distillation: ``zoo train`` trains teachers, then students)."""
    by_id = {e.id: e for e in entries}
    for e in entries:
        if e.teacher is None:
            continue
        t = by_id.get(e.teacher)
        if t is None or t.zoo != e.zoo:
            raise UserError(
                f"zoo {source}: entry {e.id} names teacher {e.teacher!r}, which is no entry of zoo {e.zoo!r}"
            )
        if (t.encoder, t.encoder_kwargs) != (e.encoder, e.encoder_kwargs):
            raise UserError(
                f"zoo {source}: entry {e.id} distils {t.id}, whose encoder differs "
                f"({t.encoder} {t.encoder_kwargs} vs {e.encoder} {e.encoder_kwargs}); use one encoder"
            )
        if t.teacher is not None:
            raise UserError(f"zoo {source}: entry {e.id} names teacher {t.id}, which has a teacher itself")


def load_zoo(name: str | None = None, root: str | Path | None = None) -> list[ZooEntry]:
    """Every entry of one zoo (a subfolder of the zoo root), or of all zoos; ids must be unique."""
    base = zoo_root(root)
    if name is not None:
        base = base / name
        if not base.is_dir():
            if not zoo_names(root):
                raise no_zoo_error(zoo_root(root))
            raise unknown_choice("zoo", name, zoo_names(root))
    paths = sorted(base.rglob("*.json"))
    if not paths:
        raise no_zoo_error(base)
    entries: dict[str, ZooEntry] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
            raise UserError(f"zoo manifest {path}: not valid JSON ({one_line(e)})") from None
        entry = parse_entry(data, str(path))
        if entry.id in entries:
            raise UserError(f"zoo manifest {path}: duplicate id {entry.id!r}")
        entries[entry.id] = entry
    check_teachers(list(entries.values()), str(base))
    return list(entries.values())


def no_zoo_error(folder: Path) -> UserError:
    """The one line for a zoo folder without manifests: where it looked, and why that is wrong."""
    why = "holds no *.json manifests" if folder.is_dir() else "does not exist"
    if os.environ.get(ZOO_ENV):
        return UserError(
            f"no zoo entries: {folder} (from ${ZOO_ENV}) {why}; point ${ZOO_ENV} at a folder of zoo "
            "manifests (one subfolder per zoo), or unset it to use the zoos robustbench-nacl ships"
        )
    return UserError(
        f"no zoo entries: {folder} (the zoo folder of this installation) {why}; the zoos ship with "
        f"robustbench-nacl, so this installation lacks them: reinstall it, or set ${ZOO_ENV} to a "
        "folder of zoo manifests"
    )


def zoo_names(root: str | Path | None = None) -> list[str]:
    """Names of the zoos (subfolders holding manifests)."""
    base = zoo_root(root)
    return (
        sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.json")))
        if base.is_dir()
        else []
    )


def find_entry(entry_id: str, root: str | Path | None = None) -> ZooEntry:
    """One entry by id (a one-line error with close matches otherwise)."""
    entries = {e.id: e for e in load_zoo(None, root)}
    if entry_id not in entries:
        import difflib

        close = difflib.get_close_matches(entry_id, entries, n=3)
        raise UserError(
            f"no zoo entry {entry_id!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
        )
    return entries[entry_id]


def checkpoint_dir(entry: ZooEntry, out: str | Path) -> Path:
    """Where an entry's trained checkpoint lives under a checkpoints directory."""
    return Path(out) / entry.id


def is_trained(entry: ZooEntry, out: str | Path) -> bool:
    """True when the entry's checkpoint manifest exists (the trainer writes it last)."""
    return (checkpoint_dir(entry, out) / "manifest.json").is_file()


def verify_entry(entry: ZooEntry, out: str | Path) -> tuple[str, str]:
    """Recompute the weights' sha256: ("ok" | "untrained" | "changed" | "unpinned-mismatch", detail)."""
    d = checkpoint_dir(entry, out)
    if not is_trained(entry, out):
        return "untrained", str(d)
    try:
        manifest = read_manifest(d)
    except UserError as e:
        return "changed", str(e)
    weights = d / manifest["weights"]
    if not weights.is_file():
        return "changed", f"{weights} is missing"
    actual = sha256_file(weights)
    if actual != manifest["weights_sha256"]:
        return (
            "changed",
            f"{weights}: sha256 {actual[:12]}... != manifest {manifest['weights_sha256'][:12]}...",
        )
    if entry.weights_sha256 and actual != entry.weights_sha256:
        return (
            "unpinned-mismatch",
            f"{weights}: sha256 {actual[:12]}... != zoo pin {entry.weights_sha256[:12]}...",
        )
    return "ok", actual


@dataclass(frozen=True)
class VerifyReport:
    """What ``zoo verify`` found: a status per entry that has a checkpoint, and the entries without one."""

    out: str
    results: list[tuple[ZooEntry, str, str]]  # (entry, status, detail) as verify_entry returns them
    missing: list[ZooEntry]  # no checkpoint under ``out``: nothing to verify

    @property
    def bad(self) -> list[ZooEntry]:
        """Entries whose weights do not match their manifest or their zoo pin."""
        return [e for e, status, _ in self.results if status != "ok"]

    def summary(self) -> str:
        """One line: how many entries were verified, how many of those failed, how many are missing."""
        n = len(self.results) + len(self.missing)
        return (
            f"verified {len(self.results)} of {n} entries under {self.out}: "
            f"{len(self.results) - len(self.bad)} ok, {len(self.bad)} changed, "
            f"{len(self.missing)} missing (no checkpoint)"
        )


def verify_entries(entries: list[ZooEntry], out: str | Path) -> VerifyReport:
    """:func:`verify_entry` for each entry, with the untrained ones listed apart as missing."""
    results, missing = [], []
    for e in entries:
        status, detail = verify_entry(e, out)
        if status == "untrained":
            missing.append(e)
        else:
            results.append((e, status, detail))
    return VerifyReport(str(out), results, missing)


def write_entry(entry: ZooEntry, root: str | Path | None = None) -> Path:
    """Write (or rewrite) an entry's manifest file atomically."""
    path = zoo_root(root) / entry.zoo / f"{entry.id}.json"
    write_json_atomic(path, entry.to_dict())
    return path


# ============ the two shipped zoos, generated from the presets ============

PAPER_RECIPE = {"epochs": 100, "batch_size": 256, "optimizer": "adam", "lr": 3e-4, "weight_decay": 0.0}
PAPER_EVAL = {"transfer": "cifar10", "shift": None, "suite": "paper", "n_examples": None}
DEMO_RECIPE = {"epochs": 10, "batch_size": 128, "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0}
DEMO_EVAL = {"transfer": "digits:5-9", "shift": "all", "suite": "paper", "n_examples": None}
DEMO_M = 3  # demo: 3 positives instead of 5, so that every family fits the 5-minute CPU budget


def package_presets() -> list[str]:
    """The presets the package ships (a plugin's presets belong to the plugin, not to the shipped zoos)."""
    from .losses import PRESETS

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
    from .losses import PRESETS

    if "teacher" not in PRESETS.get(loss).params.extra_params():
        return None
    return expected_id(encoder, TEACHER_PRESET, dataset, seed)


def paper_zoo(seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> list[ZooEntry]:
    """CIFAR-100, resnet18_cifar, NaCl recipe: every preset at paper settings plus the grids of Tables 2-5."""
    from .losses import PRESETS

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


#: The reference zoo (leaderboard/README.md): sized by measurement; it trained in 25 min and was
#: evaluated in 60 min on 2 CPU cores.
FMNIST_RECIPE = {
    "epochs": 5,
    "batch_size": 128,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 0.0,
    "max_train": 4096,
}
FMNIST_EVAL = {
    "transfer": "fashion-mnist:5-9",
    "shift": "crop,flip,jitter",  # on 1-channel images grayscale is the identity, grayscale+jitter is jitter
    "suite": "fashion-mnist",
    "n_examples": 1000,
    "probe_epochs": 100,
    "probe_max_train": 4096,
}


def _one_per_family(
    zoo: str,
    dataset: str,
    recipe: dict[str, Any],
    ev: dict[str, Any],
    seeds: tuple[int, ...],
    *,
    tag_m: bool,
    presets: list[str] | None = None,
) -> list[ZooEntry]:
    """convnet_small (width 16) on ``dataset``: ``presets`` (default: :func:`zoo_presets`; at most
    DEMO_M positives) x ``seeds``."""
    from .losses import PRESETS

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
                    eval=dict(ev),
                    description=PRESETS.get(name).description + tag,
                    teacher=teacher_of(name, "convnet_small", dataset, s),
                )
            )
    return out


#: The presets of the committed reference zoo (leaderboard/), pinned: its manifests and rows stay
#: byte-identical when presets are added (the adversarial ones enter when the reference is regenerated).
FMNIST_PRESETS = [
    "simclr",
    "debiased",
    "hardneg",
    "debiased_hardneg",
    "adv",
    "nca",
    "mixnca",
    "nca_mixnca",
    "var",
    "intcl",
    "intnacl",
    "arcl",
    "dacl",
    "dacl_plus",
    "gaussian",
    "supervised",
]


def fashion_mnist_zoo(seeds: tuple[int, ...] = (0, 1, 2)) -> list[ZooEntry]:
    """Fashion-MNIST classes 0-4, convnet_small (width 16): the pinned presets x 3 seeds (reference zoo)."""
    return _one_per_family(
        "fashion-mnist",
        "fashion-mnist:0-4",
        FMNIST_RECIPE,
        FMNIST_EVAL,
        seeds,
        tag_m=True,
        presets=FMNIST_PRESETS,
    )


def demo_zoo() -> list[ZooEntry]:
    """digits classes 0-4, convnet_small (width 16): one entry per loss family, seed 0."""
    return _one_per_family("demo", "digits:0-4", DEMO_RECIPE, DEMO_EVAL, (0,), tag_m=False)


#: The zoos whose manifests are generated from the package's presets (``zoo regenerate`` writes them).
GENERATED_ZOOS = {"demo": demo_zoo, "fashion-mnist": fashion_mnist_zoo, "paper": paper_zoo}


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
            write_entry(e, root)
        for p in stale:
            p.unlink()
        done[zoo_name] = (len(entries), len(stale))
    return done
