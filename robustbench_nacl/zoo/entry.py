"""One zoo entry: the :class:`ZooEntry` record of a manifest, its id, its training config and where
its checkpoint lives."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError

RECIPE_KEYS = {"epochs": int, "batch_size": int, "lr": float, "weight_decay": float, "max_train": int}
#: the recipe's optimizer and lr schedule (training.optim), passed to TrainConfig as they are; every
#: manifest names its optimizer ("adam" in the CPU zoos: TrainConfig's default, so their runs are unchanged)
RECIPE_OPTIMIZER_KEYS = {"optimizer": str, "optimizer_kwargs": dict, "schedule": str, "schedule_kwargs": dict}


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
    # the ++ post-processing: {"parent": <id of an entry of the same zoo>, "recipe": <post recipe>};
    # such an entry is not trained but post-processed from its parent's checkpoint (``overrides``
    # are then the post recipe's settings)
    post: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the manifest file's content); ``teacher`` and ``post`` only where an entry has
        one, so every other manifest is what it was."""
        out = asdict(self)
        for k in ("teacher", "post"):
            if out[k] is None:
                del out[k]
        return out

    def dependency(self) -> tuple[str, str] | None:
        """(verb, entry id) of the entry whose checkpoint this one needs before it can be made: its
        DeACL teacher ("distils") or its post-processing parent ("post-processes"); None if none."""
        if self.post is not None:
            return "post-processes", str(self.post["parent"])
        if self.teacher is not None:
            return "distils", self.teacher
        return None

    def train_config(
        self, data_root: str | None = None, *, ckpts: str | Path | None = None, **extra: Any
    ) -> Any:
        """The TrainConfig this entry describes; an entry with a ``teacher`` needs ``ckpts``, the
        checkpoints folder where that entry is trained (:func:`teacher_dir`)."""
        from ..training import TrainConfig

        if self.post is not None:  # made by post_process from its parent's checkpoint, not by train
            raise UserError(
                f"zoo entry {self.id} post-processes entry {self.post['parent']}: it has no training "
                "configuration of its own; make it with `zoo train`"
            )
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
            **{k: self.recipe[k] for k in RECIPE_OPTIMIZER_KEYS if k in self.recipe},
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


def post_parent_dir(entry: ZooEntry, ckpts: str | Path) -> Path:
    """The trained checkpoint of a post entry's ``post.parent`` entry under ``ckpts`` (absolute); a
    one-line error when it is not trained there yet."""
    parent = str((entry.post or {}).get("parent"))
    d = (Path(ckpts) / parent).resolve()
    if not (d / "manifest.json").is_file():
        raise UserError(
            f"zoo entry {entry.id} post-processes the checkpoint of entry {parent}, which is not trained "
            f"under {ckpts} yet: train {parent} first (`zoo train` orders them)"
        )
    return d


def expected_id(encoder: str, loss: str, dataset: str, seed: int, tag: str = "") -> str:
    """``<encoder>.<preset>[-tag]_<dataset>_s<seed>`` (dataset made filename-safe, as the trainer does)."""
    ds = dataset.replace(":", "-").replace("@", "+").replace(",", "_")
    return f"{encoder}.{loss}{'-' + tag if tag else ''}_{ds}_s{seed}"


def checkpoint_dir(entry: ZooEntry, out: str | Path) -> Path:
    """Where an entry's trained checkpoint lives under a checkpoints directory."""
    return Path(out) / entry.id


def is_trained(entry: ZooEntry, out: str | Path) -> bool:
    """True when the entry's checkpoint manifest exists (the trainer writes it last)."""
    return (checkpoint_dir(entry, out) / "manifest.json").is_file()
