"""The post-processing stage as one call (:func:`post_process`): a checkpoint written by ``train``
in, a new checkpoint directory out (``weights.safetensors`` + ``manifest.json``, loadable by
``load_encoder`` and ``eval`` like any other), its manifest naming the parent and its training
configuration the parent's plus the post-processing recipe."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from ..attack.rng import derive_seed
from ..data import ImageData, canonical_spec, load_dataset
from ..errors import UserError
from ..io import sha256_bytes, write_bytes_atomic, write_json_atomic
from ..models.checkpoint import (
    MANIFEST,
    WEIGHTS,
    read_manifest,
    resolve_manifest_path,
    save_weights,
    write_manifest,
)
from ..models.dual_bn import has_dual_bn, set_bn_momentum, set_bn_route
from ..models.features import extract_features, knn_accuracy
from ..models.foreign import load_encoder
from ..models.foreign.ours import sibling_manifest
from ..training.manifest import ID_HASH_CHARS, config_sha256, recipe_sha256
from ..utils import device_name, resolve_device, versions
from .lpaft import aft_stage, aft_step, branch_agreement, lp_stage, lp_step, run_stage, zero_head
from .pseudo_labels import assign_pseudo_labels
from .recipes import PostRecipe, resolve_recipe

STATE_DIR = "post-state"  # per-stage resume states, removed once the checkpoint is written
CLOCK = "clock.json"  # each stage's wall seconds per epoch (_Clock)
LABELS = "pseudo_labels.safetensors"  # the pseudo-labels, kept beside the weights (sha256 in the manifest)
MONITOR = "aft_monitor.json"  # the branch agreement per AFT epoch (post.aft_monitor in the manifest)
MONITOR_IMAGES = 512  # the first training images, unaugmented: one of the authors' batches


def post_process(
    checkpoint: str | Path,
    recipe: str = "dynacl++",
    out: str | Path = "robustbench_out/post",
    *,
    overrides: dict[str, Any] | None = None,
    dataset: str | None = None,
    device: str | None = None,
    data_root: str | None = None,
    progress: bool = True,
    checkpoint_id: str | None = None,
) -> Path:
    """Post-process ``checkpoint`` with ``recipe`` into ``out``; returns ``out``.

    Pseudo-labels on the training split of ``dataset`` (default: the parent's pretraining data),
    linear probing, adversarial finetuning, export. Every random draw derives from the parent's
    seed. A killed run resumes from its last finished epoch; a finished one is not redone.
    ``checkpoint_id``: the manifest's ``id`` (a zoo entry's id; default: made from the encoder,
    loss, data, seed and configuration hash), as ``train``'s ``TrainConfig.id``.
    """
    cfg = resolve_recipe(recipe, overrides)
    parent_path = _parent_manifest(checkpoint)
    parent = read_manifest(parent_path)
    out = Path(out)
    if out.resolve() == parent_path.parent.resolve():
        raise UserError(f"--out {out} is the parent checkpoint's own folder; name a new one")
    dev = resolve_device(device)
    encoder, _ = load_encoder(parent_path)
    if not has_dual_bn(encoder):
        raise UserError(
            f"{parent_path.parent} has no dual BatchNorm; {cfg.name} reads features through the clean "
            "branch and trains the adversarial one (post-process an acl, dynacl or dynacl_air checkpoint)"
        )
    spec = canonical_spec(dataset or parent.get("dataset") or "")
    train = load_dataset(spec, "train", root=data_root)
    if dataset is None:  # the parent's own training images
        train = _parent_data(train, parent)
    seed = int(parent.get("seed") or 0)
    k = cfg.clusters or train.num_classes
    training = _training_config(parent, cfg, spec, k, train.num_classes)
    done = _finished(out, training)
    if done is not None:
        print(f"{out} already holds this post-processing ({done}); nothing to do")
        return out
    _own_state(out / STATE_DIR, config_sha256(training))
    encoder = encoder.to(dev)
    t0 = time.perf_counter()
    labels, cluster_info = _pseudo_labels(encoder, train, cfg, k, seed, out / STATE_DIR)
    walls = {"pseudo_labels": time.perf_counter() - t0}
    resumed: dict[str, int] = {}
    model = _train(encoder, train, labels, cfg, k, seed, out / STATE_DIR, progress, walls, resumed)
    monitor = json.loads((out / STATE_DIR / MONITOR).read_text())
    info = cluster_info | {"wall_s": walls, "aft_monitor": monitor}
    info |= {"resumed_at": resumed} if resumed else {}  # its epochs' times were added up across runs
    _export(out, model[0], parent, cfg, training, (spec, data_root), dev, info, checkpoint_id)
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    return out


def _parent_data(train: ImageData, parent: dict[str, Any]) -> ImageData:
    """The parent's training images: its first ``max_train`` when it was trained on a budget."""
    n = (parent.get("training_config") or {}).get("max_train")
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n < len(train):
        return dataclasses.replace(train, x=train.x[:n], y=train.y[:n])
    return train


