"""Load a published reference model by name: its encoder, or the classifier its committed rows
attacked (the encoder and one linear head), each file checked against its pinned sha256 first.

Weights come from the package, or from ``weights_from`` (a local folder, or an http(s) URL whose
files are downloaded once into the user's cache: :mod:`.download`). Whatever the source, the
file's sha256 is checked against the card before a single tensor is read; a head is checked
against the set's ``heads.json`` the same way (:mod:`.catalog` describes a set's files).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from torch import nn

from ..errors import UserError
from ..eval.heads import HEADS_DIR, head_key, load_head
from ..eval.probe import ProbedClassifier
from ..io import sha256_file
from ..models.checkpoint import WEIGHTS
from ..results.rows import ResultRow, protocol_name
from .catalog import HEAD_PINS, PublishedModel, coverage, find_model, model_rows
from .download import cached_download, check_url, sha_folder


def _check_sha(model: PublishedModel, path: Path, fix: str) -> Path:
    actual = sha256_file(path)
    if actual != model.weights_sha256:
        raise UserError(
            f"weights of {model.name} at {path} have sha256 {actual[:12]}... but the model card pins "
            f"{model.weights_sha256[:12]}...: the file is damaged or another model's; {fix}"
        )
    return path


def weights_file(model: PublishedModel, weights_from: str | Path | None = None) -> Path:
    """The model's verified weights file: from the package, a folder, or a URL (cached)."""
    if weights_from is None:
        path = model.folder / WEIGHTS
        if not path.is_file():
            raise UserError(
                f"the weights of {model.name} are not in this installation ({path} is missing); reinstall "
                "robustbench-nacl, or pass --weights-from DIR|URL"
            )
        return _check_sha(model, path, "reinstall robustbench-nacl, or pass --weights-from DIR|URL")
    src = str(weights_from)
    if "://" in src:  # a URL: http(s) only, downloaded once into the cache under its pinned sha256
        fix = (
            "check the URL given to --weights-from, or pass a local folder holding <name>/weights.safetensors"
        )
        url = f"{check_url(src, '--weights-from').rstrip('/')}/{model.name}/{WEIGHTS}"
        return cached_download(url, model.weights_sha256, WEIGHTS, fix)
    for path in (Path(src) / model.name / WEIGHTS, Path(src) / f"{model.name}.safetensors"):
        if path.is_file():
            return _check_sha(model, path, f"replace {path} with the published file")
    raise UserError(
        f"--weights-from {src} holds neither {model.name}/{WEIGHTS} nor {model.name}.safetensors; "
        "pass the folder the weights were published in"
    )


def checkpoint_dir(model: PublishedModel, weights_from: str | Path | None = None) -> Path:
    """A checkpoint folder (manifest.json + verified weights) that ``evaluate`` and ``load_encoder`` read."""
    weights = weights_file(model, weights_from)
    if weights == model.folder / WEIGHTS:
        return model.folder
    # weights from elsewhere: pair them with the published manifest in the cache (a copy: a link
    # would let a later change to the source file bypass the sha256 check made now)
    folder = sha_folder(model.weights_sha256) / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in (("manifest.json", model.folder / "manifest.json"), (WEIGHTS, weights)):
        tmp = folder / f".{name}.part"
        shutil.copyfile(source, tmp)
        os.replace(tmp, folder / name)
    return folder


def not_covered(set_name: str, root: str | Path | None = None) -> list[str]:
    """Registered presets (the package's and plugins') that a published set does not cover yet:
    new presets are listed as "not in the published reference yet", never an error."""
    from ..losses import PRESETS

    return sorted(set(PRESETS.names()) - set(coverage(set_name, root)["presets"]))


# ============ linear heads, pinned like the weights ============


def head_pins(set_folder: Path) -> dict[str, dict[str, str]]:
    """A set's ``heads.json``: head key -> its sha256 and the weights it was fitted on ({} if absent:
    then every head is unpinned, and refused)."""
    path = set_folder / HEAD_PINS
    if not path.is_file():
        return {}
    try:
        pins = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is damaged ({' '.join(str(e).split())[:100]}); reinstall") from None
    if not isinstance(pins, dict) or not all(isinstance(v, dict) and "sha256" in v for v in pins.values()):
        raise UserError(f"{path} is damaged (not a key -> {{sha256, checkpoint_sha256}} map); reinstall")
    return pins


def head_problem(set_folder: Path, key: str, pins: dict[str, dict[str, str]]) -> str | None:
    """Why the published head ``key`` must not be loaded (None when its file matches its pin)."""
    path = set_folder / HEADS_DIR / f"{key}.safetensors"
    if key not in pins:
        return f"{path} is not pinned in {set_folder / HEAD_PINS}; reinstall robustbench-nacl"
    if not path.is_file():
        return f"{path} is missing; reinstall robustbench-nacl"
    if (actual := sha256_file(path)) != pins[key]["sha256"]:
        return (
            f"{path} has sha256 {actual[:12]}... but {HEAD_PINS} pins {pins[key]['sha256'][:12]}...: the "
            "file is damaged; reinstall robustbench-nacl"
        )
    return None


