"""The zoo's manifest files: where the zoo folder is, reading and validating each manifest against
the schema (zoo/README.md), and writing one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import UserError, one_line
from ..io import write_json_atomic
from ..packaged import zoo_dir
from ..registry import unknown_choice
from .entry import RECIPE_KEYS, RECIPE_OPTIMIZER_KEYS, ZooEntry

ZOO_ENV = "ROBUSTBENCH_NACL_ZOO"
REPO_ZOO = zoo_dir()  # the package's files/zoo (the repository's top-level zoo/ links to it)
# ids and zoo names are used as file names: no separators, no leading dot (so never "." or "..")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=,-]{0,199}")
EVAL_KEYS = {
    "transfer": (str, type(None)),
    "shift": (str, type(None)),
    "corruptions": (str, type(None)),  # all | a comma list (docs/decisions.md, 'Corruptions')
    "severities": (str, type(None)),  # 1-5 by default
    "suite": str,
    "n_examples": (int, type(None)),
    "probe_epochs": (int, type(None)),
    "probe_max_train": (int, type(None)),
    "probe_standardize": bool,  # ProbeConfig.standardize (docs/decisions.md, 'Linear probe')
    "probe_lr": (int, float, type(None)),  # ProbeConfig.lr
    "protocol": str,  # slf | alf | aff or a comma list (docs/decisions.md, 'Finetuning protocols')
    "finetune_settings": (str, type(None)),  # the setting kinds ALF/AFF run on; None: every one
    "finetune_recipe": str,  # uniform (default) | robustssl[:METHOD] (eval/finetune_recipes.py)
    "setting_suites": dict,  # {setting kind: suite}: a kind's own suite (e.g. a short one for corruptions)
    "alf": dict,  # AlfConfig fields that differ from the literature defaults (e.g. max_train)
    "aff": dict,  # AffConfig fields, likewise
}


def _finetune_fields(protocol: str) -> list[str]:
    """The settings of a finetuning protocol (AlfConfig / AffConfig fields)."""
    import dataclasses

    from ..results.finetune import AffConfig, AlfConfig

    return [f.name for f in dataclasses.fields(AlfConfig if protocol == "alf" else AffConfig)]


def _finetune_config(protocol: str, ev: dict[str, Any]) -> Any:
    """The entry's ALF / AFF configuration as ``eval_arguments`` builds it (None: the defaults)."""
    from ..results.finetune import AffConfig, AlfConfig

    cls = AlfConfig if protocol == "alf" else AffConfig
    return cls(**ev[protocol]) if protocol in ev else None


def zoo_root(root: str | Path | None = None) -> Path:
    """The zoo folder: argument > $ROBUSTBENCH_NACL_ZOO > the shipped zoo/ (in the package)."""
    return Path(root or os.environ.get(ZOO_ENV) or REPO_ZOO)


def parse_entry(data: Any, source: str) -> ZooEntry:
    """Validate one manifest; every problem is a one-line UserError naming the file and the field."""

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
        "post": (dict, type(None)),
    }
    for k, v in data.items():
        if k not in required and k not in optional:
            raise bad(f"unknown field {k!r}; valid fields: {', '.join([*required, *optional])}")
        if k in optional and not isinstance(v, optional[k]):
            raise bad(f"field {k!r} has the wrong type")
    for k, v in data["recipe"].items():
        if k in RECIPE_KEYS and (not isinstance(v, int | float) or isinstance(v, bool)):
            raise bad(f"recipe.{k} must be a number")
        if k in RECIPE_OPTIMIZER_KEYS and not isinstance(v, RECIPE_OPTIMIZER_KEYS[k]):
            raise bad(f"recipe.{k} must be a {RECIPE_OPTIMIZER_KEYS[k].__name__}")
    # the training monitor (learning curves): logged, never part of the weights or their ids
    every = data["recipe"].get("monitor_every")
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise bad("recipe.monitor_every must be an integer >= 1")
    if not isinstance(data["recipe"].get("monitor_probe", False), bool):
        raise bad("recipe.monitor_probe must be true or false")
    _check_eval_fields(data.get("eval", {}), bad)
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
    _check_registered(data, bad)
    return ZooEntry(**data)


def _check_registered(data: dict[str, Any], bad: Any) -> None:
    """The names the entry uses: encoder, loss preset and its overrides (or, for a post entry, its
    parent preset and post recipe), dataset, optimizer; then the ``teacher`` / ``post`` field."""
    from ..data import parse_spec
    from ..losses import resolve
    from ..models.factory import check_encoder

    post = data.get("post") is not None
    try:
        check_encoder(data["encoder"])  # a registered (or plugin) encoder, or timm:NAME
        params = None if post else resolve(data["loss"], dict(data.get("overrides", {})))
        parse_spec(data["dataset"])
        _check_optimizer(data["recipe"])
    except UserError as e:
        raise bad(str(e)) from None
    except (TypeError, ValueError) as e:
        # a JSON value of the wrong type for its loss parameter (e.g. "t": null) reaches the range checks
        raise bad(f"overrides hold a value of the wrong type for its parameter ({one_line(e)})") from None
    if params is None:
        _check_post_field(data, bad)
    else:
        _check_teacher_field(data, "teacher" in params.extra_params(), bad)


def _check_optimizer(recipe: dict[str, Any]) -> None:
    """The recipe's optimizer and schedule: registered names, known settings of the right types."""
    from ..training.config import TrainConfig
    from ..training.optim import DEFAULT_OPTIMIZER, DEFAULT_SCHEDULE, check_recipe

    check_recipe(
        recipe.get("optimizer", DEFAULT_OPTIMIZER),
        recipe.get("optimizer_kwargs", {}),
        recipe.get("schedule", DEFAULT_SCHEDULE),
        recipe.get("schedule_kwargs", {}),
        epochs=recipe.get("epochs", TrainConfig.epochs),
    )