def _parent_manifest(checkpoint: str | Path) -> Path:
    """The parent's manifest: of a directory, of its manifest.json, or beside its weights file."""
    p = Path(checkpoint)
    if not p.exists():  # say so, rather than read a typo as a foreign weights file
        raise UserError(f"{checkpoint}: no such checkpoint directory; give the --out folder of a `train` run")
    try:
        if p.is_file() and p.name != MANIFEST:
            sibling = sibling_manifest(p)
            if sibling is None:
                raise UserError(str(p))
            return sibling
        return resolve_manifest_path(checkpoint)
    except UserError:
        raise UserError(
            f"{checkpoint}: post-processing reads a checkpoint directory written by `train` "
            "(manifest.json + weights.safetensors), not a foreign weights file"
        ) from None


def _training_config(
    parent: dict[str, Any], cfg: PostRecipe, spec: str, k: int, classes: int
) -> dict[str, Any]:
    """The parent's training configuration plus a ``post`` block (the recipe, resolved); the seed
    stays the parent's, so the seeds of one post-processed recipe are one recipe."""
    base = parent.get("training_config")
    if not isinstance(base, dict):  # an older manifest: the parent is named by its weights
        base = {"seed": parent.get("seed"), "parent_weights_sha256": parent["weights_sha256"]}
    post = {**cfg.identity(), "dataset": spec, "clusters": k, "head_outputs": max(k, classes)}
    return {**base, "post": post}


def _finished(out: Path, training: dict[str, Any]) -> str | None:
    """The id of a finished post-processing of the same configuration in ``out``, else None; a
    one-line error if ``out`` holds another checkpoint (it is never overwritten)."""
    if not (out / MANIFEST).is_file():
        return None
    m = read_manifest(out)
    if m.get("config_sha256") != config_sha256(training):
        raise UserError(f"{out} holds another checkpoint ({m.get('id')}); choose another --out")
    return str(m.get("id"))


def _own_state(state: Path, sha: str) -> None:
    """Keep the resume states only if they were saved by this configuration (else start afresh)."""
    tag = state / "config_sha256"
    if state.is_dir() and (not tag.is_file() or tag.read_text().strip() != sha):
        shutil.rmtree(state)
    state.mkdir(parents=True, exist_ok=True)
    tag.write_text(sha + "\n")


def _pseudo_labels(
    encoder: nn.Module, train: ImageData, cfg: PostRecipe, k: int, seed: int, state: Path
) -> tuple[torch.Tensor, dict[str, Any]]:
    """k-means pseudo-labels, computed once per run (kept in the state folder for a resume)."""
    path = state / LABELS
    kseed = derive_seed(seed, "post", cfg.kmeans_seed_key(), "kmeans")
    if path.is_file():
        saved = st_load(path.read_bytes())
        labels, iters = saved["labels"], int(saved["iterations"])
    else:
        res = assign_pseudo_labels(
            encoder,
            train.x,
            k,
            tol=cfg.kmeans_tol,
            seed=kseed,
            route=cfg.feature_route,
            max_iter=cfg.kmeans_max_iter,
        )
        labels, iters = res.labels, res.iterations
        state.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, st_save({"labels": labels.contiguous(), "iterations": torch.tensor(iters)}))
    sizes = torch.bincount(labels, minlength=k).tolist()
    return labels, {"kmeans_seed": kseed, "kmeans_iterations": iters, "cluster_sizes": sizes}