def heads_problems(set_folder: Path, checkpoint_sha256: set[str] | None = None) -> list[str]:
    """Every published head of a set that does not match its pin, and every head file with no pin
    (only the heads fitted on ``checkpoint_sha256`` when given: one model's and its control's)."""
    pins = head_pins(set_folder)
    keys = {p.stem for p in (set_folder / HEADS_DIR).glob("*.safetensors")}
    keys |= {
        k
        for k, v in pins.items()
        if checkpoint_sha256 is None or v.get("checkpoint_sha256") in checkpoint_sha256
    }
    if checkpoint_sha256 is not None:  # files nobody pinned are everybody's problem
        keys = {k for k in keys if k not in pins or pins[k].get("checkpoint_sha256") in checkpoint_sha256}
    return [why for k in sorted(keys) if (why := head_problem(set_folder, k, pins))]


def heads_dir(model: PublishedModel) -> Path:
    """The model's set's heads folder for ``eval --model``, once every head in it matches its pin (the
    evaluation may attack any of them: the model's, or its control's with ``--control``)."""
    problems = heads_problems(model.set_folder)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"the linear heads of {model.set!r}: {problems[0]}{more}")
    return model.set_folder / HEADS_DIR


def protocol_row(model: PublishedModel, protocol: str | None) -> ResultRow:
    """A committed SLF row of the model under ``protocol``: a protocol id, a dataset spec or a setting
    name (SLF rows only: their linear heads are what a set publishes; ALF and AFF train their own).

    None and ``"slf"`` are the in-domain protocol; ``"alf"`` and ``"aff"`` are one line saying how to
    evaluate them. A one-line error lists the model's protocols otherwise (the corruptions' many
    protocol ids counted, not listed).
    """
    rows = [r for r in model_rows(model) if protocol_name(r) == "slf"]
    want = "in-domain" if protocol is None or protocol.lower() == "slf" else protocol
    if want.lower() in ("alf", "aff"):
        raise UserError(
            f"a published set holds the SLF linear heads only: {want.upper()} trains its own head"
            + (" and finetunes the encoder" if want.lower() == "aff" else "")
            + " on each run; evaluate it as the reference did with `robustbench-nacl eval --model"
            f" {model.name} --like-zoo {model.set} --protocol {want.lower()}`, or leave protocol out for"
            " the in-domain SLF head"
        )
    for r in rows:
        if want in (r["protocol_id"], r["dataset"], r["setting"]):
            return r
    listed = sorted(
        {f"{r['protocol_id']} ({r['setting']} {r['dataset']})" for r in rows if r["setting"] != "corruption"}
    )
    corruption = {r["protocol_id"] for r in rows if r["setting"] == "corruption"}
    if corruption:  # one id per corruption and severity: their count says more than 27 ids
        listed.append(f"{len(corruption)} corruption protocols (they attack the in-domain head)")
    raise UserError(f"{model.name} has no rows under protocol {want!r}; its protocols: {'; '.join(listed)}")


def load_model(
    name: str,
    dataset: str | None = None,
    protocol: str | None = None,
    *,
    head: bool = False,
    weights_from: str | Path | None = None,
) -> nn.Module:
    """A published encoder by name (images in [0,1] -> features, normalisation inside), in eval mode.

    ``head=True`` returns the probed classifier of ``protocol`` instead (images -> logits): the
    encoder followed by the linear head the committed rows of that protocol attacked (``protocol``:
    a protocol id, a dataset spec such as ``digits:5-9``, or a setting; default, or ``"slf"``,
    in-domain; ALF and AFF train their own heads, which are not published).
    ``dataset`` restricts the lookup to models pretrained on it. The weights' sha256 is checked
    against the model card before they are loaded (safetensors: no code runs on load).
    """
    from ..models.foreign import load_encoder

    model = find_model(name, dataset)
    encoder, _ = load_encoder(checkpoint_dir(model, weights_from))
    if not head:
        return encoder.eval()
    row = protocol_row(model, protocol)
    key = head_key(row["checkpoint_sha256"], row["setting"], row["dataset"], dict(row["probe_config"]))
    if why := head_problem(model.set_folder, key, head_pins(model.set_folder)):
        raise UserError(f"the linear head of {model.name} under {row['protocol_id']}: {why}")
    stored = load_head(model.set_folder / HEADS_DIR, key)
    if stored is None:
        raise UserError(f"the linear head of {model.name} under {row['protocol_id']} is missing; reinstall")
    return ProbedClassifier(encoder, stored[0])