def _check_eval_fields(ev: dict[str, Any], bad: Any) -> None:
    """The ``eval`` object: known fields of the right types, a positive ``probe_lr``, suite names
    per setting kind, and ALF/AFF settings that exist."""
    for k, v in ev.items():
        if k not in EVAL_KEYS:
            raise bad(f"unknown eval field {k!r}; valid: {', '.join(EVAL_KEYS)}")
        if not isinstance(v, EVAL_KEYS[k]):
            raise bad(f"eval.{k} has the wrong type")
    lr = ev.get("probe_lr")
    if lr is not None and (isinstance(lr, bool) or not lr > 0):
        raise bad("eval.probe_lr must be a number > 0")
    if not all(isinstance(v, str) for v in ev.get("setting_suites", {}).values()):
        raise bad("eval.setting_suites must map setting kinds to suite names")
    if "finetune_recipe" in ev:
        from ..eval.finetune_recipes import check_recipe

        try:  # a named recipe sets ALF/AFF itself: eval.alf / eval.aff may only hold what it passes through
            check_recipe(ev["finetune_recipe"], _finetune_config("alf", ev), _finetune_config("aff", ev))
        except UserError as e:
            raise bad(f"eval.finetune_recipe: {e}") from None
    for proto in ("alf", "aff"):
        fields = _finetune_fields(proto)
        unknown = [k for k in ev.get(proto, {}) if k not in fields]
        if unknown:
            raise bad(f"unknown eval.{proto} field {unknown[0]!r}; valid: {', '.join(fields)}")


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


def _check_post_field(data: dict[str, Any], bad: Any) -> None:
    """``post``: {"parent": the id of another entry of this zoo, "recipe": a post-processing recipe
    (``robustbench-nacl post --recipe``)}. The entry's ``loss`` is its parent's preset + "++" (what
    the post-processed checkpoint records, so the board's family), its ``overrides`` the recipe's
    settings; it has no teacher (its parent's checkpoint is its one input)."""
    from ..losses import resolve
    from ..post.recipes import resolve_recipe

    post, loss = data["post"], data["loss"]
    if set(post) != {"parent", "recipe"}:
        raise bad('field \'post\' must be {"parent": ENTRY_ID, "recipe": NAME} and nothing else')
    parent, recipe = post["parent"], post["recipe"]
    if not isinstance(parent, str) or not _SAFE_NAME.fullmatch(parent) or parent == data["id"]:
        raise bad(f"post.parent must be the id of another entry of this zoo, not {parent!r}")
    if not isinstance(recipe, str):
        raise bad(f"post.recipe must be the name of a post-processing recipe, not {recipe!r}")
    if data.get("teacher") is not None:
        raise bad("a post entry has no 'teacher': its parent's checkpoint is its one input")
    if not loss.endswith("++"):
        raise bad(f"loss {loss!r} of a post entry must be its parent's preset + '++' (e.g. 'dynacl++')")
    try:
        resolve(loss[:-2], {})
        resolve_recipe(recipe, dict(data.get("overrides", {})))
    except UserError as e:
        raise bad(f"{e} (field 'post')") from None


def check_posts(entries: list[ZooEntry], source: str) -> None:
    """Each ``post.parent`` names an entry of the same zoo that is no post entry itself (one stage),
    has dual BatchNorm (the ++ recipes read its clean branch and train its adversarial one) and the
    post entry's encoder, dataset, seed and recipe; the post entry's loss is the parent's + "++"."""
    by_id = {e.id: e for e in entries}
    for e in entries:
        if e.post is None:
            continue
        p = by_id.get(e.post["parent"])
        if p is None or p.zoo != e.zoo:
            raise UserError(
                f"zoo {source}: entry {e.id} post-processes {e.post['parent']!r}, which is no entry of "
                f"zoo {e.zoo!r}"
            )
        if p.post is not None:
            raise UserError(f"zoo {source}: entry {e.id} post-processes {p.id}, a post entry itself")
        if e.loss != f"{p.loss}++":
            raise UserError(
                f"zoo {source}: entry {e.id} post-processes {p.id}: its loss must be {p.loss + '++'!r} "
                f"(what the post-processed checkpoint records), not {e.loss!r}"
            )
        same = ("encoder", "encoder_kwargs", "dataset", "seed", "recipe")
        if differ := [k for k in same if getattr(e, k) != getattr(p, k)]:
            raise UserError(
                f"zoo {source}: entry {e.id} differs from its parent {p.id} in {', '.join(differ)}: a "
                f"post entry repeats its parent's {', '.join(same)}"
            )
        if not has_dual_bn(p):
            raise UserError(
                f"zoo {source}: entry {e.id} post-processes {p.id}, which has no dual BatchNorm: the ++ "
                "recipes need an adversarial preset with dual_bn (acl, dynacl, dynacl_air, ...)"
            )


def has_dual_bn(entry: ZooEntry) -> bool:
    """Whether the entry's trained encoder has dual BatchNorm (as training.manifest decides: an
    adversarial objective with ``dual_bn``); a post entry's always has (its parent's)."""
    from ..losses import needs, resolve

    if entry.post is not None:
        return True
    params = resolve(entry.loss, dict(entry.overrides))
    return bool(needs(params).adversarial and params.dual_bn)


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
    check_posts(list(entries.values()), str(base))
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


def write_entry(entry: ZooEntry, root: str | Path | None = None) -> Path:
    """Write (or rewrite) an entry's manifest file atomically."""
    path = zoo_root(root) / entry.zoo / f"{entry.id}.json"
    write_json_atomic(path, entry.to_dict())
    return path