def _train(
    encoder: nn.Module, train: ImageData, labels: torch.Tensor, cfg: PostRecipe, k: int, seed: int,
    state: Path, progress: bool, walls: dict[str, float], resumed: dict[str, int],
) -> nn.Sequential:  # fmt: skip
    """LP then AFT on the pseudo-labels; returns (encoder, head) finetuned, eval mode, frozen.
    ``walls`` gets each stage's seconds, every epoch's added up across a resume (:class:`_Clock`);
    ``resumed`` the epoch each stage resumed at, for the stages that did not start at 0."""
    # the authors' BatchNorms: torch's default momentum in both branches
    set_bn_momentum(encoder, cfg.bn_momentum, main=cfg.bn_momentum)
    set_bn_route(encoder, cfg.train_route)
    device = next(encoder.parameters()).device
    encoder.eval().requires_grad_(False)
    with torch.no_grad():
        dim = int(encoder(train.x[:1].to(device).float().div(255)).shape[1])
    head = zero_head(dim, max(k, train.num_classes), device)
    clock = _Clock(state / CLOCK)
    start_lp = run_stage(
        lp_stage(cfg, head, state / "lp.pt"),
        train.x,
        labels,
        lp_step(encoder, head),
        recipe=cfg,
        seed=seed,
        progress=progress,
        on_epoch=lambda epoch, _: clock("lp", epoch),
    )
    model = nn.Sequential(encoder, head).requires_grad_(True)
    clock.restart()  # the monitor's agreement after LP counts as AFT's
    monitor = _AftMonitor(model, train.x[:MONITOR_IMAGES].to(device), state / MONITOR)

    def aft_epoch(epoch: int, loss: float) -> None:
        monitor(epoch, loss)
        clock("aft", epoch)

    start_aft = run_stage(
        aft_stage(cfg, model, state / "aft.pt"),
        train.x,
        labels,
        aft_step(model, cfg),
        recipe=cfg,
        seed=seed,
        progress=progress,
        on_epoch=aft_epoch,
    )
    walls.update(lp=clock.total("lp"), aft=clock.total("aft"))
    resumed.update({k: v for k, v in (("lp", start_lp), ("aft", start_aft)) if v})
    return model.eval().requires_grad_(False)


class _Clock:
    """Each stage's wall seconds per epoch, kept in the state folder as the epochs end, so a run
    stopped and resumed in another process still records its whole time (a redone epoch counts once,
    the time lost to the stop not at all)."""

    def __init__(self, path: Path) -> None:
        self.path, self.t = path, time.perf_counter()
        try:
            self.log: dict[str, dict[str, float]] = dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            self.log = {}

    def restart(self) -> None:
        self.t = time.perf_counter()

    def __call__(self, stage: str, epoch: int) -> None:
        now = time.perf_counter()
        self.log.setdefault(stage, {})[str(epoch)] = round(now - self.t, 3)
        self.t = now
        write_json_atomic(self.path, self.log)

    def total(self, stage: str) -> float:
        return float(sum(self.log.get(stage, {}).values()))


