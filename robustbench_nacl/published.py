"""Published reference models: load any of them by name, with its linear heads, rows and model card.

A published set is a folder of the package's ``files/published/`` (one per zoo, e.g. ``demo``)::

    <set>/models/<name>/manifest.json       the trainer's checkpoint manifest
    <set>/models/<name>/weights.safetensors  the encoder's weights (sha256 pinned by the card)
    <set>/models/<name>/card.json            its model card (eval/cards.py; schema files/schemas/)
    <set>/models/<name>/log.jsonl            its learning curve, where the trainer logged one
    <set>/heads/<key>.safetensors            the fitted linear heads of the committed rows (eval/heads.py)
    <set>/rows.jsonl.gz                      the committed result rows in one pack (controls' rows too)
    <set>/coverage.json                      the presets and seeds this set covers

Weights come from the package, or from ``weights_from`` (a local folder, or an http(s) URL whose
files are downloaded once into the user's cache). Whatever the source, the file's sha256 is checked
against the card before a single tensor is read.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .errors import UserError
from .eval.heads import HEADS_DIR, head_key, load_head
from .eval.probe import ProbedClassifier
from .io import sha256_file
from .models.checkpoint import WEIGHTS
from .packaged import published_dir
from .results.rows import ResultRow, load_rows, protocol_name

CACHE_ENV = "ROBUSTBENCH_NACL_CACHE"
MODELS_DIR, ROWS_DIR, CARD = "models", "rows", "card.json"


@dataclass(frozen=True)
class PublishedModel:
    """One published encoder: its name (the zoo entry id), its set and its card."""

    name: str
    set: str
    folder: Path  # <set>/models/<name>
    card: dict[str, Any]

    @property
    def set_folder(self) -> Path:
        """The published set's folder (heads/, rows/, coverage.json)."""
        return self.folder.parents[1]

    @property
    def weights_sha256(self) -> str:
        """The sha256 every weights file of this model must have."""
        return str(self.card["weights_sha256"])


def published_sets(root: str | Path | None = None) -> list[str]:
    """Names of the published sets (folders holding models/)."""
    base = Path(root) if root else published_dir()
    return sorted(p.name for p in base.iterdir() if (p / MODELS_DIR).is_dir()) if base.is_dir() else []


def published_models(dataset: str | None = None, root: str | Path | None = None) -> list[PublishedModel]:
    """Every published model (of one pretraining dataset: ``digits`` or ``digits:0-4``), sorted by name."""
    base = Path(root) if root else published_dir()
    out = []
    for s in published_sets(base):
        for card_file in sorted((base / s / MODELS_DIR).glob(f"*/{CARD}")):
            card = json.loads(card_file.read_text())
            if dataset is None or dataset in (card["dataset"], card["dataset"].split(":")[0]):
                out.append(PublishedModel(card_file.parent.name, s, card_file.parent, card))
    return out


def find_model(name: str, dataset: str | None = None, root: str | Path | None = None) -> PublishedModel:
    """A published model by name; a one-line error with close names otherwise."""
    models = {m.name: m for m in published_models(dataset, root)}
    if name not in models:
        close = difflib.get_close_matches(name, models, n=3)
        where = f" on {dataset}" if dataset else ""
        hint = f"; did you mean {', '.join(close)}?" if close else "; `robustbench-nacl models` lists them"
        raise UserError(f"no published model {name!r}{where}{hint}")
    return models[name]


def coverage(set_name: str, root: str | Path | None = None) -> dict[str, Any]:
    """What a published set declares it covers (``presets``, ``seeds``, ``zoo``)."""
    return json.loads(((Path(root) if root else published_dir()) / set_name / "coverage.json").read_text())


def not_covered(set_name: str, root: str | Path | None = None) -> list[str]:
    """Registered presets (the package's and plugins') that a published set does not cover yet:
    new presets are listed as "not in the published reference yet", never an error."""
    from .losses import PRESETS

    return sorted(set(PRESETS.names()) - set(coverage(set_name, root)["presets"]))


# ============ weights: package, local folder or URL, sha256-checked ============


def cache_dir() -> Path:
    """The user's cache for downloaded weights: $ROBUSTBENCH_NACL_CACHE, else ~/.cache/robustbench_nacl."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "robustbench_nacl"
    return base.expanduser() / "models"


def _check_sha(model: PublishedModel, path: Path, fix: str) -> Path:
    actual = sha256_file(path)
    if actual != model.weights_sha256:
        raise UserError(
            f"weights of {model.name} at {path} have sha256 {actual[:12]}... but the model card pins "
            f"{model.weights_sha256[:12]}...: the file is damaged or another model's; {fix}"
        )
    return path


def _download(url: str, target: Path, sha256: str | None = None) -> None:
    """Download ``url`` to ``target`` atomically; with ``sha256``, a file that does not match it is
    refused before it reaches ``target`` (so the cache never holds a damaged download)."""
    tmp = target.with_name(f".{target.name}.part")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, urllib.error.HTTPError):
            reason: object = f"HTTP {e.code} {e.reason}"
        else:
            reason = getattr(e, "reason", None) or e
        raise UserError(
            f"cannot download {url} ({' '.join(str(reason).split())[:120]}); check the URL, or pass "
            "--weights-from a local folder holding <name>/weights.safetensors"
        ) from None
    if sha256 is not None and (actual := sha256_file(tmp)) != sha256:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"{url} has sha256 {actual[:12]}... but the model card pins {sha256[:12]}...: the server holds "
            "a damaged file or another model's; check the URL given to --weights-from"
        )
    os.replace(tmp, target)


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
    if src.startswith(("http://", "https://")):
        cached = cache_dir() / model.weights_sha256 / WEIGHTS
        fix = f"delete {cached} to download it again"
        if not cached.is_file():
            _download(f"{src.rstrip('/')}/{model.name}/{WEIGHTS}", cached, model.weights_sha256)
        return _check_sha(model, cached, fix)  # the cached copy may have been damaged since
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
    folder = cache_dir() / model.weights_sha256 / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in (("manifest.json", model.folder / "manifest.json"), (WEIGHTS, weights)):
        tmp = folder / f".{name}.part"
        shutil.copyfile(source, tmp)
        os.replace(tmp, folder / name)
    return folder


# ============ the encoder, its heads and its rows ============


def model_rows(model: PublishedModel) -> list[ResultRow]:
    """The committed rows of one published model."""
    return [r for r in load_rows(model.set_folder) if r["checkpoint_sha256"] == model.weights_sha256]


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
    from .models.foreign import load_encoder

    model = find_model(name, dataset)
    encoder, _ = load_encoder(checkpoint_dir(model, weights_from))
    if not head:
        return encoder.eval()
    row = protocol_row(model, protocol)
    key = head_key(row["checkpoint_sha256"], row["setting"], row["dataset"], dict(row["probe_config"]))
    stored = load_head(model.set_folder / HEADS_DIR, key)
    if stored is None:
        raise UserError(f"the linear head of {model.name} under {row['protocol_id']} is missing; reinstall")
    return ProbedClassifier(encoder, stored[0])