class _AftMonitor:
    """The clean/adversarial branch agreement after LP and after every AFT epoch, kept in the state
    folder (so a resumed run keeps the epochs it did not redo) and then in the manifest."""

    def __init__(self, model: nn.Module, x_uint8: torch.Tensor, path: Path) -> None:
        self.model, self.x, self.path = model, x_uint8.float().div(255), path
        self.log: list[dict[str, Any]] = []
        if path.is_file():
            try:
                self.log = list(json.loads(path.read_text()))
            except (ValueError, TypeError):
                self.log = []  # an unreadable log: the epochs still to run are logged afresh
        if not self.log:
            self.log = [{"epoch": 0, **branch_agreement(model, self.x)}]  # after LP, before AFT
            write_json_atomic(path, self.log)

    def __call__(self, epoch: int, loss: float) -> None:
        self.log = [r for r in self.log if r["epoch"] < epoch]  # a redone epoch (killed before its state)
        self.log.append({"epoch": epoch, "loss": round(loss, 6), **branch_agreement(self.model, self.x)})
        write_json_atomic(self.path, self.log)


def _export(
    out: Path, encoder: nn.Module, parent: dict[str, Any], cfg: PostRecipe,
    training: dict[str, Any], data: tuple[str, str | None], dev: torch.device, info: dict[str, Any],
    own_id: str | None = None,
) -> None:  # fmt: skip
    """The encoder (both branches; evaluated through ``cfg.export_route``), the pseudo-labels, the
    manifest (last: its presence marks a complete checkpoint). ``data``: (dataset spec, data root);
    ``own_id``: the manifest's id when the caller names it (a zoo entry's)."""
    spec, root = data
    out.mkdir(parents=True, exist_ok=True)
    set_bn_route(encoder, cfg.export_route)
    sha = save_weights(out / WEIGHTS, nn.ModuleDict({"encoder": encoder}))
    labels_bytes = (out / STATE_DIR / LABELS).read_bytes()
    write_bytes_atomic(out / LABELS, labels_bytes)
    loss = f"{parent.get('loss', 'foreign')}++"
    csha = config_sha256(training)
    encoder_name = str(parent["encoder"]).replace(":", "-").replace("/", "-")  # a folder-safe id
    ds = spec.replace(":", "-").replace("@", "+").replace(",", "_")
    manifest = {
        **{k: v for k, v in parent.items() if k not in ("teacher", "distributed", "knn_acc_init")},
        "id": own_id or f"{encoder_name}.{loss}_{ds}_s{parent.get('seed')}_{csha[:ID_HASH_CHARS]}",
        "loss": loss,
        "dual_bn": True,
        "eval_bn_route": cfg.export_route,
        "weights": WEIGHTS,
        "weights_sha256": sha,
        "versions": versions(),
        "device": device_name(dev),
        "wall_s": round(sum(info["wall_s"].values()), 3),
        "knn_acc": _knn(encoder, spec, parent, root),
        "training_config": training,
        "config_sha256": csha,
        "recipe_sha256": recipe_sha256(training),
        "parent": {
            "id": parent.get("id"),
            "loss": parent.get("loss"),
            "weights_sha256": parent["weights_sha256"],
            "recipe_sha256": parent.get("recipe_sha256"),
        },
        "post": {
            "recipe": cfg.name,
            "source": cfg.source,
            "settings": cfg.identity(),
            "pseudo_labels": LABELS,
            "pseudo_labels_sha256": sha256_bytes(labels_bytes),
            **info,
            "wall_s": {k: round(v, 3) for k, v in info["wall_s"].items()},
        },
    }
    write_manifest(out, manifest)


def _knn(encoder: nn.Module, spec: str, parent: dict[str, Any], root: str | None) -> float | None:
    """Test kNN accuracy of the exported encoder (its evaluation route), as ``train`` records it."""
    try:
        train, test = load_dataset(spec, "train", root=root), load_dataset(spec, "test", root=root)
    except UserError:
        return None
    knn = parent.get("knn") or {}
    kw = {k: knn[k] for k in ("k", "t") if k in knn}
    f_train, f_test = extract_features(encoder, train.x), extract_features(encoder, test.x)
    return knn_accuracy(f_train, train.y, f_test, test.y, num_classes=train.num_classes, **kw)
